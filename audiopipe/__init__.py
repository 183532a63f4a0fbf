"""audiopipe: speech training data, extracted once, read at memcpy speed.

The flow, one sub-package per stage:
    corpus -> decode -> features -> shard (writer) -> index -> reader -> sampler -> collate -> (trainers/)

`import audiopipe as ap` offers the names users hold (docs/api.md); each is imported on first use, so
`import audiopipe` stays cheap (no torch, Arrow or Ray until a name that needs them is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "make_loader": "audiopipe.reader.loader",
    "Loader": "audiopipe.reader.loader",
    "Reading": "audiopipe.reader.reading",
    "open_dataset": "audiopipe.reader.open_dataset",
    "BucketBatchSampler": "audiopipe.sampler.bucket",
    "PadCollator": "audiopipe.collate.pad",
    "reset_after_fork": "audiopipe.after_fork",
    "AudiopipeError": "audiopipe.errors",
    # shard(): reserved for the shard-writing entry point (added with audiopipe/shard's API, not here)
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'audiopipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
