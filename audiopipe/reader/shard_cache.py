"""A bounded local copy of shards read from object storage (make_loader's cache_dir= and max_cache_bytes=).

An entry is a whole shard, named by its checksum from the manifest (`<hex digest>.arrow`, xxh3-128, or sha256
for shards made before it): the name says which bytes
it must hold, so two prefixes sharing a shard share the entry, and a shard rebuilt upstream never matches a
stale copy. A shard is downloaded in the background the first time it is read (its rows are fetched by range
meanwhile), in chunks appended to `.<hex digest>.part`; a download cut short (a killed process) leaves the
part, and the next one resumes after its last byte. A complete part is checked against the manifest's checksum, synced
and renamed into place (the same durable rename as audiopipe/storage/atomic.py), so an entry under its final
name is always whole and verified. One process downloads a given shard at a time (a flock on the part).

Reading an entry is mapping a local file, exactly as for a local shard folder, so a second epoch over cached
shards sends no request at all. An entry of the wrong size (truncated on disk) is deleted and fetched again,
once: the threads of this process that meet it together (a batch and the look-ahead reading the next one, or two
loaders over one folder) take its lock in turn, and only the first, which still finds the truncated file,
deletes it.
The cache keeps at most `max_bytes` of entries: before one is added, the least recently used (file mtime,
touched whenever an entry is mapped) are deleted; a shard larger than the whole budget is never cached.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any

from audiopipe.after_fork import reset_after_fork
from audiopipe.errors import InvalidValue
from audiopipe.shard.checksum import checksum_of, new_hash
from audiopipe.storage.atomic import fsync_dir
from audiopipe.storage.s3 import S3URL
from audiopipe.storage.s3_ranges import RangeReader

_log = logging.getLogger(__name__)
CHUNK = 8 << 20  # bytes per ranged GET of a download

# The lock of each entry's repair, by path, for every cache of this process: two loaders over one cache_dir (an
# old one's look-ahead still reading, a new one) meet a truncated entry as two threads of one loader do.
_REPAIR_LOCKS: dict[Path, threading.Lock] = {}
_REPAIR_LOCKS_LOCK = threading.Lock()


def _repair_lock(path: Path) -> threading.Lock:
    with _REPAIR_LOCKS_LOCK:
        return _REPAIR_LOCKS.setdefault(path, threading.Lock())


def _new_repair_locks() -> None:
    """In a forked child: a lock some parent thread held at the fork would stay held there forever."""
    global _REPAIR_LOCKS, _REPAIR_LOCKS_LOCK
    _REPAIR_LOCKS, _REPAIR_LOCKS_LOCK = {}, threading.Lock()


os.register_at_fork(after_in_child=_new_repair_locks)


class ShardCache:
    def __init__(self, folder: str | os.PathLike[str], max_bytes: int, reader: RangeReader, chunk: int = CHUNK):
        if not isinstance(max_bytes, int) or max_bytes <= 0:
            raise InvalidValue(f"max_cache_bytes must be a positive number of bytes, got {max_bytes!r}")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.max_bytes, self.reader, self.chunk = max_bytes, reader, chunk
        self._reset()
        reset_after_fork(self, type(self)._reset)  # forked: the download thread stays in the parent

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue | None = None
        self._wanted: set[str] = set()  # entries (hex digests) queued or downloading in this process
        self._idle = threading.Event()
        self._idle.set()
        self.failed: dict[str, str] = {}  # hex digest -> why its download cannot be trusted (corrupt object)
        self.downloads = 0
        self.resumed_bytes = 0
        self.evictions = 0
        self.refetched = 0  # entries found truncated on disk and deleted

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "max_bytes": self.max_bytes, "reader": self.reader, "chunk": self.chunk}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_after_fork(self, type(self)._reset)  # forked: the download thread stays in the parent

    @staticmethod
    def key(entry: dict[str, Any]) -> str:
        """The name of a shard's entry: the hex digest of the checksum its manifest entry names."""
        return checksum_of(entry["arrow"]).hexdigest

    def path(self, entry: dict[str, Any]) -> Path:
        return self.folder / f"{self.key(entry)}.arrow"

    def ready(self, entry: dict[str, Any], touch: bool = False) -> Path | None:
        """The cached copy of this shard, or None. A copy of the wrong size is deleted (and so fetched again)."""
        p, want = self.path(entry), int(entry["arrow"]["bytes"])
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            return None
        if size != want:
            with _repair_lock(p):
                # Looked at again under the lock: a thread before this one may have deleted it already, or its
                # refetch may have landed; deleting either would fetch it twice.
                try:
                    size = p.stat().st_size
                except FileNotFoundError:
                    return None
                if size != want:
                    _log.warning("cache entry %s is %d bytes, expected %d: truncated on disk; fetching it again",
                                 p, size, want)
                    p.unlink(missing_ok=True)
                    self.refetched += 1
                    return None
        if touch:
            os.utime(p)  # least recently used = oldest mtime
        return p

    def request(self, url: S3URL, entry: dict[str, Any]) -> None:
        """Download this shard in the background unless it is cached, queued, failed or too big."""
        sha, size = self.key(entry), int(entry["arrow"]["bytes"])
        if size > self.max_bytes or sha in self.failed:
            return
        with self._lock:
            if sha in self._wanted or self.path(entry).exists():
                return
            self._wanted.add(sha)
            self._idle.clear()
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._loop, args=(self._queue,), daemon=True,
                                 name="audiopipe-shard-cache").start()
            self._queue.put((url, entry))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every requested download is done (tests, benchmarks); True when idle."""
        return self._idle.wait(timeout)

    def _loop(self, q: queue.SimpleQueue) -> None:
        while True:
            url, entry = q.get()
            sha = self.key(entry)
            try:
                self.download(url, entry)
            except Exception as e:  # a failed download costs only the cache: rows are still read by range
                _log.warning("could not cache %s: %s", url, e)
            finally:
                with self._lock:
                    self._wanted.discard(sha)
                    if not self._wanted:
                        self._idle.set()

    def download(self, url: S3URL, entry: dict[str, Any]) -> Path | None:
        """Fetch the shard into the cache (resuming a part left by an earlier try); the entry's path, or None
        when another process holds the download or the bytes fail the manifest's checksum."""
        final = self.path(entry)
        want = checksum_of(entry["arrow"])
        sha, size = want.hexdigest, int(entry["arrow"]["bytes"])
        part = self.folder / f".{sha}.part"
        with open(part, "ab+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return None  # another process is downloading it
            if final.exists():
                return final
            for attempt in range(2):  # a resumed part whose old bytes are bad is fetched once more from zero
                have = f.seek(0, os.SEEK_END)
                if have > size:
                    f.truncate(0)
                    have = 0
                resumed = have > 0
                self.resumed_bytes += have
                while have < size:
                    n = min(self.chunk, size - have)
                    f.write(self.reader.read(url, have, n, expect_size=size))
                    have += n
                f.flush()
                f.seek(0)
                h = new_hash(want.algorithm)
                while block := f.read(1 << 22):
                    h.update(block)
                if h.hexdigest() == sha:
                    break
                f.truncate(0)
                if not resumed:  # a fresh, whole download that fails: the object itself is bad
                    self.failed[sha] = (f"its bytes on the server fail the manifest's {want.algorithm} "
                                        f"(corrupted or replaced): {url}")
                    part.unlink(missing_ok=True)
                    return None
            os.fsync(f.fileno())
            self._make_room(size)
            os.replace(part, final)
            fsync_dir(self.folder)
        self.downloads += 1
        return final

    def _make_room(self, size: int) -> None:
        entries = []
        for p in self.folder.glob("*.arrow"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        for _, n, p in sorted(entries):
            if total + size <= self.max_bytes:
                break
            p.unlink(missing_ok=True)  # a process that has it mapped keeps reading its pages
            total -= n
            self.evictions += 1

    def diagnostics(self) -> dict[str, Any]:
        return {"cache_dir": str(self.folder), "max_cache_bytes": self.max_bytes, "downloads": self.downloads,
                "resumed_bytes": self.resumed_bytes, "evictions": self.evictions,
                "truncated_entries_refetched": self.refetched, "failed": dict(self.failed)}
