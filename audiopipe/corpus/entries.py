"""Manifest rows that name audio and, maybe, a stretch of it: one header read per audio, then an utterance or a
reject per row.

The readers of manifests made by other tools (lhotse, NeMo, Common Voice, Hugging Face; audiopipe/corpus/
manifests/) turn each row into an `Entry`: the audio (a file, a member of an uncompressed tar, or bytes in a
table cell whose header the reader has already read), the row's id, text, speaker and metadata, and an optional
[start, end) in seconds. `resolve` reads each distinct audio's header once, in threads, and cuts the rows:

- no start/end, or a stretch from 0 to the audio's end (within 10 ms: manifests round durations): the
  utterance is the audio;
- a stretch inside it: a segment (`extra` gets `recording`, `start_frame`, `end_frame`), read on its own by
  seeking in the recording (audiopipe.decode.segments), like a Kaldi `segments` line;
- a stretch that is empty, negative or runs past the audio's end: `bad_segment`. A segment is never paired
  with the whole recording.
"""

from __future__ import annotations

import math
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, TypeVar

from audiopipe.corpus.layouts.common import header, utterance
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.decode.audio import RejectError
from audiopipe.decode.members import member_info

SEGMENT_SLACK_S = 0.01  # manifests round times to 10 ms (Kaldi) or 2-3 decimals (NeMo): a little past the end is the end
T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True)
class Entry:
    path: str  # absolute path of the audio file, or of the tar / table that holds it
    source: str  # what Utterance.source will say: relative to the root, `<tar>#<member>`, `<table>#<row>`
    where: str  # the row that named it, for messages: "list.jsonl:12"
    id: str | None
    text: str = ""
    speaker: str = ""
    start: float | None = None  # seconds into the audio; None: from its start
    end: float | None = None  # seconds; None: to its end
    extra: dict[str, Any] = field(default_factory=dict)
    info: Any = None  # the header, when the reader has read it already (bytes in a table cell)
    problem: tuple[str, str] | None = None  # (reason, detail): refused by the reader itself

    def key(self) -> tuple:
        """Which audio this is: rows naming the same key share one header read."""
        return (self.path, self.extra.get("member_offset"), self.extra.get("cell_group"),
                self.extra.get("cell_row"))


def ordered_map(fn: Callable[[T], R], items: list[T], threads: int = 16, block: int = 256) -> Iterator[R]:
    """fn over items in threads, results in the items' order; a few blocks per thread in flight at most.

    Header reads are small blocking reads that release the GIL (a round trip on network file systems): threads
    overlap them. Below 64 items a pool costs more than it saves."""
    if threads <= 1 or len(items) < 64:
        yield from map(fn, items)
        return
    size = max(1, min(block, len(items) // (4 * threads)))

    def run(part: list[T]) -> list[R]:
        return [fn(x) for x in part]

    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="headers") as pool:
        pending: deque = deque()
        for i in range(0, len(items), size):
            pending.append(pool.submit(run, items[i:i + size]))
            if len(pending) >= 2 * threads:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()


def _read_header(e: Entry) -> tuple[Any, Reject | None]:
    if "member_offset" in e.extra:
        try:
            info = member_info(e.path, e.extra["member_offset"], e.extra["member_size"])
        except RejectError as err:
            return None, Reject(e.path, e.source, err.reason, f"{e.where}: {err.detail}")
        if info.frames <= 0:
            return None, Reject(e.path, e.source, "empty", f"{e.where}: the header declares no audio frames")
        return info, None
    return header(e.path, e.source, e.where)


def default_id(source: str) -> str:
    """The id of audio named by a path relative to the root: the path without its extension."""
    head, dot, ext = source.rpartition(".")
    return head if dot and "/" not in ext else source


def segment_id(base: str, first: int, last: int, sr: int) -> str:
    """Id of a stretch of `base` without an id of its own: start and end in milliseconds, zero-padded so that
    ids sort by time."""
    return f"{base}_{round(first * 1000 / sr):08d}-{round(last * 1000 / sr):08d}"


def resolve(entries: Iterable[Entry], threads: int = 16) -> tuple[list[Utterance], list[Reject]]:
    """Utterances and rejects of the entries, in entry order (discovery sorts them afterwards)."""
    entries = list(entries)
    todo: dict[tuple, Entry] = {}
    for e in entries:
        if e.problem is None and e.info is None:
            todo.setdefault(e.key(), e)
    headers = dict(zip(todo, ordered_map(_read_header, list(todo.values()), threads)))
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for e in entries:
        if e.problem is None and e.id is not None and not isinstance(e.id, str):
            e.problem = ("bad_value", f"id is {type(e.id).__name__}, not a string")
        if e.problem is not None:
            said = e.where in e.problem[1].split(": ", 1)[0]  # a detail that already names the line
            detail = e.problem[1] if said else f"{e.where}: {e.problem[1]}"
            rejects.append(Reject(e.path, e.source, e.problem[0], detail))
            continue
        if e.info is not None:
            info = e.info
        else:
            info, bad = headers[e.key()]
            if bad is not None:
                if todo[e.key()] is not e:  # the first row's reject names its own line; name this one's
                    detail = bad.detail.split(": ", 1)[-1]
                    bad = Reject(bad.path, e.source, bad.reason, f"{e.where}: {detail}")
                rejects.append(bad)
                continue
        made = cut(e, info)
        (rejects if isinstance(made, Reject) else utts).append(made)
    return utts, rejects


def cut(e: Entry, info: Any) -> Utterance | Reject:
    """The utterance of one entry whose audio header is `info`: the whole audio or a segment of it."""
    sr, total = int(info.samplerate), int(info.frames)
    if e.start is None and e.end is None or sr <= 0:
        return utterance(e.id or default_id(e.source), e.path, e.source, info, e.speaker, e.text, e.extra)
    start = 0.0 if e.start is None else float(e.start)
    end = total / sr if e.end is None else float(e.end)
    problem = segment_problem(start, end, total, sr)
    if problem:
        return Reject(e.path, e.source, "bad_segment", f"{e.where}: {problem}")
    first, last = round(start * sr), min(round(end * sr), total)
    if first == 0 and total - last <= SEGMENT_SLACK_S * sr:  # the whole audio, its end rounded in the manifest
        return utterance(e.id or default_id(e.source), e.path, e.source, info, e.speaker, e.text, e.extra)
    uid = e.id or segment_id(default_id(e.source), first, last, sr)
    extra = {**e.extra, "recording": e.extra.get("recording", default_id(e.source)), "start_frame": first,
             "end_frame": last}
    return utterance(uid, e.path, e.source, info, e.speaker, e.text, extra, frames=last - first)


def segment_problem(start: float, end: float, total: int, sr: int) -> str | None:
    """Why [start, end) seconds cannot be cut from audio of `total` frames at `sr` Hz, or None. NaN and infinite
    times are refused before any arithmetic on them (round(inf) raises)."""
    length = total / sr
    if not (math.isfinite(start) and math.isfinite(end)):
        return f"segment {start}-{end} s is not a finite stretch of the audio (0-{length:.3f} s)"
    # The bounds first: a start of 1e308 s is finite, and round(1e308 * sr) would overflow.
    if start >= 0 and end > start and end <= length + SEGMENT_SLACK_S \
            and min(round(end * sr), total) > round(start * sr):
        return None
    return f"segment {start:.3f}-{end:.3f} s is empty or outside the audio (0-{length:.3f} s)"


def resolve_path(written: str, base: str) -> str:
    """A path from a manifest: absolute as written, relative from `base`; normalised, '~' not expanded."""
    return os.path.normpath(written if os.path.isabs(written) else os.path.join(base, written))
