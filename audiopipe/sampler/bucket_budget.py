"""Per-length-bucket batch budgets: what a batch may hold depends on how long its longest item is.

One global `max_frames` must fit the bucket where a model needs the most memory per frame, so every other bucket
trains below what the GPU could hold. A calibration (benchmarks/gpu_proof.py's `calibrate` part, in the spirit of
NeMo's OOMptimizer) measures per bucket the largest batch that fits a model on a GPU with a margin and writes it as
a small JSON file; `BucketBudget.read(path)` turns that file into a budget the sampler plans with:

    {"format": "audiopipe.bucket_budget/1",
     "buckets": [{"max_len": 400, "max_frames": 150000, "max_items": 600},
                 {"max_len": 1200, "max_frames": 160000, "max_items": 200}, ...],
     "source": {...}}            # free-form: model, GPU, margin, measured memory (never read by the sampler)

A batch whose longest item has m frames belongs to the first bucket with m <= max_len and holds at most
min(max_frames // m, max_items) items; items longer than the last bucket's max_len are too long (dropped and
counted, as with a global budget). The sampler packs sorted runs of lengths and needs a capacity that never grows
with the length, so the capacity used is the running minimum over shorter lengths: a longer batch never holds more
items than a shorter one may. That can only lower a bucket's figure, never exceed one.

The sampler takes it where it takes max_frames (`BucketBatchSampler(lengths, BucketBudget.read(path))`,
`make_loader(..., max_frames=budget)`, a trainer's `--bucket-budget FILE`); it answers the same questions as
`plan.BatchBudget` (cost, capacity, fits_alone, longest_alone), so planning, dealing and diagnostics are unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from audiopipe.errors import AudiopipeError

FORMAT = "audiopipe.bucket_budget/1"


class BucketBudgetError(AudiopipeError, ValueError):
    """A budget file that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class Bucket:
    max_len: int  # longest item (frames) of a batch in this bucket
    max_frames: int  # padded frames (items x longest) a batch may hold
    max_items: int  # items a batch may hold


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise BucketBudgetError(f"{what} must be an integer >= 1, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class BucketBudget:
    """Batch budgets per bucket of the longest item's length; `max_items` (optional) caps every bucket."""

    buckets: tuple[Bucket, ...]
    max_items: int | None = None
    source: dict = field(default_factory=dict, compare=False)
    quadratic: float = 0.0  # the calibration measured the real cost: no attention term on top

    def __post_init__(self) -> None:
        if not self.buckets:
            raise BucketBudgetError("a bucket budget needs at least one bucket")
        for i, b in enumerate(self.buckets):
            for name in ("max_len", "max_frames", "max_items"):
                _positive_int(getattr(b, name), f"bucket {i} {name}")
        edges = [b.max_len for b in self.buckets]
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise BucketBudgetError(f"bucket max_len must rise strictly from bucket to bucket, got {edges}")
        if self.max_items is not None:
            _positive_int(self.max_items, "max_items")
        # Capacity at each bucket's top before the running minimum, then the floor each bucket inherits.
        floors, floor = [], np.inf
        for b in self.buckets:
            floors.append(floor)
            floor = min(floor, self._raw(b, b.max_len))
        object.__setattr__(self, "_floors", np.asarray(floors, dtype=np.float64))
        object.__setattr__(self, "_edges", np.asarray(edges, dtype=np.int64))

    def _raw(self, b: Bucket, m: int) -> int:
        cap = min(b.max_frames // max(int(m), 1), b.max_items)
        return min(cap, self.max_items) if self.max_items is not None else cap

    # ---- files ------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, doc: Any, where: str = "bucket budget") -> "BucketBudget":
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
            raise BucketBudgetError(f"{where}: not a bucket budget (format {got!r}, expected {FORMAT!r})")
        rows = doc.get("buckets")
        if not isinstance(rows, list) or not rows:
            raise BucketBudgetError(f"{where}: 'buckets' must be a non-empty list")
        try:
            buckets = tuple(Bucket(r["max_len"], r["max_frames"], r["max_items"]) for r in rows)
            return cls(buckets, doc.get("max_items"), dict(doc.get("source") or {}))
        except (KeyError, TypeError) as e:
            raise BucketBudgetError(f"{where}: every bucket needs max_len, max_frames and max_items ({e!r})") from None
        except BucketBudgetError as e:
            raise BucketBudgetError(f"{where}: {e}") from None

    @classmethod
    def read(cls, path: str | Path) -> "BucketBudget":
        p = Path(path)
        try:
            doc = json.loads(p.read_text())
        except FileNotFoundError:
            raise BucketBudgetError(f"bucket budget {p}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BucketBudgetError(f"bucket budget {p}: not readable JSON ({e})") from None
        return cls.from_dict(doc, f"bucket budget {p}")

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": FORMAT,
                               "buckets": [{"max_len": b.max_len, "max_frames": b.max_frames,
                                            "max_items": b.max_items} for b in self.buckets]}
        if self.max_items is not None:
            doc["max_items"] = self.max_items
        if self.source:
            doc["source"] = self.source
        return doc

    def write(self, path: str | Path) -> Path:
        from audiopipe.storage.atomic import write_text_atomic

        write_text_atomic(Path(path), json.dumps(self.to_dict(), indent=1) + "\n")
        return Path(path)

    def config(self) -> dict[str, Any]:
        """What a sampler state must agree on to resume (the buckets and the cap; not the free-form source)."""
        return {"buckets": [[b.max_len, b.max_frames, b.max_items] for b in self.buckets],
                "max_items": self.max_items}

    def capped(self, max_items: int | None) -> "BucketBudget":
        """This budget with every bucket also held to max_items (None: unchanged)."""
        if max_items is None:
            return self
        cap = max_items if self.max_items is None else min(max_items, self.max_items)
        return BucketBudget(self.buckets, cap, self.source)

    # ---- the questions a budget answers (those of plan.BatchBudget) -------------------------------------

    @property
    def max_frames(self) -> int:
        """The most padded frames any batch may hold (shared-memory sizing, diagnostics)."""
        return max(b.max_frames for b in self.buckets)

    def bucket_of(self, lengths: np.ndarray | int) -> np.ndarray:
        """Bucket number of each longest-item length; len(buckets) for lengths beyond the last bucket."""
        return np.searchsorted(self._edges, np.asarray(lengths, dtype=np.int64), side="left")

    def capacities(self, lengths: np.ndarray) -> np.ndarray:
        """Items a batch whose longest item has each of these lengths may hold (int64; 0: too long alone)."""
        m = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
        k = self.bucket_of(m)
        inside = k < len(self.buckets)
        kk = np.minimum(k, len(self.buckets) - 1)
        frames = np.array([b.max_frames for b in self.buckets], dtype=np.int64)[kk]
        items = np.array([b.max_items for b in self.buckets], dtype=np.int64)[kk]
        cap = np.minimum(frames // m, items).astype(np.float64)
        if self.max_items is not None:
            cap = np.minimum(cap, self.max_items)
        cap = np.minimum(cap, self._floors[kk])
        return np.where(inside, cap, 0).astype(np.int64)

    def capacity(self, length: np.ndarray | float) -> np.ndarray:
        return self.capacities(np.asarray(length))

    def cost(self, n: np.ndarray | int, max_len: np.ndarray | int) -> np.ndarray:
        """max_frames x the share of its bucket's capacity a batch uses: <= max_frames exactly when the batch is
        valid (n / cap is exactly 1.0 at n == cap), as BatchBudget.cost is; infinite for a too-long item."""
        n = np.asarray(n, dtype=np.float64)
        cap = self.capacities(np.atleast_1d(np.asarray(max_len))).astype(np.float64).reshape(np.shape(max_len))
        with np.errstate(divide="ignore"):
            share = np.where(cap > 0, n / np.where(cap > 0, cap, 1.0), np.inf)
        return share * float(self.max_frames)

    def fits_alone(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(lengths) <= self.longest_alone()

    def longest_alone(self) -> int:
        """The longest length a batch of one may have (the capacity never rises with length, so a threshold)."""
        longest = 0
        for b, floor in zip(self.buckets, self._floors):
            if floor < 1 or self._raw(b, longest + 1) < 1:
                break
            top = min(b.max_len, b.max_frames)  # max_frames // m >= 1 up to m = max_frames
            longest = max(longest, top)
            if top < b.max_len:
                break
        return longest

    def describe(self) -> list[str]:
        """One line per bucket: its lengths and what a batch there may hold (after the running minimum)."""
        lines, lo = [], 1
        for b in self.buckets:
            cap = int(self.capacities(np.array([b.max_len]))[0])
            lines.append(f"lengths {lo}-{b.max_len}: up to {b.max_frames} padded frames, {b.max_items} items "
                         f"({cap} of the longest)")
            lo = b.max_len + 1
        return lines
