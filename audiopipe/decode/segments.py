"""Utterances cut out of longer recordings (Kaldi `segments`, lhotse supervisions, NeMo offsets): each segment
read on its own, by seeking in its recording.

A segment utterance carries `extra["start_frame"]` and `extra["end_frame"]` (frames at the recording's rate).
The recording is a file, a member of an uncompressed tar, or bytes in a table cell (audiopipe.decode.members,
audiopipe.decode.cells), whichever the utterance names; `RecordingCache.load` is the one entry point the shard
builder uses for every utterance.

Memory is bounded by the segment, never the recording: a 3 s segment of a 10-hour 48 kHz stereo recording
decodes 3 s. Each recording is opened once per shard and stays open until its last segment in the shard is
read. Where libsndfile's seek lands on the exact frame (PCM, float, A-law/mu-law in any container, FLAC) the
segment is read right after a seek; for the other codecs (Vorbis, MP3, Opus, ADPCM, GSM) whose seeks are
approximate or refused, the recording is decoded forward from where the previous segment ended, block by
block into one reused buffer, so segments in time order (Kaldi's convention: utterance ids start with the
recording id) cost one pass over the recording.

The recording gets the file-level checks (unreadable, sample rate, channels, a header that declares more data
than the file holds); each segment gets the rest: frames missing from a recording cut short (`truncated`),
NaN / infinity, then the duration and silence limits, since a one-hour recording is fine when its segments are
short.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable

import numpy as np
import soundfile as sf

from audiopipe.decode import declared
from audiopipe.decode.audio import (DecodeLimits, RejectError, as_stream, check_format, check_limits,
                                   declared_length, load_audio)

# Subtypes whose frames libsndfile seeks to exactly (a byte offset), and formats that seek exactly whatever
# their subtype (FLAC's seek table and sample-accurate decoder). Vorbis seeks were measured a few hundred
# frames off, MP3 seeks land on the frame but resynthesise it differently, GSM refuses to seek.
_EXACT_SEEK_SUBTYPES = frozenset(("PCM_S8", "PCM_U8", "PCM_16", "PCM_24", "PCM_32", "FLOAT", "DOUBLE", "ULAW",
                                  "ALAW"))
_EXACT_SEEK_FORMATS = frozenset(("FLAC",))
_BLOCK = 1 << 16  # frames decoded at a time when skipping forward


def is_segment(u: Any) -> bool:
    return bool(u.extra) and "start_frame" in u.extra and "end_frame" in u.extra


def recording_key(u: Any) -> tuple:
    """Which recording a segment is cut from: its file, and within it the tar member or table cell, if any."""
    x = u.extra or {}
    return (u.path, x.get("member_offset"), x.get("cell_group"), x.get("cell_row"))


class Recording:
    """One recording opened for reading segments: `read(start, end)` decodes frames [start, end) only."""

    def __init__(self, opener: Callable[[], tuple[sf.SoundFile, Any, int]], name: str, limits: DecodeLimits):
        self.name = name
        self._opener = opener
        self.f, raw, size = opener()
        try:
            check_format(int(self.f.samplerate), int(self.f.channels), limits)
            self.frames = None if declared.unknown(self.f.frames) else int(self.f.frames)  # None: a stream
            if self.frames is not None and self.frames <= 0:
                raise RejectError("empty", "the header declares no audio frames")
            length = declared_length(raw, size, self.f) if self.frames is not None else None
        except BaseException:
            self.close()
            raise
        finally:
            if raw is not None and raw is not self.f:
                raw.close()
        self.declared = length.frames if length is not None else None
        self.short = length.short if length is not None else None
        self.exact_seek = self.frames is not None and (self.f.subtype in _EXACT_SEEK_SUBTYPES
                                                       or self.f.format in _EXACT_SEEK_FORMATS)
        if self.frames is None:  # a FLAC stream without a length: libFLAC cannot seek in it at all
            as_stream(self.f)
        self.pos = 0  # next frame a forward read returns (codecs without exact seeks)

    def close(self) -> None:
        self.f.close()

    def read(self, start: int, end: int) -> np.ndarray:
        """Frames [start, end) as float32 [N, channels]; RejectError when they are not all in the file."""
        if self.frames is not None and end > self.frames:
            if self.declared is not None and end <= self.declared:
                why = f": {self.short}" if self.short else ""
                raise RejectError("truncated", f"frames {start}-{end} are past the end of the recording, which "
                                               f"holds {self.frames} of the {self.declared} frames its header "
                                               f"declares{why}")
            raise RejectError("bad_segment", f"frames {start}-{end} are outside the {self.frames} frames of the "
                                             f"recording")
        try:
            if self.exact_seek:
                self.f.seek(start)
            else:
                self._skip_to(start)
            data = self.f.read(end - start, dtype="float32", always_2d=True)
        except (RuntimeError, OSError, ValueError) as e:  # a decoder error inside a damaged recording
            raise RejectError("truncated", f"the decoder stopped reading frames {start}-{end}: {e}") from None
        self.pos = start + len(data)
        if len(data) < end - start:
            raise RejectError("truncated", f"decoded {len(data)} of the {end - start} frames of segment "
                                           f"{start}-{end}: the recording ends early")
        return data

    def _skip_to(self, start: int) -> None:
        if start < self.pos:  # an earlier segment: decode again from the start
            if self.frames is None:  # a stream cannot be rewound: open it again
                self.f.close()
                self.f, raw, _ = self._opener()
                as_stream(self.f)
                if raw is not None:
                    raw.close()
            else:
                self.f.seek(0)
            self.pos = 0
        buf = np.empty((_BLOCK, self.f.channels), np.float32)
        while self.pos < start:
            want = min(_BLOCK, start - self.pos)
            got = len(self.f.read(want, dtype="float32", always_2d=True, out=buf[:want]))
            self.pos += got
            if got < want:  # the recording ends early, or the decoder gave up on a damaged packet here
                raise RejectError("truncated", f"the decoder stopped at frame {self.pos}, before the segment "
                                               f"starting at frame {start}")


def _file_opener(path: str) -> Callable[[], tuple[sf.SoundFile, Any, int]]:
    def opener() -> tuple[sf.SoundFile, Any, int]:
        from audiopipe.decode.audio import _open

        f, size = _open(path)
        try:
            return f, open(path, "rb"), size
        except OSError as e:
            f.close()
            raise RejectError("unreadable", f"cannot read the file: {e}") from None
    return opener


class RecordingCache:
    """The recordings of one batch of utterances, each open until its last segment has been read."""

    def __init__(self, utterances: Iterable[Any]):
        utterances = list(utterances)
        self._left = Counter(recording_key(u) for u in utterances if is_segment(u))
        self._open: dict[tuple, Recording | RejectError] = {}
        self._cells = None
        if any("cell_row" in (u.extra or {}) for u in utterances):
            from audiopipe.decode.cells import CellCache

            self._cells = CellCache(utterances)
        self.decodes = 0  # recordings opened (diagnostics: one per recording and shard)

    @property
    def row_group_reads(self) -> int:
        """Parquet row groups read for table-cell utterances (diagnostics: one per group and shard)."""
        return self._cells.group_reads if self._cells is not None else 0

    def load(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        """Any utterance's audio: a segment read from its recording, a tar member or table cell read in place,
        or a file."""
        if is_segment(u):
            return self.cut(u, limits)
        return self._whole(u, limits)

    def _whole(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        from audiopipe.decode.members import is_member, load_member

        if is_member(u):
            return load_member(u, limits)
        if self._cells is not None and "cell_row" in u.extra:
            return self._cells.load(u, limits)
        return load_audio(u.path, limits)

    def _opener(self, u: Any) -> Callable[[], tuple[sf.SoundFile, Any, int]]:
        from audiopipe.decode.members import is_member, member_info, member_view

        if is_member(u):
            def member() -> tuple[sf.SoundFile, Any, int]:
                member_info(u.path, u.extra["member_offset"], u.extra["member_size"])  # its refusals, named
                view = member_view(u)
                return sf.SoundFile(view), member_view(u), int(u.extra["member_size"])
            return member
        if self._cells is not None and "cell_row" in u.extra:
            def cell() -> tuple[sf.SoundFile, Any, int]:
                from audiopipe.decode.cells import AudioBytes, cell_info

                data = self._cells.bytes_of(u)
                cell_info(data)
                return sf.SoundFile(AudioBytes(data)), AudioBytes(data), len(data)
            return cell
        return _file_opener(u.path)

    def _recording(self, u: Any, key: tuple, limits: DecodeLimits) -> Recording:
        got = self._open.get(key)
        if got is None:
            try:
                got = Recording(self._opener(u), str(u.extra.get("recording", u.path)), limits)
            except RejectError as e:
                got = e
            except (RuntimeError, OSError, ValueError) as e:  # libsndfile's refusals of a member or cell
                got = RejectError("unreadable", f"libsndfile cannot read the recording: {e}")
            self._open[key] = got
            self.decodes += 1
        if isinstance(got, RejectError):
            raise RejectError(got.reason, f"recording {u.extra.get('recording', u.path)}: {got.detail}")
        return got

    def cut(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        """The segment's samples (float32 mono) and rate, or RejectError (the recording's, or the segment's)."""
        key = recording_key(u)
        try:
            rec = self._recording(u, key, limits)
            start, end = int(u.extra["start_frame"]), int(u.extra["end_frame"])
            if start < 0 or start >= end:
                raise RejectError("bad_segment", f"frames {start}-{end} are not a stretch of the recording")
            data = rec.read(start, end)
            sr = int(rec.f.samplerate)
        finally:
            self._left[key] -= 1
            if self._left[key] <= 0:  # the last segment of this recording in the batch: close it
                done = self._open.pop(key, None)
                if isinstance(done, Recording):
                    done.close()
        finite = np.isfinite(data)
        if not finite.all():
            bad = int(data.size - np.count_nonzero(finite))
            raise RejectError("nan_inf", f"{bad} of {data.size} samples of the segment are NaN or infinite")
        wav = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1, dtype=np.float32)
        return check_limits(np.ascontiguousarray(wav, dtype=np.float32), sr, limits, what="segment"), sr
