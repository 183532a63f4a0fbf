"""Plan one epoch of batches from a length array: budget, random pools sorted and packed, efficiency splits.

Everything here is a pure function of its arguments (the random generator included), so an epoch plan is
re-derived exactly from (seed, epoch, lengths, config) instead of being stored or replayed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchBudget:
    """What one batch may cost, counted on the PADDED batch.

    cost(n, m) = n * m + quadratic * n * m**2, with n items and m the longest item's frames. The linear term
    is the padded frame count; the quadratic term approximates self-attention (n sequences of length m cost
    ~n*m^2), e.g. quadratic = 1/2000 makes a 2000-frame item count twice its length. A batch is valid when
    cost <= max_frames and n <= max_items (when set).
    """

    max_frames: int
    quadratic: float = 0.0
    max_items: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_frames, (int, np.integer)) or self.max_frames <= 0:
            raise ValueError(f"max_frames must be a positive integer, got {self.max_frames!r}")
        if not np.isfinite(self.quadratic) or self.quadratic < 0:
            raise ValueError(f"quadratic must be a finite number >= 0, got {self.quadratic!r}")
        if self.max_items is not None and (not isinstance(self.max_items, (int, np.integer)) or self.max_items < 1):
            raise ValueError(f"max_items must be None or an integer >= 1, got {self.max_items!r}")

    def cost(self, n: np.ndarray | int, max_len: np.ndarray | int) -> np.ndarray:
        # float64 is exact for these integer products (< 2**53) and carries the quadratic term.
        n = np.asarray(n, dtype=np.float64)
        m = np.asarray(max_len, dtype=np.float64)
        return n * m + self.quadratic * n * m * m

    def fits_alone(self, lengths: np.ndarray) -> np.ndarray:
        return self.cost(1, lengths) <= self.max_frames

    def capacity(self, length: np.ndarray | float) -> np.ndarray:
        """How many items of `length` frames fit in one batch (at least 1 for lengths that fit alone)."""
        per_item = self.cost(1, np.maximum(length, 1))
        cap = np.floor(self.max_frames / per_item)
        return np.minimum(cap, self.max_items) if self.max_items is not None else cap


def validate_lengths(lengths: object) -> np.ndarray:
    """A 1-D int64 copy of `lengths` (frames per utterance), or a ValueError that says what is wrong."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ValueError(f"lengths must be a 1-D array of frame counts, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"lengths must be integer frame counts (the index's <feature>_frames column), got dtype {arr.dtype}; "
            "convert durations with np.round(duration * frame_rate).astype(int)"
        )
    out = arr.astype(np.int64, copy=True)
    if out.size and out.min() < 0:
        bad = np.flatnonzero(out < 0)
        raise ValueError(f"lengths must be >= 0; {bad.size} are negative (first at index {int(bad[0])})")
    return out


def pack_greedy(order: np.ndarray, lengths: np.ndarray, budget: BatchBudget) -> list[np.ndarray]:
    """Cut `order` into consecutive batches, each as long as the padded budget allows.

    Every item must fit alone. The leftovers at the top of a bucket simply start the next bucket's first
    batch, so only the very last batch of the epoch can be partial. Works on windows per batch (not per item)
    so a million items pack in well under a second.
    """
    seq = lengths[order].astype(np.float64)
    n = seq.size
    cap = budget.max_items if budget.max_items is not None else n
    batches: list[np.ndarray] = []
    i = 0
    window = 64
    while i < n:
        while True:
            w = seq[i : i + min(window, cap)]
            run_max = np.maximum.accumulate(w)
            counts = np.arange(1, w.size + 1, dtype=np.float64)
            cost = counts * run_max + budget.quadratic * counts * run_max * run_max
            # cost is non-decreasing in the count, so the largest batch that fits is a binary search away.
            k = int(np.searchsorted(cost, budget.max_frames, side="right"))
            if k < w.size or i + w.size >= n or w.size >= cap:
                break
            window *= 2
        if k == 0:
            raise AssertionError(f"item {int(order[i])} does not fit alone; filter with BatchBudget.fits_alone")
        batches.append(order[i : i + k])
        i += k
        window = max(64, 2 * k)
    return batches



def pack_sorted(order: np.ndarray, lengths: np.ndarray, budget: BatchBudget) -> list[np.ndarray]:
    """pack_greedy for an `order` sorted by length (ascending), with no Python step per item or window.

    In a sorted run, a batch that ends at position j has its longest item there, so it may hold at most
    cap[j] = how many items of that length fit. The batch from i to j is valid iff g[j] = j + 1 - cap[j] <= i,
    and g strictly increases with j (j grows, cap does not), so the greedy end of the batch that starts at i
    is one searchsorted for every i at once. The batches are then found by following those ends from 0.
    """
    n = order.size
    if n == 0:
        return []
    seq = lengths[order].astype(np.float64)
    cap = np.asarray(budget.capacity(seq), dtype=np.float64)
    # capacity() divides; make it exact against cost() as pack_greedy compares it, at the float boundary too.
    cap = np.where(budget.cost(cap + 1, seq) <= budget.max_frames, cap + 1, cap)
    cap = np.where(budget.cost(cap, seq) > budget.max_frames, cap - 1, cap)
    if budget.max_items is not None:
        cap = np.minimum(cap, budget.max_items)
    if cap.min() < 1:
        i = int(np.argmax(cap < 1))
        raise AssertionError(f"item {int(order[i])} does not fit alone; filter with BatchBudget.fits_alone")
    g = np.arange(1, n + 1, dtype=np.float64) - cap
    end = np.searchsorted(g, np.arange(n, dtype=np.float64), side="right")
    cuts = [0]
    i = 0
    while i < n:  # one step per batch; indexing the array beats converting a million ends to a list
        i = int(end[i])
        cuts.append(i)
    return [order[a:b] for a, b in zip(cuts[:-1], cuts[1:])]


def batch_stats(batches: list[np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(items, longest, real frames) of every batch, without a Python step per batch."""
    sizes = np.fromiter((b.size for b in batches), dtype=np.int64, count=len(batches))
    if not batches:
        return sizes, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    flat = lengths[np.concatenate(batches)]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return sizes, np.maximum.reduceat(flat, offsets), np.add.reduceat(flat, offsets)


# ---- pooled planning: sort inside random pools, pack, split the most wasteful batches ----------------------

MAX_POOLS = 16
MIN_POOL_BATCHES = 4
_POOL_CHOICES = (16, 12, 8, 6, 4, 3, 2, 1)


def sorted_efficiency(lengths: np.ndarray, budget: BatchBudget) -> tuple[float, int]:
    """Padding efficiency and batch count of packing `lengths` in sorted order (the best full batches can do)."""
    if lengths.size == 0:
        return 1.0, 0
    order = np.argsort(lengths, kind="stable")
    batches = pack_sorted(order, lengths, budget)
    sizes, longest, _ = batch_stats(batches, lengths)
    return float(lengths.sum()) / float((sizes * longest.astype(np.float64)).sum()), len(batches)


def choose_pools(lengths: np.ndarray, budget: BatchBudget, target: float, rng: np.random.Generator) -> int:
    """The most pools (<= MAX_POOLS) whose sorted packing still reaches `target` padding efficiency, each pool
    filling at least MIN_POOL_BATCHES batches.

    One pool of N/P random items sorted and packed is what every pool of an epoch looks like, so its efficiency,
    measured on a random subsample of that size, predicts the epoch's. More pools mean more random batch
    composition (pair overlap between epochs ~ 0.7 / P), fewer mean less padding.
    """
    if lengths.size == 0:
        return 1
    sample = lengths[rng.permutation(lengths.size)]
    for p in _POOL_CHOICES:
        if p == 1:
            return 1
        efficiency, batches = sorted_efficiency(sample[: lengths.size // p], budget)
        # A pool must fill a few batches: pools of a batch or less would make every batch partial.
        if batches >= MIN_POOL_BATCHES and efficiency >= target:
            return p
    return 1


def pack_pools(indices: np.ndarray, lengths: np.ndarray, budget: BatchBudget, pools: int,
               rng: np.random.Generator | None) -> list[np.ndarray]:
    """Cut the items into `pools` random pools, sort each by length and pack it greedily.

    Ties in length are broken at random. Each pool's last batch is partial; those leftovers (the longest items of
    every pool) are sorted and packed together instead, so an epoch has about one partial batch, not `pools`
    (a pool that fills only one batch keeps it).
    Without a generator there is one pool in plain length order (evaluation: the same batches every epoch).
    Every batch comes out sorted by length (split_to_efficiency relies on it).
    """
    if indices.size == 0:
        return []
    if rng is None:
        return pack_sorted(indices[np.argsort(lengths[indices], kind="stable")], lengths, budget)
    shuffled = indices[rng.permutation(indices.size)]
    out: list[np.ndarray] = []
    leftovers: list[np.ndarray] = []
    for pool in np.array_split(shuffled, max(1, min(pools, indices.size))):
        batches = pack_sorted(pool[np.argsort(lengths[pool], kind="stable")], lengths, budget)
        if len(batches) == 1:
            out += batches  # a pool of one batch is kept whole: merging it would undo its random draw
            continue
        out += batches[:-1]
        leftovers.append(batches[-1])
    if leftovers:
        rest = np.concatenate(leftovers)
        out += pack_sorted(rest[np.argsort(lengths[rest], kind="stable")], lengths, budget)
    return out


def _best_cut(batch: np.ndarray, lengths: np.ndarray) -> tuple[float, int]:
    """Padded frames saved by the best cut of a length-sorted batch into a shorter and a longer part, and where."""
    seq = lengths[batch].astype(np.float64)
    n = seq.size
    if n < 2:
        return 0.0, 0
    k = np.arange(1, n, dtype=np.float64)
    padded = k * seq[:-1] + (n - k) * seq[-1]
    j = int(np.argmin(padded))
    return float(n * seq[-1] - padded[j]), j + 1


def split_to_efficiency(batches: list[np.ndarray], lengths: np.ndarray, target: float) -> tuple[list[np.ndarray], int]:
    """Split the batches that waste most padding until the plan's padding efficiency reaches `target`.

    Each split cuts one length-sorted batch where it saves the most padded frames (a subset is under budget
    too); the batch with the largest saving goes first, so the target is reached with few extra batches. A
    corpus too small for full batches of similar lengths pays with batches below the budget (lower fill), as
    lhotse's buckets do. Returns (batches, number of splits).
    """
    if not batches or target <= 0:
        return batches, 0
    sizes, longest, frames = batch_stats(batches, lengths)
    real = float(frames.sum())
    padded = float((sizes * longest.astype(np.float64)).sum())
    if real >= target * padded:
        return batches, 0
    out = list(batches)
    heap = []
    for i, b in enumerate(out):
        gain, cut = _best_cut(b, lengths)
        if gain > 0:
            heap.append((-gain, i, cut))
    heapq.heapify(heap)
    splits = 0
    while heap and real < target * padded:
        neg_gain, i, cut = heapq.heappop(heap)
        b = out[i]
        out[i], tail = b[:cut], b[cut:]
        out.append(tail)
        padded += neg_gain
        splits += 1
        for j in (i, len(out) - 1):
            gain, c = _best_cut(out[j], lengths)
            if gain > 0:
                heapq.heappush(heap, (-gain, j, c))
    return out, splits


def pair_overlap(before: list[np.ndarray], after: list[np.ndarray], num_items: int) -> float:
    """Share of the item pairs that share a batch in `after` which already shared one in `before`.

    1.0 for fixed batches (F5's sort-and-pack), about 1/num_batches for fully random ones. Items repeated in a
    plan count once (their first batch).
    """
    pairs = sum(b.size * (b.size - 1) // 2 for b in after)
    if pairs == 0:
        return 0.0
    where = np.full(num_items, -1, dtype=np.int64)
    for j, b in enumerate(before):
        where[b] = j
    items = np.concatenate(after)
    batch = np.repeat(np.arange(len(after), dtype=np.int64), [b.size for b in after])
    prev = where[items]
    ok = prev >= 0
    key = batch[ok] * (len(before) + 1) + prev[ok]
    _, counts = np.unique(key, return_counts=True)
    return float((counts * (counts - 1) // 2).sum()) / pairs
