"""Map-style dataset over a shard set's Arrow shards: samples are zero-copy numpy views into memory-mapped files.

Opening reads manifest.json and the length index (checked against the manifest), refuses features the
trainer expects from another config, and checks every shard without touching its rows (integrity.py); what
that scan finds corrupt stops the open or, with on_corrupt="skip", leaves the plan (skipped.py). Reading a
batch gathers its rows shard by shard: each shard is mapped when first read (mapped_shard.py), at most
`max_open` stay open per process (open_shards.py), and the rows of batches to come are read ahead on a
background thread (read_ahead.py). No decode, no copy until collate pads the rows into the batch.

remote_dataset.py is the same dataset over s3://: it replaces where the manifest, the index and the shards
come from, and reuses the rest.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from audiopipe.collate.rows import RowBatch, Rows
from audiopipe.errors import InvalidValue, OutOfRange
from audiopipe.index.lengths import INDEX_NAME, LengthIndex
from audiopipe.reader import integrity
from audiopipe.reader.blocks import BlockTable, block_rows, cut_blocks
from audiopipe.reader.errors import ConfigMismatch, CorruptIndexError, CorruptShardError
from audiopipe.reader.mapped_shard import MappedShard, meta_reader
from audiopipe.reader.open_shards import OpenShards
from audiopipe.reader.read_ahead import ReadAhead
from audiopipe.reader.skipped import SkippedShards, keep_rows
from audiopipe.shard.manifest import read_manifest
from audiopipe.shard.writer import METADATA_KEY
from audiopipe.storage.paths import require_local

META_COLUMNS = ("id", "speaker", "text", "duration")
_EXTRA_ARRAYS = {"phones": 0, "durations": 0}  # front-end columns without a FeatureSpec: channels 0


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: treat every corpus as fitting, hint each row once


def feature_channels(where: Any, specs: dict[str, Any], features: Sequence[str],
                     expect: dict[str, str] | None) -> dict[str, int]:
    """Channels of each feature read; a feature the shard set lacks, or one made with another config than
    `expect` names ({feature: config hash}), is a one-line ConfigMismatch."""
    missing = [f for f in features if f not in specs and f not in _EXTRA_ARRAYS]
    if missing:
        raise ConfigMismatch(f"{where} has no feature {missing}; it has {sorted(specs)}")
    for name, want in (expect or {}).items():
        have = specs.get(name, {}).get("hash")
        if have != want:
            raise ConfigMismatch(f"feature {name!r} in {where} was made with config {have}, but expect= asks "
                                 f"for {want}; re-extract with the preset that config comes from, or point at "
                                 f"matching shards")
    return {f: specs[f]["channels"] if f in specs else _EXTRA_ARRAYS[f] for f in features}


class ShardDataset:
    """`ds[i]` -> {"id", "speaker", "text", "duration", "index", "<feature>": np.ndarray view, ...}.

    shards: the shard folder (remote_dataset.py: an s3:// prefix).
    features: the columns a trainer needs (others are never touched).
    expect: {feature: config hash} (or a FeatureSpec's hash) the trainer was built for; a mismatch is refused.
    verify: "size" (default: file size as in the manifest, Arrow footer and headers, row counts, and the column
            structure when mapped) or "checksum" (also hash every shard once at open against the manifest's
            xxh3-128, or sha256 for older shards: catches any corruption, costs one read of the corpus;
            "sha256", its old name, is accepted).
    on_corrupt: "fail" (default: a corrupt shard is a CorruptShardError at open, naming it) or "skip" (its
            rows leave the dataset's plannable rows, see without_skipped; a warning names each shard and the
            rows dropped once, and diagnostics() lists them).
    max_open: shards kept mapped (and holding a file descriptor) per process; the least recently used is
            closed beyond that and mapped again when one of its rows is asked for.
    check_shards: False skips the open-time scan (the per-utterance files baseline never reads a shard's rows).
    """

    def __init__(self, shards: str | Path, features: Iterable[str] = ("mel",),
                 expect: dict[str, str] | None = None, verify: str = "size",
                 meta_columns: Sequence[str] = META_COLUMNS, on_corrupt: str = "fail", max_open: int = 128,
                 check_shards: bool = True):
        self.verify = integrity.verify_mode(verify)
        if on_corrupt not in integrity.ON_CORRUPT:
            raise InvalidValue(f"on_corrupt must be one of {integrity.ON_CORRUPT}, got {on_corrupt!r}")
        self.on_corrupt = on_corrupt
        self._open = OpenShards(max_open)
        self.root = self._root(shards)
        self.manifest = self._read_manifest()
        self.skipped_shards = SkippedShards(str(self.root), self.manifest, on_corrupt)
        self.features = list(features)
        self.meta_columns = tuple(meta_columns)
        self.channels = feature_channels(self.root, self.manifest["features"], self.features, expect)
        self.index = self._open_index()
        integrity.check_index(self.index.shard, self.index.row, self.manifest, f"{self.root}/{INDEX_NAME}")
        self._shard_of = self.index.shard
        self._row_of = self.index.row
        shard_bytes = sum(int(e["arrow"]["bytes"]) for e in self.manifest["shards"])
        self._read_ahead = ReadAhead(len(self.index), every_time=shard_bytes > _physical_memory() // 2)
        self._index_meta_readers: dict[str, Callable[[np.ndarray], list[Any]]] | None = None
        self._hashed = False  # checksums done by the open-time scan (workers inherit it and do not hash again)
        if check_shards:
            self._scan()

    @property
    def max_open(self) -> int:
        return self._open.max_open

    @property
    def skipped(self) -> tuple[integrity.CorruptShard, ...]:
        """The shards left out as corrupt (on_corrupt="skip"), in shard order."""
        return self.skipped_shards.found

    # ---- where the shards are (remote_dataset.py overrides these for s3://) ---------------------------------

    def _root(self, shards: str | Path) -> Any:
        return Path(require_local(shards, "shard folder"))  # before pathlib turns s3:// into s3:/

    def _read_manifest(self) -> dict[str, Any]:
        return read_manifest(self.root)

    def _open_index(self) -> LengthIndex:
        index = LengthIndex.open(self.root)
        why = integrity.index_checksum_fails(None, self.root / INDEX_NAME, self.manifest)
        if why:
            raise CorruptIndexError(f"{self.root / INDEX_NAME} {why}: corrupted or from another run; rebuild the "
                                    f"shard set")
        return index

    def _shard_path(self, k: int) -> str:
        return str(self.root / self.manifest["shards"][k]["arrow"]["path"])

    def _scan(self) -> None:
        bad = integrity.scan(self.root, self.manifest, self.features, self.verify)
        self._hashed = self.verify == "checksum"
        self.skipped_shards.after_scan(bad)

    # ---- corrupt shards (skipped.py) ------------------------------------------------------------------------

    def skip_what_other_ranks_skip(self) -> None:
        """With torch.distributed initialised, also skip every shard another rank found corrupt, so all ranks
        plan over the same rows (and get the same batch count). A collective: every rank must call it
        (make_loader calls it only for a loader of the whole group, see integrity.spans_whole_group)."""
        self.skipped_shards.agree_across_ranks(self._shard_path)

    def rows_kept(self) -> np.ndarray:
        """Per utterance, whether it is read (False: its shard was skipped as corrupt)."""
        return self.skipped_shards.rows_kept(self._shard_of)

    def without_skipped(self, subset: np.ndarray | None, lengths: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(subset, lengths) less the rows of skipped shards, before a sampler plans over them.

        subset: global rows or None (all); lengths: indexed like subset (or like the dataset when it is None).
        Dropping rows here, not in the batches, is what keeps every rank's batch count equal.
        """
        lengths = np.asarray(lengths)
        if not self.skipped:
            return subset, lengths
        return keep_rows(self.rows_kept(), subset, lengths)

    def diagnostics(self) -> dict[str, Any]:
        """Skipped shards and rows (decided at open), and this process's mappings: open now, the cap, and how
        many times a shard was mapped (more than the shards read means the cap is evicting)."""
        return {**self.skipped_shards.diagnostics(), "open_mappings": len(self._open), "max_open": self.max_open,
                "mappings_made": self._open.opened}

    # ---- shards -------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self, feature: str | None = None) -> np.ndarray:
        """Frames per utterance for the sampler (from the index; no payload is opened)."""
        return self.index.frames(feature or self.features[0])

    def spec(self, feature: str) -> dict[str, Any]:
        return self.manifest["features"][feature]

    def _shard(self, k: int) -> Any:
        """Shard k, open and checked unchanged since it was opened; its rows may be touched until the next call."""
        return self._open.get(k, self._open_shard)

    def _open_shard(self, k: int) -> Any:
        if k in self.skipped_shards:
            raise CorruptShardError(f"shard {self.manifest['shards'][k]['name']} was skipped as corrupt when the "
                                    f"dataset was opened; its rows cannot be read")
        return self._map(k)

    def _map(self, k: int) -> Any:
        return self._map_file(k, self.root / self.manifest["shards"][k]["arrow"]["path"])

    def _map_file(self, k: int, path: Path) -> MappedShard:
        entry = self.manifest["shards"][k]
        name = entry["name"]
        # The open-time scan checked all this; a shard can still change between then and now.
        if not path.exists():
            raise CorruptShardError(f"shard {name} is missing: {path}")
        size = path.stat().st_size
        if size != entry["arrow"]["bytes"]:
            raise CorruptShardError(f"shard {name} ({path}) is {size} bytes, manifest says "
                                    f"{entry['arrow']['bytes']}: truncated or replaced; run `audiopipe verify`")
        if self.verify == "checksum" and not self._hashed:
            failed = integrity.checksum_fails(path, entry["arrow"])
            if failed:
                raise CorruptShardError(f"shard {name} ({path}) {failed}: corrupted; rebuild it")
        sh = MappedShard(path, name, self.features, self.channels, self.meta_columns)
        meta = json.loads(sh.table.schema.metadata[METADATA_KEY])["features"]
        for f in self.features:
            if f in self.manifest["features"] and meta[f]["hash"] != self.manifest["features"][f]["hash"]:
                sh.close()
                raise CorruptShardError(f"shard {name}: feature {f} hash differs from the manifest")
        try:
            self._check_against_index(k, sh.name, {f: sh.columns[f].frames for f in self.features},
                                      sh.meta.get("id"))
        except CorruptIndexError:
            sh.close()
            raise
        return sh

    def _check_against_index(self, k: int, name: str, frames: dict[str, np.ndarray], ids: Any) -> None:
        """The index's entries for shard k must hold its rows' ids and frame counts (an index rewritten and
        rehashed into the manifest passes every other check, and would pair one id and length with another
        utterance's features). frames: {feature: shard k's frame counts}; ids: its id column (a pyarrow
        ChunkedArray) or None. Once per mapping, or per fetch of an s3:// shard's small buffers, in C: a few
        microseconds per thousand rows."""
        if getattr(self, "_starts", None) is None:
            self._starts = np.concatenate([[0], np.cumsum([int(s["rows"]) for s in self.manifest["shards"]])])
        a, b = int(self._starts[k]), int(self._starts[k + 1])
        where = f"{self.root}/{INDEX_NAME}"
        for f in self.features:
            want = frames[f]
            try:
                have = self.index.frames(f)[a:b]
            except KeyError:
                continue
            if not np.array_equal(have, want):
                i = int(np.flatnonzero(have != want)[0])
                raise CorruptIndexError(f"{where} is corrupt: entry {a + i} says {int(have[i])} {f} frames, shard "
                                        f"{name} row {i} holds {int(want[i])}; rebuild the shard set")
        if ids is not None and "id" in self.index.table.column_names:
            listed = self.index.table.column("id").slice(a, b - a)
            if not ids.equals(listed):
                held, said = ids.to_pylist(), listed.to_pylist()
                i = next(j for j, (x, y) in enumerate(zip(held, said)) if x != y)
                raise CorruptIndexError(f"{where} is corrupt: entry {a + i} says id {said[i]!r}, shard {name} "
                                        f"row {i} holds {held[i]!r}; rebuild the shard set")

    # ---- blocks (block-window reading, blocks.py) -------------------------------------------------------

    def blocks(self, block_bytes: int) -> BlockTable:
        """The shard set cut into blocks of about block_bytes of the features read."""
        return cut_blocks(self.index, self.manifest, self.features, self.channels, block_bytes)

    def hold_blocks(self, tag: Any, blocks: BlockTable, ids: Sequence[int]) -> None:
        """Local shards: the kernel reads the blocks' rows ahead (read_ahead); the page cache keeps them."""
        self.read_ahead(block_rows(self.manifest, blocks, ids))

    def release_blocks(self, tag: Any) -> None:
        pass

    # ---- read-ahead (read_ahead.py) -----------------------------------------------------------------------

    def willneed(self, indices: Sequence[int]) -> None:
        """Start reading these utterances' feature bytes into the page cache; returns without waiting for
        the disk. About 2 us per row and feature when the rows are cached already."""
        for _, sh, _, rows in self._by_shard(self._positions(indices)):
            sh.willneed(rows)

    def read_ahead(self, indices: Sequence[int]) -> None:
        """willneed() on this process's read-ahead thread: make_loader announces the batches after the one being
        read here, so the hints cost the trainer's thread nothing (the copy kernel releases the GIL)."""
        self._read_ahead.announce(self, indices)

    # ---- gathering a batch's rows -----------------------------------------------------------------------------

    def _index_meta(self) -> dict[str, Callable[[np.ndarray], list[Any]]]:
        # Built on first use, not at open: an index written before it was one record batch is combined here.
        if self._index_meta_readers is None:
            cols = self.index.table.column_names
            self._index_meta_readers = {c: meta_reader(self.index.table.column(c)) for c in self.meta_columns
                                        if c in cols}
        return self._index_meta_readers

    def __getitem__(self, i: int) -> dict[str, Any]:
        # A batch of one: a single way of locating rows and reading metadata.
        return self.__getitems__([i])[0]

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        """Global indices as int64, negatives wrapped; an index past either end is an IndexError."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise OutOfRange(f"index out of range for a dataset of {len(self)} utterances")
        return idx % max(len(self), 1)

    def _by_shard(self, idx: np.ndarray) -> Iterator[tuple[int, Any, np.ndarray, np.ndarray]]:
        """(shard number, shard, positions in idx, rows in that shard) for each shard idx touches, in shard order."""
        if idx.size == 0:
            return
        shard_of = self._shard_of[idx]
        # All in a few numpy calls for the whole batch; per shard only slices (views) are taken.
        order = np.argsort(shard_of, kind="stable")
        by_shard = shard_of[order]
        rows = self._row_of[idx[order]].astype(np.int64)
        cut = np.flatnonzero(by_shard[1:] != by_shard[:-1]) + 1
        bounds = [0, *cut.tolist(), int(idx.size)]
        for k, a, b in zip(by_shard[bounds[:-1]].tolist(), bounds[:-1], bounds[1:]):
            yield k, self._shard(k), order[a:b], rows[a:b]

    def _meta_block(self, k: int, sh: Any, rows: np.ndarray,
                    globals_: np.ndarray) -> tuple[np.ndarray, tuple[bool, ...]]:
        """Shard k's metadata block with these rows decoded: an object array [rows of the shard, meta_columns]
        and which columns the shard has. A row is decoded the first time a batch asks for it, and kept while the
        shard stays mapped (so at most max_open shards' rows); every later batch over it gathers its values
        with one numpy call per shard instead of decoding ~80 strings per column (docs/bench-loader.md, "Where
        the bytes go"). Only the rows asked for are decoded: mapping a shard again after an eviction, or a
        first batch over many large shards, costs no more than before.
        globals_: the rows' places in the index (where id, speaker and duration are read)."""
        block = getattr(sh, "meta_block", None)
        if block is None:
            n_rows = int(self.manifest["shards"][k]["rows"])
            present = tuple(c in self._index_meta() or c in sh.meta for c in self.meta_columns)
            block = sh.meta_block = (np.full((n_rows, len(self.meta_columns)), None, dtype=object),
                                     np.zeros(n_rows, dtype=bool), present)
        values, known, present = block
        seen = known[rows]
        if not seen.all():
            index_meta = self._index_meta()
            rows, globals_ = rows[~seen], globals_[~seen]
            for j, c in enumerate(self.meta_columns):
                if c in index_meta:
                    got = index_meta[c](globals_)
                elif c in sh.meta:
                    got = sh.meta_values(c, rows)
                else:
                    continue
                for r, v in zip(rows.tolist(), got):  # one by one: a list value must stay one object
                    values[r, j] = v
            known[rows] = True
        return values, present

    def __getitems__(self, indices: Sequence[int]) -> RowBatch:
        """A whole batch at once (torch's DataLoader calls this), as columns: see audiopipe/collate/rows.py.

        Indexing the result gives the same item dicts as ds[i]; PadCollator pads it without building them.
        """
        idx = self._positions(indices)
        n = int(idx.size)
        arrays: dict[str, list[Rows]] = {f: [] for f in self.features}
        names = self.meta_columns
        meta = np.empty((n, len(names)), dtype=object)
        # A column is in the batch when the index holds it or a shard of the batch has it (as item dicts do).
        have = tuple(c in self._index_meta() for c in names)
        for k, sh, positions, rows in self._by_shard(idx):
            values, present = self._meta_block(k, sh, rows, idx[positions])
            meta[positions] = values[rows]
            if present != have:
                have = tuple(a or b for a, b in zip(have, present))
            for f in self.features:
                arrays[f].append(sh.rows(f, rows, positions))
        columns = {c: col for c, col, h in zip(names, meta.T.tolist(), have) if h}
        columns["index"] = idx.tolist()
        return RowBatch(n, dict(self.channels), arrays, columns)
