"""Audio stored as a member of an uncompressed tar (Emilia's WebDataset distribution), read in place.

An uncompressed tar keeps each member's bytes contiguous, so a member is a byte range of the tar file: the
header is read and the audio decoded through a bounded view of that range, without unpacking anything. A
member utterance carries `extra["tar_member"]`, `extra["member_offset"]` and `extra["member_size"]`.
The checks are those of `load_audio`: header limits, decoding errors, truncation (with MP3's slack), NaN,
duration and silence.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import soundfile as sf

from audiopipe.decode import declared
from audiopipe.decode.audio import DecodeLimits, Header, RejectError, decode_open, measure_frames
from audiopipe.storage import guard


class MemberView(io.RawIOBase):
    """A read-only, seekable file over bytes [offset, offset + size) of another file."""

    def __init__(self, path: str, offset: int, size: int):
        super().__init__()
        self._f = guard.open_regular(path, "tar")  # a tar swapped for a pipe since discovery must not block
        self._start, self._size, self._pos = int(offset), int(size), 0

    def __repr__(self) -> str:
        # libsndfile's errors name the file by its repr: the member's place, never an address (which would
        # differ between identical runs, in rejects.jsonl).
        return f"<tar member at byte {self._start}, {self._size} bytes>"

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        self._pos = max(0, min(self._size, base + pos))
        return self._pos

    def readinto(self, b) -> int:
        n = min(len(b), self._size - self._pos)
        if n <= 0:
            return 0
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        b[:len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


def is_member(u: Any) -> bool:
    return bool(u.extra) and "tar_member" in u.extra


def member_view(u: Any) -> MemberView:
    return MemberView(u.path, u.extra["member_offset"], u.extra["member_size"])


def member_info(path: str, offset: int, size: int) -> Any:
    """The header of a tar member (a Header), or RejectError (empty, unreadable). A stream whose header gives no
    length is measured by decoding it, as audiopipe.decode.audio.read_info does."""
    if size <= 0:
        raise RejectError("empty", "the tar member is 0 bytes")
    try:
        with MemberView(path, offset, size) as view, sf.SoundFile(view) as f:
            frames = measure_frames(f) if declared.unknown(f.frames) else f.frames
            return Header(f.samplerate, frames, f.channels, f.format, f.subtype)
    except guard.Refused as e:  # the tar itself is gone or no longer a regular file
        raise RejectError(e.reason, e.detail) from None
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        raise RejectError("unreadable", f"libsndfile cannot read the member's header ({size} bytes): {e}") from None


def load_member(u: Any, limits: DecodeLimits | None = None) -> tuple[np.ndarray, int]:
    """Decode a tar member to (float32 mono, rate) with load_audio's checks (the length its header declares
    included)."""
    limits = limits or DecodeLimits()
    size = int(u.extra["member_size"])
    member_info(u.path, u.extra["member_offset"], size)  # the refusals of a header that cannot be read
    with member_view(u) as view, sf.SoundFile(view) as f, member_view(u) as raw:
        return decode_open(f, raw, size, limits, what="tar member")
