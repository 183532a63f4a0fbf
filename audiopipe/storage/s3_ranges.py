"""Byte ranges of s3 objects: retried with backoff, bounded in time, counted, one client per process.

pyarrow's client already retries 5xx, throttling and dropped connections with backoff (`S3Settings.attempts`);
what still fails (a server down for longer, a connection reset mid-body) is tried again here `retries` times with
exponential backoff before it becomes an `ObjectStoreError` naming the URL: an error after a bounded time, never
a hang, and a restart of a few seconds is invisible to the caller.

Every request is counted (requests, bytes asked for, retries), so a reader can report how many bytes it asked
for per byte it delivered. Counters and open handles belong to the process that made them: a forked child
(a DataLoader worker) starts its own, with its own client (audiopipe.storage.s3.filesystem is per process).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from audiopipe.after_fork import reset_after_fork
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, S3URL, filesystem


class ObjectChanged(ObjectStoreError):
    """The object is not the size the caller was told (truncated, replaced) or is gone."""


# Failures no retry can fix: the object or bucket is missing, or access is refused.
_PERMANENT = ("NoSuchKey", "NoSuchBucket", "HTTP status 404", "HTTP status 403", "AccessDenied", "Path does not exist")


def _permanent(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, FileNotFoundError) or any(m in text for m in _PERMANENT)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries on top of the client's own: `retries` more tries, sleeping backoff * 2**i (capped at max_sleep)
    between them. With the default S3Settings (6 attempts, ~16 s of the client's own backoff against a server
    that refuses connections), a server that stays down is an error after about 50 s; one that is back within
    that time costs only the wait."""

    retries: int = 2
    backoff: float = 1.0
    max_sleep: float = 4.0


class RangeReader:
    """read(url, start, length) -> exactly those bytes, or an ObjectStoreError after the retries.

    Thread-safe: many reads run at once from a thread pool (pyarrow's client is thread-safe; each read_at is
    one ranged GET). `expect_size` given to open() is checked against the object's size, so an object replaced
    by one of another size is reported as ObjectChanged instead of being read as if nothing happened.
    """

    def __init__(self, settings: S3Settings | None = None, policy: RetryPolicy | None = None):
        self.settings = settings or S3Settings()
        self.policy = policy or RetryPolicy()
        self._reset()
        reset_after_fork(self, type(self)._reset)  # forked: handles and counters are the parent's

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[str, Any] = {}
        self.requests = 0  # GETs and HEADs sent (not counting the client's own retries)
        self.bytes_requested = 0
        self.retries = 0

    def __getstate__(self) -> dict[str, Any]:  # spawned workers: a fresh client and counters
        return {"settings": self.settings, "policy": self.policy}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        reset_after_fork(self, type(self)._reset)  # forked: handles and counters are the parent's

    def counters(self) -> dict[str, int]:
        return {"requests": self.requests, "bytes_requested": self.bytes_requested, "retries": self.retries}

    def _count(self, requests: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_requested += nbytes
            self.retries += retries

    def _retrying(self, url: S3URL, what: str, fn):
        p = self.policy
        for attempt in range(p.retries + 1):
            try:
                return fn()
            except ObjectStoreError:
                raise
            except OSError as e:
                if _permanent(e):
                    raise ObjectChanged(f"{url}: {what} failed: {_first_line(e)}") from e
                if attempt == p.retries:
                    raise ObjectStoreError(f"{url}: {what} failed after {p.retries + 1} tries "
                                           f"(each with the client's own retries): {_first_line(e)}") from e
                self._count(retries=1)
                with self._lock:  # a handle whose connection broke is opened afresh
                    self._handles.pop(url.path, None)
                time.sleep(min(p.backoff * 2 ** attempt, p.max_sleep))

    def _handle(self, url: S3URL, expect_size: int | None):
        with self._lock:
            h = self._handles.get(url.path)
        if h is None:
            self._count(requests=1)  # opening sends a HEAD (the size)
            h = filesystem(self.settings).open_input_file(url.path)
            with self._lock:
                self._handles[url.path] = h
        if expect_size is not None and h.size() != expect_size:
            raise ObjectChanged(f"{url} is {h.size()} bytes, the manifest says {expect_size}: replaced or "
                                f"truncated on the server")
        return h

    def forget(self) -> None:
        """Drop the open handles: the next read of each object sends a HEAD again, so an object replaced by one
        of another size since is caught (ObjectChanged) instead of trusted on an old size."""
        with self._lock:
            self._handles.clear()

    def size(self, url: S3URL) -> int:
        """The object's size (one HEAD), ObjectChanged when it does not exist."""
        return self._retrying(url, "HEAD", lambda: self._handle(url, None).size())

    def read(self, url: S3URL, start: int, length: int, expect_size: int | None = None) -> bytes:
        if length <= 0:
            return b""

        def get() -> bytes:
            h = self._handle(url, expect_size)
            self._count(requests=1, nbytes=length)
            data = h.read_at(length, start)
            if len(data) != length:
                raise ObjectChanged(f"{url}: asked for bytes {start}..{start + length}, got {len(data)}: the "
                                    f"object is shorter than expected (truncated or replaced on the server)")
            return data

        return self._retrying(url, f"read of bytes {start}..{start + length}", get)

    def read_tail(self, url: S3URL, length: int, expect_size: int | None = None) -> tuple[int, bytes]:
        """(object size, its last `length` bytes or all of it when shorter)."""
        size = self._retrying(url, "HEAD", lambda: self._handle(url, expect_size).size())
        n = min(length, size)
        return size, self.read(url, size - n, n, expect_size)

    def read_object(self, url: S3URL) -> bytes:
        """A whole (small) object: manifest.json, index.arrow."""
        size = self.size(url)
        return self.read(url, 0, size, size)
