"""The compiled copy-and-pad loop behind PadCollator's RowBatch path.

One call copies every row one shard contributes to a batch into its padded slot and writes the pad after it,
touching each destination byte once (no zero-fill first, no per-item Python). Data is copied as unsigned
integers of the same width, so one compiled variant per item size (1, 2, 4, 8 bytes) serves every dtype,
bit for bit, and the pad value is written with the bit pattern of the feature's dtype.

Each row is copied by one call to the C library's memcpy (`_copy_elems`, LLVM's memcpy intrinsic), not by
numba's slice assignment: numba lowers `dst[a:b] = src[c:d]` to an element loop that reached ~4.5 GB/s where
memcpy moves ~7 GB/s on the benchmark machine (short clips: 100 rows of ~1.1 KB per item), 1.3-1.6x on the
whole copy, measured on the benchmark corpora when this kernel replaced the slice assignment.

Loading the compiled kernel from numba's cache costs ~0.4 s on its first call in a process (a fresh install
compiles it, ~1 s). `warm_up_in_background()` (make_loader calls it) loads it in a daemon thread; until it is
ready, `pad_rows_into` copies with numpy, one row at a time (same bytes), so the first batches do not wait.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Sequence

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from audiopipe.collate.rows import Rows
from audiopipe.errors import InvalidValue, WrongType

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@intrinsic
def _copy_elems(typingctx, dst, dst_start, src, src_start, n):  # pragma: no cover - compiled
    """dst[dst_start:dst_start + n] = src[src_start:src_start + n] as one memcpy (1-D arrays of one dtype).

    No bounds checks here: _pad_rows checks every row's ranges before copying it."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.dtype == src.dtype
            and dst.ndim == 1 and src.ndim == 1 and dst.layout == "C" and src.layout == "C"):
        return None
    sig = types.void(dst, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        itemsize = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
        nbytes = builder.mul(args[4], context.get_constant(types.intp, itemsize))
        cgutils.raw_memcpy(builder, cgutils.gep(builder, d.data, args[1]), cgutils.gep(builder, s.data, args[3]),
                           nbytes, 1)
        return context.get_dummy_value()

    return sig, codegen


def _out_of_bounds(t, s, base, channels, t_max, src_size, dst_size) -> bool:
    """Whether a row of t frames at src[s:] would reach outside its column, or its slot at dst[base:] outside the
    batch: memcpy does not check, so every kernel asks this before copying a row."""
    return t < 0 or t > t_max or s < 0 or s + channels * t > src_size or base < 0 or base + channels * t_max > dst_size


# The same check inside the compiled kernels (inlined there; one definition for both paths).
_out_of_bounds_nb = numba.njit(inline="always", cache=True)(_out_of_bounds)


@numba.njit(cache=True, nogil=True)
def _pad_rows(src, starts, frames, positions, channels, t_max, pad, dst):  # pragma: no cover - numba
    """Returns -1, or the index k of the first row whose source or destination range is out of bounds (the
    rows before it are written, it and the rest are not)."""
    for k in range(starts.size):
        t = frames[k]
        s = starts[k]
        base = positions[k] * channels * t_max
        if _out_of_bounds_nb(t, s, base, channels, t_max, src.size, dst.size):
            return k
        for c in range(channels):
            o = base + c * t_max
            _copy_elems(dst, o, src, s + c * t, t)
            dst[o + t:o + t_max] = pad
    return -1


@numba.njit(cache=True, nogil=True)
def _pad_rows_time_major(src, starts, frames, positions, channels, t_max, pad, dst):  # pragma: no cover - numba
    """_pad_rows into a [B, t_max, channels] batch (layout="BTC") from the stored [channels, t] rows: a transpose,
    frame by frame (the reads of one frame hit `channels` cache lines that the next 15 frames reuse)."""
    for k in range(starts.size):
        t = frames[k]
        s = starts[k]
        base = positions[k] * channels * t_max
        if _out_of_bounds_nb(t, s, base, channels, t_max, src.size, dst.size):
            return k
        for j in range(t):
            o = base + j * channels
            for c in range(channels):
                dst[o + c] = src[s + c * t + j]
        dst[base + t * channels:base + t_max * channels] = pad
    return -1


def _pad_rows_numpy_in(src, starts, frames, positions, channels, t_max, pad, dst, time_major: bool) -> int:
    """_pad_rows / _pad_rows_time_major without the compiled kernel: one numpy copy and one fill per row (same
    checks, same result)."""
    for k, (s, t, p) in enumerate(zip(starts.tolist(), frames.tolist(), positions.tolist())):
        base = p * channels * t_max
        if _out_of_bounds(t, s, base, channels, t_max, src.size, dst.size):
            return k
        if t_max == 0:  # an empty row in an empty batch: nothing to write
            continue
        item = src[s:s + channels * t].reshape(channels, t)
        if time_major:
            box = dst[base:base + channels * t_max].reshape(t_max, channels)
            box[:t] = item.T
            box[t:] = pad
        else:
            box = dst[base:base + channels * t_max].reshape(channels, t_max)
            box[:, :t] = item
            box[:, t:] = pad
    return -1


def _pad_rows_numpy(src, starts, frames, positions, channels, t_max, pad, dst) -> int:
    return _pad_rows_numpy_in(src, starts, frames, positions, channels, t_max, pad, dst, time_major=False)


def _pad_rows_time_major_numpy(src, starts, frames, positions, channels, t_max, pad, dst) -> int:
    return _pad_rows_numpy_in(src, starts, frames, positions, channels, t_max, pad, dst, time_major=True)


_warm = {"started": False, "ready": threading.Event(), "go": threading.Event()}
_warm_lock = threading.Lock()


def _load_kernels(itemsizes: tuple[int, ...], kernels: tuple = (_pad_rows,)) -> None:
    # One call per variant loads it (from numba's cache, or compiles it). Only the variants the features need,
    # for read-only sources (mapped shard columns are read-only, a numba type of its own): each load holds the
    # GIL for a while, and the batches copied meanwhile need it too.
    try:
        for size in itemsizes:
            uint = _UINT[size]
            src = np.zeros(2, dtype=uint)
            src.setflags(write=False)
            idx = np.zeros(1, dtype=np.int64)
            for kernel in kernels:
                kernel(src, idx, np.ones(1, dtype=np.int64), idx, 1, 2, uint(0), np.zeros(2, dtype=uint))
    finally:
        _warm["ready"].set()


def _load_when_released(itemsizes: tuple[int, ...], kernels: tuple) -> None:
    _warm["go"].wait()
    _load_kernels(itemsizes, kernels)


def _finish_load_at_exit() -> None:
    # A script that exits right after its first batch would cut the load off inside numba/LLVM, which can
    # abort the process at shutdown ("terminate called without an active exception"): let it end first.
    if _warm["go"].is_set():
        _warm["ready"].wait(timeout=30)


def release_warm_up() -> None:
    """Let a load started with after_release=True begin (make_loader: once its first batch is in hand)."""
    _warm["go"].set()


def warm_up_in_background(itemsizes: Sequence[int] = (4,), layout: str = "BCT", after_release: bool = False) -> None:
    """Load the compiled kernels for these item sizes (bytes per value of the padded features) and this batch
    layout in a daemon thread, once per process; pad_rows_into uses numpy meanwhile. Another variant loads on
    its first use.

    after_release: the thread waits for release_warm_up() before loading. The load holds the GIL for ~0.4 s
    in small steps, and a first batch built meanwhile (sampler plan, shard mapping: many short GIL-releasing
    numpy and pyarrow calls, each waiting up to a switch interval to get it back) took 2-3x longer; make_loader
    releases it once the first batch is in hand, so the load overlaps the first training step instead.

    Not for a process that is about to fork DataLoader workers: a fork during the load could leave numba's
    compiler lock held in the child. make_loader calls it only with num_workers=0.
    """
    with _warm_lock:
        if _warm["started"]:
            return
        _warm["started"] = True
    sizes = tuple(sorted({int(s) for s in itemsizes if int(s) in _UINT})) or (4,)
    # A [T] feature is copied by _pad_rows in either layout; a [C, T] one by the layout's kernel.
    kernels = (_pad_rows,) if layout == "BCT" else (_pad_rows, _pad_rows_time_major)
    if not after_release:
        _warm["go"].set()
    atexit.register(_finish_load_at_exit)
    threading.Thread(target=_load_when_released, args=(sizes, kernels), name="audiopipe-kernel-load",
                     daemon=True).start()


def kernels_ready() -> bool:
    return _warm["ready"].is_set()


def wait_for_kernels() -> None:
    """Block until a background load (if one was started) is done: call before forking workers."""
    if _warm["started"]:
        _warm["go"].set()  # a load still waiting for its release starts now
        _warm["ready"].wait()


LAYOUTS = ("BCT", "BTC")


def pad_rows_into(dst: np.ndarray, parts: Sequence[Rows], channels: int, t_max: int, pad_value: float,
                  layout: str = "BCT") -> None:
    """Write every part's rows into dst, a flat C-contiguous [B * max(channels, 1) * t_max] buffer of their dtype:
    [B, channels, t_max] (layout "BCT", each row as stored) or [B, t_max, channels] ("BTC", transposed)."""
    uint = _UINT[dst.dtype.itemsize]
    pad = np.asarray(pad_value, dtype=dst.dtype).view(uint)[()]
    out = dst.view(uint)
    width = max(channels, 1)
    # While a background load is under way, numpy; without one (workers, direct use), the kernel loads here.
    compiled = not _warm["started"] or _warm["ready"].is_set()
    if layout == "BTC" and channels > 1:
        kernel = _pad_rows_time_major if compiled else _pad_rows_time_major_numpy
    elif layout in LAYOUTS:  # [T] and [1, T] features are the same bytes in either layout
        kernel = _pad_rows if compiled else _pad_rows_numpy
    else:
        raise InvalidValue(f"layout must be one of {LAYOUTS}, got {layout!r}")
    for rows in parts:
        if rows.values.dtype != dst.dtype:
            raise WrongType(f"destination is {dst.dtype}, rows are {rows.values.dtype}")
        src = rows.values.view(uint)
        bad = kernel(src, rows.starts, rows.frames, rows.positions, width, t_max, pad, out)
        if bad >= 0:
            raise InvalidValue(
                f"row {bad} of a batch part does not fit: start {int(rows.starts[bad])}, {int(rows.frames[bad])} "
                f"frames x {width} channels in a column of {src.size} values, batch position "
                f"{int(rows.positions[bad])} of a {out.size // max(width * t_max, 1)} x {width} x {t_max} batch")
