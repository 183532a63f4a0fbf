"""`make test` runs this first: audiopipe's numba kernels compiled once, into numba's cache beside their source.

A fresh checkout has no cache yet, so the two test workers and the processes they start in their first seconds
would each compile the same kernels at once (about 10 s of CPU each); compiled here, every later process loads
them from the cache. A kernel's cache follows its source file: an edit recompiles that file's kernels, here or
in the first process that needs them.
"""

from __future__ import annotations

import time

import numpy as np

from audiopipe.collate import kernels
from audiopipe.features.registry import build_feature

# The features with compiled kernels: F0's tracker, the mels' and energy's STFT.
FEATURES = ("f0", "vocos_mel", "slaney_mel", "energy")


def main() -> None:
    t0 = time.process_time()
    for kind in FEATURES:
        feature = build_feature(kind)
        rate = feature.specs[0].sample_rate
        feature(np.random.default_rng(0).uniform(-0.3, 0.3, rate).astype(np.float32))
    # Every variant of the collate copy: each item size, both batch layouts (what make_loader loads in the
    # background, one variant at a time, in each process).
    kernels._load_kernels(tuple(kernels._UINT), (kernels._pad_rows, kernels._pad_rows_time_major))
    print(f"numba kernels compiled (or loaded from their cache) in {time.process_time() - t0:.1f} s of CPU")


if __name__ == "__main__":
    main()
