"""One .npy file per utterance and feature: the layout most speech repos train from (Amphion's NS2 keeps a
pickle per utterance and feature). Here as an honest baseline with the same interface as ShardDataset, so a
trainer can run the same model, sampler and collate on both and compare how long each step waits on data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from audiopipe.reader.arrow_dataset import ShardDataset


def export_per_utterance(shards_dir: str | Path, features: Sequence[str], cache: str | Path) -> Path:
    """Write <cache>/<feature>/<row>.npy for every utterance (once; reused while the shards are unchanged)."""
    cache = Path(cache)
    stamp = cache / "metadata.json"
    key = json.loads((Path(shards_dir) / "manifest.json").read_text())["index"]["sha256"] + ",".join(features)
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        return cache
    ds = ShardDataset(shards_dir, features)
    meta = []
    for i in range(len(ds)):
        item = ds[i]
        for f in features:
            path = cache / f / f"{i:08d}.npy"
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, item[f], allow_pickle=False)
        meta.append({k: item[k] for k in ("id", "speaker", "text", "duration")})
    tmp = stamp.with_name(f".metadata.json.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "features": list(features), "utterances": meta}))
    os.replace(tmp, stamp)
    return cache


class FilesDataset(ShardDataset):
    """ShardDataset's interface (index, manifest, lengths, spec) but each item np.load's its own files."""

    def __init__(self, shards_dir: str | Path, features: Iterable[str] = ("mel",), cache: str | Path | None = None,
                 expect: dict[str, str] | None = None, **_: Any):
        super().__init__(shards_dir, features, expect=expect)
        self.cache = Path(cache or Path(shards_dir) / "per_utterance")
        if not (self.cache / "metadata.json").exists():
            raise FileNotFoundError(f"{self.cache} has no per-utterance export: call export_per_utterance first")
        self.utts = json.loads((self.cache / "metadata.json").read_text())["utterances"]

    def __getitem__(self, i: int) -> dict[str, Any]:
        u = self.utts[i]
        item: dict[str, Any] = {**u, "index": int(i)}
        for f in self.features:
            item[f] = np.load(self.cache / f / f"{i:08d}.npy")
        return item
