"""Deal the global batches of an epoch to data-parallel ranks: equal counts per rank, similar cost per step."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from audiopipe.sampler.plan import BatchBudget, batch_stats

Uneven = Literal["repeat", "drop"]


@dataclass
class Deal:
    """Which batch every rank trains on at every step.

    steps[s, r] indexes `batches`: rank r's s-th batch. Every rank has exactly len(steps) batches.
    """

    batches: list[np.ndarray]
    steps: np.ndarray  # int64 [num_steps, world_size]
    split: int = 0  # batches cut in two so that the count divides by world_size
    repeated: int = 0  # item occurrences added twice (only when items < batches needed)
    dropped: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))  # items left out ("drop")

    def rank_batches(self, rank: int, start: int = 0) -> list[np.ndarray]:
        return [self.batches[b] for b in self.steps[start:, rank]]

    def remaining(self, start: int) -> list[np.ndarray]:
        """Batches not yet trained on after `start` steps, step by step (the input of a re-deal)."""
        return [self.batches[b] for b in self.steps[start:].ravel()]


def split_batch(batch: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut a batch into its shorter and its longer half; each half is a subset, so it is under budget too."""
    by_len = batch[np.argsort(lengths[batch], kind="stable")]
    half = by_len.size // 2
    return by_len[:half], by_len[half:]


def equalize(
    batches: list[np.ndarray], lengths: np.ndarray, world_size: int, rng: np.random.Generator | None, uneven: Uneven
) -> tuple[list[np.ndarray], int, int, np.ndarray]:
    """Make the batch count a multiple of world_size: split the biggest batches; repeat/drop only if that fails.

    Splitting is impossible only when every batch is down to one item (fewer items than the batches needed);
    then "repeat" adds copies of single-item batches and "drop" leaves single items out, both counted.
    Returns (batches, splits, repeated item occurrences, dropped item indices).
    """
    out = list(batches)
    splits = 0
    if len(out) % world_size:
        # Max-heap on batch size: the biggest batch loses the least fill when halved.
        heap = [(-b.size, i) for i, b in enumerate(out)]
        heapq.heapify(heap)
        while len(out) % world_size and heap and -heap[0][0] >= 2:
            _, i = heapq.heappop(heap)
            short, long = split_batch(out[i], lengths)
            out[i] = short
            out.append(long)
            heapq.heappush(heap, (-short.size, i))
            heapq.heappush(heap, (-long.size, len(out) - 1))
            splits += 1
    missing = -len(out) % world_size
    if missing == 0:
        return out, splits, 0, np.empty(0, dtype=np.int64)
    # Every batch is a single item now.
    pick = rng.permutation(len(out)) if rng is not None else np.arange(len(out))
    if uneven == "repeat":
        # Fewer items than ranks (world_size > 1 with 1 item...): cycle through them.
        extra = [out[pick[j % len(out)]] for j in range(missing)]
        return out + extra, splits, sum(b.size for b in extra), np.empty(0, dtype=np.int64)
    excess = len(out) % world_size
    gone = set(pick[:excess].tolist())
    dropped = np.concatenate([out[i] for i in sorted(gone)])
    return [b for i, b in enumerate(out) if i not in gone], splits, 0, dropped


def deal(
    batches: list[np.ndarray],
    lengths: np.ndarray,
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
    out, splits, repeated, dropped = equalize(batches, lengths, world_size, rng, uneven)
    n = len(out)
    if n == 0:
        return Deal(out, np.empty((0, world_size), dtype=np.int64), splits, repeated, dropped)
    if rng is None:
        steps = np.arange(n, dtype=np.int64).reshape(-1, world_size)
    else:
        sizes, longest, _ = batch_stats(out, lengths)
        cost = budget.cost(sizes, longest)
        perm = rng.permutation(n)
        order = perm[np.argsort(cost[perm], kind="stable")]
        steps = order.reshape(-1, world_size)
        steps = rng.permuted(steps[rng.permutation(steps.shape[0])], axis=1)
    return Deal(out, steps, splits, repeated, dropped)
