"""A direct read of plain PCM / float WAV headers, for discovery of corpora with millions of small files.

`soundfile.SoundFile(path)` costs ~40 µs of Python per file (its wrapper holds the GIL around libsndfile's
open), which at a million files is most of discovery. A canonical WAV header is a few fixed fields: this
module reads them with one `os.read` and `struct`, and answers only when the file is one whose frame count,
rate, channels and subtype libsndfile would report the same way. Anything else (another container,
WAVE_FORMAT_EXTENSIBLE, RIFX/RF64, a data chunk of size 0 or 0xFFFFFFFF or running past the end of the file,
a RIFF size that disagrees with the file, odd-sized or unknown chunks, bytes after the data that are not
known chunks, a fmt that libsndfile might read differently) returns None, and the caller asks libsndfile.
tests/test_wavheader.py checks equality with libsndfile on a hostile corpus.
"""

from __future__ import annotations

import os
import struct

from audiopipe.decode.audio import Header
from audiopipe.storage import guard

_HEAD = 4096  # one read covers the header (and the whole file for tiny clips)
# Chunks that leave the audio alone, when well formed. libsndfile parses the contents of most chunks (LIST
# sub-chunks, PEAK per channel, cue points, ...) and a malformed one can make it lose the data chunk, so only
# these few are taken, and only in the shape checked by _chunk_ok; any other id sends the file to libsndfile.
_SKIPPED = frozenset((b"fact", b"LIST", b"PEAK", b"JUNK", b"junk"))
_PCM_SUBTYPE = {8: "PCM_U8", 16: "PCM_16", 24: "PCM_24", 32: "PCM_32"}  # WAVE_FORMAT_PCM (1) by bit depth
_FLOAT_SUBTYPE = {32: "FLOAT", 64: "DOUBLE"}  # WAVE_FORMAT_IEEE_FLOAT (3)
_MAX_CHANNELS = 256
_U32 = struct.Struct("<I")
_FMT = struct.Struct("<HHIIHH")


def _chunk_ok(cid: bytes, buf: bytes, body: int, size: int, channels: int) -> bool:
    """Whether a chunk other than fmt/data is one libsndfile reads without effect on the audio."""
    if cid not in _SKIPPED or size & 1 or body + size > len(buf):
        return False
    if cid == b"fact":
        return size == 4
    if cid == b"PEAK":  # version, time stamp, then (value, position) per channel
        return channels > 0 and size == 8 + 8 * channels
    if cid == b"LIST":  # 'INFO' then printable-id text sub-chunks tiling the list exactly
        if size < 4 or buf[body:body + 4] != b"INFO":
            return False
        pos, end = body + 4, body + size
        while pos < end:
            if pos + 8 > end or not buf[pos:pos + 4].isalnum():
                return False
            pos += 8 + _U32.unpack_from(buf, pos + 4)[0]
            pos += pos & 1
        return pos == end
    return True  # JUNK / junk: padding


def _chunks_to_end(buf: bytes, pos: int, end: int, channels: int) -> bool:
    """Whether buf[pos:end] is a run of even-sized skippable chunks ending exactly at `end`."""
    while pos < end:
        if pos + 8 > end:
            return False
        cid, size = buf[pos:pos + 4], _U32.unpack_from(buf, pos + 4)[0]
        if not _chunk_ok(cid, buf, pos + 8, size, channels):
            return False
        pos += 8 + size
    return pos == end


def parse_wav_header(buf: bytes, file_size: int) -> Header | None:
    """Header from the first bytes of a file (all of it when it is short), or None when not sure."""
    if len(buf) < 44 or buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        return None
    if _U32.unpack_from(buf, 4)[0] != file_size - 8:
        return None
    pos, fmt = 12, None
    while pos + 8 <= len(buf):
        cid, size = buf[pos:pos + 4], _U32.unpack_from(buf, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            if fmt is not None or size not in (16, 18) or body + size > len(buf):
                return None
            fmt = _FMT.unpack_from(buf, body)
            if size == 18 and buf[body + 16:body + 18] != b"\0\0":  # cbSize must be 0 for PCM / float
                return None
        elif cid == b"data":
            if fmt is None:
                return None
            tag, channels, rate, byte_rate, align, bits = fmt
            subtype = (_PCM_SUBTYPE if tag == 1 else _FLOAT_SUBTYPE if tag == 3 else {}).get(bits)
            if subtype is None or not 1 <= channels <= _MAX_CHANNELS or rate <= 0:
                return None
            if align != channels * bits // 8 or byte_rate != rate * align:
                return None
            if size == 0 or size % align or body + size > file_size:
                return None
            end = body + size + (size & 1)
            if end != file_size:  # trailing chunks: only known, complete ones, all within what was read
                if end > file_size or file_size > len(buf) or not _chunks_to_end(buf, end, file_size, channels):
                    return None
            return Header(rate, size // align, channels, "WAV", subtype)
        elif not _chunk_ok(cid, buf, body, size, fmt[1] if fmt is not None else 0):
            return None
        pos = body + size
    return None


def read_wav_header(path: str) -> Header | None:
    """parse_wav_header of the file at `path`; None also when it cannot be opened (libsndfile then says why)."""
    try:
        fd, st = guard.open_fd(path)  # a FIFO or device is not opened for reading: libsndfile's path refuses it
    except guard.Refused:
        return None
    try:
        buf = os.read(fd, _HEAD)
        size = st.st_size
        return parse_wav_header(buf, size)
    except OSError:
        return None
    finally:
        os.close(fd)
