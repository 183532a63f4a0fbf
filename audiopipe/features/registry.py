"""Feature kinds by name: build one from CLI/preset parameters or rebuild it from a manifest spec.

`build_feature(spec.kind, **spec.params)` reproduces a feature whose specs hash like the stored ones,
because every constructor records all of its (normalised) arguments in FeatureSpec.params.
"""

from __future__ import annotations

from typing import Any, Callable

from audiopipe.features.base import Feature
from audiopipe.features.energy import Energy
from audiopipe.features.f0 import F0
from audiopipe.features.fbank import KaldiFbank
from audiopipe.features.mel import SlaneyMel, VocosMel
from audiopipe.features.pcm import Pcm

_BUILDERS: dict[str, Callable[..., Feature]] = {
    "vocos_mel": VocosMel,
    "slaney_mel": SlaneyMel,
    "f0": F0,
    "energy": Energy,
    "kaldi_fbank": KaldiFbank,
    "pcm": Pcm,
}

FEATURE_KINDS: dict[str, str] = {
    "vocos_mel": "mel: log mel [100, T], 24 kHz hop 256, HTK, no norm (F5-TTS / vocos)",
    "slaney_mel": "mel: log mel [80, T], 22.05 kHz hop 256, slaney scale+norm (HiFi-GAN / BigVGAN)",
    "f0": "f0 [T] Hz + voiced [T] uint8, frames at t*hop; backends yin (fast, default), dio, harvest, praat",
    "energy": "energy [T]: L2 norm of the magnitude spectrum per frame (vocos framing by default)",
    "kaldi_fbank": "fbank: Kaldi log mel [80, T], 16 kHz 25/10 ms (3D-Speaker / WeSpeaker)",
    "pcm": "pcm: the waveform as int16 [N] at sample_rate",
}


def build_feature(kind: str, **params: Any) -> Feature:
    """Instantiate feature `kind` with keyword parameters (unknown kinds or parameters raise clearly)."""
    try:
        builder = _BUILDERS[kind]
    except KeyError:
        raise ValueError(f"unknown feature kind {kind!r}; known kinds: {', '.join(FEATURE_KINDS)}") from None
    try:
        return builder(**params)
    except TypeError as e:
        raise TypeError(f"feature {kind!r}: bad parameters {sorted(params)}: {e}") from e
