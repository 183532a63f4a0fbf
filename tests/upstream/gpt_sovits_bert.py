"""GPT-SoVITS's per-phone BERT features, by its own code, for tests/test_text_bert.py.

    gpt_sovits_bert.py BERT_DIR IN.json OUT.safetensors     IN.json: [[normalised text, word2ph], ...]

Loads the folder as GPTSoVITSInference.__init__ does (AutoTokenizer, AutoModelForMaskedLM) and runs its
_get_bert_feature (the same computation as prepare_datasets/1-get-text.py's get_bert_feature), taken out of the
installed inference.py, whose other imports the side venv lacks.
"""

import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForMaskedLM, AutoTokenizer

from gpt_sovits_s1 import upstream_function

get_bert_feature = upstream_function("infer/inference.py", "_get_bert_feature", cls="GPTSoVITSInference",
                                     env={"torch": torch})


class _Inference:  # the attributes _get_bert_feature reads
    device = "cpu"

    def __init__(self, path):
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.bert_model = AutoModelForMaskedLM.from_pretrained(path).eval()


def main(bert_dir, inp, out):
    inf = _Inference(bert_dir)
    items = json.loads(open(inp, encoding="utf-8").read())
    save_file({f"f{i}": get_bert_feature(inf, text, w2p).contiguous() for i, (text, w2p) in enumerate(items)}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
