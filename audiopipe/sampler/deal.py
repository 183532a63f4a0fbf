"""Deal the global batches of an epoch to data-parallel ranks: equal counts per rank, similar cost per step.

Batches are rows (pool, start, end) of an EpochPlan (sampler/pools.py): dealing looks at their sizes and costs
only, which come from the plan's histograms, so no batch's items are computed here.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from audiopipe.sampler.plan import BatchBudget
from audiopipe.sampler.pools import EpochPlan

Uneven = Literal["repeat", "drop"]


@dataclass
class Deal:
    """Which batch every rank trains on at every step.

    steps[s, r] indexes `table`: rank r's s-th batch is plan.batch(table[steps[s, r]]). Every rank has exactly
    len(steps) batches.
    """

    plan: EpochPlan
    table: np.ndarray  # int64 [num_batches, 3]: (pool, start, end)
    steps: np.ndarray  # int64 [num_steps, world_size]
    split: int = 0  # batches cut in two so that the count divides by world_size
    repeated: int = 0  # item occurrences added twice (only when items < batches needed)
    dropped: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # items left out ("drop")

    def batch(self, b: int) -> np.ndarray:
        """The item indices of batch b (a row of `table`)."""
        return self.plan.batch(self.table[b])

    def remaining(self, start: int) -> np.ndarray:
        """Rows not yet trained on after `start` steps, step by step (the input of a re-deal)."""
        return self.table[self.steps[start:].ravel()]

    def all_batches(self) -> list[np.ndarray]:
        """Every batch of the deal, step by step (diagnostics; computes every batch's items)."""
        return [self.batch(b) for b in self.steps.ravel()]


def equalize(
    table: np.ndarray, plan: EpochPlan, world_size: int, rng: np.random.Generator | None, uneven: Uneven
) -> tuple[np.ndarray, int, int, np.ndarray]:
    """Make the batch count a multiple of world_size: split the biggest batches; repeat/drop only if that fails.

    A batch is cut into its shorter and longer half (its rows are length-sorted, so each half is a range of the
    same pool and under budget too). Splitting is impossible only when every batch is down to one item (fewer
    items than the batches needed); then "repeat" adds copies of single-item batches and "drop" leaves single
    items out, both counted. Returns (table, splits, repeated item occurrences, dropped item indices).
    """
    n = len(table)
    missing = -n % world_size
    splits = 0
    if missing:
        sizes = table[:, 2] - table[:, 1]
        # Fewer than world_size splits are needed: only the biggest batches (and their halves) can be cut.
        m = min(n, world_size)
        # The m biggest (ties: the earlier row), without sorting a million rows: a partition, then a small sort.
        cut = np.partition(sizes, n - m)[n - m]
        top = np.flatnonzero(sizes > cut)
        top = np.concatenate([top, np.flatnonzero(sizes == cut)[: m - top.size]])
        top = top[np.lexsort((top, -sizes[top]))]
        rows = [list(table[i]) for i in top.tolist()]  # the top rows, then the halves split off them
        # Max-heap on batch size (ties: the earlier row): the biggest batch loses the least fill when halved.
        heap = [(-(r[2] - r[1]), j) for j, r in enumerate(rows)]
        heapq.heapify(heap)
        while (n + len(rows) - len(top)) % world_size and heap and -heap[0][0] >= 2:
            _, j = heapq.heappop(heap)
            p, a, b = rows[j]
            half = (b - a) // 2
            rows[j] = [p, a, a + half]
            rows.append([p, a + half, b])
            heapq.heappush(heap, (-half, j))
            heapq.heappush(heap, (-(b - a - half), len(rows) - 1))
            splits += 1
        table = table.copy()
        table[top] = np.asarray(rows[: len(top)], dtype=np.int64).reshape(-1, 3)
        table = np.concatenate([table, np.asarray(rows[len(top):], dtype=np.int64).reshape(-1, 3)])
    missing = -len(table) % world_size
    if missing == 0:
        return table, splits, 0, np.empty(0, dtype=np.int64)
    # Every batch is a single item now.
    pick = rng.permutation(len(table)) if rng is not None else np.arange(len(table))
    if uneven == "repeat":
        # Fewer items than ranks (world_size > 1 with 1 item...): cycle through them.
        extra = table[pick[np.arange(missing) % len(table)]]
        return np.concatenate([table, extra]), splits, int((extra[:, 2] - extra[:, 1]).sum()), np.empty(0, np.int64)
    gone = np.sort(pick[: len(table) % world_size])
    dropped = np.concatenate([plan.batch(table[i]) for i in gone.tolist()])
    return np.delete(table, gone, axis=0), splits, 0, dropped


def deal(
    table: np.ndarray,
    plan: EpochPlan,
    budget: BatchBudget,
    world_size: int,
    rng: np.random.Generator | None,
    uneven: Uneven = "repeat",
) -> Deal:
    """Equalize, then group batches of similar cost into steps of world_size and shuffle the steps.

    Batches are sorted by cost (ties in random order) and cut into consecutive groups of world_size, so the
    ranks of one step wait little on each other; the order of steps, and which rank gets which batch of a
    step, are random. Without a generator the plan order is kept (evaluation).
    """
    out, splits, repeated, dropped = equalize(table, plan, world_size, rng, uneven)
    n = len(out)
    if n == 0:
        return Deal(plan, out, np.empty((0, world_size), dtype=np.int64), splits, repeated, dropped)
    if rng is None:
        steps = np.arange(n, dtype=np.int64).reshape(-1, world_size)
    else:
        sizes, longest, _ = plan.stats(out)
        cost = budget.cost(sizes, longest)
        perm = rng.permutation(n)
        order = perm[np.argsort(cost[perm], kind="stable")]
        steps = order.reshape(-1, world_size)
        steps = rng.permuted(steps[rng.permutation(steps.shape[0])], axis=1)
    return Deal(plan, out, steps, splits, repeated, dropped)
