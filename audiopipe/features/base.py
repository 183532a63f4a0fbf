"""The contract every feature extractor follows.

A feature is a pure function of one mono waveform at one sample rate. It knows nothing of Ray, shards or
files: the shard stage decodes once, resamples to each rate a feature asks for, and calls it.

Layout rule: time is the LAST axis of every feature array (mel [n_mels, T], fbank [80, T], f0 [T],
codes [16, T], pcm [N]), so collate pads one axis for all of them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class FeatureSpec:
    """Everything that changes a feature's output. Two specs with equal hashes give equal arrays."""

    name: str  # column name in the shards ("mel", "f0", ...)
    kind: str  # implementation family ("vocos_mel", "kaldi_fbank", ...)
    sample_rate: int  # rate of the waveform the feature consumes
    dtype: str  # numpy dtype of the stored array
    channels: int  # size of the non-time axis; 0 for 1-D features ([T])
    hop_length: int  # samples per frame at sample_rate (1 for pcm)
    params: dict[str, Any] = field(default_factory=dict)
    version: int = 1  # bump when the implementation's output changes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "sample_rate": self.sample_rate,
            "dtype": self.dtype,
            "channels": self.channels,
            "hop_length": self.hop_length,
            "params": self.params,
            "version": self.version,
        }

    @property
    def config_hash(self) -> str:
        # Canonical JSON so the hash is stable across dict ordering and Python versions.
        blob = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def frame_rate(self) -> float:
        return self.sample_rate / self.hop_length


class Feature(Protocol):
    """What the shard stage calls. Implementations are small classes with `specs`.

    One computation may yield several columns (F0 gives `f0` and `voiced`), so a feature declares one
    FeatureSpec per output column and returns a dict keyed by those names.
    """

    specs: tuple[FeatureSpec, ...]

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        """wav: float32 mono in [-1, 1] at specs[0].sample_rate -> {spec.name: array of spec.dtype}, time last."""
        ...

    def num_frames(self, num_samples: int) -> int:
        """Frames produced for a waveform of num_samples at the feature's sample rate (used by verify)."""
        ...
