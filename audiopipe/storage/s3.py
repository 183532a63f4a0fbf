"""s3:// URLs -> pyarrow's S3 client, configured the way every AWS tool is, and nothing hard-coded.

- Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, or ~/.aws (the SDK's default chain).
- Region: AWS_REGION or AWS_DEFAULT_REGION.
- Endpoint of an S3-compatible server (MinIO, Ceph, R2, a local test server): AWS_ENDPOINT_URL_S3 or
  AWS_ENDPOINT_URL, e.g. http://127.0.0.1:9000. pyarrow is told it explicitly because its bundled SDK does not
  read those variables in every version.

pyarrow's client already retries throttling, 5xx and dropped connections with backoff; `S3Settings` sets how many
attempts and the timeouts, so a dead server ends in an error after a bounded time instead of a hang. Callers wrap
what still fails in `ObjectStoreError`, which names the URL and the operation.

Only s3:// is supported; every other scheme is refused in one line by `require_local_or_s3`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from audiopipe.after_fork import reset_after_fork
from audiopipe.errors import AudiopipeError
from audiopipe.storage.paths import UnsupportedURL, url_scheme

SCHEME = "s3"


class ObjectStoreError(AudiopipeError, OSError):
    """An object-store operation that failed after the client's retries (or a missing bucket/object)."""


@dataclass(frozen=True)
class S3URL:
    """s3://bucket/key, with the key normalised to no leading or trailing slash ("" for the bucket's root)."""

    bucket: str
    key: str = ""

    @property
    def path(self) -> str:
        """The "bucket/key" form pyarrow's file systems take."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    def child(self, *parts: str) -> "S3URL":
        key = "/".join(p.strip("/") for p in (self.key, *parts) if p.strip("/"))
        return S3URL(self.bucket, key)

    def __truediv__(self, part: str) -> "S3URL":  # as with a Path: root / "shard-00000.arrow"
        return self.child(part)

    def __str__(self) -> str:
        return f"s3://{self.path}"


def is_s3(value: str | os.PathLike[str]) -> bool:
    return url_scheme(value) == SCHEME


def parse_s3(value: str | os.PathLike[str]) -> S3URL:
    """'s3://bucket/a/b/' -> S3URL('bucket', 'a/b'). Also takes the one-slash form pathlib leaves ('s3:/bucket')."""
    text = os.fspath(value)
    if not is_s3(text):
        raise UnsupportedURL(f"{text}: not an s3:// URL")
    rest = text.split(":", 1)[1]
    rest = rest[2:] if rest.startswith("//") else rest[1:]  # "//" of a URL, or the one slash pathlib leaves
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise UnsupportedURL(f"{text}: an s3:// URL needs a bucket (s3://bucket/prefix)")
    return S3URL(bucket, key.strip("/"))


def require_local_or_s3(value: str | os.PathLike[str], what: str) -> str:
    """`value` as a string if it is a local path or an s3:// URL; any other scheme is refused naming `what`."""
    text = os.fspath(value)
    scheme = url_scheme(text)
    if scheme is not None and scheme != SCHEME:
        raise UnsupportedURL(f"{what} {text}: {scheme}:// is not supported; give s3:// (any S3-compatible "
                             f"endpoint, set AWS_ENDPOINT_URL) or a local or mounted folder")
    return text


@dataclass(frozen=True)
class S3Settings:
    """How hard the client tries before an operation fails. The defaults ride out a server restart of a few
    seconds; a server that stays down fails in about attempts x (connect_timeout + backoff)."""

    attempts: int = 6
    connect_timeout: float = 3.0
    request_timeout: float = 30.0


def _endpoint() -> tuple[str | None, str]:
    """(host:port or None, scheme) from AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL."""
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if not url:
        return None, "https"
    scheme, sep, host = url.partition("://")
    if not sep:
        return url.rstrip("/"), "https"
    return host.rstrip("/"), scheme


def filesystem(settings: S3Settings | None = None):
    """A pyarrow S3FileSystem from the environment. One per (settings, environment, IO threads) per process: the
    client is thread-safe and keeps its connection pool, so every reader and writer of the process shares it. A
    forked child (a DataLoader worker) gets its own: a connection pool must not be shared across fork."""
    s = settings or S3Settings()
    env = tuple(os.environ.get(k) for k in (
        "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION",
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"))
    import pyarrow as pa

    # The client keeps at most max(pyarrow's IO threads, 25) connections: a reader that raised the IO threads
    # to keep more requests in flight gets a client with the larger pool.
    return _CLIENTS.get((s, env, pa.io_thread_count()))


class _Clients:
    """This process's S3 clients, the 8 most recently made. A forked child keeps its parent's out of use (their
    connections and threads are the parent's) and out of harm (destroying them in the child could wait on threads
    that are not there)."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, Any] = {}
        self._parents: list[dict[tuple, Any]] = []

    def get(self, key: tuple) -> Any:
        fs = self._by_key.get(key)
        if fs is None:
            fs = self._by_key.setdefault(key, _new_filesystem(key[0]))  # two threads at once: one client wins
            while len(self._by_key) > 8:
                self._by_key.pop(next(iter(self._by_key)))
        return fs

    def forget_parents(self) -> None:
        self._parents.append(self._by_key)
        self._by_key = {}


_CLIENTS = _Clients()
reset_after_fork(_CLIENTS, _Clients.forget_parents)


def _new_filesystem(s: S3Settings):
    from pyarrow import fs as pafs

    endpoint, scheme = _endpoint()
    kw: dict = {}
    if endpoint:
        kw.update(endpoint_override=endpoint, scheme=scheme)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        kw["region"] = region
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if key and secret:  # otherwise the SDK's default chain (~/.aws, instance profile) decides
        kw.update(access_key=key, secret_key=secret, session_token=os.environ.get("AWS_SESSION_TOKEN"))
    return pafs.S3FileSystem(
        connect_timeout=s.connect_timeout, request_timeout=s.request_timeout,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=s.attempts), **kw)
