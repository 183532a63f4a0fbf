"""Split a discovered corpus into shard-sized work units, deterministically.

The plan depends only on the sorted utterance list and the job settings, so a rerun after a crash rebuilds the
same units and can skip the ones already finished. Sizes are estimated from header durations (no decode).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

from audiopipe.shard.keys import fold, sample_key


@dataclass
class PlannedUtt:
    id: str
    path: str
    source: str
    speaker: str
    text: str
    duration: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class WorkUnit:
    name: str  # "shard-000000"
    index: int
    utterances: list[PlannedUtt]

    @property
    def duration(self) -> float:
        return float(sum(u.duration for u in self.utterances))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "index": self.index, "utterances": [asdict(u) for u in self.utterances]}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> "WorkUnit":
        return WorkUnit(d["name"], d["index"], [PlannedUtt(**u) for u in d["utterances"]])


def unique_keys(utts: list[PlannedUtt]) -> tuple[list[PlannedUtt], list[dict[str, Any]]]:
    """Keep the utterances whose sample keys stay distinct on a case-insensitive disk; reject the others.

    Keys are an injective escape of the ids, and discovery already refuses equal ids, so only keys that differ
    in letter case or Unicode normalisation alone can meet here. In id order, the first keeps its key and every
    later one is rejected `duplicate_key`, naming the first: the same utterances win on every rerun.
    """
    kept: list[PlannedUtt] = []
    rejects: list[dict[str, Any]] = []
    first: dict[str, PlannedUtt] = {}
    for u in sorted(utts, key=lambda u: u.id):
        folded = fold(sample_key(u.id))
        if folded in first:
            f = first[folded]
            rejects.append({"id": u.id, "path": u.path, "source": u.source, "reason": "duplicate_key",
                            "detail": f"id {u.id!r} differs from {f.id!r} ({f.source}) only in letter case or "
                                      f"Unicode normalisation; they would overwrite each other on a "
                                      f"case-insensitive disk"})
            continue
        first[folded] = u
        kept.append(u)
    return kept, rejects


def shard_name(index: int) -> str:
    return f"shard-{index:06d}"


def bytes_per_second(specs: Iterable[Any]) -> float:
    """Estimated stored bytes per second of audio, summed over feature columns (Arrow payload only)."""
    total = 0.0
    for s in specs:
        width = max(1, s.channels)
        total += width * s.frame_rate * np.dtype(s.dtype).itemsize
    return total


AUTO_MAX_BYTES = 256 << 20
AUTO_MIN_BYTES = 16 << 20
AUTO_MIN_SHARDS = 64


def auto_shard_bytes(utts: list[PlannedUtt], bytes_per_sec: float) -> int:
    """Default shard size: 256 MB, but small corpora are cut into up to 64 shards of at least 16 MB so that
    every worker gets work. It depends on the corpus alone (never on --workers), so reruns plan alike."""
    total = sum(u.duration for u in utts) * bytes_per_sec
    return int(min(AUTO_MAX_BYTES, max(AUTO_MIN_BYTES, total / AUTO_MIN_SHARDS)))


def plan_units(utts: list[PlannedUtt], bytes_per_sec: float, target_bytes: int,
               max_utts_per_shard: int = 100_000) -> list[WorkUnit]:
    """Greedy fill in id order: a shard closes when its estimated payload reaches target_bytes."""
    units: list[WorkUnit] = []
    cur: list[PlannedUtt] = []
    cur_bytes = 0.0
    for u in utts:
        est = u.duration * bytes_per_sec
        if cur and (cur_bytes + est > target_bytes or len(cur) >= max_utts_per_shard):
            units.append(WorkUnit(shard_name(len(units)), len(units), cur))
            cur, cur_bytes = [], 0.0
        cur.append(u)
        cur_bytes += est
    if cur:
        units.append(WorkUnit(shard_name(len(units)), len(units), cur))
    return units
