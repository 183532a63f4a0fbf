"""An epoch's pooled plan held as position ranges, so that a batch's items are computed only when it is drawn.

The pooled plan sorts random pools by length and packs them. Where a batch is cut depends only on the sorted
LENGTHS of its pool, not on which items hold them, so the whole epoch is planned from per-pool length
histograms (planning work ~ pools x distinct lengths + batches, never ~ items), and a batch is a range
[start, end) of its pool's sorted order. Which items sit at those positions is a per-batch computation:

- `LengthOrder` (once per sampler): the kept items grouped by length, `by_len` (index order inside a length).
- Pools: for every length, its `counts[k]` items are put in a random order (a seeded affine bijection of
  0..counts[k]-1: a*x+b mod counts[k], a coprime to counts[k]), and pool p takes the next `hist[p, k]` of them;
  `hist` is a hypergeometric split of the histogram into pools of equal size, which is what cutting a random
  permutation of the items into equal pools gives. Inside a pool, same-length items keep that random order.
- Position x of pool p: its length run k (searchsorted over the pool's histogram), its rank inside the run,
  the bijection, `by_len` -- O(batch size) for one batch, nothing for the batches not drawn.
- Leftovers (each pool's last, partial batch: its longest items) are sorted and packed together as one more
  pool, from their lengths, so an epoch has about one partial batch, not `pools`; their items are looked up
  (pools x one batch) when a batch of that pool is first drawn.

Batches are rows (pool, start, end); splitting a length-sorted batch keeps it a range of the same pool.
"""

from __future__ import annotations

import heapq
import threading
from typing import Callable

import numpy as np

from audiopipe.sampler.plan import BatchBudget, best_cut, capacities, pack_runs


class _InBackground:
    """fn() run on a daemon thread; result() waits for it (and raises what it raised)."""

    def __init__(self, fn: Callable[[], np.ndarray]):
        self._done = threading.Event()
        self._value: np.ndarray | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), name="audiopipe-length-order", daemon=True).start()

    def _run(self, fn: Callable[[], np.ndarray]) -> None:
        try:
            self._value = fn()
        except BaseException as e:  # handed to the thread that asks for the result
            self._error = e
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self) -> np.ndarray:
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value


class LengthOrder:
    """The kept items grouped by length: lengths values[k] (ascending) held by by_len[starts[k]:starts[k+1]].

    values (int64 [K], the distinct kept lengths), counts (int64 [K]) and starts (int64 [K + 1]) come from a
    histogram; by_len (int32, int64 past 2**31 items; [kept] item indices, stable by length) from a sort. Only
    a batch's items need by_len, never the plan (it is packed and dealt from the histogram), so from
    BACKGROUND_SORT_FROM items the sort runs on a thread (numpy's sort releases the GIL) while the sampler is
    built and the first epoch is planned; by_len waits for it. members() need not: while the sort runs, the
    lengths a lookup needs are found by one pass over the items' length codes (~1 ms a million items, whatever
    the number of lengths), up to SCAN_PASSES_UP_TO passes in all; the first batches, typically.
    """

    def __init__(self, values: np.ndarray, counts: np.ndarray, starts: np.ndarray,
                 by_len: np.ndarray | _InBackground, codes: np.ndarray | None = None):
        self.values, self.counts, self.starts = values, counts, starts
        self._by_len = by_len
        # While by_len is sorted: every item's length code (k, or K when left out), for members() to scan.
        self._codes = codes
        self._scanned: dict[int, np.ndarray] = {}
        self._scans = 0

    @property
    def by_len(self) -> np.ndarray:
        if not isinstance(self._by_len, np.ndarray):  # still being sorted: wait for it
            self._by_len = self._by_len.result()
            self._codes, self._scanned = None, {}
        return self._by_len

    def members(self, k: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """by_len[starts[k] + seg]: the seg-th item (in index order) of length values[k], for arrays k, seg."""
        pending = self._by_len
        if isinstance(pending, np.ndarray) or self._codes is None or pending.done():
            return self.by_len[self.starts[k] + seg]
        new = set(k.tolist()) - self._scanned.keys()
        if new:
            if self._scans >= SCAN_PASSES_UP_TO:  # more passes would cost more than waiting for the sort
                return self.by_len[self.starts[k] + seg]
            wanted = np.zeros(self.values.size + 1, dtype=bool)
            wanted[list(new)] = True
            hit = np.flatnonzero(wanted[self._codes])
            codes = self._codes[hit]
            for kind in new:  # exactly by_len's slice of this length: its items in index order
                self._scanned[kind] = hit[codes == kind]
            self._scans += 1
        out = np.empty(k.size, dtype=np.int64)
        for kind in set(k.tolist()):
            sel = k == kind
            out[sel] = self._scanned[kind][seg[sel]]
        return out

    @staticmethod
    def build(lengths: np.ndarray, longest: int, items: np.ndarray | None = None) -> "LengthOrder":
        """Group the items of 1..longest frames (int64 `lengths`); the others (empty, too long) are left out.

        items: the item indices to group, in their order (repeats allowed: an item drawn twice by a per-epoch
        selection appears twice); default every index of `lengths`.

        Memory-lean for 50M items: the lengths are counted into a histogram, then the items are placed by a
        stable counting sort into an int32 index; temporaries stay the size of a chunk. From
        COMPILED_SORT_FROM items both passes are compiled (sampler/counting.py); below, numpy does them chunk
        by chunk (uint16 length codes, radix-sorted per chunk), on a thread from BACKGROUND_SORT_FROM items
        (every index of `lengths` only: a per-epoch selection is sorted at once). All give the same order
        (tested).
        """
        chunk = 1 << 22
        total = lengths.size if items is None else items.size
        top = int(min(longest, lengths.max())) if lengths.size else 0
        hist = np.zeros(top + 2, dtype=np.int64)
        compiled = total >= COMPILED_SORT_FROM
        # The compiled passes read every item; a selection is turned into its lengths first (one gather).
        source = lengths if items is None else None
        if compiled:
            # Two compiled passes (~0.3 s for 50M items, plus ~0.5 s to load numba) instead of ~3 s of chunked
            # numpy; below this size numpy is faster than loading the compiler.
            from audiopipe.sampler.counting import counting_sort, length_histogram

            source = lengths if items is None else lengths[items]
            length_histogram(source, top, hist)
        else:
            for s in range(0, total, chunk):
                part = lengths[s : s + chunk] if items is None else lengths[items[s : s + chunk]]
                hist += np.bincount(np.minimum(part, top + 1), minlength=top + 2)
        hist[0] = hist[top + 1] = 0  # empty and too long: not kept
        values = np.flatnonzero(hist)
        counts = hist[values]
        k = values.size
        code_dtype = np.uint16 if k < np.iinfo(np.uint16).max else np.int32
        rank = (np.cumsum(hist > 0) - 1).astype(code_dtype)
        rank[0] = rank[top + 1] = k  # left-out items sort after every kept length
        index_dtype = np.int32 if lengths.size < 2**31 else np.int64
        starts = np.concatenate([[0], np.cumsum(counts)])
        cursor = np.append(starts[:-1], starts[-1])  # next free slot of every length (left-out: past the end)
        if compiled:
            by_len = np.empty(int(starts[-1]), dtype=index_dtype)
            counting_sort(source, rank, top, cursor, by_len)  # positions in `source`
            if items is not None:
                by_len = items[by_len].astype(index_dtype)
            return LengthOrder(values.astype(np.int64), counts, starts, by_len)

        if items is None and BACKGROUND_SORT_FROM <= total <= chunk and total:
            # One chunk: its length codes are computed here (members() scans them while the sort runs), their
            # stable sort (the loop's single-chunk case below) on a thread.
            clip = int(lengths.max()) > top + 1
            codes = rank[np.minimum(lengths, top + 1) if clip else lengths]
            kept = int(starts[-1])
            sort = _InBackground(lambda: np.argsort(codes, kind="stable")[:kept].astype(index_dtype))
            return LengthOrder(values.astype(np.int64), counts, starts, sort, codes)
        by_len = np.empty(int(starts[-1]), dtype=index_dtype)
        # A stable counting sort, chunk by chunk: memory stays ~ a chunk, not 50M sort indices (400 MB).
        clip = lengths.size and int(lengths.max()) > top + 1  # too-long items map to the left-out code top + 1
        for s in range(0, total, chunk):
            ids = None if items is None else items[s : s + chunk]
            part = lengths[s : s + chunk] if items is None else lengths[ids]
            code = rank[np.minimum(part, top + 1) if clip else part]
            seen = np.bincount(code, minlength=k + 1)
            order = np.argsort(code, kind="stable")[: code.size - int(seen[k])]  # radix sort (uint16 codes)
            placed = order + s if ids is None else ids[order]
            if total <= chunk:  # one chunk: its sorted order is the whole index
                by_len[:] = placed
                break
            first = np.cumsum(seen) - seen  # where each length starts in the sorted chunk
            by_len[(cursor - first)[code[order]] + np.arange(order.size)] = placed
            cursor += seen
        return LengthOrder(values.astype(np.int64), counts, starts, by_len)

    @property
    def size(self) -> int:
        return int(self.starts[-1])


COMPILED_SORT_FROM = 1 << 23  # items; tests lower it to check both paths give the same order
# Items from which the numpy sort runs on a thread (below, ~2 ms: less than waiting for one), up to one chunk
# (4M: beyond, the chunked sort runs at once, and from 8M the compiled one); tests vary it.
BACKGROUND_SORT_FROM = 1 << 17
# Passes over the length codes members() makes, in all, while the sort runs (each ~1 ms at 1M items; the
# sort ~15-25 ms): the first batch and those make_loader's read-ahead announces with it, typically.
SCAN_PASSES_UP_TO = 8


def _equal_sizes(n: int, parts: int) -> np.ndarray:
    """np.array_split's part sizes."""
    return np.full(parts, n // parts, dtype=np.int64) + (np.arange(parts) < n % parts)


class EpochPlan:
    """The global batches of one epoch as rows (pool, start, end) of length-sorted pools.

    rng None: one pool in plain length order (index order within a length), no leftovers: evaluation.
    """

    def __init__(self, order: LengthOrder, budget: BatchBudget, pools: int, rng: np.random.Generator | None):
        self.order = order
        self.budget = budget
        # Items looked up so far (diagnostic: each drawn batch its own; the leftover pool's first batch all of it).
        self.items_computed = 0
        n, k = order.size, order.values.size
        pools = max(1, min(int(pools), n)) if rng is not None else 1
        self.num_pools = pools
        counts = order.counts
        # hist[p, k]: items of length values[k] in pool p (a random split into pools of equal size).
        hist = np.zeros((pools, k), dtype=np.int64)
        remaining = counts.copy()
        for p, size in enumerate(_equal_sizes(n, pools)[:-1]):
            hist[p] = rng.multivariate_hypergeometric(remaining, int(size))
            remaining -= hist[p]
        hist[-1] = remaining
        self._offset = np.cumsum(hist, axis=0) - hist  # where pool p's share starts in each length's order
        if rng is None:
            self._mul, self._add = np.ones(k, dtype=np.int64), np.zeros(k, dtype=np.int64)
        else:
            self._mul, self._add = _affine(counts, rng)
        self._run_end = np.cumsum(hist, axis=1)  # [P, K] end position of each length run inside the pool
        self._run_start = self._run_end - hist
        self._frames = np.cumsum(hist * order.values, axis=1)  # [P, K] frames up to each run's end
        caps = capacities(order.values, budget)
        rows: list[np.ndarray] = []
        tails: list[tuple[int, int, int]] = []
        for p in range(pools):
            ends = pack_runs(hist[p], caps)
            begins = _begins(ends)
            if pools > 1 and ends.size > 1:
                # The pool's last (partial) batch joins the other pools' leftovers; a pool of one batch is kept
                # whole: merging it would undo its random draw.
                tails.append((p, int(begins[-1]), int(ends[-1])))
                begins, ends = begins[:-1], ends[:-1]
            rows.append(np.stack([np.full(ends.size, p, dtype=np.int64), begins, ends], axis=1))
        # Pool `pools` (when any leftovers) is explicit: the leftovers sorted by length. Packing it needs their
        # lengths only (from the histograms); which items they are is looked up when one of its batches is drawn
        # (_explicit_items), so a first batch from another pool computes its own items and nothing else.
        self._tails = tails
        self._explicit: np.ndarray | None = None
        if tails:
            rest_len = np.concatenate([self.lengths_at(*t) for t in tails])
            self._explicit_sort = np.argsort(rest_len, kind="stable")
            rest_len = rest_len[self._explicit_sort]
            edges = np.flatnonzero(np.diff(rest_len)) + 1  # np.unique without its import of numpy.ma (0.2 s)
            values = rest_len[np.concatenate([[0], edges])]
            run_counts = np.diff(np.concatenate([[0], edges, [rest_len.size]]))
            self._explicit_values = values.astype(np.int64)
            self._explicit_run_end = np.cumsum(run_counts)
            self._explicit_frames = np.cumsum(run_counts * values)
            ends = pack_runs(run_counts, capacities(values, budget))
            begins = _begins(ends)
            rows.append(np.stack([np.full(ends.size, pools, dtype=np.int64), begins, ends], axis=1))
        self.table = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int64)
        self.efficiency_splits = 0

    @property
    def kept(self) -> int:
        """Items (occurrences, with a per-epoch selection) the epoch plans."""
        return self.order.size

    # ---- positions -> items and lengths -----------------------------------------------------------------

    def items(self, pool: int, start: int, end: int) -> np.ndarray:
        """The item indices (int64) at positions [start, end) of `pool`'s sorted order: one batch."""
        if pool == self.num_pools:
            return self._explicit_items()[start:end].astype(np.int64)
        self.items_computed += end - start
        x = np.arange(start, end, dtype=np.int64)
        k = np.searchsorted(self._run_end[pool], x, side="right")
        rank = self._offset[pool, k] + x - self._run_start[pool, k]  # rank among all items of length k
        seg = (self._mul[k] * rank + self._add[k]) % self.order.counts[k]
        return self.order.members(k, seg).astype(np.int64)

    def _explicit_items(self) -> np.ndarray:
        """The leftover pool's items in its sorted order: every pool's last batch, looked up once, when first needed."""
        if self._explicit is None:
            self._explicit = np.concatenate([self.items(*t) for t in self._tails])[self._explicit_sort]
        return self._explicit

    def batch(self, row: np.ndarray) -> np.ndarray:
        return self.items(int(row[0]), int(row[1]), int(row[2]))

    def stats(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(items, longest, real frames) of every row of `table`, from the histograms (no item is looked up)."""
        if table is self.table:  # the plan's own rows: asked by the efficiency check and by the first deal
            if getattr(self, "_stats_of", None) is not table:
                self._stats, self._stats_of = self._stats_uncached(table), table
            return self._stats
        return self._stats_uncached(table)

    def _stats_uncached(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        sizes = table[:, 2] - table[:, 1]
        longest = np.zeros(len(table), dtype=np.int64)
        frames = np.zeros(len(table), dtype=np.int64)
        for p in np.flatnonzero(np.bincount(table[:, 0], minlength=1)).tolist():
            sel = np.flatnonzero(table[:, 0] == p)
            if p == self.num_pools:
                values, run_end, cum = self._explicit_values, self._explicit_run_end, self._explicit_frames
            else:
                values, run_end, cum = self.order.values, self._run_end[p], self._frames[p]
            longest[sel] = values[np.searchsorted(run_end, table[sel, 2] - 1, side="right")]
            frames[sel] = _prefix(values, run_end, cum, table[sel, 2]) - _prefix(values, run_end, cum, table[sel, 1])
        return sizes, longest, frames

    def lengths_at(self, pool: int, start: int, end: int) -> np.ndarray:
        """The (ascending) lengths at positions [start, end) of a pool, from its histogram."""
        if pool == self.num_pools:
            values, run_end = self._explicit_values, self._explicit_run_end
        else:
            values, run_end = self.order.values, self._run_end[pool]
        return values[np.searchsorted(run_end, np.arange(start, end), side="right")]

    # ---- efficiency splits -----------------------------------------------------------------------------

    def split_to_efficiency(self, target: float) -> None:
        """Split the batches that waste most padding until the plan's padding efficiency reaches `target`.

        Each split cuts one length-sorted batch where it saves the most padded frames (a subset is under
        budget too); the batch with the largest saving goes first, so the target is reached with few extra
        batches. A corpus too small for full batches of similar lengths pays with batches below the budget
        (lower fill), as lhotse's buckets do. Large corpora reach the target without any (checked from the
        histograms, no Python step per batch).
        """
        if not len(self.table) or target <= 0:
            return
        sizes, longest, frames = self.stats(self.table)
        real = float(frames.sum())
        padded = float((sizes * longest.astype(np.float64)).sum())
        if real >= target * padded:
            return
        out = [tuple(r) for r in self.table.tolist()]
        heap = []
        for i, (p, a, b) in enumerate(out):
            gain, cut = best_cut(self.lengths_at(p, a, b))
            if gain > 0:
                heap.append((-gain, i, cut))
        heapq.heapify(heap)
        splits = 0
        while heap and real < target * padded:
            neg_gain, i, cut = heapq.heappop(heap)
            p, a, b = out[i]
            out[i] = (p, a, a + cut)
            out.append((p, a + cut, b))
            padded += neg_gain
            splits += 1
            for j in (i, len(out) - 1):
                gain, c = best_cut(self.lengths_at(*out[j]))
                if gain > 0:
                    heapq.heappush(heap, (-gain, j, c))
        self.table = np.asarray(out, dtype=np.int64).reshape(-1, 3)
        self.efficiency_splits = splits


class JoinedPlan:
    """Several EpochPlans as one epoch: a weighted mix plans each round of copies on its own (no batch may hold
    an utterance twice), and the rounds' batches are then dealt and shuffled together.

    Rows stay (pool, start, end): plan r's pools (its explicit leftover pool included) are renumbered after
    those of the plans before it, so the dealer and the diagnostics use the rows as they use one plan's.
    """

    def __init__(self, plans: list[EpochPlan]):
        self.plans = plans
        # Plan r owns pool ids base[r] .. base[r] + num_pools (the last one: its leftovers).
        self._base = np.concatenate([[0], np.cumsum([q.num_pools + 1 for q in plans])]).astype(np.int64)
        self._join()

    def _join(self) -> None:
        tables = [q.table + np.array([b, 0, 0], dtype=np.int64) for q, b in zip(self.plans, self._base)]
        self.table = np.concatenate(tables) if tables else np.zeros((0, 3), dtype=np.int64)
        self.efficiency_splits = sum(q.efficiency_splits for q in self.plans)

    @property
    def items_computed(self) -> int:
        return sum(q.items_computed for q in self.plans)

    @property
    def kept(self) -> int:
        return sum(q.kept for q in self.plans)

    def _plan_of(self, pool: int) -> tuple[EpochPlan, int]:
        r = int(np.searchsorted(self._base, pool, side="right")) - 1
        return self.plans[r], pool - int(self._base[r])

    def items(self, pool: int, start: int, end: int) -> np.ndarray:
        plan, p = self._plan_of(pool)
        return plan.items(p, start, end)

    def batch(self, row: np.ndarray) -> np.ndarray:
        return self.items(int(row[0]), int(row[1]), int(row[2]))

    def lengths_at(self, pool: int, start: int, end: int) -> np.ndarray:
        plan, p = self._plan_of(pool)
        return plan.lengths_at(p, start, end)

    def stats(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = [np.zeros(len(table), dtype=np.int64) for _ in range(3)]
        owner = np.searchsorted(self._base, table[:, 0], side="right") - 1
        for r in np.unique(owner).tolist():
            sel = np.flatnonzero(owner == r)
            local = table[sel] - np.array([self._base[r], 0, 0], dtype=np.int64)
            for o, v in zip(out, self.plans[r].stats(local)):
                o[sel] = v
        return out[0], out[1], out[2]

    def split_to_efficiency(self, target: float) -> None:
        for q in self.plans:  # each round reaching the target brings the whole epoch there
            q.split_to_efficiency(target)
        self._join()


def _begins(ends: np.ndarray) -> np.ndarray:
    """Start positions of consecutive batches that end at `ends`."""
    return np.concatenate([[0], ends[:-1]]).astype(np.int64) if ends.size else ends


def _prefix(values: np.ndarray, run_end: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Frames of the first x positions of a sorted pool (x may equal the pool size)."""
    k = np.minimum(np.searchsorted(run_end, x, side="right"), values.size - 1)
    before_run = np.where(k > 0, run_end[np.maximum(k - 1, 0)], 0)
    frames_before = np.where(k > 0, cum[np.maximum(k - 1, 0)], 0)
    return frames_before + (x - before_run) * values[k]


def _affine(counts: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random bijection x -> (a*x + b) mod n of 0..n-1 for every n in `counts` (a coprime to n)."""
    n = np.maximum(counts, 1)
    a = rng.integers(1, np.maximum(n, 2))
    bad = np.gcd(a, n) != 1
    while bad.any():
        a[bad] = rng.integers(1, np.maximum(n[bad], 2))
        bad = np.gcd(a, n) != 1
    return a.astype(np.int64), rng.integers(0, n).astype(np.int64)
