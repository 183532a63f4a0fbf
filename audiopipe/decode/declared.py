"""How much audio a file's header says it holds, for the containers where libsndfile silently shortens a file
that was cut.

libsndfile reports the frames it can read: a WAV, RF64, W64, AIFF, AU, NIST or CAF file whose data was cut
short (a partial download, a full disk) opens as a shorter clip with no error, and its transcript no longer
matches. The header still says how long the data should be, so this module reads that length and the decoder
compares: fewer frames than declared is `truncated`. An MP3's Xing/Info/VBRI frame counts its bytes, and a MIDI
sample dump (SDS) its words, which are checked the same way. Where the data cannot run past the end of the file at all
(a data chunk declared longer than the file, an RF64 ds64 claiming 10^12 frames), the refusal comes before
anything is decoded.

Lengths of 0 and the all-ones placeholders that streaming writers leave are "unknown", never trusted. For the
other formats libsndfile reads, its own header log is used where it states a truncation (VOC, MAT4, WVE) or a
frame count (AVR, MPC2K); a format that states no length (IRCAM, PAF, PVF) cannot be checked, and a FLAC whose
STREAMINFO gives no total (a stream) is measured by decoding (audiopipe.decode.audio).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

_HEAD = 1 << 16  # header bytes read: every chunk before the audio data fits in this for real files
_W64_RIFF = b"riff\x2e\x91\xcf\x11\xa5\xd6\x28\xdb\x04\xc1\x00\x00"
_W64_SUFFIX = b"\xf3\xac\xd3\x11\x8c\xd1\x00\xc0\x4f\x8e\xdb\x8a"  # of the fmt/data chunk GUIDs
_AU_BYTES = {1: 1, 2: 1, 3: 2, 4: 3, 5: 4, 6: 4, 7: 8, 27: 1}  # bytes per sample of the PCM/float/law encodings
UNKNOWN_FRAMES = 1 << 62  # libsndfile's frame count for a stream whose header gives none (SF_COUNT_MAX)


@dataclass(frozen=True)
class Declared:
    """What a header declares: the frames (None when it does not say) and where its data ends (None: to the
    end of the file, or unknown)."""

    frames: int | None
    data_end: int | None
    what: str  # the field that says so, for messages ("the data chunk", "the ds64 chunk", ...)
    fault: str | None = None  # a header that cannot be read one way: the file is refused with this sentence


def parse(head: bytes, size: int) -> Declared | None:
    """The declared length from a file's first bytes (`head`) and its size, or None when the format is not one
    of these or its header states no length."""
    try:
        if head[:4] in (b"RIFF", b"RIFX", b"RF64", b"BW64") and head[8:12] == b"WAVE":
            return _riff(head)
        if head[:16] == _W64_RIFF:
            return _w64(head)
        if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
            return _aiff(head)
        if head[:4] == b"FORM" and head[8:12] in (b"8SVX", b"16SV"):
            return _iff_body(head)
        if head[:4] in (b".snd", b"dns."):
            return _au(head)
        if head[:8] == b"NIST_1A\n":
            return _nist(head)
        if head[:4] == b"caff":
            return _caf(head)
        if head[:2] == b"\xf0\x7e" and head[3:4] == b"\x01":  # a MIDI sample dump header
            return _sds(head)
        if head[:3] == b"ID3" or head[:2] in (b"\xff\xfb", b"\xff\xfa", b"\xff\xf3", b"\xff\xf2", b"\xff\xe3",
                                             b"\xff\xe2"):
            return _mp3(head)
    except (struct.error, ValueError, IndexError, ZeroDivisionError, OverflowError):
        return None  # a header too damaged to say: libsndfile's own reading decides
    return None


def _chunks(head: bytes, pos: int, endian: str, even: bool = True):
    """(id, body offset, size) of the 4-byte-id chunks from `pos`, as far as `head` goes."""
    fmt = endian + "I"
    while pos + 8 <= len(head):
        cid, size = head[pos:pos + 4], struct.unpack_from(fmt, head, pos + 4)[0]
        yield cid, pos + 8, size
        pos += 8 + size + (size & 1 if even else 0)


def _riff(head: bytes) -> Declared | None:
    endian = ">" if head[:4] == b"RIFX" else "<"
    rf64 = head[:4] in (b"RF64", b"BW64")
    align, ds64_data, ds64_frames = 0, None, None
    for cid, body, size in _chunks(head, 12, endian):
        if cid == b"ds64" and rf64:
            _riff_size, ds64_data, ds64_frames = struct.unpack_from("<QQQ", head, body)
        elif cid == b"fmt ":
            align = struct.unpack_from(endian + "H", head, body + 12)[0]
        elif cid == b"data":
            if rf64 and size == 0xFFFFFFFF:
                if ds64_data is None:
                    return None
                size, what = ds64_data, "the ds64 chunk"
            elif size == 0 or size >= 0x7FFFF000:  # placeholders written by streaming tools: length unknown
                return None
            else:
                what = "the data chunk"
            frames = size // align if align > 0 else None
            if rf64 and ds64_frames and what == "the ds64 chunk" and frames is None:
                frames = ds64_frames
            return Declared(frames, body + size, what)
    return None


def _w64(head: bytes) -> Declared | None:
    pos, align = 40, 0
    while pos + 24 <= len(head):
        guid, size = head[pos:pos + 16], struct.unpack_from("<Q", head, pos + 16)[0]
        if size < 24:
            return None
        if guid == b"fmt " + _W64_SUFFIX:
            align = struct.unpack_from("<H", head, pos + 24 + 12)[0]
        elif guid == b"data" + _W64_SUFFIX:
            data = size - 24
            return Declared(data // align if align > 0 else None, pos + 24 + data, "the data chunk")
        pos += size + (-size % 8)
    return None


def _aiff(head: bytes) -> Declared | None:
    frames = None
    for cid, body, size in _chunks(head, 12, ">"):
        if cid == b"COMM":
            frames = struct.unpack_from(">I", head, body + 2)[0]
        elif cid == b"SSND":
            if size in (0, 0xFFFFFFFF) or size < 8:
                return None
            offset = struct.unpack_from(">I", head, body)[0]
            return Declared(frames, body + 8 + offset + (size - 8 - offset), "the COMM and SSND chunks")
    return None


def _iff_body(head: bytes) -> Declared | None:
    for cid, body, size in _chunks(head, 12, ">"):
        if cid == b"BODY":
            return None if size in (0, 0xFFFFFFFF) else Declared(None, body + size, "the BODY chunk")
    return None


def _au(head: bytes) -> Declared | None:
    endian = ">" if head[:4] == b".snd" else "<"
    offset, size, encoding, _rate, channels = struct.unpack_from(endian + "5I", head, 4)
    if offset < 24:
        # The data would start inside the header itself. libsndfile then reads the header bytes as samples or
        # skips them, depending on how the file is opened and read: no one decode is the file's audio.
        return Declared(None, None, "the header's data offset",
                        fault=f"the header's data offset {offset} lies inside its own 24-byte header")
    if size == 0xFFFFFFFF or size == 0:
        return None
    width = _AU_BYTES.get(encoding)
    frames = size // (width * channels) if width and channels else None
    return Declared(frames, offset + size, "the header's data size")


_NIST_FIELD = re.compile(rb"^(\w+) -([irs])\d* (.*)$")


def _nist(head: bytes) -> Declared | None:
    header_size = int(head[8:16].strip())
    fields = {}
    for line in head[16:header_size].split(b"\n"):
        if line.strip() == b"end_head":
            break
        m = _NIST_FIELD.match(line.strip())
        if m:
            fields[m.group(1)] = m.group(3).strip()
    coding = fields.get(b"sample_coding", b"pcm")
    if b"sample_count" not in fields or not coding.startswith((b"pcm", b"ulaw", b"alaw", b"mu-law")) \
            or b"shorten" in coding:
        return None
    frames = int(fields[b"sample_count"])
    channels = int(fields.get(b"channel_count", b"1"))
    width = int(fields.get(b"sample_n_bytes", b"2"))
    return Declared(frames, header_size + frames * channels * width, "the header's sample_count")


def _caf(head: bytes) -> Declared | None:
    pos, per_packet, frames_per_packet = 8, 0, 0
    while pos + 12 <= len(head):
        cid, size = head[pos:pos + 4], struct.unpack_from(">q", head, pos + 4)[0]
        body = pos + 12
        if cid == b"desc":
            per_packet, frames_per_packet = struct.unpack_from(">II", head, body + 16)
        elif cid == b"data":
            if size < 4:  # -1: the data runs to the end of the file
                return None
            data = size - 4
            frames = data // per_packet * frames_per_packet if per_packet and frames_per_packet else None
            return Declared(frames, body + size, "the data chunk")
        if size < 0:
            return None
        pos = body + size
    return None


def _sds(head: bytes) -> Declared | None:
    """A MIDI Sample Dump: its dump header gives the sample length in words (three 7-bit bytes); the words
    follow in 127-byte data packets of 120 payload bytes, each word in ceil(bits / 7) bytes. A cut dump decodes
    to garbage in its last packet, so its length must be checked."""
    bits = head[6]
    words = head[10] | head[11] << 7 | head[12] << 14
    if not 8 <= bits <= 28 or words == 0:
        return None
    packets = -(-words * ((bits + 6) // 7) // 120)
    return Declared(words, 21 + packets * 127, "its dump header")


def _mp3(head: bytes) -> Declared | None:
    """An MP3's Xing / Info / VBRI frame, which counts the stream's bytes (LAME and most encoders write one):
    the data ends that many bytes after the first frame. Without one the length is an estimate (MP3 slack)."""
    start = 0
    if head[:3] == b"ID3":  # an ID3v2 tag first: its size is syncsafe (7 bits a byte), plus a footer if flagged
        size = (head[6] << 21) | (head[7] << 14) | (head[8] << 7) | head[9]
        start = 10 + size + (10 if head[5] & 0x10 else 0)
    if start + 4 > len(head) or head[start] != 0xFF or head[start + 1] & 0xE0 != 0xE0:
        return None
    frame = head[start:start + 200]
    for tag in (b"Xing", b"Info"):
        at = frame.find(tag)
        if at >= 0:
            flags = struct.unpack_from(">I", frame, at + 4)[0]
            if not flags & 0x2:  # no byte count
                return None
            pos = at + 8 + (4 if flags & 0x1 else 0)
            count = struct.unpack_from(">I", frame, pos)[0]
            return Declared(None, start + count, f"its {tag.decode()} frame") if count else None
    at = frame.find(b"VBRI")
    if at >= 0:
        count = struct.unpack_from(">I", frame, at + 10)[0]
        return Declared(None, start + count, "its VBRI frame") if count else None
    return None


_LOG_TRUNCATED = re.compile(r"truncated|Data length \d+ should be \d+", re.IGNORECASE)
_LOG_FRAMES = re.compile(r"^\s*Frames\s*:\s*(\d+)\s*$", re.MULTILINE)
_LOG_COLS = re.compile(r"\bCols\s*:\s*(\d+)")  # MAT files: a channels x frames matrix
# Formats whose libsndfile log states the frames their header declares, and the line that says it.
_LOG_LENGTH = {"AVR": _LOG_FRAMES, "MPC2K": _LOG_FRAMES, "MAT4": _LOG_COLS, "MAT5": _LOG_COLS}


def from_log(log: str, fmt: str, frames: int) -> Length | None:
    """The declared length from libsndfile's header log, where it states more than it reads, else None."""
    m = _LOG_TRUNCATED.search(log)
    if m:
        return Length(frames + 1, f"libsndfile's header log says: {m.group(0)}", counted=False)
    if fmt in _LOG_LENGTH:
        said = [int(x) for x in _LOG_LENGTH[fmt].findall(log)]
        if said and max(said) > frames:
            return Length(max(said))
    return None


@dataclass(frozen=True)
class Length:
    """The frames a header declares (`frames`), and a sentence for a file whose data is shorter than that on
    disk already (`short`: refused before decoding), else None."""

    frames: int
    short: str | None = None
    counted: bool = True  # `frames` is a count the header gives (else only "more than libsndfile reads")
    fault: str | None = None  # the header contradicts itself (Declared.fault): refused before decoding


def declared_length(f: BinaryIO, size: int, sound: Any) -> Length:
    """The declared length of the open file `f` (`size` bytes; read from its start, position restored) that
    libsndfile has opened as `sound` (anything with frames, format, samplerate and, optionally, extra_info)."""
    frames = int(sound.frames)
    pos = f.tell()
    try:
        f.seek(0)
        head = f.read(_HEAD)
        f.seek(pos)
    except (OSError, ValueError):
        return Length(frames)
    d = parse(head, size)
    if d is not None and d.fault is not None:
        return Length(frames, fault=d.fault)
    if d is None:
        return from_log(getattr(sound, "extra_info", "") or "", str(sound.format), frames) or Length(frames)
    declared = max(frames, d.frames or 0)
    if d.data_end is not None and d.data_end > size:
        sr = int(sound.samplerate) or 1
        said = f"{d.frames} frames ({d.frames / sr:.3f} s) and " if d.frames is not None else ""
        return Length(max(declared, frames + 1), f"the header ({d.what}) declares {said}data up to byte "
                                                 f"{d.data_end}, but the file ends at byte {size}",
                      counted=d.frames is not None and d.frames > frames)
    return Length(declared)


def unknown(frames: int) -> bool:
    """Whether libsndfile's frame count means "not in the header" (a FLAC stream with total_samples 0)."""
    return frames >= UNKNOWN_FRAMES
