"""A shard worker keeps the memory it frees after one utterance for the next (audiopipe.shard.heap)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# One "utterance" allocates a few arrays of the same size and frees them all, as decode, resample, STFT and
# features do. With glibc's defaults the freed top of the heap (4 MB, over twice the largest block) is trimmed
# back to the kernel every time, so every pass faults its 4 MB in again; the faults of passes 2-40 are printed.
CHILD = r"""
import json, resource, sys
import numpy as np
from audiopipe.shard.heap import keep_freed_memory

applied = keep_freed_memory() if sys.argv[1] == "1" else False
faults = []
for i in range(40):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    arrays = [np.ones(1 << 18, np.float32) for _ in range(4)]  # 4 x 1 MB, every page written
    total = float(sum(a.sum() for a in arrays))
    del arrays
    if i:
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults, "total": total}))
"""


def _run(keep: bool) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, "1" if keep else "0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_arrays_are_reused_without_page_faults_once_the_heap_is_kept():
    default, kept = _run(False), _run(True)
    assert kept["applied"] is True and default["applied"] is False
    assert default["total"] == kept["total"] == 4.0 * (1 << 18)
    pages = 4 * (1 << 20) // 4096
    # Defaults: each pass faults (nearly) all of its 1024 pages in again.
    assert sorted(default["faults"])[len(default["faults"]) // 2] > 0.9 * pages, default["faults"]
    # Kept: the second pass on reuses the same memory; at most a few pages each (Python's own allocations).
    assert max(kept["faults"]) < 0.05 * pages, kept["faults"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_keeping_freed_memory_is_set_once_and_says_so():
    from audiopipe.shard import heap

    assert heap.keep_freed_memory() is True  # glibc (this machine, CI) accepts both settings
    assert heap.keep_freed_memory() is True  # asked again (every shard task does): set once, same answer
