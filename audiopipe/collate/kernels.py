"""The compiled copy-and-pad loop behind PadCollator's RowBatch path.

One call copies every row one shard contributes to a batch into its padded slot and writes the pad after it,
touching each destination byte once (no zero-fill first, no per-item Python). Data is copied as unsigned
integers of the same width, so one compiled variant per item size (1, 2, 4, 8 bytes) serves every dtype,
bit for bit, and the pad value is written with the bit pattern of the feature's dtype.

Loading the compiled kernel from numba's cache costs ~0.4 s on its first call in a process (a fresh install
compiles it, ~1 s). `warm_up_in_background()` (make_loader calls it) loads it in a daemon thread; until it is
ready, `pad_rows_into` copies with numpy, one row at a time (same bytes), so the first batches do not wait.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numba
import numpy as np

from audiopipe.collate.rows import Rows

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@numba.njit(cache=True, nogil=True)
def _pad_rows(src, starts, frames, positions, channels, t_max, pad, dst):  # pragma: no cover - numba
    for k in range(starts.size):
        t = frames[k]
        s = starts[k]
        base = positions[k] * channels * t_max
        for c in range(channels):
            o = base + c * t_max
            dst[o:o + t] = src[s + c * t:s + (c + 1) * t]
            dst[o + t:o + t_max] = pad


def _pad_rows_numpy(src, starts, frames, positions, channels, t_max, pad, dst) -> None:
    """_pad_rows without the compiled kernel: one numpy copy and one fill per row."""
    if t_max == 0:  # every row is empty: nothing to write (and a [-1, C, 0] view has no defined batch size)
        return
    box = dst.reshape(-1, channels, t_max)
    for s, t, p in zip(starts.tolist(), frames.tolist(), positions.tolist()):
        box[p, :, :t] = src[s:s + channels * t].reshape(channels, t)
        box[p, :, t:] = pad


_warm = {"started": False, "ready": threading.Event()}
_warm_lock = threading.Lock()


def _load_kernels(itemsizes: tuple[int, ...]) -> None:
    # One call per variant loads it (from numba's cache, or compiles it). Only the variants the features need,
    # for read-only sources (mapped shard columns are read-only, a numba type of its own): each load holds the
    # GIL for a while, and the batches copied meanwhile need it too.
    try:
        for size in itemsizes:
            uint = _UINT[size]
            src = np.zeros(2, dtype=uint)
            src.setflags(write=False)
            idx = np.zeros(1, dtype=np.int64)
            _pad_rows(src, idx, np.ones(1, dtype=np.int64), idx, 1, 2, uint(0), np.zeros(2, dtype=uint))
    finally:
        _warm["ready"].set()


def warm_up_in_background(itemsizes: Sequence[int] = (4,)) -> None:
    """Load the compiled kernels for these item sizes (bytes per value of the padded features) in a daemon
    thread, once per process; pad_rows_into uses numpy meanwhile. Another variant loads on its first use.

    Not for a process that is about to fork DataLoader workers: a fork during the load could leave numba's
    compiler lock held in the child. make_loader calls it only with num_workers=0.
    """
    with _warm_lock:
        if _warm["started"]:
            return
        _warm["started"] = True
    sizes = tuple(sorted({int(s) for s in itemsizes if int(s) in _UINT})) or (4,)
    threading.Thread(target=_load_kernels, args=(sizes,), name="audiopipe-kernel-load", daemon=True).start()


def kernels_ready() -> bool:
    return _warm["ready"].is_set()


def wait_for_kernels() -> None:
    """Block until a background load (if one was started) is done: call before forking workers."""
    if _warm["started"]:
        _warm["ready"].wait()


def pad_rows_into(dst: np.ndarray, parts: Sequence[Rows], channels: int, t_max: int, pad_value: float) -> None:
    """Write every part's rows into dst, a flat C-contiguous [B * max(channels, 1) * t_max] buffer of their dtype."""
    uint = _UINT[dst.dtype.itemsize]
    pad = np.asarray(pad_value, dtype=dst.dtype).view(uint)[()]
    out = dst.view(uint)
    width = max(channels, 1)
    # While a background load is under way, numpy; without one (workers, direct use), the kernel loads here.
    kernel = _pad_rows if not _warm["started"] or _warm["ready"].is_set() else _pad_rows_numpy
    for rows in parts:
        if rows.values.dtype != dst.dtype:
            raise TypeError(f"destination is {dst.dtype}, rows are {rows.values.dtype}")
        kernel(rows.values.view(uint), rows.starts, rows.frames, rows.positions, width, t_max, pad, out)
