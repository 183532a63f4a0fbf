"""One call from a shard set to a DDP-ready torch DataLoader: dataset -> sampler -> collate.

    loader = make_loader("./shards", ["mel"], max_frames=38400)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...
            ckpt["loader"] = loader.state_dict()

make_loader takes the three steps lhotse users know, each also usable alone:
  1. the dataset (open_dataset.py): which shard sets, which features, what is trusted;
  2. the sampler (audiopipe/sampler/): which rows make each batch, for this rank, epoch after epoch;
  3. the loader (`Loader` here): collate into padded tensors, a torch DataLoader, and `prefetch` batches made
     ready ahead of the training step (in a background thread: audiopipe/reader/prefetch.py).

Reading is a slice of an mmap, so workers are rarely needed: num_workers=0 keeps everything in one process and
uses no shared memory. With workers, each batch in flight lives in /dev/shm until the trainer takes it:
`loader.shm_bytes_per_worker()` says how much, so a full /dev/shm (a SIGBUS) can be planned away.
"""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import numpy as np
import torch

from audiopipe.collate.kernels import release_warm_up, wait_for_kernels, warm_up_in_background
from audiopipe.collate.pad import PadCollator, padded_bytes
from audiopipe.errors import InvalidValue
from audiopipe.reader import integrity
from audiopipe.reader.errors import NonFiniteBatch
from audiopipe.reader.open_dataset import is_remote, open_dataset, shard_sets
from audiopipe.reader.prefetch import LookAhead, PrefetchIterator
from audiopipe.reader.reading import Reading
from audiopipe.sampler.block_window import BlockWindowSampler
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.corpus_weights import CorpusWeights, check_weights
from audiopipe.features.names import column_names

if TYPE_CHECKING:
    from audiopipe.sampler.bucket_budget import BucketBudget


class _View:
    """The dataset seen through a subset of utterances and a per-item transform (both optional).

    The sampler plans over positions 0..len(subset)-1; this maps them back to global rows.
    """

    def __init__(self, ds: Any, subset: np.ndarray | None, item_transform: Callable | None):
        self.ds, self.subset, self.item_transform = ds, subset, item_transform

    def __len__(self) -> int:
        return len(self.ds) if self.subset is None else len(self.subset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.ds[int(self.subset[i]) if self.subset is not None else i]
        return self.item_transform(item) if self.item_transform else item

    def read_ahead(self, indices: np.ndarray) -> None:
        """Hint the rows of a batch to come (the sampler calls this `prefetch` batches early)."""
        self.ds.read_ahead(self.subset[indices] if self.subset is not None else indices)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[dict[str, Any]]:
        if hasattr(self.ds, "__getitems__"):
            # The whole batch in one call: ShardDataset answers with a RowBatch that collate pads without
            # building per-item dicts. A transform gets the same item dicts as ds[i] from it, located and read
            # once per batch instead of once per item (half of a speaker batch's CPU time, bench_speaker_batch.py).
            idx = np.asarray(indices, dtype=np.int64)
            rows = self.ds.__getitems__(self.subset[idx] if self.subset is not None else idx)
            if self.item_transform is None:
                return rows
            return [self.item_transform(rows[i]) for i in range(len(rows))]
        return [self[i] for i in indices]


class _Collate:
    """PadCollator, then an optional batch transform, both inside the worker that built the batch."""

    def __init__(self, pad: PadCollator, batch_transform: Callable | None, release_kernels: bool = False,
                 check_finite: bool = False):
        self.pad, self.batch_transform, self.check_finite = pad, batch_transform, check_finite
        # num_workers=0 without a prefetch thread: the kernel load waits until the first batch has been handed over
        # (it starts with the second batch: started as the first is returned, it held the GIL the hand-over
        # needed). With the thread, the loader releases it as the consumer takes the first batch.
        self.batches_before_release = 1 if release_kernels else -1

    def __call__(self, items):
        if self.batches_before_release == 0:
            release_warm_up()
        self.batches_before_release -= self.batches_before_release >= 0
        batch = self.pad(items)
        if self.check_finite:
            check_finite(batch, self.pad.features)
        return self.batch_transform(batch) if self.batch_transform else batch


def check_finite(batch: dict[str, Any], features: Sequence[str]) -> None:
    """Raise NonFiniteBatch when a padded float feature of `batch` holds NaN or inf, naming the feature and the
    utterances whose rows do (one pass over the batch, in the process that built it; padding is 0)."""
    for f in features:
        t = batch.get(f)
        if not torch.is_tensor(t) or not t.is_floating_point():
            continue
        bad = ~torch.isfinite(t).flatten(1).all(dim=1)
        if bool(bad.any()):
            ids = batch.get("id")
            rows = bad.nonzero().flatten().tolist()
            named = ", ".join(str(ids[r]) for r in rows[:5]) if ids is not None else f"rows {rows[:5]}"
            more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
            raise NonFiniteBatch(f"feature {f!r} holds NaN or inf in utterance(s) {named}{more}: the shard's "
                                 f"bytes changed; run `audiopipe verify` on the shard set to find the shard")


@dataclass
class Loader:
    dataset: Any  # ShardDataset, RemoteShardDataset or MixtureDataset (open_dataset.py)
    sampler: BucketBatchSampler | BlockWindowSampler
    collate: PadCollator
    dataloader: torch.utils.data.DataLoader
    prefetch: int = 2
    device: torch.device | None = None
    _active: Any = field(default=None, repr=False)  # weakref to the PrefetchIterator of the pass in progress
    _progress: Any = field(default=None, repr=False)  # its consumed count, kept after the iterator is dropped
    mix: CorpusWeights | None = None  # several corpora: mix.shares(epoch) / mix.summary(epoch) per corpus
    # The look-ahead that runs on across epochs, and the passes it runs into, in order: (epoch, position) each.
    _look: LookAhead | None = field(default=None, repr=False)
    _upcoming: Any = field(default=None, repr=False)

    def mix_summary(self) -> str | None:
        """One line per epoch on what each corpus gave the epoch being planned (None for a single corpus)."""
        return self.mix.summary(self.sampler.epoch) if self.mix is not None else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.prefetch == 0 and self.device is None:
            return iter(self.dataloader)
        self._close_active()  # one pass at a time: the previous pass' thread must not draw from the sampler
        look = self._take_over()
        if look is None:
            look = self._look_ahead()
        # The copy kernel's background load (num_workers=0) starts once the consumer holds the first batch: started
        # by the thread's second collate, it held the GIL while the first batch was being handed over.
        it = PrefetchIterator(look=look, on_first=release_warm_up if self.dataloader.num_workers == 0 else None)
        self._active, self._progress = weakref.ref(it), it.progress
        return it

    def _look_ahead(self) -> LookAhead:
        """A thread for the pass iter() begins now. In one process over a bucket plan, it runs on into the next
        epochs (set_epoch(e + 1) then iter() takes those batches over); with workers, or block windows (whose
        passes hold and release storage), it builds this pass only."""
        depth = max(self.prefetch, 1)
        if self.dataloader.num_workers > 0 or not getattr(self.sampler, "runs_ahead", False):
            return LookAhead(iter([iter(self.dataloader)]), depth, self.device)
        view, collate = self.dataloader.dataset, self.dataloader.collate_fn
        transforms = [t for t in (view.item_transform, collate.batch_transform) if hasattr(t, "set_epoch")]
        self._upcoming = collections.deque()
        passes = _epochs(self.sampler, self.sampler.epoch, _Fetch(view, collate), transforms, self._upcoming)
        self._look = LookAhead(passes, depth, self.device)
        return self._look

    def _take_over(self) -> LookAhead | None:
        """The running look-ahead when the pass it runs into is the one iter() begins now (the epoch after the
        pass it finished, from its start); otherwise it is stopped, and None."""
        look = self._look
        if look is None:
            return None
        if look.running and self._upcoming and self.sampler.adopt(*self._upcoming[0]):
            self._upcoming.popleft()
            return look
        self._drop_look()
        return None

    def _drop_look(self) -> None:
        """Stop the look-ahead; transforms it moved on to the next epoch go back to the sampler's epoch."""
        if self._look is None:
            return
        self._look.close()
        self._look = None
        self._set_transform_epochs(self.sampler.epoch)

    def _set_transform_epochs(self, epoch: int) -> None:
        view, collate = self.dataloader.dataset, self.dataloader.collate_fn
        for t in (view.item_transform, collate.batch_transform):
            if hasattr(t, "set_epoch"):
                t.set_epoch(epoch)

    def _close_active(self) -> None:
        """Stop the pass in progress if it is not over (a pass that ended leaves its look-ahead running on)."""
        it = self._active() if self._active is not None else None
        if it is not None:
            it.close()
        self._active = None

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Tell the sampler, and any transform with a set_epoch (random crops drawn per epoch), the epoch.

        Workers are persistent, so a transform used in workers must keep its epoch where they see it (e.g. a
        shared-memory tensor, as trainers/speaker.py's SpeakerCrops does).
        """
        self._close_active()  # a prefetch thread still drawing the previous epoch stops first
        if not (self._upcoming and self._upcoming[0][0] == epoch):
            self._drop_look()  # its thread builds an epoch other than this one
        self._progress = None
        self.sampler.set_epoch(epoch)
        self._set_transform_epochs(epoch)

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The sampler's state after `consumed_batches` of this pass (default with prefetch: the batches the
        trainer took from the prefetch iterator, not the ones built ahead)."""
        if consumed_batches is None and self._progress is not None:
            consumed_batches = self._progress.consumed
        return self.sampler.state_dict(consumed_batches=consumed_batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._close_active()
        self._drop_look()
        self._progress = None
        self.sampler.load_state_dict(state)

    def shm_bytes_per_worker(self) -> int:
        """Upper bound of shared memory one worker holds: `prefetch` padded batches at the frame budget."""
        dl = self.dataloader
        if dl.num_workers == 0:
            return 0
        return dl.prefetch_factor * padded_bytes(self.collate.features, self.dataset.manifest["features"],
                                                 self.dataset.channels, self.sampler.budget.max_frames)


class _Fetch:
    """One batch from its rows, as a single-process DataLoader builds it (the dataset's __getitems__, then
    collate), for the passes a look-ahead builds; holds the view and collator, never the Loader."""

    def __init__(self, view: _View, collate: _Collate):
        self.view, self.collate = view, collate

    def __call__(self, indices: list[int]) -> dict[str, Any]:
        return self.collate(self.view.__getitems__(indices))


def _epochs(sampler: Any, epoch: int, fetch: _Fetch, transforms: list, upcoming: collections.deque) -> Iterator:
    """The passes a look-ahead builds: the sampler's own pass over `epoch` (a resume, if one is pending), then a
    fresh pass over each epoch after it. Each following pass is announced in `upcoming` before the pass ahead of
    it starts, so it is known by the time the consumer finishes that one; the transforms move on to its epoch only
    once every batch before it is built (the thread builds in order)."""
    following = sampler.pass_ahead(epoch + 1)
    upcoming.append((epoch + 1, following[0]))
    yield map(fetch, iter(sampler))
    while True:
        epoch += 1
        batches = following[1]
        following = sampler.pass_ahead(epoch + 1)
        upcoming.append((epoch + 1, following[0]))
        yield _run(batches, epoch, fetch, transforms)


def _run(batches: Iterator[list[int]], epoch: int, fetch: _Fetch, transforms: list) -> Iterator[dict[str, Any]]:
    for t in transforms:
        t.set_epoch(epoch)
    for b in batches:
        yield fetch(b)


def make_loader(shards: str | Path | Sequence[str | Path], features: Sequence[str], *,
                # 1. what to read
                subset: np.ndarray | None = None, weights: Sequence[float] | None = None,
                expect: dict[str, str] | None = None, reading: Reading | None = None,
                # 2. how to batch
                max_frames: int | BucketBudget, length_feature: str | None = None, lengths: np.ndarray | None = None,
                quadratic: float = 0.0, max_items: int | None = None, seed: int = 0, shuffle: bool = True,
                min_efficiency: float = 0.97, pools: int | None = None, passes: int | None = None,
                shapes: int | None = None,
                # 3. how to hand batches over
                layout: str = "BCT", pad_to_multiple: int = 1, item_transform: Callable | None = None,
                batch_transform: Callable | None = None, collate_features: Sequence[str] | None = None,
                prefetch: int = 2, num_workers: int = 0, device: str | torch.device | None = None,
                # 4. for DDP
                rank: int | None = None, world_size: int | None = None,
                # 5. on damage
                verify: str = "size", on_corrupt: str = "fail", check_finite: bool = False) -> Loader:
    """A Loader over `shards` reading `features`: `make_loader("./shards", ["mel"], max_frames=38_400)`.

    1. What to read
      shards: a folder, s3://bucket/prefix, or a list of them to mix into one plan (indices in subset/lengths are
        then global: corpus k's item i is the sum of the earlier corpora's sizes + i).
      features: the columns to read and pad, e.g. ["mel"].
      subset: global indices of the utterances to use (e.g. the training speakers).
      weights: with a list of shard sets, one factor per corpus on its audio hours per epoch (docs/loader.md,
        "Mixing corpora").
      expect: {feature: config hash} the model was built for; other shards are a one-line ConfigMismatch.
      reading: Reading(...) (audiopipe/reader/reading.py): how rows come off storage: rows or block windows,
        shards kept open (max_open), a local cache of s3:// shards (cache_dir, max_cache_bytes).
    2. How to batch (the sampler, audiopipe/sampler/bucket.py)
      max_frames: the padded-frame budget of a batch (B x T_max of length_feature, default the first feature),
        or a BucketBudget (one budget per length bucket, audiopipe/sampler/bucket_budget.py).
      lengths: the frames the budget counts per utterance when items are transformed (e.g. 3 s crops); default
        the index's (indexed like subset when one is given).
      quadratic, max_items: extra cost per frame squared; items per batch at most.
      seed, shuffle: every epoch's plan is a pure function of (seed, epoch, lengths, rank, world_size).
      min_efficiency, pools: the padding efficiency the most wasteful batches are split to reach, and the random
        pools an epoch is sorted in (None: the most that keep min_efficiency; docs/sampler.md).
      passes: passes over the corpus per epoch, cut into batches as one stream (default None: by corpus size,
        several when the corpus fills fewer than 4 budgets, or fewer than 64 and one pass would leave its
        batches more than half empty, so that its batches are full; one pass on other corpora, on a weighted
        mix, and with block-window reading; 1: always one pass).
      shapes: at most this many batch shapes in the whole run (None: off): every batch is padded to one of K
        (items, frames) shapes (audiopipe/sampler/shapes.py), for torch.compile or CUDA graphs.
    3. How to hand batches over (audiopipe/collate/pad.py, audiopipe/reader/prefetch.py)
      layout: "BCT" ([B, C, T_max], rows copied as stored) or "BTC" (transposed while copied: slower on CPU).
      pad_to_multiple: T_max rounded up to it.
      item_transform / batch_transform: run on each item before collate, or on the padded batch, in the process
        that builds it (picklable with workers). collate_features: the keys to pad when item_transform makes
        new arrays (default: features).
      prefetch: the one look-ahead setting, batches made ready ahead of the training step (default 2): with
        num_workers=0 a background thread builds them while the step runs; each worker keeps that many ready;
        the rows of the next `prefetch` batches are announced to storage (madvise, or fetched from s3://).
        0: nothing ahead, each batch built on the caller's thread when asked. state_dict() counts the batches
        consumed, never the ones made ahead. An error raised while building a batch ahead reaches the loop as
        itself (e.g. CorruptShardError).
      num_workers: DataLoader worker processes (0 is usually fastest: reading is a slice of an mmap).
      device: hand batches over on it ("cuda", "cuda:1"); with CUDA the collator writes into pinned buffers and
        the prefetch thread copies them on a side stream (with prefetch=0, one batch ahead).
    4. For DDP
      rank, world_size: default to torch.distributed's group when it is initialised; every rank gets the same
        number of batches.
    5. On damage (audiopipe/reader/integrity.py, docs/loader.md "Corrupt shards")
      verify: "size" (sizes, footers, headers, row counts) or "checksum" (also every byte, once at open).
      on_corrupt: "fail" (a corrupt shard is a CorruptShardError before anything is planned) or "skip" (its
        rows leave the plan, logged once, in loader.dataset.diagnostics()).
      check_finite: also check every padded float feature of every batch for NaN and inf (one pass over the
        batch where it is built): a NonFiniteBatch naming the feature and the utterance ids. Bytes changed in
        place keep a shard's size, so only verify="checksum" (once, at open) or this (per batch) sees them. With torch.distributed, "skip" runs
        a collective inside make_loader so that all ranks skip the same shards: an all_reduce every rank must
        reach, run only when this loader is one of the whole group's (rank/world_size left to default or equal
        to the group's); a loader built on one rank alone (rank=0, world_size=1) skips what it found, and runs
        none.
    """
    features = column_names(features)  # vocos_mel -> mel, kaldi_fbank -> fbank (features/names.py)
    length_feature = column_names(length_feature)[0] if length_feature else None
    collate_features = column_names(collate_features) if collate_features else collate_features
    opts = reading if reading is not None else Reading()
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise InvalidValue(f"prefetch must be an integer >= 0 (batches made ready ahead), got {prefetch!r}")
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
        raise InvalidValue(f"device={device!r} but CUDA is not available here")
    mixed = not isinstance(shards, (str, Path))
    names = [str(s) for s in shard_sets(shards)]
    if mixed:
        mix_weights = check_weights(weights, names)  # before opening anything: a typo fails at once
    elif weights is not None:
        raise InvalidValue("weights= goes with a list of shard folders; one folder is read as it is")
    remote = is_remote(shards)
    ds = open_dataset(shards, features, expect=expect, verify=verify, on_corrupt=on_corrupt, reading=opts,
                      agree_on_skips=on_corrupt == "skip" and integrity.spans_whole_group(rank, world_size))
    subset, lengths = rows_to_plan(ds, length_feature or features[0], lengths, subset)
    corpus_bytes = sum(int(e["arrow"]["bytes"]) for e in ds.manifest["shards"])
    mode = opts.resolve(remote=remote, mixed=mixed, num_workers=num_workers, corpus_bytes=corpus_bytes)
    # Settings block windows lack (passes=None is one pass there: block windows plan big remote corpora).
    bucket_only = (min_efficiency, pools, shapes) != (0.97, None, None) or passes not in (None, 1)
    if mode == "blocks" and opts.mode == "auto" and bucket_only:
        mode = "rows"
    if mode == "blocks":
        table = ds.blocks(opts.block_bytes)
        rows = subset if subset is not None else np.arange(len(ds), dtype=np.int64)
        sampler: Any = BlockWindowSampler(lengths, table.of_row[rows], max_frames, block_shard=table.shard,
                                          block_bytes=table.nbytes, window=opts.window, ahead=opts.ahead,
                                          quadratic=quadratic, max_items=max_items, seed=seed, shuffle=shuffle,
                                          rank=rank, world_size=world_size, nodes=opts.nodes)
        if bucket_only:
            raise InvalidValue("min_efficiency, pools, passes and shapes set the bucket sampler; block-window "
                             "reading plans its own batches: give Reading(mode='rows')")
        sampler.on_hold = lambda tag, ids: ds.hold_blocks(tag, table, ids)
        sampler.on_release = ds.release_blocks
    else:
        if opts.nodes != 1:
            raise InvalidValue("Reading(nodes=...) partitions shards by node for block-window reading; "
                               "give mode='blocks'")
        sampler = BucketBatchSampler(lengths, max_frames, quadratic=quadratic, max_items=max_items, seed=seed,
                                     shuffle=shuffle, rank=rank, world_size=world_size,
                                     min_efficiency=min_efficiency, pools=pools,
                                     passes=1 if mixed and passes is None else passes,  # a mix sets its repeats
                                     shapes=shapes, shape_multiple=pad_to_multiple)
    mix = None
    if mixed:
        # The sampler plans positions (of the subset, when one is given): weights need each position's corpus
        # and hours, and count only what the sampler can plan (not empty, fits the budget alone).
        rows = subset if subset is not None else np.arange(len(ds), dtype=np.int64)
        n = sampler.lengths
        mix = CorpusWeights(ds.corpus_of(rows), ds.durations()[rows], mix_weights, names,
                            usable=(n > 0) & sampler.budget.fits_alone(n), seed=seed)
        sampler.epoch_items = mix
    # From s3 with workers, each worker fetches its own batch's rows at once (DataLoader keeps several batches
    # in flight); the main process' read-ahead would fetch into memory no worker sees.
    announce = mode == "rows" and not (remote and num_workers > 0)
    return loader_over(ds, sampler, features, subset=subset, layout=layout, pad_to_multiple=pad_to_multiple,
                       item_transform=item_transform, batch_transform=batch_transform,
                       collate_features=collate_features, prefetch=prefetch, num_workers=num_workers, device=dev,
                       seed=seed, announce_rows=announce, mix=mix, check_finite=check_finite)


def rows_to_plan(ds: Any, length_feature: str, lengths: np.ndarray | None,
                 subset: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray]:
    """(subset, lengths) a sampler plans over: the subset given (global rows; None: all), its lengths (default:
    the index's frame counts of length_feature), less the rows of shards skipped as corrupt."""
    if subset is not None:
        subset = np.asarray(subset, dtype=np.int64)
    if lengths is None:
        lengths = ds.lengths(length_feature).astype(np.int64)
        if subset is not None:
            lengths = lengths[subset]
    if hasattr(ds, "without_skipped"):
        subset, lengths = ds.without_skipped(subset, lengths)
    return subset, np.asarray(lengths, dtype=np.int64)


def loader_over(ds: Any, sampler: Any, features: Sequence[str], *, subset: np.ndarray | None = None,
                layout: str = "BCT", pad_to_multiple: int = 1, item_transform: Callable | None = None,
                batch_transform: Callable | None = None, collate_features: Sequence[str] | None = None,
                prefetch: int = 2, num_workers: int = 0, device: torch.device | None = None, seed: int = 0,
                announce_rows: bool = True, mix: CorpusWeights | None = None, check_finite: bool = False) -> Loader:
    """The loader step alone: `ds` (a map-style dataset with manifest and channels, as open_dataset gives) read
    in the batches `sampler` plans, padded by PadCollator into a DataLoader (make_loader's arguments of the
    same names). announce_rows: the sampler announces each batch's rows to ds.read_ahead `prefetch` batches
    early, when ds has one."""
    if num_workers == 0:
        # The copy kernel loads in the background while the first batches are copied with numpy, once the first
        # batch is in hand: loading it meanwhile made that batch 2-3x slower (GIL).
        # Not with workers: they fork, and must not inherit numba's compiler lock mid-load.
        feats = ds.manifest["features"]
        warm_up_in_background([np.dtype(feats[f]["dtype"]).itemsize for f in (collate_features or features)
                               if f in feats and "dtype" in feats[f]], layout, after_release=True)
    else:
        wait_for_kernels()  # a load started by an earlier loader of this process must not be forked mid-way
    view = _View(ds, subset, item_transform)
    if announce_rows and prefetch and hasattr(ds, "read_ahead"):
        sampler.read_ahead, sampler.on_upcoming = prefetch, view.read_ahead
    # Batches alive at once with a prefetch thread (device alone runs one batch ahead): K queued + 1 being built
    # + 1 held by the step. (A CUDA copy frees its ring slot at once; device="cpu" hands over the slot itself.)
    depth = max(prefetch, 1) if prefetch or device is not None else 0
    pinned = device is not None and device.type == "cuda"
    collate = PadCollator(list(collate_features or features), pad_to_multiple=pad_to_multiple,
                          ring_size=depth + 2 if depth else 2, pin_memory=pinned, layout=layout,
                          shapes=getattr(sampler, "shapes", None))
    kw: dict[str, Any] = {}
    if num_workers > 0:
        kw = {"prefetch_factor": max(prefetch, 1), "persistent_workers": True}
    # Every iter() of a DataLoader draws a worker base seed; from its own generator it leaves torch's global RNG
    # alone, so a resumed run's dropout masks and crops continue exactly where the checkpoint left them.
    dl = torch.utils.data.DataLoader(view, batch_sampler=sampler,
                                     collate_fn=_Collate(collate, batch_transform,
                                                         release_kernels=num_workers == 0 and depth == 0,
                                                         check_finite=check_finite),
                                     num_workers=num_workers, pin_memory=pinned,
                                     generator=torch.Generator().manual_seed(seed), **kw)
    return Loader(ds, sampler, collate, dl, prefetch=prefetch, device=device, mix=mix)
