"""Map-style dataset over Arrow shards through pyarrow.memory_map: samples are zero-copy numpy views.

Opening reads manifest.json and the length index, and checks every shard's size, Arrow footer and headers
without touching its rows (audiopipe/reader/integrity.py): a corrupt shard fails the open or, with
on_corrupt="skip", leaves the plan. A shard is mapped the first time one of its rows is asked for, once per
process (DataLoader workers map their own; the page cache is shared, resident memory is not ours), and at most
`max_open` stay mapped: the least recently used is closed and mapped again when needed. Reading a sample is
slicing a view: no decode, no copy until collate pads it into the batch.
A whole batch (`__getitems__`, what the DataLoader calls) comes back as a RowBatch, columns of rows that
collate copies in one compiled pass; `read_ahead` lets the kernel fetch the rows of batches to come.
"""

from __future__ import annotations

import ctypes
import json
import logging
import mmap
import os
import queue
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from audiopipe.collate.rows import RowBatch, Rows
from audiopipe.index.lengths import INDEX_NAME, LengthIndex
from audiopipe.reader import integrity
from audiopipe.reader.blocks import BlockTable, cut_blocks
from audiopipe.reader.errors import ConfigMismatch, CorruptIndexError, CorruptShardError
from audiopipe.index.arrow_views import numeric_view, numeric_view_possible
from audiopipe.shard.columns import ListColumn
from audiopipe.shard.manifest import read_manifest
from audiopipe.shard.writer import METADATA_KEY
from audiopipe.storage.paths import require_local

_META_COLUMNS = ("id", "speaker", "text", "duration")
_log = logging.getLogger(__name__)
_PAGE = mmap.PAGESIZE
_MADV_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise = _libc.madvise
except (OSError, AttributeError):  # no madvise here: read-ahead becomes a no-op
    def _madvise(addr: int, length: int, advice: int) -> int:
        return 0


@dataclass
class _Column:
    values: np.ndarray  # flat zero-copy view over the mmap'd buffer
    offsets: np.ndarray  # int64 [rows + 1]
    frames: np.ndarray  # int64 [rows]
    channels: int


class _MappedShard:
    def __init__(self, path: Path, name: str, features: Sequence[str], channels: dict[str, int],
                 meta_columns: Sequence[str]):
        self.name, self.path = name, path
        try:
            self._mmap = pa.memory_map(str(path))
            table = pa.ipc.open_file(self._mmap).read_all()
        except (pa.lib.ArrowException, OSError) as e:
            raise CorruptShardError(f"shard {name} ({path}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e
        self.size, self._fd = self._mmap.size(), self._mmap.fileno()
        self.table = table
        self.columns: dict[str, _Column] = {}
        try:
            # Buffer sizes against the lengths the headers declare (cheap: no row payload is read). A header
            # whose buffer length was shrunk would otherwise surface as a bare numpy ValueError naming nothing.
            table.validate()
            self._columns(table, features, channels)
        except (pa.lib.ArrowException, ValueError, IndexError) as e:
            self._mmap.close()
            raise CorruptShardError(f"shard {name} ({path}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e
        self.meta = {c: table.column(c) for c in meta_columns if c in table.column_names}
        self._meta_get = {c: _meta_reader(col) for c, col in self.meta.items()}

    def _columns(self, table: pa.Table, features: Sequence[str], channels: dict[str, int]) -> None:
        name = self.name
        for f in features:
            if f not in table.column_names:
                raise CorruptShardError(f"shard {name} has no column {f!r} (it has {table.column_names})")
            column = ListColumn(table.column(f))
            offsets, values = column.offsets, column.values
            frames_col = table.column(f"{f}_frames")
            frames = (numeric_view(frames_col.chunk(0)) if frames_col.num_chunks == 1 and
                      numeric_view_possible(frames_col.chunk(0)) else frames_col.to_numpy())
            ch = channels.get(f, 0)
            # Structural checks are O(rows) and catch truncation or corruption of the offsets.
            if offsets[-1] != len(values) or (np.diff(offsets) != np.maximum(ch, 1) * frames).any():
                raise CorruptShardError(f"shard {name}: column {f} offsets do not match frame counts (corrupted)")
            # int64 once here: the copy kernel takes int64 frame counts, and a batch gathers them per shard.
            self.columns[f] = _Column(values, offsets, frames.astype(np.int64), ch)

    def check(self) -> None:
        """Refuse to touch rows of a file whose size changed since it was mapped.

        Reading a page past a truncated file's new end is a SIGBUS that kills the process with no message; one
        fstat (a few microseconds) before each batch's rows are touched turns it into a named error. A file
        replaced by rename (how audiopipe writes) keeps its old inode mapped and is not affected.
        """
        try:
            now = os.fstat(self._fd).st_size
        except OSError as e:
            raise CorruptShardError(f"shard {self.name} ({self.path}) cannot be checked: {e.strerror}") from e
        if now != self.size:
            raise CorruptShardError(
                f"shard {self.name} ({self.path}) changed size after it was mapped ({self.size} -> {now} bytes): "
                f"rewritten in place while training; its rows can no longer be read safely")

    def close(self) -> None:
        """Give back the file descriptor. Views already handed out stay valid: the mapping lives until the
        last of them is gone (pyarrow's buffers hold it), so closing never pulls memory from under a batch."""
        self._mmap.close()

    def rows(self, feature: str, rows: np.ndarray, positions: np.ndarray) -> Rows:
        """Where these rows of `feature` lie: views into the mapped column (collate copies them)."""
        column = self.columns[feature]
        return Rows(column.values, column.offsets[rows].astype(np.int64, copy=False), column.frames[rows], positions)

    def meta_values(self, column: str, rows: np.ndarray) -> list[Any]:
        """Python values of a metadata column at `rows` (int64 array), without a pyarrow scalar per value."""
        return self._meta_get[column](rows)

    def willneed(self, rows: np.ndarray) -> None:
        """Ask the kernel to start reading these rows' bytes into the page cache, and return at once.

        Page faults on a mapping read one small window at a time, in the trainer's thread; a cold shard (first
        epoch, or a corpus larger than RAM) then costs a disk round trip per window. Announcing the next
        batches' rows lets the disk (or network file system) read them in parallel while this batch is copied.
        """
        for c in self.columns.values():
            size = c.values.itemsize
            base = c.values.ctypes.data
            starts = c.offsets[rows] * size + base
            ends = c.offsets[rows + 1] * size + base
            starts -= starts % _PAGE  # madvise wants a page-aligned start
            for a, b in zip(starts.tolist(), ends.tolist()):
                _madvise(a, b - a, _MADV_WILLNEED)



def _meta_reader(column: pa.ChunkedArray) -> Callable[[np.ndarray], list[Any]]:
    """rows -> values. Strings are decoded from the zero-copy data buffer (~0.3 us a value against ~1 us for a
    pyarrow scalar's as_py), numbers come from a numpy view; anything else (nulls, other types) per scalar."""
    arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if arr.null_count == 0 and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset:arr.offset + len(arr) + 1]
        data = memoryview(arr.buffers()[2] or b"")

        def strings(rows: np.ndarray) -> list[str]:
            return [str(data[a:b], "utf-8") for a, b in zip(offsets[rows].tolist(), offsets[rows + 1].tolist())]

        return strings
    if numeric_view_possible(arr):
        values = numeric_view(arr)  # not arr.to_numpy(): it imports pandas (1-3 s) on the first batch
        return lambda rows: values[rows].tolist()
    return lambda rows: [arr[int(r)].as_py() for r in rows]


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: treat every corpus as fitting, hint each row once


def _read_ahead_loop(ref: "weakref.ref[ShardDataset]", q: queue.SimpleQueue) -> None:
    while (indices := q.get()) is not None:
        ds = ref()
        if ds is None:
            return
        try:
            ds.willneed(indices)
        except Exception:  # advice only: it must not kill the process; the read itself reports any error
            pass
        del ds


def keep_rows(ok: np.ndarray, subset: np.ndarray | None, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, lengths) of the rows `ok` keeps: of the subset when one is given (lengths indexed like it),
    else of every row."""
    if subset is None:
        keep = np.flatnonzero(ok)
        return keep, lengths[keep]
    keep = ok[subset]
    return subset[keep], lengths[keep]


class ShardDataset:
    """`ds[i]` -> {"id", "speaker", "text", "duration", "<feature>": np.ndarray view, ...}.

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
    check_shards: False skips the open-time scan (the files baseline, which never reads a shard's rows).
    """

    def __init__(self, shards_dir: str | Path, features: Iterable[str] = ("mel",),
                 expect: dict[str, str] | None = None, verify: str = "size",
                 meta_columns: Sequence[str] = _META_COLUMNS, on_corrupt: str = "fail", max_open: int = 128,
                 check_shards: bool = True):
        verify = integrity.verify_mode(verify)
        if on_corrupt not in integrity.ON_CORRUPT:
            raise ValueError(f"on_corrupt must be one of {integrity.ON_CORRUPT}, got {on_corrupt!r}")
        if not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be a positive number of shards, got {max_open!r}")
        self.root = self._root(shards_dir)
        self.manifest = self._read_manifest()
        self.features = list(features)
        self.verify, self.on_corrupt, self.max_open = verify, on_corrupt, max_open
        self.meta_columns = tuple(meta_columns)
        specs = self.manifest["features"]
        extra_arrays = {"phones": 0, "durations": 0}  # front-end columns without a FeatureSpec
        missing = [f for f in self.features if f not in specs and f not in extra_arrays]
        if missing:
            raise ConfigMismatch(f"{self.root} has no feature {missing}; it has {sorted(specs)}")
        for name, want in (expect or {}).items():
            have = specs.get(name, {}).get("hash")
            if have != want:
                raise ConfigMismatch(
                    f"feature {name!r} in {self.root} was made with config {have}, but this trainer expects "
                    f"{want}; re-extract with the trainer's preset or point at matching shards")
        self.channels = {f: specs[f]["channels"] if f in specs else extra_arrays[f] for f in self.features}
        self.index = self._open_index()
        integrity.check_index(self.index.shard, self.index.row, self.manifest, f"{self.root}/{INDEX_NAME}")
        self._shard_of = self.index.shard
        self._row_of = self.index.row
        self._open: OrderedDict[int, _MappedShard] = OrderedDict()  # least recently used first
        self._maps = 0  # shards mapped in this process, remaps after eviction included
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the read-ahead thread opens shards too
        self._ahead_pid: int | None = None
        self._ahead_queue: queue.SimpleQueue | None = None
        self._hinted: np.ndarray | None = None
        shard_bytes = sum(int(e["arrow"]["bytes"]) for e in self.manifest["shards"])
        self._hint_always = shard_bytes > _physical_memory() // 2
        self._index_meta_readers: dict[str, Callable[[np.ndarray], list[Any]]] | None = None
        self._shard_first: np.ndarray | None = None
        self.skipped: tuple[integrity.CorruptShard, ...] = ()
        self._skipped_shard = np.zeros(len(self.manifest["shards"]), dtype=bool)
        self._hashed = False  # checksums done by the open-time scan (workers inherit it and do not hash again)
        if check_shards:
            self._scan()

    # ---- where the shards are (audiopipe/reader/remote_dataset.py overrides these for s3://) -----------

    def _root(self, shards_dir: str | Path) -> Path:
        return Path(require_local(shards_dir, "shard folder"))  # before pathlib turns s3:// into s3:/

    def _read_manifest(self) -> dict[str, Any]:
        return read_manifest(self.root)

    def _open_index(self) -> LengthIndex:
        index = LengthIndex.open(self.root)
        why = integrity.index_checksum_fails(None, self.root / INDEX_NAME, self.manifest)
        if why:
            raise CorruptIndexError(f"{self.root / INDEX_NAME} {why}: corrupted or from another run; rebuild the "
                                    f"shard set")
        return index

    # ---- corrupt shards ------------------------------------------------------------------------------

    def _scan(self) -> None:
        bad = integrity.scan(self.root, self.manifest, self.features, self.verify)
        self._hashed = self.verify == "checksum"
        if bad and self.on_corrupt == "fail":
            raise CorruptShardError(
                f"{self.root}: {integrity.summary(bad, len(self.manifest['shards']))}; rebuild them "
                f"(`audiopipe verify` lists every problem) or pass on_corrupt='skip' (--on-corrupt skip) to "
                f"train without their rows")
        self._skip(bad)

    def _skip(self, bad: Sequence[integrity.CorruptShard]) -> None:
        new = [b for b in bad if not self._skipped_shard[b.shard]]
        if not new:
            return
        for b in new:
            self._skipped_shard[b.shard] = True
        self.skipped = tuple(sorted((*self.skipped, *new), key=lambda b: b.shard))
        rows = sum(b.rows for b in new)
        _log.warning("skipping %d rows of %s: %s", rows, self.root,
                     integrity.summary(new, len(self.manifest["shards"]), limit=len(new)))

    def skip_what_other_ranks_skip(self) -> None:
        """With torch.distributed initialised, also skip every shard another rank found corrupt, so all ranks
        plan over the same rows (and get the same batch count). A collective: every rank must call it
        (make_loader calls it only for a loader of the whole group, see integrity.spans_whole_group)."""
        if self.on_corrupt != "skip":
            return
        agreed = integrity.union_across_ranks([b.shard for b in self.skipped], len(self.manifest["shards"]))
        shards = self.manifest["shards"]
        self._skip([integrity.CorruptShard(k, shards[k]["name"], str(self.root / shards[k]["arrow"]["path"]),
                                           int(shards[k]["rows"]), "found corrupt by another rank")
                    for k in agreed if not self._skipped_shard[k]])

    def without_skipped(self, subset: np.ndarray | None, lengths: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(subset, lengths) less the rows of skipped shards, before a sampler plans over them.

        subset: global rows or None (all); lengths: indexed like subset (or like the dataset when it is None).
        Dropping rows here, not in the batches, is what keeps every rank's batch count equal.
        """
        lengths = np.asarray(lengths)
        if not self.skipped:
            return subset, lengths
        return keep_rows(~self._skipped_shard[self._shard_of], subset, lengths)

    def diagnostics(self) -> dict[str, Any]:
        """Skipped shards and rows (decided at open), and this process's mappings: open now, the cap, and how
        many times a shard was mapped (more than the shards read means the cap is evicting)."""
        return {"skipped_shards": [b.__dict__.copy() for b in self.skipped],
                "skipped_rows": int(sum(b.rows for b in self.skipped)),
                "open_mappings": len(self._open), "max_open": self.max_open, "mappings_made": self._maps}

    def __getstate__(self) -> dict[str, Any]:
        # For spawned workers: mappings, the lock and the read-ahead thread are per process.
        state = self.__dict__.copy()
        state.update(_open=OrderedDict(), _maps=0, _lock=None, _pid=None, _ahead_pid=None, _ahead_queue=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __len__(self) -> int:
        return len(self.index)

    def lengths(self, feature: str | None = None) -> np.ndarray:
        """Frames per utterance for the sampler (from the index; no payload is opened)."""
        return self.index.frames(feature or self.features[0])

    def spec(self, feature: str) -> dict[str, Any]:
        return self.manifest["features"][feature]

    def _shard(self, k: int) -> _MappedShard:
        """Shard k, mapped and checked unchanged since mapping; its rows may be touched until the next call.

        Under the lock: the read-ahead thread maps and evicts too, and a shard's check must not race its close.
        """
        if os.getpid() != self._pid:  # forked into a DataLoader worker: map afresh in this process
            self._open, self._pid, self._lock, self._maps = OrderedDict(), os.getpid(), threading.Lock(), 0
        with self._lock:
            sh = self._open.get(k)
            if sh is None:
                if self._skipped_shard[k]:
                    raise CorruptShardError(f"shard {self.manifest['shards'][k]['name']} was skipped as corrupt "
                                            f"when the dataset was opened; its rows cannot be read")
                sh = self._open[k] = self._map(k)
                self._maps += 1
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)[1].close()
            else:
                self._open.move_to_end(k)
            sh.check()
        return sh

    def _map(self, k: int) -> _MappedShard:
        return self._map_file(k, self.root / self.manifest["shards"][k]["arrow"]["path"])

    def _map_file(self, k: int, path: Path) -> _MappedShard:
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
        sh = _MappedShard(path, name, self.features, self.channels, self.meta_columns)
        meta = json.loads(sh.table.schema.metadata[METADATA_KEY])["features"]
        for f in self.features:
            if f in self.manifest["features"] and meta[f]["hash"] != self.manifest["features"][f]["hash"]:
                sh.close()
                raise CorruptShardError(f"shard {name}: feature {f} hash differs from the manifest")
        return sh

    # ---- blocks (block-window reading, audiopipe/reader/blocks.py) --------------------------------------

    def blocks(self, block_bytes: int) -> BlockTable:
        """The shard set cut into blocks of about block_bytes of the features read."""
        return cut_blocks(self.index, self.manifest, self.features, self.channels, block_bytes)

    def block_rows(self, blocks: BlockTable, ids: Sequence[int]) -> np.ndarray:
        """Global indices of the rows of these blocks."""
        if self._shard_first is None:
            rows = np.array([int(s["rows"]) for s in self.manifest["shards"]], dtype=np.int64)
            self._shard_first = np.concatenate([[0], np.cumsum(rows)[:-1]])
        ids = np.asarray(ids, dtype=np.int64)
        first = self._shard_first[blocks.shard[ids]] + blocks.start[ids]
        count = blocks.end[ids] - blocks.start[ids]
        return np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()), dtype=np.int64)

    def hold_blocks(self, tag: Any, blocks: BlockTable, ids: Sequence[int]) -> None:
        """Local shards: the kernel reads the blocks' rows ahead (read_ahead); the page cache keeps them."""
        self.read_ahead(self.block_rows(blocks, ids))

    def release_blocks(self, tag: Any) -> None:
        pass

    def willneed(self, indices: Sequence[int]) -> None:
        """Start reading these utterances' feature bytes into the page cache; returns without waiting for
        the disk. About 2 us per row and feature when the rows are cached already."""
        for _, sh, _, rows in self._by_shard(self._positions(indices)):
            sh.willneed(rows)

    def read_ahead(self, indices: Sequence[int]) -> None:
        """willneed() on a background thread of this process: make_loader announces the batches after the one
        being read here, so the hints cost the trainer's thread nothing (the copy kernel releases the GIL).

        A hint costs ~8 us per row even when the row is cached, and finding out whether it is costs as much
        (mincore). So while the shards fit in half the RAM, each row is hinted only the first time it comes
        (the first epoch, when the cache is cold); a corpus larger than that is hinted every time.
        """
        idx = np.asarray(indices, dtype=np.int64).reshape(-1) % max(len(self), 1)
        if not self._hint_always:
            if self._hinted is None:
                self._hinted = np.zeros(len(self), dtype=bool)
            idx = idx[~self._hinted[idx]]
            if idx.size == 0:
                return
            self._hinted[idx] = True
        if self._ahead_pid != os.getpid():  # threads do not survive a fork: one per process
            q: queue.SimpleQueue = queue.SimpleQueue()
            # The thread holds the dataset weakly, and ends when it is collected: its mappings are released.
            threading.Thread(target=_read_ahead_loop, args=(weakref.ref(self), q), daemon=True,
                             name="audiopipe-read-ahead").start()
            weakref.finalize(self, q.put, None)
            self._ahead_queue, self._ahead_pid = q, os.getpid()
        self._ahead_queue.put(idx)

    def _index_meta(self) -> dict[str, Callable[[np.ndarray], list[Any]]]:
        # Built on first use, not at open: an index written before it was one record batch is combined here.
        if self._index_meta_readers is None:
            cols = self.index.table.column_names
            self._index_meta_readers = {c: _meta_reader(self.index.table.column(c)) for c in self.meta_columns
                                        if c in cols}
        return self._index_meta_readers

    def __getitem__(self, i: int) -> dict[str, Any]:
        # A batch of one: a single way of locating rows and reading metadata.
        return self.__getitems__([i])[0]

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        """Global indices as int64, negatives wrapped; an index past either end is an IndexError."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise IndexError(f"index out of range for a dataset of {len(self)} utterances")
        return idx % max(len(self), 1)

    def _by_shard(self, idx: np.ndarray) -> Iterator[tuple[int, _MappedShard, np.ndarray, np.ndarray]]:
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
