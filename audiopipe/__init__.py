"""audiopipe: speech training data, extracted once, read at memcpy speed.

The flow, one sub-package per stage:
    corpus -> decode -> features -> shard (writer) -> index -> reader -> sampler -> collate -> (trainers/)

`import audiopipe as ap` offers what a user calls (docs/api.md):

    ap.shard(corpus, out, preset=...)       the `audiopipe shard` job; returns its summary
    ap.verify(shards) / ap.inspect(shards)  check every checksum and row / a summary dict of a shard folder
    ap.make_loader(shards, features, max_frames=...)   the training loader (ap.Reading: how it reads)
    ap.split(shards, by="speaker", test=...)   training and held-out rows, as make_loader's subset=
    ap.export_hf / ap.export_lhotse / ap.export_nemo / ap.export_f5   shards out to other tools' formats
    ap.open_dataset, ap.BucketBatchSampler, ap.PadCollator   the loader's dataset, sampler and collate, to
                                            compose your own
    ap.AudiopipeError                       the base of every error audiopipe raises on purpose

Each name is imported on first use, so `import audiopipe` stays cheap (no torch, Arrow or Ray until a name that
needs them is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

from audiopipe.version import __version__

# public name -> (module, attribute)
_EXPORTS = {
    "verify": ("audiopipe.shard.verify", "verify"),
    "inspect": ("audiopipe.shard.inspect", "summarize"),
    "make_loader": ("audiopipe.reader.loader", "make_loader"),
    "Loader": ("audiopipe.reader.loader", "Loader"),
    "Reading": ("audiopipe.reader.reading", "Reading"),
    "open_dataset": ("audiopipe.reader.open_dataset", "open_dataset"),
    "split": ("audiopipe.reader.split", "split"),
    "BucketBatchSampler": ("audiopipe.sampler.bucket", "BucketBatchSampler"),
    "PadCollator": ("audiopipe.collate.pad", "PadCollator"),
    "export_hf": ("audiopipe.export.hf", "export_hf"),
    "export_lhotse": ("audiopipe.export.lhotse", "export_lhotse"),
    "export_nemo": ("audiopipe.export.nemo", "export_nemo"),
    "export_f5": ("audiopipe.export.f5", "export_f5"),
    "AudiopipeError": ("audiopipe.errors", "AudiopipeError"),
}

# `shard` is the sub-package audiopipe.shard, which can be called: ap.shard(corpus, out, ...) runs the job.
__all__ = sorted([*_EXPORTS, "shard"]) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name == "shard":
        return importlib.import_module("audiopipe.shard")  # binds itself on this package as it is imported
    where = _EXPORTS.get(name)
    if where is None:
        raise AttributeError(f"module 'audiopipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

