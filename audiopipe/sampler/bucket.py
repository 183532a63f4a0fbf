"""A global, length-sorted-in-random-pools, padded-budget batch sampler for data-parallel training.

Driven only by a per-utterance length array (the `<feature>_frames` column of index.arrow); it never opens
payloads. Use it as `DataLoader(dataset, batch_sampler=sampler, collate_fn=...)`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterator

import numpy as np

from audiopipe.errors import InvalidValue
from audiopipe.sampler.corpus_weights import copy_rounds
from audiopipe.sampler.deal import Deal, Uneven, deal
from audiopipe.sampler.dist import rank_and_world
from audiopipe.sampler.bucket_budget import BucketBudget
from audiopipe.sampler.plan import BatchBudget, choose_pools, pair_overlap, validate_lengths
from audiopipe.sampler.pools import EpochPlan, JoinedPlan, LengthOrder
from audiopipe.sampler.passes import EpochPasses, Position
from audiopipe.sampler.repeat import RepeatPlan, auto_passes
from audiopipe.sampler.shapes import BatchShapes, ShapeBudget

STATE_FORMAT = "audiopipe.BucketBatchSampler/3"
# States of an older plan: resuming one into this plan would train other batches than the ones it counted.
_OLD_FORMATS = ("audiopipe.BucketBatchSampler/1", "audiopipe.BucketBatchSampler/2")

# Stream ids keep the random draws of different purposes independent of each other.
_POOLS, _PLAN, _DEAL = 0, 1, 2


@dataclass(frozen=True)
class SamplerDiagnostics:
    """What an epoch plan does with the corpus. All counts are global (every rank), in utterances.

    num_items == kept + dropped_too_long + dropped_empty + dropped_uneven always holds (with epoch_items, kept
    counts the epoch's occurrences instead); every kept item is in exactly one batch of the epoch, plus
    `repeated` extra occurrences when there were fewer items than batches needed to give every rank the same
    count.
    """

    epoch: int
    world_size: int
    num_items: int
    kept: int
    dropped_too_long: int  # longer than the whole budget on their own
    dropped_empty: int  # zero frames
    dropped_uneven: int  # left out to equalize ranks (only uneven="drop" with items < ranks needed)
    repeated: int  # extra occurrences added to equalize ranks (only uneven="repeat", same condition)
    split: int  # batches cut in two to make the batch count divisible by the world size
    efficiency_splits: int  # batches cut in two to reach min_efficiency (small corpora)
    num_batches: int  # global batches of the epoch
    batches_per_rank: int  # under the current world size
    pools: int  # random pools the epoch is sorted and packed in
    padding_efficiency: float  # sum of real frames / sum of padded frames (n * longest; with shapes, rows * edge)
    fill_ratio: float  # mean batch cost / max_frames
    max_fill: float  # largest batch cost / max_frames (<= 1 by construction)
    frame_fill: float  # mean over batches of (sum of the items' own frames) / max_frames: the budget used by data
    passes: int  # passes over the corpus in one epoch (> 1 on a small corpus: repeat.py)
    too_long_indices: np.ndarray = field(repr=False)
    empty_indices: np.ndarray = field(repr=False)
    dropped_uneven_indices: np.ndarray = field(repr=False)
    overlap_of: Callable[[], float] = field(repr=False, compare=False, default=lambda: float("nan"))

    @cached_property
    def pair_overlap(self) -> float:
        """Share of item pairs sharing a batch that already shared one the epoch before (epoch 0: epoch 1
        against epoch 0). Computed on first access: it plans and materialises a second epoch."""
        return self.overlap_of()

    def summary(self) -> str:
        return (
            f"epoch {self.epoch}: {self.kept}/{self.num_items} items in {self.num_batches} batches "
            f"({self.batches_per_rank}/rank x {self.world_size}), padding efficiency "
            f"{self.padding_efficiency:.2%}, fill {self.fill_ratio:.2%} (frames {self.frame_fill:.2%}, "
            f"{self.passes} pass{'es' if self.passes > 1 else ''}), pairs together again {self.pair_overlap:.1%} "
            f"({self.pools} pools); dropped {self.dropped_too_long} too long, "
            f"{self.dropped_empty} empty, {self.dropped_uneven} uneven; repeated {self.repeated}; split {self.split} (ranks) "
            f"+ {self.efficiency_splits} (padding)"
        )




class BucketBatchSampler(EpochPasses):
    """Yields this rank's batches (lists of GLOBAL utterance indices) of one globally planned epoch.

    Budget: a batch of n items whose longest has m frames costs n*m + quadratic*n*m**2 (padded frames plus an
    optional attention term) and never exceeds max_frames; n never exceeds max_items. max_frames may instead be a
    BucketBudget (a budget per bucket of the longest item's length, e.g. calibrated on a GPU; bucket_budget.py). Items that exceed the
    budget alone, and empty items, are dropped and counted in `diagnostics`.

    Plan (pools.EpochPlan), from (seed, epoch) only: the items are cut into `pools` random pools, each pool is
    sorted by length and packed greedily, so a batch holds neighbours in length (little padding) drawn from a
    new random 1/pools of the corpus every epoch (new composition: pairs of items meet again with probability
    ~0.7/pools). pools=None picks the most pools (<= 16) whose packing still reaches min_efficiency + 1.5 points
    (plan.choose_pools). If the epoch's padding efficiency is still below min_efficiency (small corpora: few
    items of similar length), the most wasteful batches are cut in two until it is not
    (EpochPlan.split_to_efficiency). The global batches are then dealt to ranks (deal.deal): biggest batches are
    split until the count divides by world_size, so every rank gets the same number of batches; the batches of
    one step have similar cost.

    Epochs: call set_epoch(epoch) before iterating (like DistributedSampler). Each iter() is one pass over
    the epoch; only the first pass after load_state_dict() resumes mid-epoch.

    Checkpointing with a DataLoader: the loader runs the sampler ahead of training (prefetch), so the
    sampler's own count of yielded batches is too high. Pass what the trainer really consumed::

        for epoch in range(state_epoch, epochs):
            sampler.set_epoch(epoch)            # no-op for the epoch just restored
            for i, batch in enumerate(loader):  # i counts from 0 on every pass, resumed or not
                train(batch)
                if want_checkpoint:
                    save({"sampler": sampler.state_dict(consumed_batches=i + 1), ...})

    state_dict() is identical on every rank (ranks move in lockstep), so rank 0 can save it for all.
    load_state_dict() costs one epoch plan, whatever the position. A state saved under another world size
    is resumed by re-dealing the batches not yet trained on to the new ranks: nothing lost, nothing repeated.

    Small corpora (passes, repeat.py): passes=k makes an epoch k passes over the items, sorted by length and cut
    into full batches as one stream (no batch holds an item twice); passes=None chooses by corpus size (several
    below repeat.SMALL_CORPUS_BUDGETS budgets of kept frames, or below CHECK_FILL_BELOW_BUDGETS when one pass's
    batches would carry less than MIN_FRAME_FILL of the budget). min_efficiency and pools apply to one-pass
    epochs.

    Few batch shapes (shapes, shapes.py): shapes=K fits K length edges to the lengths and plans every batch to fit
    the shape it is padded to ([items at that edge, edge]); `self.shapes` is what the collator pads to. No
    efficiency splits then: a split batch would be padded back to its shape's rows.
    """

    runs_ahead = True

    def __init__(
        self,
        lengths: np.ndarray,
        max_frames: int,
        *,
        quadratic: float = 0.0,
        max_items: int | None = None,
        pools: int | None = None,
        min_efficiency: float = 0.97,
        seed: int = 0,
        shuffle: bool = True,
        uneven: Uneven = "repeat",
        rank: int | None = None,
        world_size: int | None = None,
        epoch_items: Callable[[int], np.ndarray] | None = None,
        passes: int | None = 1,
        shapes: int | None = None,
        shape_multiple: int = 1,
    ):
        self.lengths = validate_lengths(lengths)
        # The sampler's own copy, read-only: the fingerprint is taken from it lazily (below), so it must not change.
        self.lengths.setflags(write=False)
        if isinstance(max_frames, BucketBudget):  # per-length-bucket budgets (audiopipe/sampler/bucket_budget.py)
            if quadratic:
                raise InvalidValue("quadratic adds an attention term to one global max_frames; a bucket budget was "
                                   "measured on the real cost per bucket: leave quadratic at 0")
            self.budget: BatchBudget | BucketBudget = max_frames.capped(max_items)
        else:
            self.budget = BatchBudget(int(max_frames) if isinstance(max_frames, np.integer) else max_frames,
                                      float(quadratic), max_items)
        # Few batch shapes (shapes.py): the planner charges every batch for the shape it is padded to.
        self.shapes: BatchShapes | None = None
        if shapes is not None:
            self.shapes = BatchShapes.fit(self.lengths, self.budget, shapes, shape_multiple)
            self.budget = ShapeBudget(self.budget, self.shapes)
        if passes is not None and (isinstance(passes, bool) or not isinstance(passes, (int, np.integer))
                                   or passes < 1):
            raise InvalidValue(f"passes must be None (automatic: by corpus size) or an integer >= 1, got {passes!r}")
        if passes is not None and passes > 1 and epoch_items is not None:
            raise InvalidValue("passes > 1 repeats one corpus; a weighted mix of corpora (weights) sets its own "
                             "repeats: leave passes at None or 1")
        if pools is not None and (isinstance(pools, bool) or not isinstance(pools, (int, np.integer)) or pools < 1):
            raise InvalidValue(f"pools must be None (automatic) or an integer >= 1, got {pools!r}")
        if not 0 <= min_efficiency < 1:
            raise InvalidValue(f"min_efficiency must be in [0, 1) (0 turns it off), got {min_efficiency!r}")
        if int(seed) < 0:
            raise InvalidValue(f"seed must be >= 0, got {seed!r}")
        if uneven not in ("repeat", "drop"):
            raise InvalidValue(f"uneven must be 'repeat' or 'drop', got {uneven!r}")
        self.min_efficiency = float(min_efficiency)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.uneven: Uneven = uneven
        self.rank, self.world_size = rank_and_world(rank, world_size)
        # epoch -> the items that epoch plans, an index repeated as often as it is to be seen (weighted corpus
        # mixing, audiopipe/sampler/corpus_weights.py); None: every item once. Must be a pure function of the
        # epoch (every rank, and every resume, plans the same items); its config() joins the state's config.
        self.epoch_items = epoch_items

        longest = self.budget.longest_alone()
        # The kept items grouped by length, once: every epoch's plan is drawn from it (sampler/pools.py).
        self._order = LengthOrder.build(self.lengths, longest)
        if self._order.size == self.lengths.size:  # nothing left out: spare two passes over 50M lengths
            self._empty = self._too_long = np.empty(0, dtype=np.int64)
        else:
            self._empty = np.flatnonzero(self.lengths == 0)
            self._too_long = np.flatnonzero(self.lengths > longest)
        self.requested_pools = None if pools is None else int(pools)
        if pools is None:
            target = min(self.min_efficiency + 0.015, 0.995)
            pools = choose_pools(self._order.values, self._order.counts, self.budget, target, self._rng(_POOLS))
        self.pools = int(pools)
        # A small corpus's epoch is several passes cut as one stream (repeat.py): full batches, not a few
        # partly empty ones. Automatic: by how many budgets the kept frames fill, and how full one pass is.
        self.requested_passes = None if passes is None else int(passes)
        if passes is None:
            passes = 1 if epoch_items is not None else self.small_corpus_passes()
        self.passes = int(passes)
        self.epoch = 0
        self._pending: Position | None = None  # set by load_state_dict, consumed by the next iter()
        self._active: Position | None = None  # the pass in progress (or the last one)
        self._cache: dict[tuple, Any] = {}
        # Told the batches `read_ahead` steps before they are yielded (make_loader: the dataset's read_ahead,
        # so the disk fetches them while the current batch is copied). Never changes what is yielded.
        self.read_ahead = 0
        self.on_upcoming: Callable[[np.ndarray], None] | None = None

    # ---- epochs and iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        # Planning and taking over a pending resume happen at the first next(), not here: a multi-worker
        # DataLoader calls iter() twice before drawing anything, and the resume must survive that.
        pos = self._begin_pass()
        yield from self._batches(self.epoch, pos)

    def _batches(self, epoch: int, pos: Position) -> Iterator[list[int]]:
        """This rank's batches of `epoch` from `pos` on (pos counts what is yielded); no other state is touched."""
        current = self._deal(epoch, pos.segments)
        steps = current.steps[pos.start :, self.rank]
        ahead = self.read_ahead if self.on_upcoming is not None else 0
        for j in range(min(ahead, steps.size)):
            self.on_upcoming(current.batch(steps[j]))
        for j, b in enumerate(steps):
            if ahead and j + ahead < steps.size:
                self.on_upcoming(current.batch(steps[j + ahead]))
            pos.yielded += 1
            # Only this batch's items are computed (the plan holds position ranges): O(batch), not O(corpus).
            yield current.batch(b).tolist()
        pos.finished = True

    def small_corpus_passes(self) -> int:
        """The passes passes=None would choose for this corpus (repeat.auto_passes): several below 4 budgets of
        kept frames, or below 64 when one pass's batches would carry less than half the budget; else 1."""
        frames = int((self._order.values * self._order.counts).sum())
        return auto_passes(frames, self.budget.max_frames, self.world_size, self.one_pass_frame_fill,
                           items=int(self._order.counts.sum()), max_items=getattr(self.budget, "max_items", None))

    def one_pass_frame_fill(self) -> float:
        """Mean fill per batch of epoch 0's one-pass plan, efficiency splits included: data frames / max_frames, or
        items / max_items where that is larger (a batch the item cap closed is full). What passes=None weighs on a
        corpus of a few dozen budgets; planned here, outside the cache."""
        plan = EpochPlan(self._order, self.budget, self.pools, self._rng(_PLAN, 0) if self.shuffle else None)
        if self.shapes is None:
            plan.split_to_efficiency(self.min_efficiency)
        n, _, frames = plan.stats(plan.table)
        if not frames.size:
            return 0.0
        fill = frames / self.budget.max_frames
        max_items = getattr(self.budget, "max_items", None)
        if max_items:
            fill = np.maximum(fill, n / max_items)
        return float(fill.mean())

    def __len__(self) -> int:
        """Batches this rank gets in the next pass (or the pass in progress)."""
        pos = self._pending or (self._active if self._active and not self._active.finished else None)
        return self._pass_length(pos or Position((), 0))

    def _pass_length(self, pos: Position) -> int:
        return self._deal(self.epoch, pos.segments).steps.shape[0] - pos.start

    # ---- checkpointing -------------------------------------------------------------------------------

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """Position in the epoch as a small JSON-able dict.

        consumed_batches: batches this rank has trained on in the current pass (enumerate(loader) index + 1);
        by default the number the sampler has yielded, which is too high under DataLoader prefetching.
        """
        if self._pending is not None:
            pos, done = self._pending, 0
        elif self._active is not None:
            pos, done = self._active, self._active.yielded
        else:
            pos, done = Position((), 0), 0
        if consumed_batches is not None:
            limit = self._pass_length(pos) if self._pending is None and self._active is not None else 0
            if not 0 <= consumed_batches <= limit:
                raise InvalidValue(f"consumed_batches={consumed_batches} is outside this pass's 0..{limit} batches")
            done = int(consumed_batches)
        segments = [list(s) for s in pos.segments] + [[self.world_size, pos.start + done]]
        return {
            "format": STATE_FORMAT,
            "epoch": self.epoch,
            "segments": segments,
            "lengths_sha256": self._fingerprint,
            "num_items": int(self.lengths.size),
            "config": self._config(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from state_dict(): the next iter() yields exactly this rank's remaining batches."""
        if isinstance(state, dict) and state.get("format") in _OLD_FORMATS:
            raise InvalidValue(
                f"this sampler state has format {state['format']!r}, saved by an older audiopipe whose epoch plan "
                f"differs ({STATE_FORMAT!r} now): it cannot resume mid-epoch into this plan; restart the epoch "
                f"(drop the sampler state, keep the epoch number)"
            )
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidValue(f"not a BucketBatchSampler state (expected format {STATE_FORMAT!r})")
        if state["lengths_sha256"] != self._fingerprint:
            raise InvalidValue(
                f"the state was saved for other lengths ({state['num_items']} items, sha256 {state['lengths_sha256']}) "
                f"than this sampler's ({self.lengths.size} items, sha256 {self._fingerprint}): another corpus or index?"
            )
        saved_passes = state["config"].get("passes", 1)
        if self.requested_passes is None and self.epoch_items is None and isinstance(saved_passes, int) \
                and saved_passes >= 1 and saved_passes != self.passes:
            # passes=None chose for the world size the state was saved under (repeat.auto_passes): a resume under
            # another one keeps the run's passes, so the epoch it re-deals is the one it counted.
            self.passes = saved_passes
            self._cache = {}
        now = self._config()  # both ways: a setting only one side has (shapes, passes) is a difference too
        diff = {k: (state["config"].get(k), now.get(k)) for k in state["config"].keys() | now.keys()
                if state["config"].get(k) != now.get(k)}
        if diff:
            raise InvalidValue(f"the state was saved with another sampler config (saved, now): {diff}")
        segments = tuple((int(w), int(k)) for w, k in state["segments"])
        if not segments or any(w < 1 or k < 0 for w, k in segments):
            raise InvalidValue(f"corrupt sampler state segments: {state['segments']}")
        epoch = int(state["epoch"])
        # Validate every step count against its deal now rather than failing at the first batch.
        for j in range(len(segments)):
            steps = self._deal(epoch, segments[:j], world_size=segments[j][0]).steps.shape[0]
            if segments[j][1] > steps:
                raise InvalidValue(f"sampler state says {segments[j][1]} steps of {steps} were consumed")
        *prior, (w_last, k_last) = segments
        earlier = tuple(prior)
        if w_last == self.world_size:
            pos = Position(earlier, k_last)  # same world size: continue the same deal
        elif k_last == 0:
            pos = Position(earlier, 0)  # the last world size consumed nothing: deal as if it never ran
        else:
            pos = Position(earlier + ((w_last, k_last),), 0)  # re-deal what is left to the new ranks
        self.epoch = epoch
        self._active = None
        self._pending = pos

    @cached_property
    def _fingerprint(self) -> str:
        """sha256 of the lengths, taken when a state is saved or loaded, not at construction: hashing 8 MB of a
        million lengths is ~5 ms of the time to the first batch (issue 10.2). Exact all the same: the lengths
        are the sampler's own read-only copy."""
        # memoryview: hashes the buffer in place (tobytes() would copy 400 MB for 50M lengths).
        return hashlib.sha256(memoryview(self.lengths).cast("B")).hexdigest()[:16]

    # ---- diagnostics ---------------------------------------------------------------------------------

    @property
    def diagnostics(self) -> SamplerDiagnostics:
        """Diagnostics of the current epoch as planned (including earlier world-size segments of a resume)."""
        pos = self._pending or self._active or Position((), 0)
        key = ("diag", self.epoch, pos.segments, self.world_size)
        diag = self._cache.get(key)
        if diag is None:
            diag = self._cache[key] = self._diagnose(self.epoch, pos.segments)
        return diag

    def _diagnose(self, epoch: int, segments: tuple[tuple[int, int], ...]) -> SamplerDiagnostics:
        plan = self._plan(epoch)
        trained: list[np.ndarray] = []
        split = repeated = 0
        dropped: list[np.ndarray] = []
        for j, (w, k) in enumerate(segments):
            d = self._deal(epoch, segments[:j], world_size=w)
            trained.append(d.table[d.steps[:k].ravel()])
            split, repeated = split + d.split, repeated + d.repeated
            dropped.append(d.dropped)
        current = self._deal(epoch, segments)
        trained.append(current.table[current.steps.ravel()])
        split, repeated = split + current.split, repeated + current.repeated
        dropped.append(current.dropped)
        dropped_uneven = np.concatenate(dropped) if dropped else np.empty(0, dtype=np.int64)
        # Sizes, longest items and real frames come from the plan's histograms: no batch is materialised.
        sizes, longest, frames = plan.stats(np.concatenate(trained))
        sizes, longest = sizes.astype(np.float64), longest.astype(np.float64)
        real = float(frames.sum())
        shaped = getattr(self.budget, "padded", None)  # with shapes: the rows x edge each batch is padded to
        padded = float(shaped(sizes, longest).sum() if shaped is not None and sizes.size else (sizes * longest).sum())
        cost = self.budget.cost(sizes, longest) / self.budget.max_frames
        return SamplerDiagnostics(
            epoch=epoch,
            world_size=self.world_size,
            num_items=int(self.lengths.size),
            kept=int(plan.kept - dropped_uneven.size),  # occurrences, with epoch_items
            dropped_too_long=int(self._too_long.size),
            dropped_empty=int(self._empty.size),
            dropped_uneven=int(dropped_uneven.size),
            repeated=int(repeated),
            split=int(split),
            efficiency_splits=int(plan.efficiency_splits),
            num_batches=int(sizes.size),
            batches_per_rank=int(current.steps.shape[0]),
            pools=self.pools,
            padding_efficiency=real / padded if padded else 1.0,
            fill_ratio=float(cost.mean()) if cost.size else 0.0,
            max_fill=float(cost.max()) if cost.size else 0.0,
            frame_fill=float(frames.mean()) / self.budget.max_frames if frames.size else 0.0,
            passes=self.passes,
            too_long_indices=self._too_long,
            empty_indices=self._empty,
            dropped_uneven_indices=dropped_uneven,
            overlap_of=lambda: self._pair_overlap(epoch),
        )

    # ---- planning (cached, pure functions of seed/epoch/config) ------------------------------------

    def _rng(self, *stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *stream])

    def _plan(self, epoch: int) -> EpochPlan:
        """The epoch's global batches before dealing (position ranges of its pools)."""
        key = ("plan", epoch)
        plan = self._cache.get(key)
        if plan is None:  # kept in a local: a look-ahead's thread may trim the cache meanwhile
            self._trim_cache(epoch)
            plan = self._cache[key] = self._plan_uncached(epoch)
        return plan

    def _epoch_items(self, epoch: int) -> np.ndarray:
        items = np.asarray(self.epoch_items(epoch), dtype=np.int64)
        if items.size and (items.min() < 0 or items.max() >= self.lengths.size):
            raise InvalidValue(f"epoch_items({epoch}) returned an index outside 0..{self.lengths.size - 1}")
        return items

    def _plan_uncached(self, epoch: int) -> EpochPlan | JoinedPlan:
        rng = self._rng(_PLAN, epoch) if self.shuffle else None
        if self.passes > 1:
            plan: EpochPlan | JoinedPlan | RepeatPlan = RepeatPlan(self._order, self.budget, self.passes, rng)
        elif self.epoch_items is None:
            plan = EpochPlan(self._order, self.budget, self.pools, rng)
        else:  # repeated items: each round of copies planned on its own, so no batch holds an item twice
            plans = []
            for r, part in enumerate(copy_rounds(self._epoch_items(epoch))):
                # Empty and too-long items leave here, as they do without epoch_items.
                order = LengthOrder.build(self.lengths, self.budget.longest_alone(), items=part)
                if order.size or not plans:
                    rr = (rng if r == 0 else self._rng(_PLAN, epoch, r)) if self.shuffle else None
                    plans.append(EpochPlan(order, self.budget, self.pools, rr))
            plan = plans[0] if len(plans) == 1 else JoinedPlan(plans)
        if self.shapes is None:  # a split batch is padded back to its shape's rows: it would save nothing
            plan.split_to_efficiency(self.min_efficiency)
        return plan

    def _pair_overlap(self, epoch: int) -> float:
        """Pairs of this epoch's batches (as dealt to all ranks) that shared a batch in the epoch before
        (epoch 0: epoch 1 against epoch 0). Materialises every batch of both epochs."""
        other = epoch - 1 if epoch > 0 else epoch + 1
        a = self._deal(epoch, ()).all_batches()
        # The other epoch is planned and dealt outside the cache, which holds the epoch in progress only.
        rng = self._rng(_DEAL, other, 0) if self.shuffle else None
        plan = self._plan_uncached(other)
        b = deal(plan.table, plan, self.budget, self.world_size, rng, self.uneven).all_batches()
        before, after = (b, a) if other < epoch else (a, b)
        return pair_overlap(before, after, self.lengths.size)

    def _deal(self, epoch: int, segments: tuple[tuple[int, int], ...], world_size: int | None = None) -> Deal:
        """The deal of segment len(segments): the plan, re-dealt after each earlier (world_size, steps)."""
        world_size = self.world_size if world_size is None else world_size
        key = ("deal", epoch, segments, world_size)
        dealt = self._cache.get(key)
        if dealt is None:
            plan = self._plan(epoch)
            if segments:
                w, k = segments[-1]
                table = self._deal(epoch, segments[:-1], world_size=w).remaining(k)
            else:
                table = plan.table
            rng = self._rng(_DEAL, epoch, len(segments)) if self.shuffle else None
            dealt = self._cache[key] = deal(table, plan, self.budget, world_size, rng, self.uneven)
        return dealt

    def _trim_cache(self, epoch: int) -> None:
        # Plans of older epochs are never needed again; keep memory bounded to two epochs: a look-ahead plans
        # epoch e+1 (in its thread) while the pass over e ends and may still ask for e's plan (state_dict).
        # list(): a copy taken at once, as the other thread may add an entry meanwhile.
        self._cache = {k: v for k, v in list(self._cache.items()) if epoch - 1 <= k[1] <= epoch + 1}

    def _config(self) -> dict[str, Any]:
        cfg = {
            "max_frames": int(self.budget.max_frames),
            "quadratic": self.budget.quadratic,
            "max_items": self.budget.max_items,
            "pools": self.pools,
            "min_efficiency": self.min_efficiency,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "uneven": self.uneven,
        }
        base = self.budget.base if isinstance(self.budget, ShapeBudget) else self.budget
        if isinstance(base, BucketBudget):
            cfg["buckets"] = base.config()["buckets"]
        if self.shapes is not None:
            cfg["shapes"] = self.budget.config()
        if self.passes > 1:
            cfg["passes"] = self.passes
        if self.epoch_items is not None:
            cfg["epoch_items"] = getattr(self.epoch_items, "config", lambda: "custom")()
        return json.loads(json.dumps(cfg))  # what a JSON round trip of the checkpoint gives back

