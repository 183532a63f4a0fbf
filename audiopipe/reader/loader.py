"""One call from a shard folder to a DDP-ready torch DataLoader: dataset -> sampler -> collate.

    loader = make_loader("./shards", ["mel"], max_frames=38400)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...
            ckpt["sampler"] = loader.state_dict(consumed_batches=step + 1)

`prefetch=K` builds the next K batches in a background thread while the step runs (audiopipe/reader/prefetch.py);
`device="cuda"` also hands them over already on the GPU (pinned buffers, side-stream copy).

Several corpora: `make_loader(["./libritts", "./emilia"], ["mel"], weights=[1, 3], ...)` plans one epoch over
their union, each corpus's hours multiplied by its weight (audiopipe/sampler/corpus_weights.py; `loader.mix`
says per epoch what each corpus contributed).

Reading is a slice of an mmap, so workers are rarely needed: num_workers=0 keeps everything in one process and
uses no shared memory at all. With workers, each batch in flight lives in /dev/shm until the trainer takes it:
`shm_bytes_per_worker()` says how much, so the 3D-Speaker-style SIGBUS (a full /dev/shm) can be planned away.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from audiopipe.collate.kernels import release_warm_up, wait_for_kernels, warm_up_in_background
from audiopipe.collate.pad import PadCollator
from audiopipe.reader import integrity
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.mixture import MixtureDataset
from audiopipe.reader.prefetch import PrefetchIterator
from audiopipe.reader.shm import bytes_per_frame, shm_bytes_per_worker
from audiopipe.reader.reading import Reading
from audiopipe.sampler.block_window import BlockWindowSampler
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.corpus_weights import CorpusWeights, check_weights
from audiopipe.storage.s3 import is_s3, require_local_or_s3


class _View:
    """The dataset seen through a subset of utterances and a per-item transform (both optional).

    The sampler plans over positions 0..len(subset)-1; this maps them back to global rows.
    """

    def __init__(self, ds: ShardDataset, subset: np.ndarray | None, item_transform: Callable | None):
        self.ds, self.subset, self.item_transform = ds, subset, item_transform

    def __len__(self) -> int:
        return len(self.ds) if self.subset is None else len(self.subset)

    def __getitem__(self, i: int) -> dict[str, Any]:
        item = self.ds[int(self.subset[i]) if self.subset is not None else i]
        return self.item_transform(item) if self.item_transform else item

    def read_ahead(self, indices: np.ndarray) -> None:
        """Hint the rows of a batch to come (the sampler calls this `read_ahead` batches early)."""
        self.ds.read_ahead(self.subset[indices] if self.subset is not None else indices)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[dict[str, Any]]:
        if self.item_transform is None and hasattr(self.ds, "__getitems__"):
            # The whole batch in one call: ShardDataset answers with a RowBatch that collate pads without
            # building per-item dicts.
            idx = np.asarray(indices, dtype=np.int64)
            return self.ds.__getitems__(self.subset[idx] if self.subset is not None else idx)
        return [self[i] for i in indices]


class _Collate:
    """PadCollator, then an optional batch transform, both inside the worker that built the batch."""

    def __init__(self, pad: PadCollator, batch_transform: Callable | None, release_kernels: bool = False):
        self.pad, self.batch_transform = pad, batch_transform
        # num_workers=0: the kernel load waits until the first batch has been handed over (it starts with the
        # second batch: started as the first is returned, it held the GIL the hand-over needed).
        self.batches_before_release = 1 if release_kernels else -1

    def __call__(self, items):
        if self.batches_before_release == 0:
            release_warm_up()
        self.batches_before_release -= self.batches_before_release >= 0
        batch = self.pad(items)
        return self.batch_transform(batch) if self.batch_transform else batch


@dataclass
class Loader:
    dataset: ShardDataset
    sampler: BucketBatchSampler | BlockWindowSampler
    collate: PadCollator
    dataloader: torch.utils.data.DataLoader
    prefetch: int = 0
    device: torch.device | None = None
    _active: Any = field(default=None, repr=False)  # weakref to the PrefetchIterator of the pass in progress
    _progress: Any = field(default=None, repr=False)  # its consumed count, kept after the iterator is dropped
    mix: CorpusWeights | None = None  # several corpora: mix.shares(epoch) / mix.summary(epoch) per corpus

    def mix_summary(self) -> str | None:
        """One line per epoch on what each corpus gave the epoch being planned (None for a single corpus)."""
        return self.mix.summary(self.sampler.epoch) if self.mix is not None else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self.prefetch == 0 and self.device is None:
            return iter(self.dataloader)
        self._close_active()  # one pass at a time: the previous pass' thread must not draw from the sampler
        it = PrefetchIterator(iter(self.dataloader), max(self.prefetch, 1), self.device)
        self._active, self._progress = weakref.ref(it), it.progress
        return it

    def _close_active(self) -> None:
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
        self._progress = None
        self.sampler.set_epoch(epoch)
        view, collate = self.dataloader.dataset, self.dataloader.collate_fn
        for t in (view.item_transform, collate.batch_transform):
            if hasattr(t, "set_epoch"):
                t.set_epoch(epoch)

    def state_dict(self, consumed_batches: int | None = None) -> dict[str, Any]:
        """The sampler's state after `consumed_batches` of this pass (default with prefetch: the batches the
        trainer took from the prefetch iterator, not the ones built ahead)."""
        if consumed_batches is None and self._progress is not None:
            consumed_batches = self._progress.consumed
        return self.sampler.state_dict(consumed_batches=consumed_batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._close_active()
        self._progress = None
        self.sampler.load_state_dict(state)

    def shm_bytes_per_worker(self) -> int:
        """Upper bound of shared memory one worker holds: prefetch_factor padded batches at the frame budget."""
        per_frame = bytes_per_frame(self.collate.features, self.dataset.manifest["features"], self.dataset.channels)
        return shm_bytes_per_worker(self.dataloader.num_workers, self.dataloader.prefetch_factor,
                                    self.sampler.budget.max_frames, per_frame)


def make_loader(shards_dir: str | Path | Sequence[str | Path], features: Sequence[str], *, max_frames: int,
                length_feature: str | None = None, lengths: np.ndarray | None = None,
                subset: np.ndarray | None = None, quadratic: float = 0.0, max_items: int | None = None,
                seed: int = 0, shuffle: bool = True, num_workers: int = 0, prefetch_factor: int = 2,
                rank: int | None = None, world_size: int | None = None, expect: dict[str, str] | None = None,
                pad_to_multiple: int = 1, verify: str = "size", pin_memory: bool = False,
                item_transform: Callable | None = None, batch_transform: Callable | None = None,
                collate_features: Sequence[str] | None = None, reader: str = "mmap",
                files_cache: str | Path | None = None, read_ahead: int = 2, on_corrupt: str = "fail",
                max_open: int = 128, prefetch: int = 0, device: str | torch.device | None = None,
                weights: Sequence[float] | None = None, cache_dir: str | Path | None = None,
                max_cache_bytes: int | None = None, layout: str = "BCT", reading: Reading | None = None) -> Loader:
    """Map-style mmap dataset + global bucketed batch plan + padding collate, wired into a DataLoader.

    shards_dir: one shard folder, or a list of them to mix (one global plan over their union; indices in
             `subset`/`lengths` are then global: corpus k's item i is sum(len of corpora before k) + i).
    weights: with a list, one per corpus (default all 1): the factor its audio hours are multiplied by in every
             epoch. 1 = each utterance once, 3 = three times, 0.5 = a random half of its hours (another half every
             epoch, from (seed, epoch)), 0 = left out. Exact definition: docs/loader.md, "Mixing corpora".
             The features read must have the same config in every corpus (else a one-line ConfigMismatch).

    length_feature: which feature's frame count the budget is measured in (default: the first of `features`).
    lengths: the frames the budget counts per utterance when items are transformed (e.g. 3 s crops);
             default: the index's counts of length_feature. Indexed like the subset when one is given.
    subset: global indices of the utterances to use (e.g. training speakers only).
    item_transform: per-sample function applied before collate (random crops); batch_transform: applied to the
             padded batch (a prompt/target split). Both run in the DataLoader workers and must be picklable.
    collate_features: the keys to pad, when item_transform makes new arrays (default: features).
    reader: "mmap" (the Arrow shards) or "files" (one .npy per utterance and feature, exported to files_cache by
             audiopipe.reader.files_dataset.export_per_utterance: a baseline to measure against).
    rank/world_size: default to torch.distributed's when it is initialised.
    read_ahead: batches whose rows are announced to the kernel (madvise WILLNEED, from a background thread)
             before they are read, so a cold shard is fetched from disk in parallel with the copy of the
             current batch; 0 turns it off (mmap reader only).
    on_corrupt: "fail" (a corrupt shard is a CorruptShardError before anything is planned) or "skip" (its rows
             leave the plan before planning, on every rank alike; logged once, in dataset.diagnostics()). Ranks
             agree on what to skip through a collective, run only when the loader is one of the whole
             torch.distributed group's (rank/world_size left to default or equal to the group's); a loader built
             on one rank alone (rank=0, world_size=1 for evaluation) skips what that rank found, and runs none.
    max_open: shards kept mapped per process (least recently used closed beyond it; mmap reader only).
    prefetch: batches built ahead in a background thread while the step runs (0: built on the caller's
             thread, when it asks). The loader's state_dict() then counts the batches consumed, not built.
    device: hand batches over on this device ("cuda", "cuda:1"); with CUDA the collator writes into pinned
             buffers and the prefetch thread copies on a side stream (with prefetch=0, one batch ahead).
    shards_dir may be s3://bucket/prefix (audiopipe/reader/remote_dataset.py): the same batches, rows read by
             byte range and `read_ahead` batches fetched ahead; cache_dir + max_cache_bytes keep whole shards
             in a bounded local cache (read by mmap once there). See docs/loader.md, "Shards on object storage".
    layout: "BCT" (default: [B, C, T_max], each stored row copied as is) or "BTC" ([B, T_max, C], transposed
             while copied: several times the CPU cost, see docs/loader.md).
    reading: how rows are read (audiopipe/reader/reading.py, `Reading(mode=...)`): "rows" (the global
             length-bucketed plan), "blocks" (block windows: a few large requests per window of blocks, batches
             planned from the resident window; loader.sampler is then a BlockWindowSampler) or "auto" (default:
             "blocks" for a large s3:// shard set read with num_workers=0, else "rows"); plus the requests in
             flight from s3:// and the block, window and node settings. See docs/loader.md.
    """
    opts = reading if reading is not None else Reading()
    if not isinstance(opts, Reading):
        raise ValueError(f"reading must be a Reading(...), got {type(reading).__name__}")
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an integer >= 0 (batches built ahead), got {prefetch!r}")
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available here")
    # on_corrupt="skip" agrees on the skipped shards across ranks (a collective) only when this loader is one of
    # the whole group's: rank/world_size left to default, or equal to torch.distributed's.
    whole_group = on_corrupt == "skip" and integrity.spans_whole_group(rank, world_size)
    mixed = not isinstance(shards_dir, (str, Path))
    folders = [str(s) for s in shards_dir] if mixed else [shards_dir]
    remote = [is_s3(require_local_or_s3(f, "shard folder")) for f in folders]  # other schemes: one line
    if any(remote) and reader != "mmap":
        raise ValueError(f"reader={reader!r} reads local folders only; shards on s3:// use reader='mmap'")
    if not any(remote) and (cache_dir is not None or max_cache_bytes is not None):
        raise ValueError("cache_dir/max_cache_bytes cache shards read from s3://; these folders are local already")

    def open_shards(folder, is_remote: bool) -> ShardDataset:
        if is_remote:
            from audiopipe.reader.remote_dataset import RemoteShardDataset

            return RemoteShardDataset(str(folder), features, expect=expect, verify=verify, on_corrupt=on_corrupt,
                                      max_open=max_open, cache_dir=cache_dir, max_cache_bytes=max_cache_bytes,
                                      fetch_threads=opts.fetch_threads, request_rate=opts.request_rate)
        return ShardDataset(folder, features, expect=expect, verify=verify, on_corrupt=on_corrupt,
                            max_open=max_open)

    if mixed:
        names = folders
        if not names:
            raise ValueError("shards_dir is an empty list: give at least one shard folder")
        mix_weights = check_weights(weights, names)  # before opening anything: a typo fails at once
        if reader != "mmap":
            raise ValueError(f"mixing corpora needs reader='mmap', got reader={reader!r}")
        ds = MixtureDataset([open_shards(f, r) for f, r in zip(names, remote)], names)
        if whole_group:
            ds.skip_what_other_ranks_skip()
    elif weights is not None:
        raise ValueError("weights= goes with a list of shard folders; one folder is read as it is")
    elif reader == "mmap":
        ds = open_shards(shards_dir, remote[0])
        if whole_group:  # a collective: all ranks plan the same rows; never for a loader of one rank alone
            ds.skip_what_other_ranks_skip()
    elif reader == "files":
        from audiopipe.reader.files_dataset import FilesDataset

        ds = FilesDataset(shards_dir, features, cache=files_cache, expect=expect)
    else:
        raise ValueError(f"reader must be 'mmap' or 'files', got {reader!r}")
    if subset is not None:
        subset = np.asarray(subset, dtype=np.int64)
    if lengths is None:
        lengths = ds.lengths(length_feature or features[0]).astype(np.int64)
        if subset is not None:
            lengths = lengths[subset]
    if reader == "mmap":
        subset, lengths = ds.without_skipped(subset, lengths)
    corpus_bytes = sum(int(e["arrow"]["bytes"]) for e in ds.manifest["shards"]) if reader == "mmap" else 0
    mode = opts.resolve(remote=any(remote), mixed=mixed, num_workers=num_workers, reader=reader,
                        corpus_bytes=corpus_bytes)
    if mode == "blocks":
        table = ds.blocks(opts.block_bytes)
        rows = subset if subset is not None else np.arange(len(ds), dtype=np.int64)
        sampler = BlockWindowSampler(np.asarray(lengths, dtype=np.int64), table.of_row[rows], max_frames,
                                     block_shard=table.shard, block_bytes=table.nbytes, window=opts.window,
                                     ahead=opts.ahead, quadratic=quadratic, max_items=max_items, seed=seed,
                                     shuffle=shuffle, rank=rank, world_size=world_size, nodes=opts.nodes)
        sampler.on_hold = lambda tag, ids: ds.hold_blocks(tag, table, ids)
        sampler.on_release = ds.release_blocks
    else:
        if opts.nodes != 1:
            raise ValueError("Reading(nodes=...) partitions shards by node for block-window reading; "
                             "give mode='blocks'")
        sampler = BucketBatchSampler(np.asarray(lengths, dtype=np.int64), max_frames, quadratic=quadratic,
                                     max_items=max_items, seed=seed, shuffle=shuffle, rank=rank,
                                     world_size=world_size)
    mix = None
    if mixed:
        # The sampler plans positions (of the subset, when one is given): weights need each position's corpus
        # and hours, and count only what the sampler can plan (not empty, fits the budget alone).
        rows = subset if subset is not None else np.arange(len(ds), dtype=np.int64)
        n = sampler.lengths
        mix = CorpusWeights(ds.corpus_of(rows), ds.durations()[rows], mix_weights, names,
                            usable=(n > 0) & sampler.budget.fits_alone(n), seed=seed)
        sampler.epoch_items = mix
    if num_workers == 0:
        # The copy kernel loads in the background while the first batches are copied with numpy (issue 10.2),
        # once the first batch is in hand: loading it meanwhile made that batch 2-3x slower (GIL).
        # Not with workers: they fork, and must not inherit numba's compiler lock mid-load.
        feats = ds.manifest["features"] if reader == "mmap" else {}
        warm_up_in_background([np.dtype(feats[f]["dtype"]).itemsize for f in (collate_features or features)
                               if f in feats and "dtype" in feats[f]], layout, after_release=True)
    else:
        wait_for_kernels()  # a load started by an earlier loader of this process must not be forked mid-way
    if read_ahead < 0:
        raise ValueError(f"read_ahead must be >= 0 batches, got {read_ahead!r}")
    view = _View(ds, subset, item_transform)
    # From s3 with workers, each worker fetches its own batch's rows at once (DataLoader keeps several batches
    # in flight); the main process' read-ahead would fetch into memory no worker sees.
    if mode == "rows" and read_ahead and hasattr(ds, "read_ahead") and not (any(remote) and num_workers > 0):
        sampler.read_ahead, sampler.on_upcoming = read_ahead, view.read_ahead
    # Batches alive at once with a prefetch thread (device alone runs one batch ahead): K queued + 1 being built
    # + 1 held by the step. (A CUDA copy frees its ring slot at once; device="cpu" hands over the slot itself.)
    depth = max(prefetch, 1) if prefetch or dev is not None else 0
    ring = depth + 2 if depth else 2
    pinned = dev is not None and dev.type == "cuda"
    collate = PadCollator(list(collate_features or features), pad_to_multiple=pad_to_multiple, ring_size=ring,
                          pin_memory=pinned, layout=layout)
    kw: dict[str, Any] = {}
    if num_workers > 0:
        kw = {"prefetch_factor": prefetch_factor, "persistent_workers": True}
    # Every iter() of a DataLoader draws a worker base seed; from its own generator it leaves torch's global RNG
    # alone, so a resumed run's dropout masks and crops continue exactly where the checkpoint left them.
    dl = torch.utils.data.DataLoader(view, batch_sampler=sampler,
                                     collate_fn=_Collate(collate, batch_transform, release_kernels=num_workers == 0),
                                     num_workers=num_workers,
                                     pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed), **kw)
    return Loader(ds, sampler, collate, dl, prefetch=prefetch, device=dev, mix=mix)
