"""A shard worker's heap: keep the memory freed after one utterance for the next, instead of handing it back to
the kernel and faulting it in again.

Every utterance allocates and frees the same few arrays of 0.1-5 MB: the decoded file, its resampled copy, the
STFT, the features. With glibc's defaults such blocks are either mmap'd (the dynamic mmap threshold starts at
128 KB) or taken from the top of the heap, which glibc trims back to the kernel as soon as more than the trim
threshold lies free there. Either way the next utterance touches fresh pages, each one a page fault and a page
zeroed by the kernel. Measured on the 2-core VM (build_shard over 926 WAV files, f5tts, one process, shards of
16): 125k minor faults and 0.41-0.54 s of system time with the defaults; under 1k faults and 0.24-0.33 s with
the settings below, user time unchanged (OGG: 98-132k faults and 0.38-0.42 s, against under 1k and 0.33 s).
That system time is several % of a worker's CPU, and with every core busy it is taken from the compute.

The settings are glibc's own ceilings: 32 MB is the most its dynamic mmap threshold ever reaches on a 64-bit
machine, and it then trims at twice that. Fixing them skips the warm-up during which glibc learns them and the
faults it pays meanwhile. A worker may then hold up to 64 MB of freed heap beyond what it uses, small beside the
shard it holds in memory; blocks over 32 MB (a whole shard's column) are still mmap'd and returned at once.
"""

from __future__ import annotations

import ctypes
import platform

# mallopt(3) parameters, from glibc's malloc.h
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Set this process's glibc heap as above, once; returns whether it is set (False on another C library,
    musl or macOS, where nothing is changed)."""
    global _applied
    if _applied is None:
        _applied = False
        if platform.libc_ver()[0] == "glibc":
            mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
            if mallopt is not None:
                mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                mallopt.restype = ctypes.c_int
                # mallopt returns 1 on success; the order matters not, each call also ends the dynamic threshold
                _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                    mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _applied
