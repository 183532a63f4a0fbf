"""F5-TTS training steps: audiopipe's trainer against F5-TTS's own Trainer (f5-tts 1.1.22, in the side venv).

F5's `Trainer.train` (its AdamW, warmup + decay LinearLR, clipping and ema_pytorch EMA, fp32, one process on the
CPU) takes 3 updates from weights built by its own code (tests/upstream/f5tts_steps.py); it records each update's
batch, the RNG state its forward started from, and the loss. Our trainer's pieces (F5TTS in F5's forward, its
loss_fn, core's AdamW with the F5 run defaults, f5_lr, clip 1.0, EmaHook) take the same 3 steps in core.train's
order (tests/step_parity.py) from the same weights: every loss, and the online and EMA weights after the last
update, equal F5's within 1e-5.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import save_file

import core
import train_f5tts as f5
from audiopipe.checkpoints import f5tts as ck
from step_parity import max_gap, replay
from upstream_oracle import run_upstream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# F5's position convolution is fixed at kernel 31, 16 groups (so dim is a multiple of 16)
ARCH = dict(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2, text_dim=16, conv_layers=1)
VOCAB = [" "] + [chr(c) for c in range(33, 127)]
UPDATES, WARMUP, LR = 3, 2, 1e-2  # warmup then decay both taken; an LR large enough to move every weight
TEXTS = ["Hello there, friend.", "short one"]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    d = tmp_path_factory.mktemp("f5_steps")
    g = torch.Generator().manual_seed(5)
    lens = torch.tensor([37, 26])
    mel = (torch.randn(2, 37, 100, generator=g) * 2 - 5) * (torch.arange(37)[None, :] < lens[:, None])[..., None]
    chars = torch.full((2, 40), -1)
    for i, t in enumerate(TEXTS):
        chars[i, :len(t)] = torch.tensor([ord(c) for c in t])
    save_file({"mel": mel, "lens": lens, "chars": chars}, str(d / "inputs.safetensors"))
    (d / "arch.json").write_text(json.dumps({
        "arch": {**ARCH, "text_mask_padding": True, "pe_attn_head": None, "attn_mask_enabled": False},
        "vocab": VOCAB, "updates": UPDATES, "warmup": WARMUP, "lr": LR, "clip": f5.RUN_DEFAULTS["clip"]}))
    run_upstream("f5tts_steps.py", d, timeout=300)
    return d


def test_three_updates_equal_f5s_trainer(upstream):
    d = upstream
    steps = torch.load(d / "steps.pt", weights_only=True)
    assert len(steps) == UPDATES
    init = ck.read_f5_checkpoint(d / "init.pt", use_ema=False)
    cfg = core.RunConfig(**{**f5.RUN_DEFAULTS, "lr": LR, "warmup_steps": WARMUP, "max_steps": UPDATES})
    model = f5.F5TTS(f5.ModelConfig(**ARCH, text_num_embeds=len(VOCAB), upstream_forward=True))
    model.load_state_dict(init.online_weights, strict=True)
    # as trainers/core.train builds the optimizer, and train_f5tts.main its schedule and EMA
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema = f5.EmaHook()
    tok = f5.Tokenizer(VOCAB)
    batches = [{"mel": s["mel"].transpose(1, 2), "mel_lengths": s["lens"],
                "text_ids": tok.batch(["".join(map(chr, t)) for t in s["text"]])} for s in steps]

    def set_rng(k: int) -> None:
        torch.set_rng_state(steps[k]["torch_rng"])
        random.setstate(steps[k]["python_rng"])

    losses = replay(model, f5.loss_fn, batches, opt, lambda s: f5.f5_lr(s, cfg.lr, cfg.warmup_steps, cfg.max_steps),
                    cfg.clip, [ema], set_rng)
    theirs = [s["loss"] for s in steps]
    assert losses == pytest.approx(theirs, abs=1e-5, rel=0)
    last = ck.read_f5_checkpoint(d / "ckpts" / "model_last.pt")
    assert last.ema_step == UPDATES
    start = dict(init.online_weights)
    online = {k: v.detach() for k, v in model.state_dict().items()}
    gap, where = max_gap(online, last.online_weights)
    assert gap < 1e-5, (where, gap)
    moved = max(((online[k] - start[k]).abs().max().item(), k) for k in online)
    assert moved[0] > 100 * 1e-5, moved  # the steps moved the weights far beyond the tolerance
    gap, where = max_gap({k: ema.weights[k] for k in last.ema_weights}, last.ema_weights)
    assert gap < 1e-5, (where, gap)
