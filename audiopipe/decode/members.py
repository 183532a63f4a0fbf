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

from audiopipe.decode.audio import DecodeLimits, RejectError, check_header, decode_checked


class MemberView(io.RawIOBase):
    """A read-only, seekable file over bytes [offset, offset + size) of another file."""

    def __init__(self, path: str, offset: int, size: int):
        super().__init__()
        self._f = open(path, "rb")
        self._start, self._size, self._pos = int(offset), int(size), 0

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
    """soundfile info of a tar member, or RejectError("unreadable", ...)."""
    if size <= 0:
        raise RejectError("empty", "the tar member is 0 bytes")
    try:
        with MemberView(path, offset, size) as view:
            return sf.info(view)
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        raise RejectError("unreadable", f"libsndfile cannot read the member's header ({size} bytes): {e}") from None


def load_member(u: Any, limits: DecodeLimits | None = None) -> tuple[np.ndarray, int]:
    """Decode a tar member to (float32 mono, rate) with load_audio's checks."""
    limits = limits or DecodeLimits()
    info = member_info(u.path, u.extra["member_offset"], u.extra["member_size"])
    check_header(info, limits)
    with member_view(u) as view, sf.SoundFile(view) as f:
        return decode_checked(f, int(info.frames), limits, what="tar member")
