"""Reading one WebDataset tar of a shard folder, sample by sample, with every check the stream makes.

Plain `tarfile` in stream mode reads the members (webdataset's own tar iterators are internal modules and
change between releases); `webdataset.gopen`, a public function, opens the URL, so `pipe:` commands and
http(s) work as they do for webdataset. A tar is checked against the index as it is read: every sample's key
and row, the byte count to its end, and optionally its checksum.
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import soundfile as sf
import webdataset

from audiopipe.errors import InvalidValue
from audiopipe.reader.errors import ShardError
from audiopipe.shard.checksum import Checksum, new_hash


class _CheckedStream:
    """A read-only file object that counts (and optionally hashes) the bytes tarfile pulls through it."""

    BLOCK = 1 << 20  # tarfile asks for 10 KB at a time; one large read serves ~100 of those

    def __init__(self, raw: Any, algorithm: str | None):
        self.raw = raw
        self.bytes = 0
        self.sha = new_hash(algorithm) if algorithm else None
        self._buf = memoryview(b"")

    def _fill(self) -> bool:
        data = self.raw.read(self.BLOCK)
        if not data:
            return False
        self.bytes += len(data)
        if self.sha is not None:
            self.sha.update(data)
        self._buf = memoryview(data)
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [bytes(self._buf)]
            self._buf = memoryview(b"")
            while self._fill():
                parts.append(bytes(self._buf))
            self._buf = memoryview(b"")
            return b"".join(parts)
        if not self._buf and not self._fill():
            return b""
        out, self._buf = self._buf[:n], self._buf[n:]
        return bytes(out)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self.raw.close()


def split_member(name: str) -> tuple[str, str] | None:
    """(sample key, extension) of a tar member, as webdataset splits them: the key ends at the first dot of the
    file name (folders may hold dots), the extension is the rest, lower-cased; None for a name with neither."""
    folder, slash, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not stem or not dot:
        return None
    return folder + slash + stem, ext.lower()


def _samples(stream: _CheckedStream, wanted: Callable[[str], bool]) -> Iterator[dict[str, Any]]:
    """Consecutive members with the same key make one sample {"__key__": key, ext: bytes, ...}."""
    tar = tarfile.open(fileobj=stream, mode="r|*")  # opened at the first next(): a bad header is a read error
    sample: dict[str, Any] | None = None
    for member in tar:
        parts = split_member(member.name) if member.isreg() else None
        tar.members = []  # stream mode keeps every TarInfo otherwise: memory grows with the tar
        if parts is None:
            continue
        key, ext = parts
        if sample is not None and key != sample["__key__"]:
            yield sample
            sample = None
        if sample is None:
            sample = {"__key__": key}
        if ext in sample:
            raise InvalidValue(f"{member.name}: a second member with extension {ext!r} for sample {key!r}")
        if wanted(ext):  # unwanted members are skipped by the next read, never copied
            sample[ext] = tar.extractfile(member).read()
    if sample is not None:
        yield sample


class TarReader:
    """The samples of one tar in row order, checked against the index; `take(row)` skips to that row."""

    def __init__(self, url: str, name: str, rows: int, expect_bytes: int, expect: Checksum | None,
                 key_of: Callable[[int], str], wanted: Callable[[str], bool]):
        """expect: the checksum to hash the bytes for and check at the end (None: sizes only).
        wanted(extension): whether a member is read (the others are skipped unread)."""
        self.url, self.name, self.rows = url, name, rows
        self.expect_bytes, self.expect = expect_bytes, expect
        self.key_of = key_of
        self.next_row = 0
        try:
            self.stream = _CheckedStream(webdataset.gopen(url), expect.algorithm if expect else None)
        except Exception as e:  # gopen raises whatever its scheme's opener raises
            raise ShardError(f"tar {name} ({url}) cannot be opened: {type(e).__name__}: {e}") from e
        self.samples = _samples(self.stream, wanted)

    def take(self, row: int) -> dict[str, Any]:
        while True:
            if self.next_row >= self.rows:
                raise ShardError(f"tar {self.name} ({self.url}): row {row} asked for, but it has {self.rows} rows")
            try:
                sample = next(self.samples)
            except StopIteration:
                raise ShardError(f"tar {self.name} ({self.url}) ends after {self.next_row} of {self.rows} samples: "
                                 "truncated; run `audiopipe verify`") from None
            except Exception as e:  # tarfile.ReadError, EOFError, a pipe's exit status, ...
                raise ShardError(f"tar {self.name} ({self.url}) is unreadable after {self.next_row} samples: "
                                 f"{type(e).__name__}: {e}; run `audiopipe verify`") from e
            r = self.next_row
            self.next_row += 1
            want = self.key_of(r)
            if sample["__key__"] != want:
                raise ShardError(f"tar {self.name} ({self.url}): sample {r} is {sample['__key__']!r}, the index says "
                                 f"{want!r}: the tar does not belong to this index (corrupted or replaced)")
            if r == row:
                return sample

    def finish(self) -> None:
        """Read to the end and check size and hash: catches a truncated or altered tail."""
        try:
            for _ in self.samples:
                pass
            self.stream.drain()
        except Exception as e:
            raise ShardError(f"tar {self.name} ({self.url}) is unreadable at its end: {type(e).__name__}: {e}") from e
        finally:
            try:
                self.stream.close()
            except Exception as e:  # a pipe: command that failed reports it at close
                raise ShardError(f"tar {self.name} ({self.url}): {type(e).__name__}: {e}") from e
        if self.stream.bytes != self.expect_bytes:
            raise ShardError(f"tar {self.name} ({self.url}) is {self.stream.bytes} bytes, the manifest says "
                             f"{self.expect_bytes}: truncated or replaced")
        if self.expect is not None and self.stream.sha.hexdigest() != self.expect.hexdigest:
            raise ShardError(f"tar {self.name} ({self.url}) fails its {self.expect.algorithm} checksum: corrupted; "
                             "rebuild it")


def decode_sample(sample: dict[str, Any], gi: int, features: Sequence[str], channels: Mapping[str, int],
                  where: str) -> dict[str, Any]:
    """The item ShardDataset gives for this tar sample, every array checked against the frames in its json."""
    try:
        meta = json.loads(sample["json"])
        item: dict[str, Any] = {"id": meta["id"], "speaker": meta["speaker"], "text": meta["text"],
                                "duration": meta["duration"], "index": gi}
    except (KeyError, ValueError, UnicodeDecodeError) as e:
        raise ShardError(f"{where}: unreadable json ({type(e).__name__}: {e})") from e
    for f in features:
        try:
            if f == "pcm" and "flac" in sample:
                arr = sf.read(io.BytesIO(sample["flac"]), dtype="int16")[0]
            else:
                arr = np.load(io.BytesIO(sample[f"{f}.npy"]), allow_pickle=False)
        except KeyError:
            raise ShardError(f"{where} has no member for feature {f!r}") from None
        except Exception as e:  # np.load / soundfile on corrupted bytes: ValueError, RuntimeError, EOFError
            raise ShardError(f"{where}: feature {f} is undecodable ({type(e).__name__}: {e})") from e
        ch = channels.get(f, 0)
        frames = meta.get(f"{f}_frames")
        shape_ok = arr.ndim == (2 if ch else 1) and (not ch or arr.shape[0] == ch)
        if not shape_ok or arr.shape[-1] != frames:
            raise ShardError(f"{where}: feature {f} has shape {list(arr.shape)}, expected "
                             f"{[ch, frames] if ch else [frames]} (corrupted)")
        item[f] = arr
    return item
