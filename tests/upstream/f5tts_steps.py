"""F5-TTS's Trainer as the oracle of audiopipe's F5 training step (runs in the side venv: f5-tts 1.1.22).

    python f5tts_steps.py DIR   # DIR/inputs.safetensors and DIR/arch.json written by tests/test_step_parity_f5tts.py

Builds F5's CFM + DiT at the test's small config (f5tts_oracle.build: fixed seed, zero-initialised layers drawn),
saves those initial weights, and trains them with F5's own `Trainer.train` (its AdamW, LinearLR warmup + decay,
gradient clipping, ema_pytorch EMA; one process, fp32, the CPU) for DIR/arch.json's "updates" updates on two
fixed utterances. Hooks on the model record, for every update, what its forward was given (the batch as F5's
collate made it) and the RNG states it started from (torch and Python's `random`, whose draws make the span, noise,
flow time, CFG drops and dropout), and the loss it returned. Writes DIR/init.pt (the weights before update 1),
DIR/steps.pt (per update: mel, lens, text, RNG states, loss) and DIR/ckpts/model_last.pt (F5's own checkpoint
after the last update: online weights, EMA, scheduler).
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from f5tts_oracle import Utterances, build


def main(d: Path) -> None:
    from f5_tts.model import Trainer

    inp = load_file(str(d / "inputs.safetensors"))
    cfg = json.loads((d / "arch.json").read_text())
    model = build(cfg["arch"], len(cfg["vocab"]))
    model.vocab_char_map = {s: i for i, s in enumerate(cfg["vocab"])}
    torch.save({"model_state_dict": model.state_dict()}, d / "init.pt")
    steps: list[dict] = []

    def before(_module, args, kwargs):
        text = kwargs["text"]
        steps.append({"mel": args[0].detach().clone(), "lens": kwargs["lens"].detach().clone(),
                      "text": [list(map(ord, "".join(t))) for t in text],
                      "torch_rng": torch.get_rng_state(), "python_rng": random.getstate()})

    def after(_module, _args, _kwargs, output):
        steps[-1]["loss"] = float(output[0].detach())

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after, with_kwargs=True)
    trainer = Trainer(model, epochs=cfg["updates"], learning_rate=cfg["lr"], num_warmup_updates=cfg["warmup"],
                      save_per_updates=10**9, last_per_updates=10**9, checkpoint_path=str(d / "ckpts"),
                      batch_size_per_gpu=2, batch_size_type="sample", max_grad_norm=cfg["clip"], logger=None)
    trainer.train(Utterances(inp), num_workers=1)
    torch.save(steps, d / "steps.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    os.environ.setdefault("WANDB_MODE", "disabled")
    main(Path(sys.argv[1]))
