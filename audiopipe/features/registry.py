"""Feature kinds by name: build one from CLI/preset parameters or rebuild it from a manifest spec.

`build_feature(spec.kind, **spec.params)` reproduces a feature whose specs hash like the stored ones,
because every constructor records all of its (normalised) arguments in FeatureSpec.params.
"""

from __future__ import annotations

from typing import Any, Callable

from audiopipe.errors import InvalidValue, WrongType
from audiopipe.features.base import Feature
from audiopipe.features.energy import Energy
from audiopipe.features.f0 import F0
from audiopipe.features.fbank import KaldiFbank
from audiopipe.features.mel import SlaneyMel, VocosMel
from audiopipe.features.kinds import FEATURE_KINDS  # noqa: F401  (re-exported: the public name)
from audiopipe.features.pcm import Pcm

_BUILDERS: dict[str, Callable[..., Feature]] = {
    "vocos_mel": VocosMel,
    "slaney_mel": SlaneyMel,
    "f0": F0,
    "energy": Energy,
    "kaldi_fbank": KaldiFbank,
    "pcm": Pcm,
}



def build_feature(kind: str, **params: Any) -> Feature:
    """Instantiate feature `kind` with keyword parameters (unknown kinds or parameters raise clearly)."""
    try:
        builder = _BUILDERS[kind]
    except KeyError:
        raise InvalidValue(f"unknown feature kind {kind!r}; known kinds: {', '.join(FEATURE_KINDS)}") from None
    try:
        return builder(**params)
    except TypeError as e:
        raise WrongType(f"feature {kind!r}: bad parameters {sorted(params)}: {e}") from e
