"""The pieces of an epoch plan: the budget, sorted packing (of items, or of a length histogram), how many pools,
the best cut of a sorted batch, and the pair-overlap measure. sampler/pools.py assembles them into an epoch.

Everything here is a pure function of its arguments (the random generator included), so an epoch plan is
re-derived exactly from (seed, epoch, lengths, config) instead of being stored or replayed.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from audiopipe.errors import InvalidValue


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
            raise InvalidValue(f"max_frames must be a positive integer, got {self.max_frames!r}")
        if not np.isfinite(self.quadratic) or self.quadratic < 0:
            raise InvalidValue(f"quadratic must be a finite number >= 0, got {self.quadratic!r}")
        if self.max_items is not None and (not isinstance(self.max_items, (int, np.integer)) or self.max_items < 1):
            raise InvalidValue(f"max_items must be None or an integer >= 1, got {self.max_items!r}")

    def cost(self, n: np.ndarray | int, max_len: np.ndarray | int) -> np.ndarray:
        # float64 is exact for these integer products (< 2**53) and carries the quadratic term.
        n = np.asarray(n, dtype=np.float64)
        m = np.asarray(max_len, dtype=np.float64)
        return n * m + self.quadratic * n * m * m

    def fits_alone(self, lengths: np.ndarray) -> np.ndarray:
        return self.cost(1, lengths) <= self.max_frames

    def longest_alone(self) -> int:
        """The longest length that fits alone: fits_alone(m) is exactly m <= longest_alone() (cost grows with m),
        so a corpus is filtered with one integer comparison instead of float costs per item."""
        q, f = self.quadratic, float(self.max_frames)
        m = int(f if q == 0 else (np.sqrt(1 + 4 * q * f) - 1) / (2 * q))
        while m > 0 and not self.fits_alone(m):
            m -= 1
        while self.fits_alone(m + 1):
            m += 1
        return m

    def capacity(self, length: np.ndarray | float) -> np.ndarray:
        """How many items of `length` frames fit in one batch (at least 1 for lengths that fit alone)."""
        per_item = self.cost(1, np.maximum(length, 1))
        cap = np.floor(self.max_frames / per_item)
        return np.minimum(cap, self.max_items) if self.max_items is not None else cap


def validate_lengths(lengths: object) -> np.ndarray:
    """A 1-D int64 copy of `lengths` (frames per utterance), or a ValueError that says what is wrong."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise InvalidValue(f"lengths must be a 1-D array of frame counts, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InvalidValue(
            f"lengths must be integer frame counts (the index's <feature>_frames column), got dtype {arr.dtype}; "
            "convert durations with np.round(duration * frame_rate).astype(int)"
        )
    out = arr.astype(np.int64, copy=True)
    if out.size and out.min() < 0:
        bad = np.flatnonzero(out < 0)
        raise InvalidValue(f"lengths must be >= 0; {bad.size} are negative (first at index {int(bad[0])})")
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



def capacities(lengths: np.ndarray, budget: BatchBudget) -> np.ndarray:
    """How many items of each length fit in one batch (int64), exact against cost() as pack_greedy compares it.

    capacity() divides, which can be one off at the float boundary; the two corrections make it agree with the
    multiplication cost() does. 0 for lengths that do not fit alone. A budget with its own exact capacities
    (bucket_budget.BucketBudget: integer per-bucket limits) answers itself.
    """
    own = getattr(budget, "capacities", None)
    if own is not None:
        return own(lengths)
    seq = np.asarray(lengths).astype(np.float64)
    cap = np.asarray(budget.capacity(seq), dtype=np.float64)
    cap = np.where(budget.cost(cap + 1, seq) <= budget.max_frames, cap + 1, cap)
    cap = np.where(budget.cost(cap, seq) > budget.max_frames, cap - 1, cap)
    if budget.max_items is not None:
        cap = np.minimum(cap, budget.max_items)
    return np.maximum(cap, 0).astype(np.int64)


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
    cap = capacities(lengths[order], budget).astype(np.float64)
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


POSITIONAL_PER_RUN = 64  # items per distinct length below which pack_runs searches positions; tests vary it


def pack_runs(counts: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """pack_sorted's batch ends for a sorted sequence given only as runs: counts[k] items of the k-th length
    (ascending), caps[k] of which fit in one batch. Returns the end position of every batch (int64).

    The cut positions of a sorted packing depend only on the lengths, not on which items hold them, so a pool
    is packed from its length histogram alone. Same rule as pack_sorted (batch [i, e) is valid iff
    g[e-1] = e - cap[e-1] <= i, g increasing), but walked run by run: inside one run the batches are chunks of
    caps[k] (emitted at once), and a batch that crosses runs ends in the last run whose first g is <= i. So the
    loop takes at most two steps per run, whatever the item count (a 3M-item pool of 2,000 lengths: ~4,000).
    """
    keep = np.flatnonzero(np.asarray(counts) > 0)
    counts = np.asarray(counts, dtype=np.int64)[keep]
    caps = np.asarray(caps, dtype=np.int64)[keep]
    if counts.size == 0:
        return np.zeros(0, dtype=np.int64)
    if caps.min() < 1:
        raise AssertionError("a length that does not fit alone is in the pool; filter with BatchBudget.fits_alone")
    starts = np.concatenate([[0], np.cumsum(counts)])
    n = int(starts[-1])
    if n < POSITIONAL_PER_RUN * counts.size:
        # Few items per length (a pool of a small corpus, or of a million items over ~2,000 lengths): batches
        # cross runs all the time, and one step per batch is cheaper than walking every run in Python.
        # The batch from i ends at end(i) = #{j : g[j] <= i} (g strictly increasing). Inside run k, g[j] = j + 1
        # - caps[k]; so with k the last run whose first g is <= i, end(i) = min(starts[k + 1], i + caps[k]):
        # one bisect per batch over the runs, no array over the pool's positions (a searchsorted of every
        # position was most of a 1M-item epoch's planning, ~1.4 ms a 60k-item pool; this is ~0.4 ms).
        first_g = (starts[:-1] + 1 - caps).tolist()
        a, c = starts.tolist(), caps.tolist()
        cuts = []
        i = 0
        while i < n:
            k = bisect_right(first_g, i) - 1
            e, run_end = i + c[k], a[k + 1]
            i = run_end if run_end < e else e
            cuts.append(i)
        return np.asarray(cuts, dtype=np.int64)
    first_g = (starts[:-1] + 1 - caps).tolist() + [None]  # g at each run's first position, strictly increasing
    a, c = starts.tolist(), caps.tolist()
    runs = len(c)
    # Batches as (first end, step, how many): whole chunks of a run in one entry, expanded once at the end.
    first: list[int] = []
    step: list[int] = []
    many: list[int] = []
    i = r = k = 0
    a_next = a[1]  # end of run r
    while i < n:
        while a_next <= i:  # the run holding i (i only grows: both indices move forward)
            r += 1
            a_next = a[r + 1]
        if k < r:
            k = r
        while k + 1 < runs and first_g[k + 1] <= i:  # the last run the batch from i reaches into
            k += 1
        if k == r:
            cap = c[r]
            if i + cap <= a_next:
                m = (a_next - i) // cap  # whole chunks of cap inside this run
                first.append(i + cap)
                step.append(cap)
                many.append(m)
                i += m * cap
                continue
            i = a_next
        else:
            e = i + c[k]
            i = a[k + 1] if a[k + 1] < e else e
        first.append(i)
        step.append(0)
        many.append(1)
    many_a = np.asarray(many, dtype=np.int64)
    within = np.arange(int(many_a.sum()), dtype=np.int64) - np.repeat(np.cumsum(many_a) - many_a, many_a)
    return np.repeat(np.asarray(first, dtype=np.int64), many_a) + np.repeat(np.asarray(step, np.int64), many_a) * within


# ---- pooled planning: how many pools, and the best cut of a sorted batch --------------------------------

MIN_POOL_BATCHES = 4
_POOL_CHOICES = (16, 12, 8, 6, 4, 3, 2, 1)


def runs_efficiency(values: np.ndarray, counts: np.ndarray, budget: BatchBudget) -> tuple[float, int]:
    """Padding efficiency and batch count of packing counts[k] items of length values[k] in sorted order."""
    ends = pack_runs(counts, capacities(values, budget))
    if ends.size == 0:
        return 1.0, 0
    starts = np.concatenate([[0], ends[:-1]])
    run_end = np.cumsum(counts)
    longest = values[np.searchsorted(run_end, ends - 1, side="right")].astype(np.float64)
    real = float((values.astype(np.float64) * counts).sum())
    return real / float(((ends - starts) * longest).sum()), int(ends.size)


def choose_pools(values: np.ndarray, counts: np.ndarray, budget: BatchBudget, target: float,
                 rng: np.random.Generator) -> int:
    """The most pools (of _POOL_CHOICES, <= 16) whose sorted packing still reaches `target` padding efficiency,
    each pool filling at least MIN_POOL_BATCHES batches. `counts[k]` items have length `values[k]`.

    One pool of N/P random items sorted and packed is what every pool of an epoch looks like, so its efficiency,
    measured on a random draw of that many items (a hypergeometric draw of the length histogram: no pass over
    the items), predicts the epoch's. More pools mean more random batch composition (pair overlap between
    epochs ~ 0.7 / P), fewer mean less padding.
    """
    total = int(np.sum(counts))
    if total == 0:
        return 1
    for p in _POOL_CHOICES:
        if p == 1:
            return 1
        sample = rng.multivariate_hypergeometric(np.asarray(counts, dtype=np.int64), total // p)
        efficiency, batches = runs_efficiency(values, sample, budget)
        # A pool must fill a few batches: pools of a batch or less would make every batch partial.
        if batches >= MIN_POOL_BATCHES and efficiency >= target:
            return p
    return 1


def best_cut(seq: np.ndarray) -> tuple[float, int]:
    """Padded frames saved by the best cut of an ascending length sequence into a shorter and a longer part,
    and where (the shorter part's size)."""
    seq = np.asarray(seq, dtype=np.float64)
    n = seq.size
    if n < 2:
        return 0.0, 0
    k = np.arange(1, n, dtype=np.float64)
    padded = k * seq[:-1] + (n - k) * seq[-1]
    j = int(np.argmin(padded))
    return float(n * seq[-1] - padded[j]), j + 1


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
