"""The epoch plan of a WebDataset stream: a pure function of (seed, epoch, index, world size, workers).

Every (rank, DataLoader worker) stream is planned before a byte of payload is read: which tars it reads, in
which interleaved order its samples arrive, and how every pool of arrivals is packed into padded-budget
batches (sampler.plan.BatchBudget + pack_greedy). Because every rank can plan every other rank's streams from
the same small files, all ranks stop at the same batch count without talking to each other.

Equalising ranks: the mmap sampler (sampler/deal.py) splits its biggest batches until the count divides by
the world size, because any batch may go to any rank; a stream's batches are made of the tars its rank
reads, so one rank cannot be handed another's batches, and the ranks' counts can differ by more than
splitting could make up: the surplus batches of the longest streams are dropped instead (`water_fill`),
and counted in `StreamPlan`.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from audiopipe.sampler.plan import BatchBudget, pack_greedy

_TARS, _ASSIGN, _STREAM = 0, 1, 2  # random stream ids, so different purposes draw independently

@dataclass
class StreamBatches:
    """One (rank, worker) stream of an epoch: what it reads, in which order, and the batches it makes."""

    tars: list[int]  # shard positions in the order they are opened
    arrivals: np.ndarray  # global indices of the kept samples, in the order they are read
    batches: list[np.ndarray]  # global indices per batch, in emission order
    ready: np.ndarray  # int64 [len(batches)]: arrivals needed before batch b is complete (its pool's end)


@dataclass(frozen=True)
class StreamPlan:
    """The epoch as planned for every stream; counts are over all ranks, in utterances unless said otherwise.

    num_items == kept + dropped_too_long + dropped_empty + dropped_unused; every kept item is in exactly one
    batch, and the batches beyond a stream's quota (to give every rank `batches_per_rank`) are dropped: their
    items are `dropped_uneven` (not read this epoch).
    """

    epoch: int
    world_size: int
    num_workers: int
    split: str  # "tar": each stream reads its own tars; "sample": every stream reads every tar, keeps 1/S
    num_items: int
    kept: int
    dropped_too_long: int
    dropped_empty: int
    dropped_unused: int  # outside `subset`
    dropped_uneven: int  # in batches beyond the equalized count
    dropped_batches: int
    batches_per_rank: int
    counts: np.ndarray = field(repr=False)  # int [world_size, workers]: batches each stream planned
    quotas: np.ndarray = field(repr=False)  # int [world_size, workers]: batches each stream yields
    padding_efficiency: float = 1.0  # real frames / (n * longest), over the yielded batches
    streams: list[StreamBatches] = field(default_factory=list, repr=False)  # index rank * workers + worker

    def stream(self, rank: int, worker: int) -> StreamBatches:
        return self.streams[rank * max(self.num_workers, 1) + worker]

    def summary(self) -> str:
        return (f"epoch {self.epoch}: {self.batches_per_rank} batches/rank x {self.world_size} ranks "
                f"({max(self.num_workers, 1)} streams/rank, split by {self.split}); {self.kept}/{self.num_items} "
                f"items planned, padding efficiency {self.padding_efficiency:.2%}; dropped {self.dropped_uneven} "
                f"items in {self.dropped_batches} batches to equalize ranks, {self.dropped_too_long} too long, "
                f"{self.dropped_empty} empty")


def _interleave(groups: list[np.ndarray], rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
    """A random merge of the groups' item lists that keeps each list's order: (items, which group each is from)."""
    sizes = np.array([g.size for g in groups], dtype=np.int64)
    labels = np.repeat(np.arange(len(groups)), sizes)
    if rng is not None:
        labels = labels[rng.permutation(labels.size)]
    # k-th occurrence of label t takes item k of group t.
    order = np.argsort(labels, kind="stable")
    rank_in_group = np.empty(labels.size, dtype=np.int64)
    rank_in_group[order] = np.arange(labels.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    flat = np.concatenate(groups) if groups else np.empty(0, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    return flat[starts[labels] + rank_in_group], labels


def _pool_batches(arrivals: np.ndarray, lengths: np.ndarray, budget: BatchBudget, pool_size: int,
                  rng: np.random.Generator | None) -> tuple[list[np.ndarray], np.ndarray]:
    """Pack arrivals pool by pool: sort a pool by length, pack greedily, emit its batches in random order.

    The last (least filled) batch of a pool is carried into the next pool instead of being emitted, so only
    the stream's final batch can be small. Returns (batches, arrivals needed before each is complete).
    """
    batches: list[np.ndarray] = []
    ready: list[int] = []
    carry = np.empty(0, dtype=np.int64)
    j, n = 0, arrivals.size
    while j < n:
        take = max(pool_size - carry.size, 1)
        pool = np.concatenate([carry, arrivals[j : j + take]])
        j = min(j + take, n)
        if rng is not None:
            pool = pool[rng.permutation(pool.size)]  # equal lengths in random order
        order = pool[np.argsort(lengths[pool], kind="stable")]
        packed = pack_greedy(order, lengths, budget)
        carry = np.empty(0, dtype=np.int64)
        if j < n and len(packed) > 1:
            carry = packed.pop()
        emit = rng.permutation(len(packed)) if rng is not None else np.arange(len(packed))
        batches += [packed[b] for b in emit]
        ready += [j] * len(packed)
    return batches, np.asarray(ready, dtype=np.int64)


def _bins(loads: np.ndarray, n_bins: int, rng: np.random.Generator) -> list[list[int]]:
    """Longest-first greedy: each tar (biggest first, ties random) goes to the least loaded bin."""
    perm = rng.permutation(loads.size)
    order = perm[np.argsort(-loads[perm], kind="stable")]
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    total = np.zeros(n_bins)
    for t in order.tolist():
        b = int(np.argmin(total))
        bins[b].append(t)
        total[b] += loads[t]
    return bins


def water_fill(counts: np.ndarray, total: int) -> np.ndarray:
    """Quotas q <= counts with sum(q) == total, as equal as the counts allow (the largest are cut first)."""
    counts = np.asarray(counts, dtype=np.int64)
    if total >= counts.sum():
        return counts.copy()
    lo, hi = 0, int(counts.max())
    while lo < hi:  # the smallest level L with sum(min(counts, L)) >= total
        mid = (lo + hi) // 2
        if np.minimum(counts, mid).sum() >= total:
            hi = mid
        else:
            lo = mid + 1
    q = np.minimum(counts, lo)
    excess = int(q.sum() - total)
    at_level = np.flatnonzero(q == lo)[::-1]  # cut the last workers first
    q[at_level[:excess]] -= 1
    return q


def round_robin_taken(quotas: np.ndarray, consumed: int) -> np.ndarray:
    """Batches each worker has delivered after `consumed` batches of a DataLoader over iterable workers.

    torch's DataLoader asks its workers in turn and skips a worker once it is exhausted, so batch k of the
    rank comes from the k-th step of a round robin over the workers that still have batches.
    """
    quotas = np.asarray(quotas, dtype=np.int64)
    taken = np.zeros_like(quotas)
    left = int(consumed)
    while left > 0:
        active = np.flatnonzero(taken < quotas)
        if active.size == 0:
            break
        rounds = min(int((quotas[active] - taken[active]).min()), left // active.size)
        if rounds:
            taken[active] += rounds
            left -= rounds * active.size
            continue
        for w in active[:left]:  # a partial round: the first `left` active workers
            taken[w] += 1
        left = 0
    return taken


class StreamPlanner:
    """Plans epochs of the streams of every rank and worker from the index alone (nothing is read).

    lengths: budget frames per global index; used: which global indices take part (a subset);
    offsets: int64 [tars + 1], the first global index of each tar (the index lists the tars row by row).
    """

    def __init__(self, lengths: np.ndarray, used: np.ndarray, offsets: np.ndarray, budget: BatchBudget, *,
                 pool_size: int, interleave: int, seed: int, shuffle: bool, world_size: int, num_workers: int):
        self.lengths, self.used, self.offsets, self.budget = lengths, used, offsets, budget
        self.pool_size, self.interleave = pool_size, interleave
        self.seed, self.shuffle = seed, shuffle
        self.world_size, self.num_workers = world_size, num_workers

    def _rng(self, *keys: int) -> np.random.Generator | None:
        return np.random.default_rng([self.seed, *keys]) if self.shuffle else None

    def plan(self, epoch: int) -> StreamPlan:
        W = max(self.num_workers, 1)
        S = self.world_size * W
        n = self.lengths.size
        fits = self.budget.fits_alone(self.lengths)
        empty = self.used & (self.lengths == 0)
        too_long = self.used & ~fits & (self.lengths > 0)
        keep = self.used & fits & (self.lengths > 0)
        n_tars = self.offsets.size - 1
        split = "tar" if n_tars >= S else "sample"
        rng_tars = self._rng(_TARS, epoch)
        tar_order = rng_tars.permutation(n_tars) if rng_tars is not None else np.arange(n_tars)
        kept_rows = [np.flatnonzero(keep[self.offsets[t]:self.offsets[t + 1]]) + self.offsets[t] for t in range(n_tars)]
        if split == "tar":
            # Balanced bins of tars (by frames), dealt to streams in a new order every epoch.
            loads = np.array([self.lengths[k].sum() for k in kept_rows], dtype=np.float64)
            bins = _bins(loads, S, np.random.default_rng([self.seed, _ASSIGN]))
            deal = rng_tars.permutation(S) if rng_tars is not None else np.arange(S)
            pos = {int(t): i for i, t in enumerate(tar_order)}
            per_stream = [sorted(bins[deal[s]], key=pos.__getitem__) for s in range(S)]
            members = [[kept_rows[t] for t in tars] for tars in per_stream]
        else:
            warnings.warn(f"{n_tars} tars for {S} streams ({self.world_size} ranks x {W} workers): every stream reads "
                          f"every tar and keeps 1/{S} of its samples; write smaller shards (--shard-size) to stream "
                          "efficiently", stacklevel=3)
            rng_assign = self._rng(_ASSIGN, epoch)
            slot = (rng_assign.permutation(n) if rng_assign is not None else np.arange(n)) % S
            per_stream = [[int(t) for t in tar_order] for _ in range(S)]
            members = [[k[slot[k] == s] for k in (kept_rows[t] for t in tar_order)] for s in range(S)]
        streams = []
        for s in range(S):
            rng = self._rng(_STREAM, epoch, s)
            tars = [t for t, m in zip(per_stream[s], members[s]) if m.size]
            groups = [m for m in members[s] if m.size]
            arrivals = []
            for g in range(0, len(groups), self.interleave):
                merged, _ = _interleave(groups[g : g + self.interleave], rng)
                arrivals.append(merged)
            arr = np.concatenate(arrivals) if arrivals else np.empty(0, dtype=np.int64)
            batches, ready = _pool_batches(arr, self.lengths, self.budget, self.pool_size, rng)
            streams.append(StreamBatches(tars, arr, batches, ready))
        counts = np.array([len(st.batches) for st in streams], dtype=np.int64).reshape(self.world_size, W)
        per_rank = int(counts.sum(axis=1).min()) if counts.size else 0
        quotas = np.stack([water_fill(c, per_rank) for c in counts])
        dropped_items = dropped_batches = 0
        real = padded = 0.0
        for st, q in zip(streams, quotas.ravel()):
            for b in st.batches[q:]:
                dropped_items += b.size
            dropped_batches += len(st.batches) - int(q)
            for b in st.batches[:q]:
                lens = self.lengths[b]
                real += float(lens.sum())
                padded += float(lens.size * lens.max())
        return StreamPlan(
            epoch=epoch, world_size=self.world_size, num_workers=self.num_workers, split=split, num_items=n,
            kept=int(keep.sum()), dropped_too_long=int(too_long.sum()), dropped_empty=int(empty.sum()),
            dropped_unused=int((~self.used).sum()), dropped_uneven=int(dropped_items),
            dropped_batches=int(dropped_batches), batches_per_rank=per_rank, counts=counts, quotas=quotas,
            padding_efficiency=real / padded if padded else 1.0, streams=streams)
