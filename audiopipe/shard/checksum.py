"""Checksums of shard files: taken while writing, checked by streaming the file back.

A shard file's entry in a done record or the manifest names its algorithm by its key:
{"path": ..., "bytes": ..., "xxh3_128": "<hex>"} (what audiopipe writes) or {..., "sha256": "<hex>"} (what
shards made before xxh3 carry; still read and checked). `checksum_of(entry)` says which.

Why xxh3-128 and not sha256: the checksum is there to catch corruption (a truncated upload, a flipped bit on a
disk, a file replaced by another run's), and xxh3-128 misses an accidental change with probability 2^-128:
as negligible as sha256's 2^-256 (rsync 3.2 checks its transfers with the same hash). It runs at ~47 GB/s on one core here against
sha256's 1.7 GB/s, so hashing two copies of every feature no longer costs an extraction worker ~7 % of its
time, and `audiopipe verify` or a reader's checksum check of a large corpus is bound by the disk, not the CPU.
What sha256 would add, resistance to someone crafting a colliding file, the manifest cannot give anyway:
it lies beside the shards, and whoever can rewrite a shard can rewrite it too. `--checksum sha256` keeps the
old algorithm for those who want it in their records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import xxhash

from audiopipe.errors import InvalidValue, MissingKey

# Preferred first: the key checksum_of looks for first when an entry somehow carries both.
ALGORITHMS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
DEFAULT = "xxh3_128"


def new_hash(algorithm: str = DEFAULT):
    try:
        return ALGORITHMS[algorithm]()
    except KeyError:
        raise InvalidValue(f"unknown checksum {algorithm!r}; choose one of {', '.join(ALGORITHMS)}") from None


def file_checksum(path: str | Path, algorithm: str = DEFAULT, chunk: int = 1 << 22) -> str:
    """Hex digest of a file, streamed from disk so multi-GB shards never sit in memory."""
    h = new_hash(algorithm)
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """sha256 of a file: for identities that other records keep by this name (the length index's)."""
    return file_checksum(path, "sha256", chunk)


@dataclass(frozen=True)
class Checksum:
    algorithm: str
    hexdigest: str

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def checksum_of(entry: dict[str, Any]) -> Checksum:
    """The checksum a file entry of a done record or manifest was written with."""
    for algorithm in ALGORITHMS:
        if algorithm in entry:
            return Checksum(algorithm, str(entry[algorithm]))
    raise MissingKey(f"file entry {entry.get('path', entry)!r} has no checksum (one of {', '.join(ALGORITHMS)})")


@dataclass(frozen=True)
class Digest:
    """Size and checksum of a file as written (what a done record and the manifest keep of a shard file)."""

    bytes: int
    checksum: Checksum

    def entry(self, path: str) -> dict[str, Any]:
        """The file's entry in a done record or manifest."""
        return {"path": path, "bytes": self.bytes, self.checksum.algorithm: self.checksum.hexdigest}


class HashingWriter:
    """A binary file open for writing that hashes every byte on its way to disk.

    Shard writers hand it to pyarrow (`pa.PythonFile`) and tarfile, so the checksum costs no second read of
    the file. It hashes what this process wrote, not what the disk holds: `audiopipe verify` and the readers'
    checksum check still read the file back and compare with it.
    """

    def __init__(self, path: str | Path, algorithm: str = DEFAULT) -> None:
        self._h = new_hash(algorithm)
        self._algorithm = algorithm
        self._f = open(path, "wb")
        self._n = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")  # pyarrow hands buffers, tarfile bytes: count bytes, not items
        self._f.write(view)
        self._h.update(view)
        self._n += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._n

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    @property
    def closed(self) -> bool:
        return self._f.closed

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def digest(self) -> Digest:
        return Digest(self._n, Checksum(self._algorithm, self._h.hexdigest()))
