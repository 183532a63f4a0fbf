"""Split a discovered corpus into shard-sized work units, deterministically.

The plan depends only on the sorted utterance list and the job settings, so a rerun after a crash rebuilds the
same units and can skip the ones already finished. Sizes are estimated from header durations (no decode).

Shards are exchangeable: before shards are cut, the utterances are put in a seeded pseudo-random order
(`shard_order`), so a shard is a random sample of the corpus, not one speaker's, book's or session's stretch
of ids. Readers that take a few shards or blocks at a time (block-window reading, WebDataset streaming) then
see a mix of the corpus in every window. The order is a sort by a 64-bit hash of (seed, id): the same on
every machine and version, and an utterance's place does not depend on which others are in the corpus.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import numpy as np

import xxhash

from audiopipe.errors import InvalidValue
from audiopipe.shard.keys import fold, sample_key
from audiopipe.storage.atomic import atomic_path


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


def write_plan(path: str | os.PathLike[str], plan: dict[str, Any], units: list[WorkUnit]) -> None:
    """plan.json: `plan`'s fields (sorted keys) and then "units", written unit by unit (atomically).

    A plan holds every utterance: at a million of them, one json.dumps of the whole would hold the text and its
    UTF-8 bytes (~600 bytes an utterance) on top of the plan itself. Each unit is its own compact line."""
    head = json.dumps(plan, sort_keys=True, indent=1, ensure_ascii=False)
    if "units" in plan or not head.endswith("\n}"):
        raise InvalidValue("write_plan: the units go in their own argument")
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(head[:-2] + ',\n "units": [')
            for k, u in enumerate(units):
                f.write(("\n  " if k == 0 else ",\n  ") + json.dumps(u.to_dict(), sort_keys=True, ensure_ascii=False))
            f.write("\n ]\n}\n")


# A unit's line in plan.json as write_plan writes it (sorted keys): its name comes before its utterances.
_UNIT_LINE = re.compile(r' *\{"index": \d+, "name": ("(?:[^"\\]|\\.)*"), "utterances": \[')
_UNITS_OPEN = ' "units": [\n'


def plan_summary(lines: Iterable[str]) -> tuple[dict[str, Any], list[str]] | None:
    """plan.json's fields without its units, and the units' names in order, read from its lines without parsing
    a single utterance (a plan holds them all: json.loads of a 500,000-utterance plan costs seconds and a
    kilobyte of Python objects an utterance, for a rerun that may have nothing to do). None when the lines are
    not in write_plan's layout (a plan written whole by an older version): then parse the file."""
    it = iter(lines)
    head = []
    for line in it:
        if line == _UNITS_OPEN:
            break
        head.append(line)
    else:
        return None
    try:
        fields = json.loads("".join(head).rstrip().removesuffix(",") + "\n}")
    except ValueError:
        return None
    names: list[str] = []
    for line in it:
        if line.startswith(" ]"):
            return fields, names
        m = _UNIT_LINE.match(line)
        if m is None:
            return None
        names.append(json.loads(m.group(1)))
    return None


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


def shard_order(utts: list[PlannedUtt], seed: int | None) -> list[PlannedUtt]:
    """The order shards are cut in: sorted by xxh3_64 of the id under `seed` (ties, never seen in practice, by
    id); seed None keeps the order given (id order: the order before shards were exchangeable)."""
    if seed is None:
        return list(utts)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise InvalidValue(f"the shard order seed must be an integer in 0..2**64-1 or None, got {seed!r}")
    return sorted(utts, key=lambda u: (xxhash.xxh3_64_intdigest(u.id.encode("utf-8", "surrogatepass"), seed=seed),
                                       u.id))


def order_record(seed: int | None) -> dict[str, Any]:
    """What the manifest says of the order (under "shard_order")."""
    if seed is None:
        return {"order": "id"}
    return {"order": "shuffled", "seed": seed, "key": "xxh3_64(utf-8 id, seed), then id"}


def plan_units(utts: list[PlannedUtt], bytes_per_sec: float, target_bytes: int,
               max_utts_per_shard: int = 100_000, seed: int | None = None) -> list[WorkUnit]:
    """Greedy fill in shard_order(utts, seed): a shard closes when its estimated payload reaches target_bytes.
    seed None fills in the order given (id order)."""
    units: list[WorkUnit] = []
    cur: list[PlannedUtt] = []
    cur_bytes = 0.0
    for u in shard_order(utts, seed):
        est = u.duration * bytes_per_sec
        if cur and (cur_bytes + est > target_bytes or len(cur) >= max_utts_per_shard):
            units.append(WorkUnit(shard_name(len(units)), len(units), cur))
            cur, cur_bytes = [], 0.0
        cur.append(u)
        cur_bytes += est
    if cur:
        units.append(WorkUnit(shard_name(len(units)), len(units), cur))
    return units
