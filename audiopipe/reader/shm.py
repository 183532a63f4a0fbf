"""How much shared memory a DataLoader worker holds: the bound both loaders (mmap and WebDataset) report.

A worker's batches wait in /dev/shm until the trainer takes them; a full /dev/shm ends in a SIGBUS (as in
3D-Speaker), so the bound is printed before training rather than discovered by a crash.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def bytes_per_frame(features: Sequence[str], specs: Mapping[str, Any], channels: Mapping[str, int],
                    mask: bool = True) -> int:
    """Bytes one padded frame of a batch costs: every feature's channels x itemsize, plus its bool mask.

    specs: the manifest's feature specs; a column without one (phones, durations) is collated as int64.
    """
    total = 0
    for f in features:
        ch = max(1, channels.get(f, 0))
        spec = specs.get(f)
        itemsize = np.dtype(spec["dtype"]).itemsize if spec else np.dtype("int64").itemsize
        total += ch * itemsize + (1 if mask else 0)
    return total


def shm_bytes_per_worker(num_workers: int, prefetch_factor: int | None, max_frames: int, per_frame: int) -> int:
    """Upper bound of shared memory one worker holds: prefetch_factor padded batches at the frame budget."""
    if num_workers == 0:
        return 0
    return int(prefetch_factor * max_frames * per_frame)
