"""The compiled copy-and-pad loop behind PadCollator's RowBatch path.

One call copies every row one shard contributes to a batch into its padded slot and writes the pad after it,
touching each destination byte once (no zero-fill first, no per-item Python). Data is copied as unsigned
integers of the same width, so one compiled variant per item size (1, 2, 4, 8 bytes) serves every dtype,
bit for bit, and the pad value is written with the bit pattern of the feature's dtype.
"""

from __future__ import annotations

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


def pad_rows_into(dst: np.ndarray, parts: Sequence[Rows], channels: int, t_max: int, pad_value: float) -> None:
    """Write every part's rows into dst, a flat C-contiguous [B * max(channels, 1) * t_max] buffer of their dtype."""
    uint = _UINT[dst.dtype.itemsize]
    pad = np.asarray(pad_value, dtype=dst.dtype).view(uint)[()]
    out = dst.view(uint)
    width = max(channels, 1)
    for rows in parts:
        if rows.values.dtype != dst.dtype:
            raise TypeError(f"destination is {dst.dtype}, rows are {rows.values.dtype}")
        _pad_rows(rows.values.view(uint), rows.starts, rows.frames, rows.positions, width, t_max, pad, out)
