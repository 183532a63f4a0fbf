"""Plan one epoch of batches from a length array: budget, bucket boundaries, ordering, greedy packing.

Everything here is a pure function of its arguments (the random generator included), so an epoch plan is
re-derived exactly from (seed, epoch, lengths, config) instead of being stored or replayed.
"""

from __future__ import annotations

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


def estimate_boundaries(
    lengths: np.ndarray,
    budget: BatchBudget,
    bucket_width: float,
    min_bucket_batches: float,
    sample_size: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Upper edges of the length buckets (the last bucket is open), estimated from a random sample.

    A geometric grid with ratio (1 + bucket_width) spans the sample's range: items of one cell differ by at
    most that ratio, which bounds padding (a batch of one cell wastes < bucket_width/2 on average). The sample
    (scaled to the corpus size) says how many batches each cell will fill; consecutive cells are merged, from
    the short end, until a bucket holds at least `min_bucket_batches` batches, so that sparse tails still get
    a new composition every epoch instead of the same few items.
    """
    if lengths.size == 0:
        return np.empty(0, dtype=np.float64)
    sample = lengths if lengths.size <= sample_size else rng.choice(lengths, size=sample_size, replace=False)
    scale = lengths.size / sample.size
    ratio = 1.0 + bucket_width
    lo, hi = float(max(sample.min(), 1)), float(sample.max())
    n_cells = int(np.ceil(np.log(hi / lo) / np.log(ratio))) + 1
    edges = lo * ratio ** np.arange(1, n_cells + 1)
    cell_items = np.bincount(np.searchsorted(edges, sample, side="right"), minlength=n_cells + 1)[:n_cells] * scale
    kept: list[float] = []
    acc = 0.0
    for edge, items in zip(edges, cell_items):
        acc += items
        # Items of the bucket are padded up to ~its upper edge, so that edge sets how many fit in a batch.
        if acc / max(float(budget.capacity(edge)), 1.0) >= min_bucket_batches:
            kept.append(float(edge))
            acc = 0.0
    if acc > 0 and kept:
        kept.pop()  # a last bucket too small to stand alone joins the one below it
    return np.asarray(kept, dtype=np.float64)


def bucket_order(
    indices: np.ndarray, lengths: np.ndarray, edges: np.ndarray, rng: np.random.Generator | None
) -> np.ndarray:
    """`indices` ordered bucket by bucket (short to long), in random order inside a bucket.

    With rng=None the order is simply by length (deterministic, for evaluation).
    """
    if rng is None:
        return indices[np.argsort(lengths[indices], kind="stable")]
    shuffled = indices[rng.permutation(indices.size)]
    bucket = np.searchsorted(edges, lengths[shuffled], side="right")
    return shuffled[np.argsort(bucket, kind="stable")]


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


def plan_epoch(
    indices: np.ndarray,
    lengths: np.ndarray,
    budget: BatchBudget,
    edges: np.ndarray,
    bucket_width: float,
    rng: np.random.Generator | None,
) -> list[np.ndarray]:
    """The global batches of one epoch (before dealing to ranks), from the items that fit alone.

    With a generator, the bucket edges are shifted up by a random fraction of one grid cell, items are
    shuffled inside their bucket, and packed: a new batch composition every epoch. Without one (no shuffle),
    the items are packed in length order.
    """
    if indices.size == 0:
        return []
    if rng is not None and edges.size:
        edges = edges * (1.0 + bucket_width) ** rng.random()
    order = bucket_order(indices, lengths, edges, rng)
    return pack_greedy(order, lengths, budget)
