"""ShardDataset over a shard set on object storage (s3://bucket/prefix): the same batches as the local folder,
read by byte range.

The layout under the prefix is the local folder's (manifest.json, index.arrow, shard-*.arrow). Opening reads
the manifest and the length index whole (both small, the index checked against the manifest's checksum and row
by row), then checks every shard as the local scan does, from its size (HEAD) and its Arrow footer and
record-batch headers (ranged GETs), 64 shards at a time; in the same pass it fetches each shard's small buffers
(feature offsets and frame counts, the text column: a few KB a shard, ipc_layout.py says where they lie), which
are kept for every shard whatever max_open. A shard's row payload is never downloaded whole for random access:
- a batch's rows are fetched by byte range, each row's values being one contiguous range of its column
  (adjacent rows in one request), `fetch_threads` requests at once (sized by rate x round trip);
- the rows of the batches to come are fetched ahead: the sampler announces them (`read_ahead` batches early,
  on the read-ahead thread the local reader uses for madvise), so the step finds them fetched already;
- with block-window reading (reading.py, sampler/block_window.py) whole blocks of rows are fetched instead, a
  window at a time (`hold_blocks`), and the batches cut their rows from them.
With `cache_dir`, shards are also downloaded whole in the background into a bounded local cache
(shard_cache.py) and read from there by mmap once complete: later epochs send no request.

Failures: a request that fails is retried with backoff (storage/s3_ranges.py), so a server restart of a few
seconds costs only time; after that an ObjectStoreError names the URL. A shard whose object is missing, of
another size, or unreadable is corrupt as a local one is (CorruptShardError, or skipped at open with
on_corrupt="skip"). A DataLoader worker (fork) opens its own client, thread pool and counters.
"""

from __future__ import annotations

import io
import os
import struct
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from audiopipe.after_fork import reset_after_fork
from audiopipe.collate.rows import Rows
from audiopipe.errors import InvalidValue, NotFound
from audiopipe.index.lengths import INDEX_NAME, LengthIndex
from audiopipe.reader import integrity, ipc_layout
from audiopipe.reader.arrow_dataset import META_COLUMNS, ShardDataset
from audiopipe.reader.mapped_shard import meta_reader
from audiopipe.reader.errors import CorruptIndexError, CorruptShardError
from audiopipe.reader.shard_cache import ShardCache
from audiopipe.shard.checksum import checksum_of, new_hash
from audiopipe.shard.manifest import read_manifest
from audiopipe.storage.s3 import S3Settings, S3URL, parse_s3
from audiopipe.storage.s3_ranges import ObjectChanged, RangeReader, RetryPolicy

_TAIL = 64 << 10  # first guess of footer + schema size: one request covers both for any audiopipe shard
_GAP = 4 << 10  # small buffers closer than this are fetched in one request
_MAX_RUN = 8 << 20  # adjacent rows are merged into requests of at most this many bytes
_MAX_OVERTAKEN = 1 << 16  # ranges remembered as fetched before their read-ahead came


class _TailFile(io.RawIOBase):
    """The last bytes of an object as a file of the object's size, so pyarrow reads the schema from the footer
    without another request. Reading outside the tail is a LayoutError (it never happens for a valid file)."""

    def __init__(self, size: int, tail_start: int, tail: bytes):
        self._size, self._start, self._tail, self._pos = size, tail_start, tail, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = {0: pos, 1: self._pos + pos, 2: self._size + pos}[whence]
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, b) -> int:
        if self._pos < self._start:
            raise ipc_layout.LayoutError("footer larger than the bytes read")
        chunk = self._tail[self._pos - self._start:self._pos - self._start + len(b)]
        b[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


class _Layout:
    """A shard's schema and where each column's buffers lie in the object, per record batch (no row payload read).

    Network failures propagate as they are (ObjectStoreError, ObjectChanged); any failure to parse the bytes
    (a garbled footer or header, a buffer shorter than its array needs, whatever pyarrow or the flatbuffer
    walker trips on) is a LayoutError."""

    def __init__(self, reader: RangeReader, url: S3URL, size: int):
        t0 = time.perf_counter()
        _, tail = reader.read_tail(url, _TAIL, expect_size=size)
        self.seconds = time.perf_counter() - t0  # HEAD + one GET: the round trips the fetch pool is sized by
        flen = _parsed(ipc_layout.footer_length, tail[-ipc_layout.TRAILER:])
        if flen + ipc_layout.TRAILER > size:
            raise ipc_layout.LayoutError(f"footer length {flen} exceeds the file")
        if flen + ipc_layout.TRAILER > len(tail):
            tail = reader.read(url, size - flen - ipc_layout.TRAILER, flen + ipc_layout.TRAILER, size)
        start = size - len(tail)
        footer = tail[len(tail) - ipc_layout.TRAILER - flen:len(tail) - ipc_layout.TRAILER]
        self.schema = _parsed(lambda: pa.ipc.open_file(pa.PythonFile(_TailFile(size, start, tail), mode="r")).schema)
        blocks = _parsed(ipc_layout.record_batch_blocks, footer)
        self.batches: list[ipc_layout.BatchLayout] = []
        self.columns: list[dict[str, ipc_layout.ColumnBuffers]] = []
        for b in blocks:  # an audiopipe shard has one; any valid Arrow file may have several
            if b.offset < 0 or b.metadata_length <= 0 or b.offset + b.metadata_length + b.body_length > size:
                raise ipc_layout.LayoutError("record batch block outside the file")
            if b.offset >= start:
                head = tail[b.offset - start:b.offset - start + b.metadata_length]
            else:
                head = reader.read(url, b.offset, b.metadata_length, size)
            batch = _parsed(ipc_layout.batch_layout, b, head)
            cols = _parsed(ipc_layout.columns, self.schema, batch)
            for c in cols.values():
                _parsed(ipc_layout.check_sizes, c)
            self.batches.append(batch)
            self.columns.append(cols)

    @property
    def rows(self) -> int:
        return sum(b.rows for b in self.batches)


def _parsed(fn, *args):
    """fn(*args), with any parsing failure turned into a LayoutError (the bytes are in memory: no I/O here)."""
    try:
        return fn(*args)
    except ipc_layout.LayoutError:
        raise
    except (pa.lib.ArrowException, OSError, ValueError, struct.error, IndexError, KeyError, OverflowError) as e:
        raise ipc_layout.LayoutError(integrity.first_line(e)) from e


def _runs(ranges: list[tuple[int, int]], gap: int, max_run: int) -> list[tuple[int, int, list[int]]]:
    """Merge (start, length) ranges, sorted by start, into requests: (start, length, indices of the ranges)."""
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    runs: list[tuple[int, int, list[int]]] = []
    for i in order:
        s, n = ranges[i]
        if runs:
            rs, rn, members = runs[-1]
            if s <= rs + rn + gap and max(rs + rn, s + n) - rs <= max_run:
                runs[-1] = (rs, max(rs + rn, s + n) - rs, members + [i])
                continue
        runs.append((s, n, [i]))
    return runs


class _Fetcher:
    """Ranged GETs on a thread pool: submitted ahead (prefetch) or on demand, taken once by the batch; and blocks
    held whole (block-window reading) that any number of rows are cut from until they are released.

    Prefetched ranges wait in `pending` until a batch takes them; beyond `max_pending` bytes the oldest are
    dropped (a pass abandoned midway must not keep its read-ahead forever), and fetched again if asked for.
    """

    def __init__(self, reader: RangeReader, threads: int, max_pending: int):
        self.reader, self.max_pending, self.threads = reader, max_pending, threads
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="audiopipe-s3")
        self.lock = threading.Lock()
        self.pending: OrderedDict[tuple, tuple[Future, int, int]] = OrderedDict()
        self.pending_bytes = 0
        # Ranges a batch fetched itself because their read-ahead had not come yet (a busy read-ahead thread):
        # the late read-ahead of each is skipped once instead of fetching it a second time.
        self.overtaken: OrderedDict[tuple, None] = OrderedDict()
        # Held blocks: object path -> [(start, end, future, tag)]; tag -> the paths it holds.
        self.held: dict[str, list[tuple[int, int, Future, Any]]] = {}
        self.held_tags: dict[Any, set[str]] = {}
        self.held_bytes = 0
        self.stats = {"bytes_delivered": 0, "ranges_taken": 0, "ranges_prefetched": 0, "ranges_waited": 0,
                      "ranges_dropped": 0, "ranges_late": 0, "ranges_from_blocks": 0, "blocks_fetched": 0,
                      "max_held_bytes": 0, "wait_s": 0.0}

    def _submit(self, url: S3URL, size: int, ranges: list[tuple[int, int]]) -> list[tuple[Future, int, int]]:
        out: list[Any] = [None] * len(ranges)
        for start, length, members in _runs(ranges, 0, _MAX_RUN):
            fut = self.pool.submit(self.reader.read, url, start, length, size)
            for i in members:
                out[i] = (fut, ranges[i][0] - start, ranges[i][1])
        return out

    def prefetch(self, url: S3URL, size: int, ranges: Iterable[tuple[int, int]]) -> None:
        with self.lock:
            missing = []
            for r in dict.fromkeys(ranges):
                key = (url.path, *r)
                if r[1] <= 0 or key in self.pending or self._in_held(url.path, r) is not None:
                    continue
                if key in self.overtaken:
                    del self.overtaken[key]
                    self.stats["ranges_late"] += 1
                    continue
                missing.append(r)
            for r, e in zip(missing, self._submit(url, size, missing)):
                self.pending[(url.path, *r)] = e
                self.pending_bytes += r[1]
            while self.pending_bytes > self.max_pending and self.pending:
                _, (_, _, n) = self.pending.popitem(last=False)
                self.pending_bytes -= n
                self.stats["ranges_dropped"] += 1

    # ---- held blocks ----------------------------------------------------------------------------------

    def _in_held(self, path: str, r: tuple[int, int]) -> tuple[Future, int, int] | None:
        for start, end, fut, _ in self.held.get(path, ()):
            if start <= r[0] and r[0] + r[1] <= end:
                return fut, r[0] - start, r[1]
        return None

    def hold(self, tag: Any, url: S3URL, size: int, start: int, length: int) -> None:
        """Fetch bytes start..start+length (one GET) and keep them until release(tag)."""
        if length <= 0:
            return
        with self.lock:
            if any(s == start and e == start + length for s, e, _, t in self.held.get(url.path, ()) if t == tag):
                return
            fut = self.pool.submit(self.reader.read, url, start, length, size)
            self.held.setdefault(url.path, []).append((start, start + length, fut, tag))
            self.held_tags.setdefault(tag, set()).add(url.path)
            self.held_bytes += length
            self.stats["blocks_fetched"] += 1
            self.stats["max_held_bytes"] = max(self.stats["max_held_bytes"], self.held_bytes)

    def release(self, tag: Any) -> None:
        """Forget the blocks held under `tag` (rows already cut from them stay valid: they hold the bytes)."""
        with self.lock:
            for path in self.held_tags.pop(tag, ()):
                keep = []
                for e in self.held.get(path, ()):
                    if e[3] == tag:
                        self.held_bytes -= e[1] - e[0]
                        if not e[2].done():
                            e[2].cancel()
                    else:
                        keep.append(e)
                if keep:
                    self.held[path] = keep
                else:
                    self.held.pop(path, None)

    def take(self, url: S3URL, size: int, ranges: Sequence[tuple[int, int]],
             payload: bool = True) -> list[bytes | memoryview]:
        """The bytes of each range, cut from a held block, waiting for those still in flight, and fetching the
        rest now. payload: count them as rows delivered (False for a shard's small buffers)."""
        unique = list(dict.fromkeys(r for r in ranges if r[1] > 0))
        found: dict[tuple[int, int], tuple[Future, int, int]] = {}
        from_blocks = 0
        with self.lock:
            for r in unique:
                e = self._in_held(url.path, r)
                if e is not None:
                    found[r] = e
                    from_blocks += 1
                    continue
                e = self.pending.pop((url.path, *r), None)
                if e is not None:
                    found[r] = e
                    self.pending_bytes -= r[1]
            missing = [r for r in unique if r not in found]
            if payload:
                for r in missing:
                    self.overtaken[(url.path, *r)] = None
                while len(self.overtaken) > _MAX_OVERTAKEN:
                    self.overtaken.popitem(last=False)
        if payload:
            self.stats["ranges_prefetched"] += len(found)
            self.stats["ranges_from_blocks"] += from_blocks
            self.stats["ranges_waited"] += len(missing) + sum(not e[0].done() for e in found.values())
        found.update(zip(missing, self._submit(url, size, missing)))
        t0 = time.perf_counter()
        out: list[bytes | memoryview] = []
        for r in ranges:
            if r[1] <= 0:
                out.append(b"")
                continue
            fut, rel, n = found[r]
            out.append(memoryview(fut.result())[rel:rel + n])
        if payload:
            self.stats["wait_s"] += time.perf_counter() - t0
            self.stats["ranges_taken"] += len(unique)
            self.stats["bytes_delivered"] += sum(r[1] for r in unique)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class _Small:
    """A shard's small buffers, decoded: where each row's values start in the object, its frame counts, and the
    metadata columns the index does not hold (the transcripts). Kept for every shard once fetched, whatever
    max_open (a few bytes a row); no feature value is here."""

    def __init__(self, name: str, url: S3URL, size: int, rows: int, starts: dict[str, np.ndarray],
                 frames: dict[str, np.ndarray], dtypes: dict[str, np.dtype], meta: dict[str, pa.ChunkedArray]):
        self.name, self.url, self.size, self.rows = name, url, size, rows
        self.starts, self.frames, self.dtypes, self.meta = starts, frames, dtypes, meta

    @staticmethod
    def fetch(ds: "RemoteShardDataset", k: int, layout: _Layout) -> "_Small":
        """Read and check shard k's small buffers (a few GETs: nearby buffers in one request). Raises
        CorruptShardError for buffers that contradict each other, ObjectChanged/ObjectStoreError for I/O."""
        entry = ds.manifest["shards"][k]
        name, url, size = entry["name"], ds._shard_url(k), int(entry["arrow"]["bytes"])
        for f in ds.features:
            for c in (f, f"{f}_frames"):
                if c not in layout.schema.names:
                    raise CorruptShardError(f"shard {name} ({url}) has no column {c!r}")
        meta_names = [c for c in ds.shard_meta_columns if c in layout.schema.names
                      and layout.schema.field(c).type.num_fields == 0]
        want: list[tuple[int, int]] = []  # the small buffers: list offsets, frame counts, metadata columns
        for cols in layout.columns:
            for f in ds.features:
                want += [cols[f].buffers[1], cols[f"{f}_frames"].buffers[1]]
            for c in meta_names:
                want += cols[c].buffers
        ranges = sorted(r for r in dict.fromkeys(want) if r[1] > 0)
        got: dict[tuple[int, int], bytes] = {}
        for start, length, members in _runs(ranges, _GAP, _MAX_RUN):
            data = ds.reader.read(url, start, length, size)
            for i in members:
                a, n = ranges[i]
                got[ranges[i]] = data[a - start:a - start + n]
        starts: dict[str, np.ndarray] = {}
        frames: dict[str, np.ndarray] = {}
        dtypes: dict[str, np.dtype] = {}
        for f in ds.features:
            ch = ds.channels.get(f, 0)
            dtype = np.dtype(layout.schema.field(f).type.value_type.to_pandas_dtype())
            st, fr = [], []
            for batch, cols in zip(layout.batches, layout.columns):
                offsets = np.frombuffer(got.get(cols[f].buffers[1], b""), dtype=np.int64)
                fcount = np.frombuffer(got.get(cols[f"{f}_frames"].buffers[1], b""), dtype=np.int32)
                voff, vlen = cols[f].buffers[3]
                if batch.rows == 0 and offsets.size == 0:
                    continue
                if (offsets.size != batch.rows + 1 or fcount.size < batch.rows or offsets[0] < 0
                        or offsets[-1] * dtype.itemsize > vlen
                        or (np.diff(offsets) != np.maximum(ch, 1) * fcount[:batch.rows]).any()):
                    raise CorruptShardError(f"shard {name} ({url}): column {f} offsets do not match frame counts "
                                            f"(corrupted)")
                st.append(voff + offsets[:-1] * dtype.itemsize)
                fr.append(fcount[:batch.rows].astype(np.int64))
            starts[f] = np.concatenate(st) if st else np.zeros(0, dtype=np.int64)
            frames[f] = np.concatenate(fr) if fr else np.zeros(0, dtype=np.int64)
            dtypes[f] = dtype
        meta: dict[str, pa.ChunkedArray] = {}
        for c in meta_names:
            typ, chunks = layout.schema.field(c).type, []
            for cols in layout.columns:
                (length, nulls), bufs = cols[c].nodes[0], cols[c].buffers
                # An absent validity bitmap is None; any other empty buffer is an empty buffer (a string column
                # whose values are all "" has a zero-length data buffer, which must not read as missing).
                arrow_bufs = [None if j == 0 and b[1] <= 0 else pa.py_buffer(got.get(b, b"")) for j, b in enumerate(bufs)]
                try:
                    arr = pa.Array.from_buffers(typ, length, arrow_bufs, null_count=nulls)
                    arr.validate(full=True)
                except (pa.lib.ArrowException, ValueError) as e:
                    raise CorruptShardError(f"shard {name} ({url}): column {c} is unreadable "
                                            f"({integrity.first_line(e)}); run `audiopipe verify`") from e
                chunks.append(arr)
            meta[c] = pa.chunked_array(chunks, type=typ)
        ds._check_against_index(k, name, frames, meta.get("id"))  # CorruptIndexError: the index is wrong, not k
        return _Small(name, url, size, layout.rows, starts, frames, dtypes, meta)

    def ranges(self, feature: str, rows: np.ndarray, channels: int) -> list[tuple[int, int]]:
        starts = self.starts[feature][rows]
        n = self.frames[feature][rows] * (max(channels, 1) * self.dtypes[feature].itemsize)
        return list(zip(starts.tolist(), n.tolist()))

    def span(self, features: Sequence[str], channels: dict[str, int], first: int, end: int) -> list[tuple[int, int]]:
        """Per feature, the one byte range rows first..end-1 occupy (a block: contiguous within a batch's
        column; across record batches, one range per batch)."""
        out = []
        for f in features:
            r = self.ranges(f, np.arange(first, end, dtype=np.int64), channels.get(f, 0))
            r = [x for x in r if x[1] > 0]
            if not r:
                continue
            a, e = r[0][0], r[0][0] + r[0][1]
            for s, n in r[1:]:
                if s != e:  # the next record batch's buffer: a range of its own
                    out.append((a, e - a))
                    a = s
                e = s + n
            out.append((a, e - a))
        return out


class _RemoteShard:
    """A shard read by byte range: its small buffers in memory (_Small), its feature values on the server.
    Cheap to make from the small buffers: evicting it past max_open costs no request to undo."""

    def __init__(self, ds: "RemoteShardDataset", small: _Small):
        self._ds, self.small = ds, small
        self.name, self.url, self.size = small.name, small.url, small.size
        self.meta = small.meta
        self._meta_get = {c: meta_reader(col) for c, col in self.meta.items()}

    def check(self) -> None:
        """Nothing to check locally: a changed object shows as a failed or short read (ObjectChanged)."""

    def close(self) -> None:
        pass

    def ranges(self, feature: str, rows: np.ndarray) -> list[tuple[int, int]]:
        return self.small.ranges(feature, rows, self._ds.channels.get(feature, 0))

    def willneed(self, rows: np.ndarray) -> None:
        """Start fetching these rows' values (all features) on the thread pool; returns at once."""
        fetcher = self._ds.fetcher()
        for f in self._ds.features:
            fetcher.prefetch(self.url, self.size, self.ranges(f, rows))

    def rows(self, feature: str, rows: np.ndarray, positions: np.ndarray) -> Rows:
        """The rows' values fetched (or taken from the read-ahead or a held block) into one buffer, in batch
        order."""
        dtype = self.small.dtypes[feature]
        try:
            chunks = self._ds.fetcher().take(self.url, self.size, self.ranges(feature, rows))
        except ObjectChanged as e:
            raise CorruptShardError(f"shard {self.name} ({self.url}) changed on the server while training: "
                                    f"{integrity.first_line(e)}") from e
        frames = self.small.frames[feature][rows]
        counts = frames * max(self._ds.channels.get(feature, 0), 1)
        values = np.frombuffer(b"".join(chunks), dtype=dtype)
        starts = np.zeros(rows.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        return Rows(values, starts, frames.astype(np.int64), positions)

    def meta_values(self, column: str, rows: np.ndarray) -> list[Any]:
        return self._meta_get[column](rows)


def _raise_io_threads(n: int) -> None:
    """pyarrow's S3 client keeps at most max(IO threads, 25) connections: raise the IO pool to `n` so `n`
    requests can be in flight (clients made afterwards get the larger pool; see storage/s3.filesystem)."""
    if pa.io_thread_count() < n:
        pa.set_io_thread_count(n)


OPEN_THREADS = 64  # concurrent shard checks at open: ~3 round trips a shard, all shards in parallel


class RemoteShardDataset(ShardDataset):
    """ShardDataset whose shards are objects under an s3:// prefix (see the module docstring).

    cache_dir / max_cache_bytes: the optional local cache of whole shards (shard_cache.py).
    fetch_threads: requests in flight per process; None sizes it by rate x round trip: `request_rate` (GETs per
        second the loader should sustain) times the round trip measured while opening, within 16..256.
    max_pending_bytes: read-ahead kept waiting for its batch.
    settings / retry: the client's attempts and timeouts, and the retries on top of them (storage/).
    The other arguments are ShardDataset's.
    """

    def __init__(self, shards: str, features: Iterable[str] = ("mel",), *, expect: dict[str, str] | None = None,
                 verify: str = "size", meta_columns: Sequence[str] = META_COLUMNS, on_corrupt: str = "fail",
                 max_open: int = 128, check_shards: bool = True, cache_dir: str | os.PathLike[str] | None = None,
                 max_cache_bytes: int | None = None, fetch_threads: int | None = None,
                 request_rate: float = 2000.0, max_pending_bytes: int = 512 << 20,
                 settings: S3Settings | None = None, retry: RetryPolicy | None = None):
        if fetch_threads is not None and (not isinstance(fetch_threads, int) or fetch_threads < 1):
            raise InvalidValue(f"fetch_threads must be a positive integer or None (sized by rate x round trip), "
                               f"got {fetch_threads!r}")
        if not request_rate > 0:
            raise InvalidValue(f"request_rate must be > 0 requests per second, got {request_rate!r}")
        _raise_io_threads(OPEN_THREADS)  # before the first client is made: the open runs that many at once
        self.reader = RangeReader(settings, retry)
        self.fetch_threads_asked, self.request_rate = fetch_threads, float(request_rate)
        self.fetch_threads = fetch_threads or 16
        self.max_pending_bytes = max_pending_bytes
        self.round_trip_s: float | None = None
        self._layouts: dict[int, _Layout] = {}
        self._small: dict[int, _Small] = {}  # every shard's, once fetched: never evicted
        self._forget_threads()
        reset_after_fork(self, RemoteShardDataset._forget_threads)
        if cache_dir is None and max_cache_bytes is not None:
            raise InvalidValue("max_cache_bytes needs cache_dir (the folder of the local shard cache)")
        if cache_dir is not None and max_cache_bytes is None:
            raise InvalidValue("cache_dir needs max_cache_bytes (the most the cache may hold on disk)")
        self.cache = ShardCache(cache_dir, max_cache_bytes, self.reader) if cache_dir is not None else None
        # Index columns (id, speaker, duration) come from the index; only the rest is fetched from the shards.
        self.shard_meta_columns: list[str] = []
        super().__init__(shards, features, expect=expect, verify=verify, meta_columns=meta_columns,
                         on_corrupt=on_corrupt, max_open=max_open, check_shards=check_shards)
        self._read_ahead.every_time = True  # a fetched range is consumed by its batch: announce every batch
        if fetch_threads is None and self.round_trip_s is not None:
            self.fetch_threads = int(min(256, max(16, np.ceil(self.request_rate * self.round_trip_s))))
        _raise_io_threads(self.fetch_threads)

    # ---- where the shards are -------------------------------------------------------------------------

    def _root(self, shards: str | Path) -> S3URL:  # type: ignore[override]
        return parse_s3(shards)

    def _read_manifest(self) -> dict[str, Any]:
        return read_manifest(str(self.root))

    def _open_index(self) -> LengthIndex:
        url = self.root.child(INDEX_NAME)
        try:
            data = self.reader.read_object(url)
        except ObjectChanged as e:
            raise NotFound(f"{url} not found: is {self.root} an audiopipe shard prefix? ({e})") from e
        why = integrity.index_checksum_fails(data, None, self.manifest)
        if why:
            raise CorruptIndexError(f"{url} {why}: corrupted or from another run; rebuild the shard set")
        index = LengthIndex(pa.ipc.open_file(pa.BufferReader(data)).read_all())
        # The transcripts the index does not hold, and the ids it does: fetched from each shard with its frame
        # counts (a few bytes a row) to check the index against (_check_against_index).
        self.shard_meta_columns = [c for c in self.meta_columns if c not in index.table.column_names or c == "id"]
        return index

    def _forget_threads(self) -> None:
        """This process's thread pools, made on first use (a forked or spawned worker makes its own: threads
        stay in the parent)."""
        self._fetcher: _Fetcher | None = None
        self._small_futs: dict[int, Future] = {}
        self._small_lock = threading.Lock()
        self._small_pool: ThreadPoolExecutor | None = None

    def fetcher(self) -> _Fetcher:
        if self._fetcher is None:
            self._fetcher = _Fetcher(self.reader, self.fetch_threads, self.max_pending_bytes)
        return self._fetcher

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_fetcher", "_small_futs", "_small_lock", "_small_pool"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._forget_threads()
        reset_after_fork(self, RemoteShardDataset._forget_threads)

    def _shard_url(self, k: int) -> S3URL:
        return self.root.child(self.manifest["shards"][k]["arrow"]["path"])

    def _layout(self, k: int) -> _Layout:
        lay = self._layouts.get(k)
        if lay is None:
            entry = self.manifest["shards"][k]
            lay = self._layouts[k] = _Layout(self.reader, self._shard_url(k), int(entry["arrow"]["bytes"]))
        return lay

    # ---- corrupt shards -------------------------------------------------------------------------------

    def _check_remote(self, k: int, hashes: dict[str, str]) -> str | None:
        entry = self.manifest["shards"][k]
        url = self._shard_url(k)
        try:
            layout = self._layout(k)
        except ObjectChanged as e:
            return integrity.first_line(e).replace(f"{url}: ", "").replace(f"{url} ", "")
        except (ipc_layout.LayoutError, pa.lib.ArrowException) as e:
            return f"unreadable Arrow file ({integrity.first_line(e)})"
        reason = integrity.check_contents(layout.schema, layout.rows, entry, self.features, hashes)
        if reason is None and self.verify == "checksum":
            try:
                want = checksum_of(entry["arrow"])
            except KeyError:
                return "has no checksum in the manifest"
            h, size, step = new_hash(want.algorithm), int(entry["arrow"]["bytes"]), 8 << 20
            for start in range(0, size, step):
                h.update(self.reader.read(url, start, min(step, size - start), size))
            if h.hexdigest() != want.hexdigest:
                return f"fails its {want.algorithm} checksum"
        if reason is None:
            # Its small buffers now, on this pool, in parallel with every other shard's: never one shard after
            # another on the batch path, and kept for every shard whatever max_open.
            try:
                self._small[k] = _Small.fetch(self, k, layout)
            except CorruptIndexError:
                raise  # the index, not this shard: no shard is skipped for it
            except CorruptShardError as e:
                return integrity.first_line(e).split(": ", 1)[-1]
            except ObjectChanged as e:
                return integrity.first_line(e).replace(f"{url}: ", "").replace(f"{url} ", "")
        return reason

    def _scan(self) -> None:
        hashes = {f: spec["hash"] for f, spec in self.manifest["features"].items()}
        shards = self.manifest["shards"]
        # A server that stays down is an ObjectStoreError from here, never a shard taken for corrupt.
        with ThreadPoolExecutor(min(OPEN_THREADS, max(len(shards), 1))) as pool:
            reasons = list(pool.map(lambda k: self._check_remote(k, hashes), range(len(shards))))
        bad = [integrity.CorruptShard(k, shards[k]["name"], str(self._shard_url(k)), int(shards[k]["rows"]), r)
               for k, r in enumerate(reasons) if r is not None]
        times = sorted(lay.seconds for lay in self._layouts.values())
        if times:
            # HEAD + GET of each tail: half of one is a round trip, server time included. The open sends 64 at a
            # time, so most of them also queue at the server; the 10th percentile is what an exchange costs when
            # it does not (the median, inflated by that queueing under load, sized the pool 2-4x too large and
            # the extra requests only queued at the server).
            self.round_trip_s = times[len(times) // 10] / 2
        self._hashed = self.verify == "checksum"
        self.reader.forget()  # each shard's size is asked again when it is first read (a change since is caught)
        self.skipped_shards.after_scan(bad)

    # ---- small buffers: fetched off the batch path ----------------------------------------------------------

    def _request_small(self, k: int) -> Future:
        """Shard k's small buffers on the opening pool (a future; at once when they are in memory)."""
        with self._small_lock:
            if self._small_pool is None:
                self._small_pool = ThreadPoolExecutor(8, thread_name_prefix="audiopipe-s3-open")
            fut = self._small_futs.get(k)
            if fut is None:
                fut = self._small_futs[k] = self._small_pool.submit(self._fetch_small, k)
        return fut

    def _fetch_small(self, k: int) -> _Small:
        sm = self._small.get(k)
        if sm is not None:
            return sm
        entry = self.manifest["shards"][k]
        url = self._shard_url(k)
        try:
            sm = _Small.fetch(self, k, self._layout(k))
        except CorruptShardError:
            raise
        except ObjectChanged as e:
            raise CorruptShardError(f"shard {entry['name']} ({url}) changed on the server since the open: "
                                    f"{integrity.first_line(e)}") from e
        except (ipc_layout.LayoutError, pa.lib.ArrowException, ValueError) as e:  # bytes that do not parse
            raise CorruptShardError(f"shard {entry['name']} ({url}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e
        self._small[k] = sm
        return sm

    def small(self, k: int) -> _Small:
        """Shard k's small buffers, waiting for them if they are being fetched (never under the dataset lock)."""
        sm = self._small.get(k)
        return sm if sm is not None else self._request_small(k).result()

    # ---- shards ---------------------------------------------------------------------------------------

    def _cached_path(self, k: int, touch: bool = False) -> Path | None:
        return self.cache.ready(self.manifest["shards"][k], touch=touch) if self.cache is not None else None

    def _map(self, k: int):  # type: ignore[override]
        """Under the dataset lock: a cached copy is mapped (local I/O), else the shard is made from its small
        buffers, which _shard fetched before taking the lock. No network request here."""
        entry = self.manifest["shards"][k]
        url = self._shard_url(k)
        if self.cache is not None:
            path = self.cache.ready(entry, touch=True)
            if path is not None:
                return self._map_file(k, path)
            why = self.cache.failed.get(self.cache.key(entry))
            if why is not None:
                raise CorruptShardError(f"shard {entry['name']}: {why}")
            self.cache.request(url, entry)
        sm = self._small.get(k)
        if sm is None:  # its cached copy vanished since _shard looked: fetched here, once
            sm = self._fetch_small(k)
        return _RemoteShard(self, sm)

    def _shard(self, k: int):  # type: ignore[override]
        if k not in self._small and k not in self.skipped_shards and self._cached_path(k) is None:
            self.small(k)  # outside the lock: other batches' shards open meanwhile
        sh = super()._shard(k)
        if self.cache is not None and isinstance(sh, _RemoteShard):
            entry = self.manifest["shards"][k]
            why = self.cache.failed.get(self.cache.key(entry))
            if why is not None:  # its whole bytes were seen not to match the manifest: stop reading it
                raise CorruptShardError(f"shard {entry['name']}: {why}")
            # Its download finished: read the local copy from now on (the next call maps it).
            if self.cache.ready(entry) is not None:
                self._open.drop(k, sh)
                if k not in self._small:
                    self.small(k)
                sh = super()._shard(k)
        return sh

    def willneed(self, indices: Sequence[int]) -> None:  # type: ignore[override]
        """Start fetching these utterances' rows; a shard whose small buffers are not in memory yet is opened
        on the opening pool first, in parallel with the others, and its rows follow when it is."""
        idx = self._positions(indices)
        if idx.size == 0:
            return
        shard_of = self._shard_of[idx]
        rows = self._row_of[idx].astype(np.int64)
        for k in np.unique(shard_of).tolist():
            if k in self.skipped_shards or self._cached_path(k) is not None:
                continue
            mine = rows[shard_of == k]
            sm = self._small.get(k)
            if sm is not None:
                _RemoteShard(self, sm).willneed(mine)
                continue

            def then(fut: Future, mine=mine) -> None:
                if fut.exception() is None:  # a failure is reported by the read itself
                    _RemoteShard(self, fut.result()).willneed(mine)

            self._request_small(k).add_done_callback(then)

    # ---- blocks (block-window reading) ----------------------------------------------------------------

    def hold_blocks(self, tag: Any, blocks: Any, ids: np.ndarray) -> None:
        """Fetch these blocks whole (one GET per feature and block) and keep them until release_blocks(tag):
        the batches of a window cut their rows from them. `blocks` is the BlockTable the ids index."""
        fetcher = self.fetcher()
        for b in np.asarray(ids, dtype=np.int64).tolist():
            k, first, end = int(blocks.shard[b]), int(blocks.start[b]), int(blocks.end[b])
            if k in self.skipped_shards:
                continue
            if self.cache is not None:
                entry = self.manifest["shards"][k]
                if self.cache.ready(entry) is not None:
                    continue  # read from the local copy
                self.cache.request(self._shard_url(k), entry)

            def hold(sm: _Small, first=first, end=end) -> None:
                for start, length in sm.span(self.features, self.channels, first, end):
                    fetcher.hold(tag, sm.url, sm.size, start, length)

            sm = self._small.get(k)
            if sm is not None:
                hold(sm)
            else:
                self._request_small(k).add_done_callback(
                    lambda fut, hold=hold: hold(fut.result()) if fut.exception() is None else None)

    def release_blocks(self, tag: Any) -> None:
        self.fetcher().release(tag)

    def diagnostics(self) -> dict[str, Any]:
        """ShardDataset's, plus this process's requests: count, bytes asked for and delivered, retries, and
        how many ranges the read-ahead had fetched (or started) before their batch asked for them."""
        d = super().diagnostics()
        stats = dict(self._fetcher.stats) if self._fetcher is not None else {}
        d.update(self.reader.counters(), **stats)
        delivered = stats.get("bytes_delivered", 0)
        d["bytes_requested_per_byte_delivered"] = (d["bytes_requested"] / delivered) if delivered else None
        d["fetch_threads"] = self.fetch_threads
        d["round_trip_ms"] = None if self.round_trip_s is None else 1e3 * self.round_trip_s
        d["shards_open_small_buffers"] = len(self._small)
        if self.cache is not None:
            d["cache"] = self.cache.diagnostics()
        return d
