"""Utterances cut out of longer recordings (Kaldi `segments`, lhotse supervisions, NeMo offsets): each recording
decoded once for all its cuts.

A segment utterance carries `extra["start_frame"]` and `extra["end_frame"]` (frames at the recording's rate).
The recording is a file, a member of an uncompressed tar, or bytes in a table cell (audiopipe.decode.members,
audiopipe.decode.cells), whichever the utterance names; `RecordingCache.load` is the one entry point the shard
builder uses for every utterance.
The recording is decoded with the file-level checks only (unreadable, truncated, NaN); the duration and
silence limits apply to each segment, since a one-hour recording is fine when its segments are short.
"Once" is per shard: a recording whose segments straddle a shard boundary is decoded by each shard. A decoded
recording stays in memory until its last segment in the shard is cut, so segments are best kept grouped by
recording in id order (Kaldi's convention: utterance ids start with the recording id).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any, Iterable

import numpy as np

from audiopipe.decode.audio import DecodeLimits, RejectError, check_limits, load_audio


def is_segment(u: Any) -> bool:
    return bool(u.extra) and "start_frame" in u.extra and "end_frame" in u.extra


def recording_key(u: Any) -> tuple:
    """Which recording a segment is cut from: its file, and within it the tar member or table cell, if any."""
    x = u.extra or {}
    return (u.path, x.get("member_offset"), x.get("cell_group"), x.get("cell_row"))


class RecordingCache:
    """Decoded recordings of one batch of utterances, each kept until its last segment has been cut."""

    def __init__(self, utterances: Iterable[Any]):
        utterances = list(utterances)
        self._left = Counter(recording_key(u) for u in utterances if is_segment(u))
        self._decoded: dict[tuple, tuple[np.ndarray, int] | RejectError] = {}
        self._cells = None
        if any("cell_row" in (u.extra or {}) for u in utterances):
            from audiopipe.decode.cells import CellCache

            self._cells = CellCache(utterances)
        self.decodes = 0  # recordings decoded (diagnostics: one per recording)

    @property
    def row_group_reads(self) -> int:
        """Parquet row groups read for table-cell utterances (diagnostics: one per group and shard)."""
        return self._cells.group_reads if self._cells is not None else 0

    def load(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        """Any utterance's audio: a segment cut from its recording, a tar member or table cell read in place, or
        a file."""
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

    def cut(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        """The segment's samples (float32 mono) and rate, or RejectError (the recording's, or the segment's)."""
        key = recording_key(u)
        got = self._decoded.get(key)
        if got is None:
            whole = replace(limits, min_duration=0.0, max_duration=math.inf, silence_dbfs=-math.inf)
            try:
                got = self._whole(u, whole)
            except RejectError as e:
                got = e
            self._decoded[key] = got
            self.decodes += 1
        self._left[key] -= 1
        if self._left[key] <= 0:  # the last segment of this recording: free it
            self._decoded.pop(key, None)
        if isinstance(got, RejectError):
            raise RejectError(got.reason, f"recording {u.extra.get('recording', u.path)}: {got.detail}")
        wav, sr = got
        start, end = int(u.extra["start_frame"]), int(u.extra["end_frame"])
        if end > len(wav) or start >= end:
            raise RejectError("bad_segment", f"frames {start}-{end} are outside the {len(wav)} decoded frames")
        return check_limits(wav[start:end].copy(), sr, limits, what="segment"), sr

