"""Praat TextGrids as Montreal Forced Aligner writes them, and phone durations in codec frames.

A small reader rather than a dependency: like Praat's own text reader it takes the file's quoted strings and
numbers in order and ignores everything else (the `name =` keys of the long format, comments, `<exists>`), so
the long and the short text formats go through one path. Binary TextGrids are refused.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audiopipe.storage import guard
from audiopipe.errors import AudiopipeError, InvalidValue

SILENCE = "sil"  # MFA leaves silence intervals unlabelled ("")


@dataclass(frozen=True)
class Interval:
    start: float  # seconds
    end: float
    label: str


@dataclass(frozen=True)
class TextGrid:
    """Tiers by name, in file order. A point tier's points are Intervals with start == end."""

    xmin: float
    xmax: float
    tiers: dict[str, list[Interval]]


class TextGridError(AudiopipeError, ValueError):
    """A file that is not a readable Praat text TextGrid."""


# A quoted string ("" is an escaped quote), a number, or a <flag>; everything else is skipped, including the
# long format's "item [1]:" indices (a number right after "[").
_TOKEN = re.compile(r'"((?:[^"]|"")*)"|(?<![\w.\[])([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])|<(\w+)>')


def read_textgrid(path: str | Path) -> TextGrid:
    path = Path(path)
    try:  # through the guard: a TextGrid that is a pipe, /dev/zero or a huge file is refused, not read
        raw = guard.read_bytes(str(path), "textgrid", "TextGrid")
    except guard.Refused as exc:
        raise TextGridError(exc.detail) from None
    try:
        return parse_textgrid(_decode(raw))
    except TextGridError as exc:
        raise TextGridError(f"{path}: {exc}") from exc


def parse_textgrid(text: str) -> TextGrid:
    """Parse the long or short Praat text format."""
    if not text.lstrip().startswith('File type = "ooTextFile"'):
        if text.startswith("ooBinaryFile"):
            raise TextGridError("binary TextGrid: save it as a text file (Praat: Save as text file)")
        raise TextGridError('not a Praat text file (expected it to start with File type = "ooTextFile")')
    tokens = _Tokens(text)
    if tokens.string() != "ooTextFile" or tokens.string() != "TextGrid":
        raise TextGridError('expected Object class = "TextGrid"')
    xmin, xmax = tokens.number(), tokens.number()
    if tokens.flag() != "exists":
        return TextGrid(xmin, xmax, {})
    tiers: dict[str, list[Interval]] = {}
    for _ in range(tokens.count()):
        kind, name = tokens.string(), tokens.string()
        tokens.number(), tokens.number()  # the tier's own xmin/xmax
        n = tokens.count()
        if kind == "IntervalTier":
            items = [Interval(tokens.number(), tokens.number(), tokens.string()) for _ in range(n)]
        elif kind == "TextTier":
            items = [Interval(t, t, tokens.string()) for t in (tokens.number() for _ in range(n))]
        else:
            raise TextGridError(f"unknown tier class {kind!r}")
        if name in tiers:
            raise TextGridError(f"two tiers named {name!r}")
        tiers[name] = items
    return TextGrid(xmin, xmax, tiers)


def phone_intervals(grid: TextGrid, tier: str | None = None) -> list[Interval]:
    """The phone tier with silences labelled "sil". Default tier: "phones", or the one "<speaker> - phones"."""
    if tier is None:
        names = [n for n in grid.tiers if n == "phones" or n.endswith(" - phones")]
        if len(names) != 1:
            raise TextGridError(f"cannot pick the phone tier among {list(grid.tiers)}: name it with tier=")
        tier = names[0]
    if tier not in grid.tiers:
        raise TextGridError(f"no tier {tier!r}; tiers are {list(grid.tiers)}")
    return [Interval(iv.start, iv.end, iv.label.strip() or SILENCE) for iv in grid.tiers[tier]]


def clip_intervals(intervals: list[Interval], start: float, end: float | None = None) -> list[Interval]:
    """Intervals seen through the window [start, end) seconds (after trimming), re-timed to start at 0.

    Intervals entirely outside the window (trimmed-away silence) are dropped; partly covered ones are cut.
    """
    stop = math.inf if end is None else end
    out = []
    for iv in intervals:
        a, b = max(iv.start, start), min(iv.end, stop)
        if b > a:
            out.append(Interval(a - start, b - start, iv.label))
    return out


def durations_in_frames(
    intervals: list[Interval], frame_rate: float = 75.0, *, total_frames: int, tolerance_frames: float = 2.0
) -> np.ndarray:
    """Frames per interval, int32, summing exactly to total_frames (the code length).

    Rounds the cumulative boundaries, not each duration, so errors never accumulate: interval k covers frames
    [round(start_k * rate), round(end_k * rate)). The first interval takes any lead-in before it, the last one
    the rest up to total_frames; a timeline off by more than `tolerance_frames` at either end is refused.
    """
    if total_frames < 0:
        raise InvalidValue(f"total_frames must be >= 0, got {total_frames}")
    if not intervals:
        if total_frames == 0:
            return np.zeros(0, dtype=np.int32)
        raise InvalidValue(f"no intervals to cover {total_frames} frames")
    starts = np.array([iv.start for iv in intervals], dtype=np.float64)
    ends = np.array([iv.end for iv in intervals], dtype=np.float64)
    if not (np.isfinite(starts).all() and np.isfinite(ends).all()):
        raise InvalidValue("interval times must be finite")
    if (ends < starts).any() or (starts[1:] < ends[:-1] - 1e-6).any():
        raise InvalidValue("intervals must be in time order, each ending after it starts, without overlap")
    lead = starts[0] * frame_rate
    tail = ends[-1] * frame_rate - total_frames
    if abs(lead) > tolerance_frames or abs(tail) > tolerance_frames:
        raise InvalidValue(
            f"alignment spans {starts[0]:.3f}-{ends[-1]:.3f} s = {starts[0] * frame_rate:.2f}-"
            f"{ends[-1] * frame_rate:.2f} frames but the audio has {total_frames} frames at {frame_rate} Hz "
            "(wrong TextGrid, or trimming not applied with clip_intervals?)"
        )
    # Half-up rounding (not banker's) so a boundary exactly between two frames always goes the same way.
    bounds = np.floor(ends * frame_rate + 0.5).astype(np.int64)
    bounds = np.clip(bounds, 0, total_frames)
    bounds[-1] = total_frames
    return np.diff(bounds, prepend=0).astype(np.int32)


def read_phone_durations(
    path: str | Path,
    total_frames: int,
    frame_rate: float = 75.0,
    start: float = 0.0,
    end: float | None = None,
    tier: str | None = None,
) -> tuple[list[str], np.ndarray]:
    """Phones of an MFA TextGrid and their frame counts over the kept window [start, end) seconds."""
    intervals = clip_intervals(phone_intervals(read_textgrid(path), tier), start, end)
    return [iv.label for iv in intervals], durations_in_frames(intervals, frame_rate, total_frames=total_frames)


class _Tokens:
    def __init__(self, text: str) -> None:
        self._it = _TOKEN.finditer(text)

    def _next(self) -> re.Match:
        try:
            return next(self._it)
        except StopIteration:
            raise TextGridError("file ends early (truncated TextGrid?)") from None

    def string(self) -> str:
        m = self._next()
        if m.group(1) is None:
            raise TextGridError(f"expected a quoted string, found {m.group(0)!r}")
        return m.group(1).replace('""', '"')

    def number(self) -> float:
        m = self._next()
        if m.group(2) is None:
            raise TextGridError(f"expected a number, found {m.group(0)!r}")
        return float(m.group(2))

    def count(self) -> int:
        value = self.number()
        if value < 0 or value != int(value):
            raise TextGridError(f"expected a count, found {value}")
        return int(value)

    def flag(self) -> str | None:
        m = self._next()
        if m.group(3) is None:
            raise TextGridError(f"expected <exists> or <absent>, found {m.group(0)!r}")
        return m.group(3)


def _decode(raw: bytes) -> str:
    # Praat writes UTF-16 (with BOM) when labels need it, UTF-8 otherwise.
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return raw.decode("utf-16")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TextGridError(f"not UTF-8 or UTF-16 text: {exc}") from exc
