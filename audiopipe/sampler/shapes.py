"""Few batch shapes: every batch padded to one of K (items, frames) shapes, so a run meets at most K shapes.

A GPU pays for every batch shape it sees for the first time (allocator growth, kernel plans, a recompile under
torch.compile); dynamic batching gives almost every batch a new longest item. `BatchShapes.fit` picks the K length
edges that pad the corpus least (`best_edges`: every item padded to the first edge at or above its length; the
last edge is the longest kept item; each rounded up to `multiple`) and, for each edge, the items a batch padded to it may hold under the budget. `ShapeBudget` is the
budget the sampler plans with: a batch whose longest item falls at edge k holds at most sizes[k] items, so the
padded batch [sizes[k], edges[k]] never exceeds the budget. The collator (collate/pad.py) then pads the time
axis to edges[k] and the item axis to sizes[k] with empty rows (length 0, mask all False).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from audiopipe.errors import InvalidValue
from audiopipe.sampler.plan import capacities


@dataclass(frozen=True)
class BatchShapes:
    """The K shapes of a run: a batch whose longest item has m frames is padded to [sizes[k], edges[k]], k the
    first edge with m <= edges[k]."""

    edges: tuple[int, ...]  # ascending frame counts
    sizes: tuple[int, ...]  # items a batch at each edge holds (rows of its padded tensors)

    @staticmethod
    def fit(lengths: np.ndarray, budget: Any, k: int, multiple: int = 1) -> "BatchShapes":
        """K edges at the quantiles of the lengths that fit the budget alone (empty ones left out)."""
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise InvalidValue(f"shapes must be None (off) or an integer >= 1 (batch shapes per run), got {k!r}")
        if not isinstance(multiple, (int, np.integer)) or multiple < 1:
            raise InvalidValue(f"multiple must be an integer >= 1, got {multiple!r}")
        longest = budget.longest_alone()
        kept = lengths[(lengths > 0) & (lengths <= longest)]
        if kept.size == 0:
            return BatchShapes((max(int(multiple), 1),), (1,))
        edges = best_edges(kept, int(k))
        edges = np.unique(-(-edges // multiple) * multiple)
        # An edge rounded past what fits alone would make its batches cost more than the budget: cap it.
        edges = np.unique(np.minimum(edges, max(longest // multiple * multiple, int(kept[-1]))))
        sizes = capacities(edges, budget)
        keep = sizes > 0
        return BatchShapes(tuple(int(e) for e in edges[keep]), tuple(int(s) for s in sizes[keep]))

    def index(self, longest: np.ndarray | int) -> np.ndarray:
        """The shape of batches whose longest items have these lengths (len(edges) past the last edge)."""
        return np.searchsorted(np.asarray(self.edges), np.asarray(longest, dtype=np.int64), side="left")

    def shape(self, items: int, longest: int) -> tuple[int, int]:
        """(rows, frames) a batch of `items` whose longest has `longest` frames is padded to. A batch past the last
        edge (lengths other than the ones planned with) keeps its own size: nothing is cut."""
        k = int(self.index(longest))
        if k >= len(self.edges):
            return items, int(longest)
        return max(items, self.sizes[k]), self.edges[k]

    def describe(self) -> str:
        return ", ".join(f"{s}x{e}" for s, e in zip(self.sizes, self.edges))


CANDIDATES = 512  # distinct lengths the edge search considers at most (quantiles beyond): K passes over 512^2


def best_edges(lengths: np.ndarray, k: int) -> np.ndarray:
    """The k (or fewer) edges minimising the padded frames sum(edge(l) for l in lengths), edge(l) the first edge
    >= l; the last edge is max(lengths). Exact over the distinct lengths (a dynamic programme over them, one
    numpy pass per edge); past CANDIDATES distinct lengths, over that many quantiles of them."""
    values, counts = np.unique(lengths, return_counts=True)
    if values.size > CANDIDATES:
        at = np.ceil(np.arange(1, CANDIDATES + 1) * values.size / CANDIDATES).astype(np.int64) - 1
        cand = np.unique(values[at])
        counts = np.bincount(np.searchsorted(cand, values), weights=counts, minlength=cand.size)
        values = cand
    v = values.astype(np.float64)
    below = np.concatenate([[0.0], np.cumsum(counts, dtype=np.float64)])  # items shorter than values[i]
    n = v.size
    # span[i, j]: frames of the items of values[i..j] padded to values[j] (inf where i > j).
    span = v[None, :] * (below[None, 1:] - below[:n, None])
    span[np.tril_indices(n, -1)] = np.inf
    best = span[0].copy()  # best[j]: values[0..j] padded with exactly the edges so far, the last at values[j]
    starts = []  # per added edge: where the bucket ending at each j starts
    for _ in range(1, min(k, n)):  # more edges never pad more: use all k (or one per distinct length)
        total = np.concatenate([[np.inf], best[:-1]])[:, None] + span  # last bucket starts at i >= 1
        start = np.argmin(total, axis=0)
        best = total[start, np.arange(n)]
        starts.append(start)
    edges, j = [int(values[-1])], n - 1
    for start in reversed(starts):
        j = int(start[j]) - 1  # the bucket before ends here
        edges.append(int(values[j]))
    return np.asarray(sorted(edges), dtype=np.int64)


class ShapeBudget:
    """A budget (plan.BatchBudget or bucket_budget.BucketBudget) seen through BatchShapes: a batch is charged for
    the shape it is padded to. Answers the questions the planner asks of a budget (capacities, cost, fits_alone,
    longest_alone, capped)."""

    def __init__(self, base: Any, shapes: BatchShapes):
        self.base, self.shapes = base, shapes
        self._edges = np.asarray(shapes.edges, dtype=np.int64)
        self._sizes = np.asarray(shapes.sizes, dtype=np.int64)
        self.max_frames = base.max_frames
        self.max_items = base.max_items
        self.quadratic = getattr(base, "quadratic", 0.0)

    def capacities(self, lengths: np.ndarray) -> np.ndarray:
        k = self.shapes.index(np.maximum(np.asarray(lengths, dtype=np.int64), 1))
        inside = k < self._sizes.size
        return np.where(inside, self._sizes[np.minimum(k, self._sizes.size - 1)], 0).astype(np.int64)

    def capacity(self, length: np.ndarray | float) -> np.ndarray:
        return self.capacities(np.asarray(length))

    def cost(self, n: np.ndarray | int, max_len: np.ndarray | int) -> np.ndarray:
        """The base budget's cost of the batch as padded: its items at its edge's length (too long: infinite)."""
        m = np.asarray(max_len, dtype=np.int64)
        k = self.shapes.index(m)
        edge = np.where(k < self._edges.size, self._edges[np.minimum(k, self._edges.size - 1)], m)
        cost = np.asarray(self.base.cost(n, edge), dtype=np.float64)
        return np.where(k < self._edges.size, cost, np.inf)

    def padded(self, n: np.ndarray, max_len: np.ndarray) -> np.ndarray:
        """Frames of the padded tensor (rows x edge) of batches of n items whose longest has max_len frames."""
        k = np.minimum(self.shapes.index(max_len), self._edges.size - 1)
        return np.maximum(np.asarray(n), self._sizes[k]).astype(np.float64) * self._edges[k]

    def fits_alone(self, lengths: np.ndarray) -> np.ndarray:
        return np.asarray(lengths) <= self.longest_alone()

    def longest_alone(self) -> int:
        return int(self._edges[-1])

    def capped(self, max_items: int | None) -> "ShapeBudget":
        if max_items is None:
            return self
        return ShapeBudget(self.base, BatchShapes(self.shapes.edges, tuple(min(s, max_items) for s in self.shapes.sizes)))

    def config(self) -> dict[str, Any]:
        return {"edges": list(self.shapes.edges), "sizes": list(self.shapes.sizes)}
