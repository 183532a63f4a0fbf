"""A small corpus's epoch: several passes over its items, cut into batches as one stream, so batches are full.

A corpus that fills a budget one or two times over can only give one or two batches a pass, the last one partly
empty, and the efficiency splits of the pooled plan (pools.EpochPlan) cut it further into small batches:
78 utterances at F5-TTS's 38,400-frame budget gave 19 batches 6.9 % full. Here an epoch is `passes` passes:
the kept items are sorted by length (ties in a random order drawn per epoch) and that order is repeated
`passes` times, starting at a random offset, and cut greedily into batches as full as the budget allows. A batch
spans at most as many consecutive positions as there are items, so no batch holds an item twice. The epoch's
last batch is topped up from the pass after, so it is as full as the others (a batch of one item would also
stop a BatchNorm in training mode): every item is trained on `passes` times an epoch, a few once more.

Rows are (0, start, end) over stream positions, as an EpochPlan's are over a pool's, so dealing, resuming and the
diagnostics use them unchanged. There is no efficiency split: the stream is cut in length order already, and
splitting would give back the small batches this plan exists to avoid.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from audiopipe.sampler.plan import capacities
from audiopipe.sampler.pools import LengthOrder

# A corpus whose kept frames fill fewer budgets than this is small: its epoch is several passes (auto).
SMALL_CORPUS_BUDGETS = 4
# Below this many budgets, a corpus is also several passes when one pass's batches would carry less than
# MIN_FRAME_FILL of the budget on average: its efficiency splits cut it into small batches (1,000 short clips at
# 38,400 frames: 24 %). From here on one pass has no such splits (a corpus fills enough batches), and is not
# planned twice to find out.
CHECK_FILL_BELOW_BUDGETS = 64
MIN_FRAME_FILL = 0.5
# The budgets of frames (per rank) a small corpus's epoch is made to fill: passes = ceil(this x ranks / budgets).
EPOCH_BUDGETS = 16


def auto_passes(frames: int, max_frames: int, world_size: int,
                one_pass_fill: Callable[[], float] | None = None, items: int = 0,
                max_items: int | None = None) -> int:
    """Passes per epoch for a corpus of `frames` kept frames in `items` items: several below SMALL_CORPUS_BUDGETS
    budgets, or below CHECK_FILL_BELOW_BUDGETS when one_pass_fill() (per batch, the larger of data frames / budget
    and items / max_items, in the one-pass plan) is under MIN_FRAME_FILL; else 1. With max_items, a budget is
    filled by max_frames frames or by max_items items, whichever comes first: many short items fill batches by
    their count."""
    if frames <= 0:
        return 1
    # the corpus in budgets, num / den: by frames, or by items where the item cap fills batches first
    num, den = frames, max_frames
    if max_items and items * max_frames > frames * max_items:
        num, den = items, max_items
    several = max(2, int(-(-EPOCH_BUDGETS * world_size * den // num)))
    if num < SMALL_CORPUS_BUDGETS * den:
        return several
    if num < CHECK_FILL_BELOW_BUDGETS * den and one_pass_fill is not None and one_pass_fill() < MIN_FRAME_FILL:
        return several
    return 1


class RepeatPlan:
    """The global batches of one small-corpus epoch: `passes` copies of one length order, cut as a stream."""

    num_pools = 1

    def __init__(self, order: LengthOrder, budget, passes: int, rng: np.random.Generator | None):
        self.order, self.budget = order, budget
        self.items_computed = 0
        self.efficiency_splits = 0
        n = order.size
        lens = np.repeat(order.values, order.counts)
        items = np.asarray(order.by_len, dtype=np.int64)
        if rng is not None and n:
            # Same-length items in a random order, and a random first position: new batches every epoch.
            perm = np.lexsort((rng.random(n), lens))
            items, lens = items[perm], lens[perm]
            offset = int(rng.integers(n))
        else:
            offset = 0
        self._items = items
        # One pass more than planned: the last batch may reach into it (topped up), never past it.
        stream = (offset + np.arange((passes + 1) * n, dtype=np.int64)) % max(n, 1)
        self._len = lens[stream] if n else np.zeros(0, dtype=np.int64)
        ends = []
        i, total = 0, passes * n
        while i < total:
            w = self._len[i : i + n]  # at most n positions: distinct items
            cap = capacities(np.maximum.accumulate(w), budget)
            fits = np.arange(1, w.size + 1) <= cap  # True up to the batch's end, then False
            k = int(np.argmin(fits)) if not fits.all() else w.size
            if k == 0:
                raise AssertionError("an item that does not fit alone is in the plan; filter with fits_alone")
            i += k
            ends.append(i)
        self._stream = stream[:i]
        self._len = self._len[:i]
        self._frames = np.concatenate([[0], np.cumsum(self._len)])
        ends_a = np.asarray(ends, dtype=np.int64)
        begins = np.concatenate([[0], ends_a[:-1]]).astype(np.int64) if ends else ends_a
        self.table = np.stack([np.zeros(ends_a.size, dtype=np.int64), begins, ends_a], axis=1).reshape(-1, 3)

    @property
    def kept(self) -> int:
        """Item occurrences the epoch plans (every kept item `passes` times, those of the top-up once more)."""
        return int(self._stream.size)

    def items(self, pool: int, start: int, end: int) -> np.ndarray:
        self.items_computed += end - start
        return self._items[self._stream[start:end]]

    def batch(self, row: np.ndarray) -> np.ndarray:
        return self.items(int(row[0]), int(row[1]), int(row[2]))

    def lengths_at(self, pool: int, start: int, end: int) -> np.ndarray:
        return self._len[start:end]

    def stats(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = table[:, 1], table[:, 2]
        longest = np.array([int(self._len[x:y].max()) if y > x else 0 for x, y in zip(a.tolist(), b.tolist())],
                           dtype=np.int64)
        return b - a, longest, self._frames[b] - self._frames[a]

    def split_to_efficiency(self, target: float) -> None:
        """No efficiency splits (module docstring)."""
