"""Block-window batches: each rank reads a few large blocks at a time and plans its batches from their rows.

For shards on object storage a request per row costs a round trip each and money per request. Here the unit of
reading is a block, a run of consecutive rows of one shard (~8-16 MB: one ranged GET per feature, since a
shard's rows are contiguous per column, see audiopipe/reader/blocks.py). Per epoch, from (seed, epoch) only:

- the blocks are put in a random order and dealt to the ranks in turn (with `nodes` > 1, a block goes to the
  ranks of node shard % nodes only, so a node reads, and caches, a fixed 1/nodes of the shards);
- each rank cuts its blocks into windows of `window` blocks; a window's rows are sorted by length (ties in
  random order) and packed greedily under the padded budget (sampler/plan.py's BatchBudget, the same cost as
  the row sampler), and the window's batches come in random order;
- ranks get equal batch counts: a rank with fewer batches splits its largest ones (each half a length-sorted
  range, so under budget) until it has as many as the rank with most; only when every batch is one item is one
  repeated (counted).

While a window's batches are yielded, the next `ahead` windows' blocks are announced (`on_hold`), so the reader
fetches them in the background; a window left behind is released (`on_release`). Rows are thus read in a few
large requests, a window resident at a time, and each batch still has length-sorted neighbours.

The price is randomness: a batch holds rows of at most `window` blocks (distinct shards per batch ~ window
instead of ~ batch size), and rows of one block meet in a window every epoch (pair overlap across epochs above
the row sampler's); `diagnostics` reports both next to the row sampler's on the same lengths. With shards cut
from a seeded random order of the corpus (audiopipe/shard/plan.py), a block is a random sample of it.

Exact resume: the plan is a pure function of (seed, epoch, world size, position); state_dict() saves the
position and load_state_dict() resumes at the next batch, under the same or another world size (the rows not yet
trained on are planned again for the new ranks, by block).
"""

from __future__ import annotations

import hashlib
import heapq
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator

import numpy as np

from audiopipe.errors import InvalidValue
from audiopipe.sampler.dist import rank_and_world
from audiopipe.sampler.plan import BatchBudget, capacities, pair_overlap, validate_lengths
from audiopipe.sampler.passes import EpochPasses, Position

STATE_FORMAT = "audiopipe.BlockWindowSampler/1"
# Random streams, kept apart from each other (and from the row sampler's 0..2).
_UNITS, _TIES, _SHUFFLE, _REPEAT = 10, 11, 12, 13


@dataclass(frozen=True)
class BlockWindowDiagnostics:
    """What an epoch's block-window plan does (global counts, every rank; items are positions).

    kept + dropped_too_long + dropped_empty == num_items; every kept item is in exactly one batch of the epoch
    plus `repeated` extra occurrences.
    """

    epoch: int
    world_size: int
    num_items: int
    kept: int
    dropped_too_long: int
    dropped_empty: int
    repeated: int  # extra occurrences added to equalize ranks (only when a rank's batches are all one item)
    split: int  # batches cut in two to equalize ranks
    num_batches: int
    batches_per_rank: int
    window: int  # blocks per window
    blocks_per_rank: float  # blocks each rank fetches in the epoch (mean): one GET per feature each
    blocks_per_batch: float  # distinct blocks per batch (mean)
    shards_per_batch: float  # distinct shards per batch (mean)
    padding_efficiency: float
    fill_ratio: float
    max_resident_bytes: int  # most block bytes one rank holds at once (its window and those ahead)
    overlap_of: Callable[[], float] = field(repr=False, compare=False, default=lambda: float("nan"))
    row_mode_of: Callable[[], dict] = field(repr=False, compare=False, default=dict)

    @cached_property
    def pair_overlap(self) -> float:
        """Share of item pairs sharing a batch that already shared one the epoch before (epoch 0: against
        epoch 1). Plans a second epoch on first access."""
        return self.overlap_of()

    @cached_property
    def row_mode(self) -> dict:
        """The row sampler (BucketBatchSampler) on the same lengths, budget, seed and world size: its
        pair_overlap, shards_per_batch and padding_efficiency, for comparison. Plans two epochs of it."""
        return self.row_mode_of()

    def summary(self) -> str:
        return (f"epoch {self.epoch}: {self.kept}/{self.num_items} items in {self.num_batches} batches "
                f"({self.batches_per_rank}/rank x {self.world_size}), windows of {self.window} blocks, "
                f"{self.blocks_per_rank:.0f} blocks/rank, {self.blocks_per_batch:.1f} blocks and "
                f"{self.shards_per_batch:.1f} shards per batch, padding efficiency {self.padding_efficiency:.2%}, "
                f"pairs together again {self.pair_overlap:.1%}; split {self.split}, repeated {self.repeated}; "
                f"resident up to {self.max_resident_bytes / 2**20:.0f} MiB")


@dataclass
class _RankPlan:
    """One rank's batches in yield order: batch b is seq[start[b]:end[b]] (a length-sorted run), read while
    window win[b] is resident; windows[w] are the block ids of window w."""

    seq: np.ndarray
    start: np.ndarray
    end: np.ndarray
    win: np.ndarray
    windows: list[np.ndarray]
    split: int = 0
    repeated: int = 0

    def __len__(self) -> int:
        return int(self.start.size)

    def batch(self, b: int) -> np.ndarray:
        return self.seq[self.start[b]:self.end[b]]

    def items_from(self, b: int) -> np.ndarray:
        if b >= len(self):
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([self.batch(j) for j in range(b, len(self))])




class BlockWindowSampler(EpochPasses):
    """Yields this rank's batches (lists of positions) of one epoch planned by blocks and windows.

    lengths: frames per position (what the budget counts); blocks: the block id of each position (positions of
    one block need not be adjacent); block_shard / block_bytes: per block id, its shard (diagnostics, nodes)
    and bytes (diagnostics). window: blocks per window; ahead: windows announced ahead of the one being read.
    nodes: > 1 reads shard k on node k % nodes only (ranks rank // (world_size // nodes) form a node).
    Budget, seed, shuffle, rank and world_size as BucketBatchSampler's.
    """

    def __init__(self, lengths: np.ndarray, blocks: np.ndarray, max_frames: int, *,
                 block_shard: np.ndarray | None = None, block_bytes: np.ndarray | None = None, window: int = 8,
                 ahead: int = 1, quadratic: float = 0.0, max_items: int | None = None, seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None, nodes: int = 1):
        self.lengths = validate_lengths(lengths)
        self.lengths.setflags(write=False)
        blocks = np.asarray(blocks)
        if blocks.shape != self.lengths.shape or (blocks.size and not np.issubdtype(blocks.dtype, np.integer)):
            raise InvalidValue(f"blocks must be one integer block id per item ({self.lengths.size}), got "
                               f"shape {blocks.shape} dtype {blocks.dtype}")
        if blocks.size and blocks.min() < 0:
            raise InvalidValue("block ids must be >= 0")
        self.blocks = blocks.astype(np.int64)
        self.blocks.setflags(write=False)
        n_blocks = int(self.blocks.max()) + 1 if self.blocks.size else 0
        self.block_shard = (np.arange(n_blocks, dtype=np.int64) if block_shard is None
                            else np.asarray(block_shard, dtype=np.int64))
        self.block_bytes = (np.zeros(n_blocks, dtype=np.int64) if block_bytes is None
                            else np.asarray(block_bytes, dtype=np.int64))
        if self.block_shard.size < n_blocks or self.block_bytes.size < n_blocks:
            raise InvalidValue(f"block_shard and block_bytes need an entry for each of the {n_blocks} block ids")
        for name, v in (("window", window), ("nodes", nodes)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise InvalidValue(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(ahead, bool) or not isinstance(ahead, (int, np.integer)) or ahead < 0:
            raise InvalidValue(f"ahead must be an integer >= 0 (windows fetched ahead), got {ahead!r}")
        if int(seed) < 0:
            raise InvalidValue(f"seed must be >= 0, got {seed!r}")
        self.budget = BatchBudget(int(max_frames), float(quadratic), max_items)
        self.window, self.ahead, self.nodes = int(window), int(ahead), int(nodes)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self._check_nodes(self.world_size)
        longest = self.budget.longest_alone()
        self._kept = np.flatnonzero((self.lengths > 0) & (self.lengths <= longest))
        self._empty = np.flatnonzero(self.lengths == 0)
        self._too_long = np.flatnonzero(self.lengths > longest)
        self.epoch = 0
        self._pending: Position | None = None
        self._active: Position | None = None
        self._cache: dict[tuple, Any] = {}
        self._passes = 0
        # Told which blocks to fetch and keep (tag, block ids), and when a tag's blocks are no longer needed.
        self.on_hold: Callable[[Any, np.ndarray], None] | None = None
        self.on_release: Callable[[Any], None] | None = None
        # make_loader's row read-ahead does not apply: whole windows are fetched ahead instead.
        self.read_ahead = 0
        self.on_upcoming = None

    def _check_nodes(self, world_size: int) -> None:
        if world_size % self.nodes:
            raise InvalidValue(f"nodes={self.nodes} must divide the world size ({world_size}): each node's ranks "
                               f"share its shards")

    # ---- epochs and iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        pos = self._begin_pass()
        self._passes += 1
        plan = self._plans(self.epoch, pos.segments, self.world_size)[self.rank]
        seg = len(pos.segments)
        tag = lambda w: (id(self), self._passes, self.epoch, seg, w)  # noqa: E731
        held: list[int] = []

        def hold_through(w: int) -> None:
            last = min(w + self.ahead, len(plan.windows) - 1)
            for v in range(held[-1] + 1 if held else w, last + 1):
                if self.on_hold is not None:
                    self.on_hold(tag(v), plan.windows[v])
                held.append(v)

        def release_before(w: int) -> None:
            while held and held[0] < w:
                v = held.pop(0)
                if self.on_release is not None:
                    self.on_release(tag(v))

        try:
            for b in range(pos.start, len(plan)):
                w = int(plan.win[b])
                release_before(w)
                hold_through(w)
                pos.yielded += 1
                yield plan.batch(b).tolist()
            pos.finished = True
        finally:  # the end of the pass, or a pass abandoned midway: nothing stays held
            release_before(1 << 62)

    def __len__(self) -> int:
        pos = self._pending or (self._active if self._active and not self._active.finished else None)
        pos = pos or Position((), 0)
        return len(self._plans(self.epoch, pos.segments, self.world_size)[self.rank]) - pos.start

    # ---- checkpointing -------------------------------------------------------------------------------

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """Position in the epoch (same on every rank: ranks move in lockstep). consumed_batches: batches this
        rank trained on in the current pass (default: the ones yielded, too many under DataLoader prefetch)."""
        if self._pending is not None:
            pos, done = self._pending, 0
        elif self._active is not None:
            pos, done = self._active, self._active.yielded
        else:
            pos, done = Position((), 0), 0
        if consumed_batches is not None:
            limit = (len(self._plans(self.epoch, pos.segments, self.world_size)[self.rank]) - pos.start
                     if self._pending is None and self._active is not None else 0)
            if not 0 <= consumed_batches <= limit:
                raise InvalidValue(f"consumed_batches={consumed_batches} is outside this pass's 0..{limit} batches")
            done = int(consumed_batches)
        return {"format": STATE_FORMAT, "epoch": self.epoch,
                "segments": [list(s) for s in pos.segments] + [[self.world_size, pos.start + done]],
                "items_sha256": self._fingerprint, "num_items": int(self.lengths.size), "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidValue(f"not a BlockWindowSampler state (expected format {STATE_FORMAT!r}); a state saved "
                               f"by the row sampler resumes only under reading='rows'")
        if state["items_sha256"] != self._fingerprint:
            raise InvalidValue(f"the state was saved for other lengths or blocks ({state['num_items']} items, "
                               f"{state['items_sha256']}) than this sampler's ({self.lengths.size}, "
                               f"{self._fingerprint}): another corpus, index or block size?")
        now = self._config()
        diff = {k: (v, now.get(k)) for k, v in state["config"].items() if now.get(k) != v}
        if diff:
            raise InvalidValue(f"the state was saved with another sampler config (saved, now): {diff}")
        segments = tuple((int(w), int(k)) for w, k in state["segments"])
        if not segments or any(w < 1 or k < 0 for w, k in segments):
            raise InvalidValue(f"corrupt sampler state segments: {state['segments']}")
        epoch = int(state["epoch"])
        for j, (w, k) in enumerate(segments):
            self._check_nodes(w)
            steps = len(self._plans(epoch, segments[:j], w)[0])
            if k > steps:
                raise InvalidValue(f"sampler state says {k} steps of {steps} were consumed")
        *prior, (w_last, k_last) = segments
        if w_last == self.world_size:
            pos = Position(tuple(prior), k_last)
        elif k_last == 0:
            pos = Position(tuple(prior), 0)
        else:
            pos = Position(tuple(prior) + ((w_last, k_last),), 0)
        self.epoch = epoch
        self._active = None
        self._pending = pos

    @cached_property
    def _fingerprint(self) -> str:
        h = hashlib.sha256(memoryview(self.lengths).cast("B"))
        h.update(memoryview(self.blocks).cast("B"))
        return h.hexdigest()[:16]

    def _config(self) -> dict[str, Any]:
        cfg = {"max_frames": int(self.budget.max_frames), "quadratic": self.budget.quadratic,
               "max_items": self.budget.max_items, "window": self.window, "nodes": self.nodes, "seed": self.seed,
               "shuffle": self.shuffle}
        return json.loads(json.dumps(cfg))

    # ---- planning: pure functions of (seed, epoch, segments, world size) --------------------------------

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *stream])

    def _plans(self, epoch: int, segments: tuple[tuple[int, int], ...], world_size: int) -> list[_RankPlan]:
        key = ("plans", epoch, segments, world_size)
        if key not in self._cache:
            if len(self._cache) > 8:
                self._cache = {k: v for k, v in self._cache.items() if k[1] == epoch}
            if segments:
                w, k = segments[-1]
                before = self._plans(epoch, segments[:-1], w)
                items = np.unique(np.concatenate([p.items_from(k) for p in before]))
            else:
                items = self._kept
            self._cache[key] = self._plan(epoch, len(segments), items, world_size)
        return self._cache[key]

    def _plan(self, epoch: int, seg: int, items: np.ndarray, world_size: int) -> list[_RankPlan]:
        blk = self.blocks[items]
        order = np.argsort(blk, kind="stable")
        items, blk = items[order], blk[order]
        units, first = np.unique(blk, return_index=True)  # a unit: one block's items in this segment
        bounds = np.append(first, items.size)
        perm = self._rng(_UNITS, epoch, seg).permutation(units.size) if self.shuffle else np.arange(units.size)
        mine: list[np.ndarray] = []
        if self.nodes > 1:
            per_node = world_size // self.nodes
            node_of = self.block_shard[units[perm]] % self.nodes
            for r in range(world_size):
                mine.append(perm[node_of == r // per_node][r % per_node::per_node])
        else:
            mine = [perm[r::world_size] for r in range(world_size)]
        plans = [self._pack_rank(units, items, bounds, u, self._rng(_TIES, epoch, seg, r))
                 for r, u in enumerate(mine)]
        target = max((len(p) for p in plans), default=0)
        out = []
        for r, p in enumerate(plans):
            rng = self._rng(_REPEAT, epoch, seg, r)
            out.append(self._equalize(p, target, rng) if len(p) or not target else self._borrow(plans, target, rng))
        return out

    def _borrow(self, plans: list[_RankPlan], target: int, rng: np.random.Generator) -> _RankPlan:
        """A rank left without blocks (fewer blocks than ranks): copies of other ranks' batches, each its own
        window (counted as repeated)."""
        pool = [p.batch(b) for p in plans for b in range(len(p))]
        chosen = [pool[j] for j in rng.choice(len(pool), size=target, replace=True).tolist()]
        sizes = np.array([c.size for c in chosen], dtype=np.int64)
        stop = np.cumsum(sizes)
        return _RankPlan(np.concatenate(chosen), stop - sizes, stop, np.arange(target, dtype=np.int64),
                         [np.unique(self.blocks[c]) for c in chosen], 0, int(sizes.sum()))

    def _pack_rank(self, units: np.ndarray, items: np.ndarray, bounds: np.ndarray, mine: np.ndarray,
                   rng: np.random.Generator) -> _RankPlan:
        w = self.window
        windows = [units[mine[i:i + w]] for i in range(0, mine.size, w)]
        if mine.size == 0:
            z = np.zeros(0, dtype=np.int64)
            return _RankPlan(z, z, z, z, [])
        sizes = bounds[mine + 1] - bounds[mine]
        pick = np.concatenate([np.arange(bounds[u], bounds[u + 1]) for u in mine.tolist()])
        its = items[pick]
        win = np.repeat(np.arange(mine.size, dtype=np.int64) // w, sizes)
        lens = self.lengths[its]
        ties = rng.random(its.size) if self.shuffle else np.zeros(its.size)
        order = np.lexsort((ties, lens, win))
        seq, wseq, lseq = its[order], win[order], lens[order]
        n = seq.size
        # Greedy packing of each window's length-sorted run (sampler/plan.py's pack_sorted, all windows at
        # once): batch [i, e) is valid iff g[e-1] <= i with g[j] = j + 1 - cap[j]; raising g to the window's
        # first position keeps a batch inside its window and g non-decreasing across windows.
        wfirst = np.searchsorted(wseq, wseq, side="left")
        g = np.maximum(np.arange(1, n + 1, dtype=np.int64) - capacities(lseq, self.budget), wfirst)
        end = np.searchsorted(g, np.arange(n, dtype=np.int64), side="right")
        cuts = [0]
        i = 0
        while i < n:
            i = int(end[i])
            cuts.append(i)
        start, stop = np.asarray(cuts[:-1], dtype=np.int64), np.asarray(cuts[1:], dtype=np.int64)
        bwin = wseq[start]
        keys = rng.random(start.size) if self.shuffle else np.arange(start.size, dtype=np.float64)
        o = np.lexsort((keys, bwin))  # windows in order, their batches shuffled
        return _RankPlan(seq, start[o], stop[o], bwin[o], windows)

    def _equalize(self, plan: _RankPlan, target: int, rng: np.random.Generator) -> _RankPlan:
        """Split this rank's largest batches (or, when all are single items, repeat some) up to `target`."""
        need = target - len(plan)
        if need <= 0:
            return plan
        pieces: dict[int, list[tuple[int, int]]] = {}
        sizes = plan.end - plan.start
        m = min(len(plan), need)
        top = np.argsort(-sizes, kind="stable")[:m]
        heap = [(-int(sizes[b]), int(b), int(plan.start[b]), int(plan.end[b])) for b in top.tolist()]
        heapq.heapify(heap)
        split = 0
        while split < need and heap and -heap[0][0] >= 2:
            _, b, a, e = heapq.heappop(heap)
            half = (e - a) // 2
            parts = pieces.setdefault(b, [(int(plan.start[b]), int(plan.end[b]))])
            parts.remove((a, e))
            parts += [(a, a + half), (a + half, e)]
            parts.sort()
            heapq.heappush(heap, (-half, b, a, a + half))
            heapq.heappush(heap, (-(e - a - half), b, a + half, e))
            split += 1
        start, stop, win = [], [], []
        for b in range(len(plan)):
            for a, e in pieces.get(b, [(int(plan.start[b]), int(plan.end[b]))]):
                start.append(a)
                stop.append(e)
                win.append(int(plan.win[b]))
        repeated = 0
        if split < need:  # every batch is one item: repeat some of the last window's, where they are resident
            last = [j for j in range(len(start)) if win[j] == win[-1]]
            for j in rng.choice(last, size=need - split, replace=True).tolist():
                start.append(start[j])
                stop.append(stop[j])
                win.append(win[j])
                repeated += 1
        arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        return _RankPlan(plan.seq, arr(start), arr(stop), arr(win), plan.windows, split, repeated)

    # ---- diagnostics ---------------------------------------------------------------------------------

    def all_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """Every rank's batches of an epoch (from its start), step by step: rank 0's first, rank 1's first, ..."""
        plans = self._plans(self.epoch if epoch is None else epoch, (), self.world_size)
        return [p.batch(b) for b in range(len(plans[0])) for p in plans]

    @property
    def diagnostics(self) -> BlockWindowDiagnostics:
        epoch = self.epoch
        key = ("diag", epoch, self.world_size)
        if key in self._cache:
            return self._cache[key]
        plans = self._plans(epoch, (), self.world_size)
        batches = self.all_batches(epoch)
        sizes = np.array([b.size for b in batches], dtype=np.float64)
        longest = np.array([self.lengths[b].max() if b.size else 0 for b in batches], dtype=np.float64)
        real = float(sum(self.lengths[b].sum() for b in batches))
        padded = float((sizes * longest).sum())
        cost = self.budget.cost(sizes, longest) / self.budget.max_frames
        resident = 0
        for p in plans:
            per_window = [int(self.block_bytes[w].sum()) for w in p.windows]
            for i in range(len(per_window)):
                resident = max(resident, sum(per_window[i:i + 1 + self.ahead]))
        d = BlockWindowDiagnostics(
            epoch=epoch, world_size=self.world_size, num_items=int(self.lengths.size),
            kept=int(self._kept.size), dropped_too_long=int(self._too_long.size),
            dropped_empty=int(self._empty.size), repeated=sum(p.repeated for p in plans),
            split=sum(p.split for p in plans), num_batches=len(batches), batches_per_rank=len(plans[0]),
            window=self.window, blocks_per_rank=float(np.mean([sum(w.size for w in p.windows) for p in plans])),
            blocks_per_batch=distinct_per_batch(batches, self.blocks),
            shards_per_batch=distinct_per_batch(batches, self.block_shard[self.blocks]),
            padding_efficiency=real / padded if padded else 1.0,
            fill_ratio=float(cost.mean()) if cost.size else 0.0, max_resident_bytes=resident,
            overlap_of=lambda: self._pair_overlap(epoch), row_mode_of=lambda: self._row_mode(epoch))
        self._cache[key] = d
        return d

    def _pair_overlap(self, epoch: int) -> float:
        other = epoch - 1 if epoch > 0 else epoch + 1
        a, b = self.all_batches(epoch), self.all_batches(other)
        before, after = (b, a) if other < epoch else (a, b)
        return pair_overlap(before, after, self.lengths.size)

    def _row_mode(self, epoch: int) -> dict:
        from audiopipe.sampler.bucket import BucketBatchSampler

        row = BucketBatchSampler(self.lengths, self.budget.max_frames, quadratic=self.budget.quadratic,
                                 max_items=self.budget.max_items, seed=self.seed, shuffle=self.shuffle, rank=0,
                                 world_size=self.world_size)
        row.set_epoch(epoch)
        d = row.diagnostics
        batches = row._deal(epoch, ()).all_batches()
        return {"pair_overlap": d.pair_overlap, "padding_efficiency": d.padding_efficiency,
                "shards_per_batch": distinct_per_batch(batches, self.block_shard[self.blocks]),
                "blocks_per_batch": distinct_per_batch(batches, self.blocks), "num_batches": d.num_batches}


def distinct_per_batch(batches: list[np.ndarray], label: np.ndarray) -> float:
    """Mean number of distinct labels (block or shard of each item) per batch."""
    if not batches:
        return 0.0
    which = np.repeat(np.arange(len(batches), dtype=np.int64), [b.size for b in batches])
    lab = label[np.concatenate(batches)]
    pairs = np.unique(np.stack([which, lab]), axis=1)
    return pairs.shape[1] / len(batches)
