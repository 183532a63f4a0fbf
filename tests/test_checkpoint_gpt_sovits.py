"""GPT-SoVITS stage 1 checkpoints both ways, against GPT-SoVITS's own code (tests/upstream/gpt_sovits_s1.py in the
side venv): its model saved as its WebUI saves it loads whole into ours with equal outputs, and our export loads
strictly through its inference loader with equal outputs. Two upstream runs in all (write, then forward)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from audiopipe.checkpoints import gpt_sovits as io
from audiopipe.checkpoints.files import CheckpointError, write_torch
from audiopipe.checkpoints.load import load_matching
from upstream_oracle import run_upstream_jobs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainers"))
from train_gpt_sovits import CONFIGS, Text2Semantic  # noqa: E402

BASE = {"train": {"seed": 1234, "epochs": 1, "batch_size": 8, "save_every_n_epoch": 1, "precision": "32",
                  "gradient_clip": 1.0},
        "optimizer": {"lr": 0.01, "lr_init": 0.00001, "lr_end": 0.0001, "warmup_steps": 2000, "decay_steps": 40000},
        "data": {"max_eval_sample": 8, "max_sec": 54, "num_workers": 4, "pad_val": 1024},
        "inference": {"top_k": 5}}


def upstream_cfg(phone_rows: int) -> dict:
    """A small model in GPT-SoVITS's config schema; 512 phone rows is a v1 checkpoint, 732 a v2 one."""
    return {**BASE, "model": {"vocab_size": 1025, "phoneme_vocab_size": phone_rows, "embedding_dim": 32,
                              "hidden_dim": 32, "head": 4, "linear_units": 128, "n_layer": 2, "dropout": 0,
                              "EOS": 1024, "random_bert": 0}}


def ours_from(path: Path) -> tuple[Text2Semantic, object]:
    state, config, _ = io.read_upstream(path)
    model = Text2Semantic(replace(CONFIGS["default"], **io.sizes_from_config(config)))
    return model.eval(), load_matching(model, state)


def batch() -> dict[str, torch.Tensor]:
    """Three utterances of unequal phone and token lengths (padding as GPT-SoVITS's collate pads: phones 0, tokens
    EOS), one with BERT features on its first phones, zeros elsewhere as for non-Chinese text."""
    g = torch.Generator().manual_seed(0)
    pl, tl = [7, 4, 9], [11, 6, 3]
    phones = torch.randint(1, 322, (3, 9), generator=g)
    tokens = torch.randint(0, 1024, (3, 11), generator=g)
    for i, (p, t) in enumerate(zip(pl, tl)):
        phones[i, p:] = 0
        tokens[i, t:] = 1024
    bert = torch.zeros(3, 1024, 9)
    bert[1, :, :4] = torch.randn(1024, 4, generator=g)
    return {"phones": phones, "phone_lens": torch.tensor(pl), "semantic": tokens, "semantic_lens": torch.tensor(tl),
            "bert": bert}


def our_outputs(model: Text2Semantic, b: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at every position and GPT-SoVITS's loss (sum over all positions, EOS on padding)."""
    with torch.no_grad():
        logits, targets = model(b["phones"], b["phone_lens"], b["semantic"], b["semantic_lens"], b["bert"])
    loss = F.cross_entropy(logits.transpose(1, 2), targets.masked_fill(targets < 0, model.c.eos), reduction="sum")
    return logits, loss


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """Upstream-written v1 and v2 checkpoints, our exports of a model of ours (fp16 and fp32), and upstream's
    outputs for all four on one batch."""
    from safetensors.torch import load_file, save_file

    tmp = tmp_path_factory.mktemp("sovits_ckpt")
    args = []
    for rows in (512, 732):
        (tmp / f"cfg{rows}.json").write_text(json.dumps(upstream_cfg(rows)))
        args += [tmp / f"cfg{rows}.json", tmp / f"up{rows}.ckpt", rows]
    torch.manual_seed(3)
    ours = Text2Semantic(replace(CONFIGS["tiny"], dim=32, heads=4, ff=128, phone_vocab=512)).eval()
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    config = io.upstream_config({"dim": 32, "heads": 4, "layers": 2, "ff": 128, "vocab_size": 1025,
                                 "phone_vocab": 512})
    for fmt in io.FORMATS:
        io.write_upstream(ours.state_dict(), tmp / f"ours_{fmt}.ckpt", config, "GPT-audiopipe-step0", fmt)
    b = batch()
    save_file(b, tmp / "batch.safetensors")
    names = ["up512", "up732", "ours_fp16", "ours_fp32"]
    # upstream writes its two checkpoints, then runs all four: one side-venv process
    run_upstream_jobs(("gpt_sovits_s1.py", "write", *args),
                      ("gpt_sovits_s1.py", "forward", tmp / "batch.safetensors",
                       *[x for n in names for x in (tmp / f"{n}.ckpt", tmp / f"{n}.out")]))
    return tmp, ours, b, {n: load_file(tmp / f"{n}.out") for n in names}


@pytest.mark.parametrize("rows", [512, 732])
def test_upstream_checkpoint_loads_whole_with_equal_outputs(oracle, rows):
    tmp, _, b, outs = oracle
    raw = torch.load(tmp / f"up{rows}.ckpt", weights_only=True)
    assert set(raw) == {"weight", "config", "info"} and all(v.dtype == torch.float16 for v in raw["weight"].values())
    model, report = ours_from(tmp / f"up{rows}.ckpt")
    assert report.new == [] and report.dropped == [] and len(report.loaded) == 12 * 2 + 7
    assert model.phone_emb.weight.shape[0] == rows  # v1: 322 symbols in 512 rows; v2: 732 symbols
    # the parameter count of upstream's Lightning module, bert_proj included
    assert sum(p.numel() for p in model.parameters()) == int(outs[f"up{rows}"]["n_params"])
    logits, loss = our_outputs(model, b)
    torch.testing.assert_close(logits, outs[f"up{rows}"]["logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(loss.reshape(1), outs[f"up{rows}"]["loss"], rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("fmt", io.FORMATS)
def test_our_export_loads_strictly_in_upstream_with_equal_outputs(oracle, fmt):
    tmp, ours, b, outs = oracle
    raw = torch.load(tmp / f"ours_{fmt}.ckpt", weights_only=True)
    assert raw["config"]["model"]["phoneme_vocab_size"] == 512 and raw["info"] == "GPT-audiopipe-step0"
    assert {v.dtype for v in raw["weight"].values()} == {torch.float16 if fmt == "fp16" else torch.float32}
    # upstream's loader is strict (load_state_dict of the whole Lightning module): it ran, so every name fits.
    # Compare with our model on the weights as written (fp16 rounds them).
    model, _ = ours_from(tmp / f"ours_{fmt}.ckpt")
    if fmt == "fp32":
        for k, v in ours.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k
    logits, loss = our_outputs(model, b)
    torch.testing.assert_close(logits, outs[f"ours_{fmt}"]["logits"], rtol=0, atol=1e-5)
    torch.testing.assert_close(loss.reshape(1), outs[f"ours_{fmt}"]["loss"], rtol=1e-6, atol=1e-5)


# ----------------------------------------------------------------------------- without the oracle

def test_names_map_one_to_one_both_ways():
    model = Text2Semantic(CONFIGS["tiny"])
    state = model.state_dict()
    theirs = io.to_upstream(state)
    assert len(theirs) == len(state) == 12 * CONFIGS["tiny"].layers + 7
    assert "model.h.layers.1.self_attn.in_proj_weight" in theirs and "model.bert_proj.bias" in theirs
    back = io.from_upstream(theirs)
    assert back.keys() == state.keys() and all(back[k] is state[k] for k in state)
    with pytest.raises(CheckpointError, match="no place in GPT-SoVITS"):
        io.to_upstream({**state, "extra.weight": torch.zeros(1)})


def test_unknown_upstream_tensors_are_reported_dropped_not_lost():
    model = Text2Semantic(CONFIGS["tiny"])
    theirs = io.to_upstream(model.state_dict())
    theirs["model.some_new_head.weight"] = torch.zeros(3)
    report = load_matching(model, io.from_upstream(theirs))
    assert report.dropped == ["model.some_new_head.weight"] and report.new == []


def test_config_round_trip_and_refusals(tmp_path):
    sizes = io.sizes_from_config(upstream_cfg(732))
    assert sizes == {"dim": 32, "heads": 4, "layers": 2, "ff": 128, "vocab_size": 1025, "phone_vocab": 732,
                     "emb_dropout": 0.0}
    cfg = io.upstream_config(sizes, max_sec=30)
    assert io.sizes_from_config(cfg) == sizes and cfg["data"]["max_sec"] == 30 and cfg["inference"]["top_k"] == 15
    kept = io.upstream_config(sizes, base={**upstream_cfg(732), "pretrained_s1": "x.ckpt"})
    assert kept["pretrained_s1"] == "x.ckpt" and kept["train"]["epochs"] == 1  # the starting checkpoint's config
    with pytest.raises(CheckpointError, match="4 x dim"):
        io.upstream_config({**sizes, "ff": 100})
    with pytest.raises(CheckpointError, match="EOS 5"):
        io.sizes_from_config({"model": {**upstream_cfg(512)["model"], "EOS": 5}})
    # a SoVITS (stage 2) file, a Lightning training checkpoint, a plain dict: each refused in one line
    write_torch({"weight": {"enc_p.x": torch.zeros(1)}, "config": {}, "info": ""}, tmp_path / "s2.pth")
    with pytest.raises(CheckpointError, match="SoVITS \\(stage 2\\)"):
        io.read_upstream(tmp_path / "s2.pth")
    write_torch({"state_dict": {"model.ar_x": torch.zeros(1)}}, tmp_path / "l.ckpt")
    with pytest.raises(CheckpointError, match="Lightning training checkpoint"):
        io.read_upstream(tmp_path / "l.ckpt")
