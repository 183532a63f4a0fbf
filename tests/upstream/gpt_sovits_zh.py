"""GPT-SoVITS v2's own Chinese front end (its `text.cleaner.clean_text(text, "zh", "v2")`), run in the upstream
venv over a list of sentences: the oracle of tests/test_text_zh_oracle.py.

Usage: python gpt_sovits_zh.py GPT_SOVITS_DIR SENTENCES.json OUT.json
GPT_SOVITS_DIR is a GPT-SoVITS checkout's `GPT_SoVITS` folder (the one holding `text/`). Writes
{"phones": [[...], ...], "norm_text": [...]} in the order of the sentences.

Two things stand in for what a training machine of GPT-SoVITS has and this one cannot:
- G2PW, its neural polyphone model, is a download: `text.g2pw` is replaced by an empty module and chinese2's
  `is_g2pw` switched off, which is the path GPT-SoVITS itself takes without the model (pypinyin + its tone sandhi +
  erhua). audiopipe matches that path.
- nothing else: jieba_fast, pypinyin and cn2an are the real packages (the upstream venv installs them).
"""

import contextlib
import io
import json
import os
import sys
import types


def main() -> None:
    src, sentences_path, out_path = sys.argv[1:4]
    sys.path.insert(0, src)
    os.environ.setdefault("version", "v2")
    stub = types.ModuleType("text.g2pw")
    stub.G2PWPinyin = lambda **kwargs: None
    stub.correct_pronunciation = lambda word, pinyins: pinyins
    sys.modules["text.g2pw"] = stub
    with contextlib.redirect_stdout(io.StringIO()):
        import text.chinese2 as chinese2
    chinese2.is_g2pw = False
    from text.cleaner import clean_text

    sentences = json.loads(open(sentences_path, encoding="utf-8").read())
    phones, norm = [], []
    for s in sentences:
        with contextlib.redirect_stdout(io.StringIO()):  # chinese2 prints pypinyin's result on this path
            p, _, n = clean_text(s, "zh", "v2")
        phones.append(list(p))
        norm.append(n)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"phones": phones, "norm_text": norm}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
