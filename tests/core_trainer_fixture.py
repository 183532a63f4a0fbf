"""A minimal trainer on trainers/core.py with dropout, for testing the core itself under torchrun.

It logs `u`, the first number rank 0 draws from torch's global RNG in each step, so a test can see which
random stream a step used. Run with trainers/ on PYTHONPATH (the tests set it), as every trainer imports core.
"""

import torch

from core import parse_args, setup_dist, train

cfg, _ = parse_args("core test trainer")
d = setup_dist(cfg.seed)
model = torch.nn.Sequential(torch.nn.Conv1d(100, 32, 3, padding=1), torch.nn.Dropout(0.3), torch.nn.Conv1d(32, 100, 1))


def loss_fn(m, b):
    u = torch.rand(())
    x, mask = b["mel"], b["mel_mask"][:, None].float()
    return (((m(x) - x) ** 2) * mask).sum() / mask.sum() / 100, {"u": u}


train(model, loss_fn, cfg, d, features=["mel"])
