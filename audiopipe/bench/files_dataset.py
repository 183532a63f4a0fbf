"""One .npy file per utterance and feature: the layout most speech repos train from (Amphion's NS2 keeps a
file, or a pickle, per utterance and feature). A benchmark baseline, not a reader to train from: it has the
interface of ShardDataset, so a trainer (`--reader files`, through `files_loader`) or `audiopipe bench-loader`
(npy_per_utt, npy_amphion) can run the same model, sampler and collate on both and compare how long each step
waits on data.

Honest means every array comes from its own file on every path: `ds[i]`, `ds.__getitems__` (what the
DataLoader and make_loader's batch path call) and DataLoader workers all `np.load`; the shards are used for
their manifest and length index only and no shard is ever mapped (tests/test_files_dataset.py moves the shards
away after the export and reads every row).

Layout, written once by `export_per_utterance` (the only exporter of it):

    <cache>/<feature>/<row:08d>.npy   row = the utterance's global index in index.arrow
    <cache>/metadata.json             written last and atomically: which shards (index sha256) and features
                                      the files hold, and id/speaker/text/duration/frames per row

Files are named by row, not by utterance id, so any id (dots, slashes, case-only twins) maps to a safe name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from audiopipe.errors import InvalidValue, NotFound
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.loader import Loader, loader_over, rows_to_plan
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.storage.atomic import fsync_dir, write_json_atomic

EXPORT_FORMAT = "audiopipe.per_utterance/1"
STAMP = "metadata.json"
_META = ("id", "speaker", "text", "duration")


def utterance_file(cache: str | Path, feature: str, row: int) -> Path:
    return Path(cache) / feature / f"{row:08d}.npy"


def _index_sha256(shards: str | Path) -> str:
    return json.loads((Path(shards) / "manifest.json").read_text())["index"]["sha256"]


def _read_stamp(cache: Path) -> dict[str, Any] | None:
    try:
        stamp = json.loads((cache / STAMP).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and stamp.get("format") == EXPORT_FORMAT else None


def _covers(stamp: dict[str, Any] | None, index_sha256: str, features: Sequence[str]) -> bool:
    return bool(stamp) and stamp["index_sha256"] == index_sha256 and set(features) <= set(stamp["features"])


def export_per_utterance(shards: str | Path, features: Sequence[str], cache: str | Path) -> Path:
    """Write every utterance's `features` as its own .npy under `cache` (see the module doc); returns `cache`.

    Reused as long as metadata.json says it holds these shards (same index) and features. The stamp is removed
    before any file is rewritten and written last (fsync'd, renamed), so an interrupted export is never taken
    for a complete one; each .npy is fsync'd before the stamp names it.
    """
    cache, features = Path(cache), list(features)
    index_sha256 = _index_sha256(shards)
    old = _read_stamp(cache)
    if _covers(old, index_sha256, features):
        return cache
    (cache / STAMP).unlink(missing_ok=True)
    for f in {*features, *(old["features"] if old else ())}:  # rows of an earlier export would linger
        for stale in (cache / f).glob("*.npy") if (cache / f).is_dir() else ():
            stale.unlink()
    ds = ShardDataset(shards, features)  # every row is read: a corrupt shard stops the export, named
    utterances = []
    for f in features:
        (cache / f).mkdir(parents=True, exist_ok=True)
    for i in range(len(ds)):
        item = ds[i]
        for f in features:
            with open(utterance_file(cache, f, i), "wb") as fh:
                np.save(fh, np.ascontiguousarray(item[f]), allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
        utterances.append({**{k: item[k] for k in _META}, "frames": {f: int(item[f].shape[-1]) for f in features}})
    for f in features:
        fsync_dir(cache / f)
    write_json_atomic(cache / STAMP, {"format": EXPORT_FORMAT, "index_sha256": index_sha256, "features": features,
                                      "utterances": utterances}, indent=None)
    return cache


class FilesDataset:
    """ShardDataset's interface (len, lengths, spec, channels, manifest, index) over per-utterance files.

    `ds[i]` and `ds.__getitems__(indices)` return the same item dicts as ShardDataset's
    ({"id", "speaker", "text", "duration", "index", <feature>: np.ndarray}), every array np.load'ed from its file.
    """

    def __init__(self, shards: str | Path, features: Iterable[str] = ("mel",), cache: str | Path | None = None,
                 expect: dict[str, str] | None = None):
        # The wrapped dataset answers the metadata questions (and checks `expect`); it never maps a shard.
        self.shards = ShardDataset(shards, features, expect=expect, check_shards=False)
        self.features = self.shards.features
        self.cache = Path(cache or Path(shards) / "per_utterance")
        stamp = _read_stamp(self.cache)
        if stamp is None:
            raise NotFound(f"{self.cache} has no complete per-utterance export: call "
                           f"audiopipe.bench.files_dataset.export_per_utterance first")
        if not _covers(stamp, _index_sha256(shards), self.features):
            raise InvalidValue(f"{self.cache} holds features {stamp['features']} of other shards or features than "
                               f"{shards} {self.features}: export again (export_per_utterance)")
        self.utts = stamp["utterances"]
        if len(self.utts) != len(self.shards):
            raise InvalidValue(f"{self.cache} holds {len(self.utts)} utterances, {shards} {len(self.shards)}")
        self._paths = {f: [str(utterance_file(self.cache, f, i)) for i in range(len(self.utts))] for f in self.features}

    # the shard folder's metadata, as ShardDataset has it
    @property
    def root(self) -> Path:
        return self.shards.root

    @property
    def manifest(self) -> dict[str, Any]:
        return self.shards.manifest

    @property
    def index(self):
        return self.shards.index

    @property
    def channels(self) -> dict[str, int]:
        return self.shards.channels

    def spec(self, feature: str) -> dict[str, Any]:
        return self.shards.spec(feature)

    def lengths(self, feature: str | None = None) -> np.ndarray:
        return self.shards.lengths(feature)

    def __len__(self) -> int:
        return len(self.utts)

    def __getitem__(self, i: int) -> dict[str, Any]:
        i = range(len(self.utts))[i]  # negatives wrap, out of range is an IndexError
        item: dict[str, Any] = {**{k: self.utts[i][k] for k in _META}, "index": i}
        for f in self.features:
            item[f] = np.load(self._paths[f][i], allow_pickle=False)
        return item

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """A batch as the DataLoader asks for it: one np.load per item and feature, as Amphion's loader does."""
        return [self[int(i)] for i in indices]


def files_loader(shards: str | Path, features: Sequence[str], cache: str | Path, *, max_frames: int,
                 length_feature: str | None = None, lengths: np.ndarray | None = None,
                 subset: np.ndarray | None = None, expect: dict[str, str] | None = None, quadratic: float = 0.0,
                 max_items: int | None = None, seed: int = 0, shuffle: bool = True, rank: int | None = None,
                 world_size: int | None = None, passes: int | None = None, **loader_kw: Any) -> Loader:
    """make_loader's Loader over the per-utterance export in `cache` (written by export_per_utterance): the same
    sampler, collate and look-ahead as over the shards, every array np.load'ed from its own file.
    passes: as make_loader's (None: by corpus size).
    loader_kw: make_loader's batch and look-ahead arguments (layout, item_transform, prefetch, num_workers, ...)."""
    ds = FilesDataset(shards, features, cache=cache, expect=expect)
    subset, lengths = rows_to_plan(ds, length_feature or features[0], lengths, subset)
    sampler = BucketBatchSampler(lengths, max_frames, quadratic=quadratic, max_items=max_items, seed=seed,
                                 shuffle=shuffle, rank=rank, world_size=world_size, passes=passes)
    return loader_over(ds, sampler, features, subset=subset, seed=seed, **loader_kw)
