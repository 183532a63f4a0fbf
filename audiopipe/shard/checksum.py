"""sha256 of files: streamed from disk so multi-GB shards never sit in memory, or taken while writing."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class Digest:
    """Size and sha256 of a file as written (what a done record and the manifest keep of a shard file)."""

    bytes: int
    sha256: str


class HashingWriter:
    """A binary file open for writing that hashes every byte on its way to disk.

    Shard writers hand it to pyarrow (`pa.PythonFile`) and tarfile, so the checksum costs no second read of
    the file. It hashes what this process wrote, not what the disk holds: `audiopipe verify` and the readers'
    sha256 check still read the file back and compare with it.
    """

    def __init__(self, path: str | Path) -> None:
        self._f = open(path, "wb")
        self._h = hashlib.sha256()
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
        return Digest(self._n, self._h.hexdigest())
