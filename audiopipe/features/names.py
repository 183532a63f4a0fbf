"""One name per feature, the same for `audiopipe shard --features`, `ap.shard(features=...)`, `make_loader`,
`open_dataset`, the exports, `tokens --feature` and `bench-loader --feature`: the name of the shard column it
fills.

    mel (F5-TTS's vocos mel), slaney_mel (HiFi-GAN's), fbank (Kaldi fbank), f0 (+ voiced), energy, pcm

The names of the classes that compute them (`vocos_mel`, `kaldi_fbank`) are accepted everywhere as aliases, with
one note (a FeatureAlias warning) that gives the name to use. `slaney_mel` fills the column `mel` too, so a
reader asking for `slaney_mel` reads `mel`.
"""

from __future__ import annotations

import warnings
from typing import Sequence

from audiopipe.errors import AudiopipeWarning
from audiopipe.features.kinds import FEATURE_KINDS

# public name -> the feature kind that computes it (the registry's key, recorded in manifests)
KIND_OF: dict[str, str] = {"mel": "vocos_mel", "slaney_mel": "slaney_mel", "fbank": "kaldi_fbank", "f0": "f0",
                           "energy": "energy", "pcm": "pcm"}
# names accepted for another one: what to compute / what to read
COMPUTE_ALIASES = {"vocos_mel": "mel", "kaldi_fbank": "fbank"}
READ_ALIASES = {**COMPUTE_ALIASES, "slaney_mel": "mel"}
NAMES = tuple(KIND_OF)
assert set(KIND_OF.values()) == set(FEATURE_KINDS)  # every kind has one public name


class FeatureAlias(AudiopipeWarning):
    """A feature given by an alias (vocos_mel, kaldi_fbank): accepted, with its name to use."""


def _note(alias: str, name: str, reading: bool) -> None:
    said = f"feature {alias!r} is read as the column {name!r}" if reading else f"feature {alias!r} is {name!r}"
    warnings.warn(FeatureAlias(f"{said}; {name!r} is its name everywhere"), stacklevel=4)


def feature_kinds(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """What to compute: (kinds, unknown names), aliases noted."""
    kinds, unknown = [], []
    for n in names:
        public = COMPUTE_ALIASES.get(n, n)
        if public != n:
            _note(n, public, reading=False)
        (kinds.append(KIND_OF[public]) if public in KIND_OF else unknown.append(n))
    return kinds, unknown


def column_names(names: Sequence[str] | str) -> list[str]:
    """What to read: the columns, aliases noted; other names pass through (tokens, bert, codes, ...)."""
    if isinstance(names, str):
        names = [names]
    out = []
    for n in names:
        public = READ_ALIASES.get(n, n)
        if public != n:
            _note(n, public, reading=True)
        out.append(public)
    return out


def column_name(name: str) -> str:
    return column_names([name])[0]
