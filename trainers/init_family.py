"""--init-from another model's checkpoint: one line and exit 2, before the trainer reads its shards or builds a model.

Each trainer's own reader converts one family's files; given an ERes2Net checkpoint, F5's reader would fail deep
in its converter. Every train_*.py calls `refuse_other_family` first thing after its flags
(audiopipe.checkpoints.family tells the families apart by their tensor names). Every rank checks the same file
and exits alike; only rank 0 prints, so torchrun's output holds the line once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from audiopipe.checkpoints.family import ForeignCheckpoint, expect_family

from core import RunConfig, latest_checkpoint


def refuse_other_family(cfg: RunConfig, family: str, name: str) -> None:
    """End the run (exit 2, one line `name: error: --init-from ...`) when --init-from, which this run reads (it
    does not resume), holds another family's weights than `family`."""
    if not cfg.init_from or (cfg.resume and latest_checkpoint(Path(cfg.out)) is not None):
        return
    try:
        expect_family(cfg.init_from, family, f"train_{family}")
    except ForeignCheckpoint as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"{name}: error: --init-from {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
