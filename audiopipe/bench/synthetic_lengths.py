"""Seeded synthetic utterance-length arrays (frames) for the batching benchmark and its tests.

Two shapes of corpus, both log-normal durations cut to a range and counted in frames:
  short_clip      median 3 s, sigma 0.55 (log space), 0.5-15 s: fine-tuning sets of sliced clips (GPT-SoVITS, F5)
  libritts_like   median 5.5 s, sigma 0.7, 1-20 s: LibriTTS
"""

from __future__ import annotations

import numpy as np

from audiopipe.errors import InvalidValue

FRAME_RATE = 24_000 / 256  # vocos mel hop 256 at 24 kHz, as F5-TTS
DISTRIBUTIONS = {"short_clip": (3.0, 0.55, 0.5, 15.0), "libritts_like": (5.5, 0.7, 1.0, 20.0)}


def synthetic_lengths(kind: str, n: int, seed: int = 0, frame_rate: float = FRAME_RATE) -> np.ndarray:
    """n frame counts (int64) drawn from distribution `kind` (a key of DISTRIBUTIONS)."""
    if kind not in DISTRIBUTIONS:
        raise InvalidValue(f"unknown length distribution {kind!r}; choose one of {sorted(DISTRIBUTIONS)}")
    median, sigma, lo, hi = DISTRIBUTIONS[kind]
    rng = np.random.default_rng(seed)
    seconds = np.empty(0)
    while seconds.size < n:
        draw = np.exp(rng.normal(np.log(median), sigma, 2 * n + 16))
        seconds = np.concatenate([seconds, draw[(draw >= lo) & (draw <= hi)]])
    return np.round(seconds[:n] * frame_rate).astype(np.int64)
