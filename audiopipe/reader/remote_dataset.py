"""ShardDataset over a shard set on object storage (s3://bucket/prefix): the same batches as the local folder,
read by byte range.

The layout under the prefix is the local folder's (manifest.json, index.arrow, shard-*.arrow). Opening reads
the manifest and the length index whole (both small, the index checked against the manifest's sha256), then
checks every shard as the local scan does, from its size (HEAD) and its Arrow footer and record-batch header
(two ranged GETs), on a thread pool. A shard's row payload is never downloaded whole for random access:
- the first time a shard is read, its small buffers (feature offsets and frame counts, the text column) are
  fetched, a few KB a shard (ipc_layout.py says where they lie);
- a batch's rows are fetched by byte range, each row's values being one contiguous range of its column
  (adjacent rows in one request), many requests at once from a thread pool;
- the rows of the batches to come are fetched ahead: the sampler announces them (`read_ahead` batches early,
  on the read-ahead thread the local reader uses for madvise), so the step finds them fetched already.
With `cache_dir`, shards are also downloaded whole in the background into a bounded local cache
(shard_cache.py) and read from there by mmap once complete: later epochs send no request.

Failures: a request that fails is retried with backoff (storage/s3_ranges.py), so a server restart of a few
seconds costs only time; after that an ObjectStoreError names the URL. A shard whose object is missing, of
another size, or unreadable is corrupt as a local one is (CorruptShardError, or skipped at open with
on_corrupt="skip"). A DataLoader worker (fork) opens its own client, thread pool and counters.
"""

from __future__ import annotations

import hashlib
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

from audiopipe.collate.rows import Rows
from audiopipe.index.lengths import INDEX_NAME, LengthIndex
from audiopipe.reader import integrity, ipc_layout
from audiopipe.reader.arrow_dataset import ShardDataset, _META_COLUMNS, _meta_reader
from audiopipe.reader.errors import CorruptShardError
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
    """A shard's schema and where each column's buffers lie in the object (no row payload read).

    Network failures propagate as they are (ObjectStoreError, ObjectChanged); any failure to parse the bytes
    (a garbled footer or header, whatever pyarrow or the flatbuffer walker trips on) is a LayoutError."""

    def __init__(self, reader: RangeReader, url: S3URL, size: int):
        _, tail = reader.read_tail(url, _TAIL, expect_size=size)
        flen = _parsed(ipc_layout.footer_length, tail[-ipc_layout.TRAILER:])
        if flen + ipc_layout.TRAILER > size:
            raise ipc_layout.LayoutError(f"footer length {flen} exceeds the file")
        if flen + ipc_layout.TRAILER > len(tail):
            tail = reader.read(url, size - flen - ipc_layout.TRAILER, flen + ipc_layout.TRAILER, size)
        start = size - len(tail)
        footer = tail[len(tail) - ipc_layout.TRAILER - flen:len(tail) - ipc_layout.TRAILER]
        self.schema = _parsed(lambda: pa.ipc.open_file(pa.PythonFile(_TailFile(size, start, tail), mode="r")).schema)
        blocks = _parsed(ipc_layout.record_batch_blocks, footer)
        if len(blocks) != 1:
            raise ipc_layout.LayoutError(f"{len(blocks)} record batches; an audiopipe shard has one")
        b = blocks[0]
        if b.offset < 0 or b.metadata_length <= 0 or b.offset + b.metadata_length + b.body_length > size:
            raise ipc_layout.LayoutError("record batch block outside the file")
        if b.offset >= start:
            head = tail[b.offset - start:b.offset - start + b.metadata_length]
        else:
            head = reader.read(url, b.offset, b.metadata_length, size)
        self.batch = _parsed(ipc_layout.batch_layout, b, head)
        self.columns = _parsed(ipc_layout.columns, self.schema, self.batch)

    @property
    def rows(self) -> int:
        return self.batch.rows


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
    """Ranged GETs on a thread pool: submitted ahead (prefetch) or on demand, taken once by the batch.

    Prefetched ranges wait in `pending` until a batch takes them; beyond `max_pending` bytes the oldest are
    dropped (a pass abandoned midway must not keep its read-ahead forever), and fetched again if asked for.
    """

    def __init__(self, reader: RangeReader, threads: int, max_pending: int):
        self.reader, self.max_pending, self.pid = reader, max_pending, os.getpid()
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="audiopipe-s3")
        self.lock = threading.Lock()
        self.pending: OrderedDict[tuple, tuple[Future, int, int]] = OrderedDict()
        self.pending_bytes = 0
        # Ranges a batch fetched itself because their read-ahead had not come yet (a busy read-ahead thread):
        # the late read-ahead of each is skipped once instead of fetching it a second time.
        self.overtaken: OrderedDict[tuple, None] = OrderedDict()
        self.stats = {"bytes_delivered": 0, "ranges_taken": 0, "ranges_prefetched": 0, "ranges_waited": 0,
                      "ranges_dropped": 0, "ranges_late": 0, "wait_s": 0.0}

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
                if r[1] <= 0 or key in self.pending:
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

    def take(self, url: S3URL, size: int, ranges: Sequence[tuple[int, int]],
             payload: bool = True) -> list[bytes | memoryview]:
        """The bytes of each range, waiting for those still in flight and fetching the rest now. payload:
        count them as rows delivered (False for a shard's small buffers read when it is opened)."""
        unique = list(dict.fromkeys(r for r in ranges if r[1] > 0))
        found: dict[tuple[int, int], tuple[Future, int, int]] = {}
        with self.lock:
            for r in unique:
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


class _RemoteColumn:
    def __init__(self, offset: int, nbytes: int, dtype: np.dtype, offsets: np.ndarray, frames: np.ndarray,
                 channels: int):
        self.offset, self.nbytes, self.dtype = offset, nbytes, dtype
        self.offsets, self.frames, self.channels = offsets, frames, channels


class _RemoteShard:
    """One shard's offsets, frame counts and text in memory; its feature values stay on the server."""

    def __init__(self, ds: "RemoteShardDataset", k: int, url: S3URL, layout: _Layout):
        entry = ds.manifest["shards"][k]
        self.name, self.url, self.size, self._ds = entry["name"], url, int(entry["arrow"]["bytes"]), ds
        cols = layout.columns
        want: list[tuple[int, int]] = []  # the small buffers: list offsets, frame counts, metadata columns
        for f in ds.features:
            for c in (f, f"{f}_frames"):
                if c not in cols:
                    raise CorruptShardError(f"shard {self.name} ({url}) has no column {c!r}")
            want += [cols[f].buffers[1], cols[f"{f}_frames"].buffers[1]]
        meta = [c for c in ds.shard_meta_columns if c in cols and cols[c].field.type.num_fields == 0]
        for c in meta:
            want += cols[c].buffers
        ranges = [r for r in dict.fromkeys(want) if r[1] > 0]
        data = ds.fetcher().take(url, self.size, ranges, payload=False) if ranges else []
        got = {r: bytes(d) for r, d in zip(ranges, data)}
        got.update({r: b"" for r in want if r[1] <= 0})
        rows = layout.rows
        self.columns: dict[str, _RemoteColumn] = {}
        for f in ds.features:
            values_type = cols[f].field.type.value_type
            dtype = np.dtype(values_type.to_pandas_dtype())
            offsets = np.frombuffer(got[cols[f].buffers[1]], dtype=np.int64)
            frames = np.frombuffer(got[cols[f"{f}_frames"].buffers[1]], dtype=np.int32)
            voff, vlen = cols[f].buffers[3]
            ch = ds.channels.get(f, 0)
            if (offsets.size != rows + 1 or frames.size != rows or offsets[-1] * dtype.itemsize > vlen
                    or (np.diff(offsets) != np.maximum(ch, 1) * frames).any()):
                raise CorruptShardError(f"shard {self.name} ({url}): column {f} offsets do not match frame counts "
                                        f"(corrupted)")
            self.columns[f] = _RemoteColumn(voff, vlen, dtype, offsets, frames, ch)
        self.meta: dict[str, pa.ChunkedArray] = {}
        for c in meta:
            (length, nulls), bufs = cols[c].nodes[0], cols[c].buffers
            arr = pa.Array.from_buffers(cols[c].field.type, length,
                                        [pa.py_buffer(got[b]) if b[1] > 0 else None for b in bufs], null_count=nulls)
            self.meta[c] = pa.chunked_array([arr])
        self._meta_get = {c: _meta_reader(col) for c, col in self.meta.items()}

    def check(self) -> None:
        """Nothing to check locally: a changed object shows as a failed or short read (ObjectChanged)."""

    def close(self) -> None:
        pass

    def ranges(self, feature: str, rows: np.ndarray) -> list[tuple[int, int]]:
        c = self.columns[feature]
        size = c.dtype.itemsize
        starts = c.offset + c.offsets[rows] * size
        ends = c.offset + c.offsets[rows + 1] * size
        return list(zip(starts.tolist(), (ends - starts).tolist()))

    def willneed(self, rows: np.ndarray) -> None:
        """Start fetching these rows' values (all features) on the thread pool; returns at once."""
        fetcher = self._ds.fetcher()
        for f in self.columns:
            fetcher.prefetch(self.url, self.size, self.ranges(f, rows))

    def rows(self, feature: str, rows: np.ndarray, positions: np.ndarray) -> Rows:
        """The rows' values fetched (or taken from the read-ahead) into one buffer, in batch order."""
        c = self.columns[feature]
        try:
            chunks = self._ds.fetcher().take(self.url, self.size, self.ranges(feature, rows))
        except ObjectChanged as e:
            raise CorruptShardError(f"shard {self.name} ({self.url}) changed on the server while training: "
                                    f"{integrity.first_line(e)}") from e
        counts = np.diff(c.offsets)[rows].astype(np.int64)
        values = np.frombuffer(b"".join(chunks), dtype=c.dtype)
        starts = np.zeros(rows.size, dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        return Rows(values, starts, c.frames[rows].astype(np.int64), positions)

    def meta_values(self, column: str, rows: np.ndarray) -> list[Any]:
        return self._meta_get[column](rows)


class RemoteShardDataset(ShardDataset):
    """ShardDataset whose shards are objects under an s3:// prefix (see the module docstring).

    cache_dir / max_cache_bytes: the optional local cache of whole shards (shard_cache.py).
    fetch_threads: concurrent ranged GETs per process. max_pending_bytes: read-ahead kept waiting for its batch.
    settings / retry: the client's attempts and timeouts, and the retries on top of them (storage/).
    The other arguments are ShardDataset's.
    """

    def __init__(self, url: str, features: Iterable[str] = ("mel",), *, expect: dict[str, str] | None = None,
                 verify: str = "size", meta_columns: Sequence[str] = _META_COLUMNS, on_corrupt: str = "fail",
                 max_open: int = 128, check_shards: bool = True, cache_dir: str | os.PathLike[str] | None = None,
                 max_cache_bytes: int | None = None, fetch_threads: int = 16, max_pending_bytes: int = 512 << 20,
                 settings: S3Settings | None = None, retry: RetryPolicy | None = None):
        if not isinstance(fetch_threads, int) or fetch_threads < 1:
            raise ValueError(f"fetch_threads must be a positive integer, got {fetch_threads!r}")
        self.reader = RangeReader(settings, retry)
        self.fetch_threads, self.max_pending_bytes = fetch_threads, max_pending_bytes
        self._fetcher: _Fetcher | None = None
        self._layouts: dict[int, _Layout] = {}
        if cache_dir is None and max_cache_bytes is not None:
            raise ValueError("max_cache_bytes needs cache_dir (the folder of the local shard cache)")
        if cache_dir is not None and max_cache_bytes is None:
            raise ValueError("cache_dir needs max_cache_bytes (the most the cache may hold on disk)")
        self.cache = ShardCache(cache_dir, max_cache_bytes, self.reader) if cache_dir is not None else None
        super().__init__(url, features, expect=expect, verify=verify, meta_columns=meta_columns,
                         on_corrupt=on_corrupt, max_open=max_open, check_shards=check_shards)
        # Index columns (id, speaker, duration) come from the index; only the rest is fetched from the shards.
        self.shard_meta_columns = [c for c in self.meta_columns if c not in self.index.table.column_names]
        self._hint_always = True  # a fetched range is consumed by its batch: announce every batch, every epoch

    # ---- where the shards are -------------------------------------------------------------------------

    def _root(self, shards_dir: str | Path) -> S3URL:  # type: ignore[override]
        return parse_s3(shards_dir)

    def _read_manifest(self) -> dict[str, Any]:
        return read_manifest(str(self.root))

    def _open_index(self) -> LengthIndex:
        url = self.root.child(INDEX_NAME)
        try:
            data = self.reader.read_object(url)
        except ObjectChanged as e:
            raise FileNotFoundError(f"{url} not found: is {self.root} an audiopipe shard prefix? ({e})") from e
        want = (self.manifest.get("index") or {}).get("sha256")
        if want and hashlib.sha256(data).hexdigest() != want:
            raise CorruptShardError(f"{url} fails the manifest's sha256 check: corrupted or from another run")
        return LengthIndex(pa.ipc.open_file(pa.BufferReader(data)).read_all())

    def fetcher(self) -> _Fetcher:
        f = self._fetcher
        if f is None or f.pid != os.getpid():  # none yet, or forked: threads stay in the parent
            f = self._fetcher = _Fetcher(self.reader, self.fetch_threads, self.max_pending_bytes)
        return f

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_fetcher"] = None
        return state

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
        return reason

    def _scan(self) -> None:
        hashes = {f: spec["hash"] for f, spec in self.manifest["features"].items()}
        shards = self.manifest["shards"]
        # A server that stays down is an ObjectStoreError from here, never a shard taken for corrupt.
        with ThreadPoolExecutor(min(self.fetch_threads, max(len(shards), 1))) as pool:
            reasons = list(pool.map(lambda k: self._check_remote(k, hashes), range(len(shards))))
        bad = [integrity.CorruptShard(k, shards[k]["name"], str(self._shard_url(k)), int(shards[k]["rows"]), r)
               for k, r in enumerate(reasons) if r is not None]
        self._hashed = self.verify == "checksum"
        self.reader.forget()  # each shard's size is asked again when it is first read (a change since is caught)
        if bad and self.on_corrupt == "fail":
            raise CorruptShardError(
                f"{self.root}: {integrity.summary(bad, len(shards))}; rebuild them (`audiopipe verify` lists every "
                f"problem) or pass on_corrupt='skip' (--on-corrupt skip) to train without their rows")
        self._skip(bad)

    # ---- shards ---------------------------------------------------------------------------------------

    def _map(self, k: int):  # type: ignore[override]
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
        try:
            return _RemoteShard(self, k, url, self._layout(k))
        except CorruptShardError:
            raise
        except ObjectChanged as e:
            raise CorruptShardError(f"shard {entry['name']} ({url}) changed on the server since the open: "
                                    f"{integrity.first_line(e)}") from e
        except (ipc_layout.LayoutError, pa.lib.ArrowException, ValueError) as e:  # bytes that do not parse
            raise CorruptShardError(f"shard {entry['name']} ({url}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e

    def _shard(self, k: int):  # type: ignore[override]
        sh = super()._shard(k)
        if self.cache is not None and isinstance(sh, _RemoteShard):
            entry = self.manifest["shards"][k]
            why = self.cache.failed.get(self.cache.key(entry))
            if why is not None:  # its whole bytes were seen not to match the manifest: stop reading it
                raise CorruptShardError(f"shard {entry['name']}: {why}")
            # Its download finished: read the local copy from now on (the next call maps it).
            if self.cache.ready(entry) is not None:
                with self._lock:
                    if self._open.get(k) is sh:
                        del self._open[k]
                sh = super()._shard(k)
        return sh

    def diagnostics(self) -> dict[str, Any]:
        """ShardDataset's, plus this process's requests: count, bytes asked for and delivered, retries, and
        how many ranges the read-ahead had fetched (or started) before their batch asked for them."""
        d = super().diagnostics()
        f = self._fetcher if self._fetcher is not None and self._fetcher.pid == os.getpid() else None
        stats = dict(f.stats) if f else {}
        d.update(self.reader.counters(), **stats)
        delivered = stats.get("bytes_delivered", 0)
        d["bytes_requested_per_byte_delivered"] = (d["bytes_requested"] / delivered) if delivered else None
        if self.cache is not None:
            d["cache"] = self.cache.diagnostics()
        return d
