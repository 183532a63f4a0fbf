"""A minimal trainer on trainers/core.py with dropout, for testing the core itself under torchrun."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "trainers"))

import torch  # noqa: E402

from core import parse_args, setup_dist, train  # noqa: E402

cfg, _ = parse_args("core test trainer")
d = setup_dist(cfg.seed)
model = torch.nn.Sequential(torch.nn.Conv1d(100, 32, 3, padding=1), torch.nn.Dropout(0.3), torch.nn.Conv1d(32, 100, 1))


def loss_fn(m, b):
    x, mask = b["mel"], b["mel_mask"][:, None].float()
    return (((m(x) - x) ** 2) * mask).sum() / mask.sum() / 100, {}


train(model, loss_fn, cfg, d, features=["mel"])
