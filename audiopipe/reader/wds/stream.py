"""The streaming dataset: padded batches read from the WebDataset tars, following the epoch's plan.

WdsStream checks the folder (manifest, index, tars), plans the epoch with plan.StreamPlanner, and has each
DataLoader worker play its stream: open the tars the plan names (tar.TarReader), decode only the samples of
the batches it yields, and pad them with PadCollator, as make_loader does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from audiopipe.collate.pad import PadCollator
from audiopipe.errors import InvalidValue
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import ShardError
from audiopipe.reader.integrity import checksum_fails, verify_mode
from audiopipe.reader.wds.plan import StreamBatches, StreamPlan, StreamPlanner, round_robin_taken
from audiopipe.reader.wds.tar import TarReader, decode_sample
from audiopipe.sampler.dist import rank_and_world
from audiopipe.sampler.plan import BatchBudget, validate_lengths
from audiopipe.shard.checksum import checksum_of
from audiopipe.shard.writer import wds_key

STATE_FORMAT = "audiopipe.WdsStream/1"


class WdsStream(torch.utils.data.IterableDataset):
    """Padded batches streamed from the WebDataset tars; each batch is PadCollator's dict, as in make_loader.

    Samples are the dicts ShardDataset gives ({"id", "speaker", "text", "duration", "index", <feature>: array}),
    decoded with np.load(allow_pickle=False) (features) and soundfile (flac pcm, int16).

    Budget and rules as BucketBatchSampler: cost(n, m) = n*m + quadratic*n*m**2 <= max_frames, n <= max_items;
    items that do not fit alone, and empty items, are dropped and counted. Batching: `pool_size` arrivals
    (from `interleave` tars read at once) are sorted by length and packed greedily; smaller pools use less
    memory, larger ones pad less. Every rank yields `len(self)` batches; the plan says what that drops.

    num_workers: the DataLoader workers of EVERY rank (streams are planned for all of them); each worker and
    rank reads its own tars when there are at least world_size * max(num_workers, 1) of them, otherwise every
    stream reads every tar and keeps its share of the samples (correct, but reads the bytes once per stream).
    tar_url: a format string with {path} (the manifest's relative tar path) and/or {name}; default: local files.
    verify: "size" (local tars: size checked before opening; every tar: bytes counted to its end) or "checksum"
            (the manifest's xxh3-128, or sha256 for older shards: local tars hashed before first use, URLs
            hashed while streaming and checked at the tar's end; "sha256", its old name, is accepted).
    """

    def __init__(self, shards: str | Path, features: Sequence[str], *, max_frames: int,
                 length_feature: str | None = None, lengths: np.ndarray | None = None,
                 subset: np.ndarray | None = None, quadratic: float = 0.0, max_items: int | None = None,
                 pool_size: int = 1000, interleave: int = 4, seed: int = 0, shuffle: bool = True,
                 num_workers: int = 0, rank: int | None = None, world_size: int | None = None,
                 expect: dict[str, str] | None = None, verify: str = "size", tar_url: str | None = None,
                 pad_to_multiple: int = 1, item_transform: Callable | None = None,
                 batch_transform: Callable | None = None, collate_features: Sequence[str] | None = None):
        super().__init__()
        verify = verify_mode(verify)
        if pool_size < 1 or interleave < 1 or num_workers < 0:
            raise InvalidValue(f"need pool_size >= 1, interleave >= 1, num_workers >= 0; got {pool_size}, "
                               f"{interleave}, {num_workers}")
        if int(seed) < 0:
            raise InvalidValue(f"seed must be >= 0, got {seed!r}")
        # ShardDataset's constructor reads only manifest.json and index.arrow and refuses unknown features and
        # config-hash mismatches; reuse those checks (check_shards=False: the Arrow shards may not be here at all).
        meta = ShardDataset(shards, features, expect=expect, check_shards=False)
        self.root = meta.root
        self.manifest = meta.manifest
        self.features = list(features)
        self.channels = meta.channels
        self.verify = verify
        if tar_url is not None:
            try:
                tar_url.format(path="wds/x.tar", name="x")
            except (KeyError, IndexError, ValueError) as e:
                raise InvalidValue(f"tar_url {tar_url!r} may use only {{path}} and {{name}} "
                                   f"({type(e).__name__}: {e})") from None
        self.tar_url = tar_url
        missing = [s["name"] for s in self.manifest["shards"] if "tar" not in s]
        if missing:
            raise ShardError(f"{self.root} has no WebDataset tars for {len(missing)} shards (e.g. {missing[0]}): "
                             "it was written with --no-tar; use make_loader (mmap) or reshard")
        index = meta.index
        self._ids = index.table.column("id").combine_chunks()
        shard_of = index.shard.astype(np.int64)
        row_of = index.row.astype(np.int64)
        rows = np.array([s["rows"] for s in self.manifest["shards"]], dtype=np.int64)
        self._offset = np.concatenate([[0], np.cumsum(rows)])
        # The plan addresses samples as (tar, row) and a tar yields rows in order: the index must be the
        # concatenation of the shards in manifest order, as `audiopipe shard` writes it.
        if shard_of.size != rows.sum() or (shard_of.size and (
                (np.diff(shard_of) < 0).any() or (row_of != np.arange(shard_of.size) - self._offset[shard_of]).any())):
            raise ShardError(f"{self.root}/index.arrow does not list the manifest's shards row by row "
                             "(stale or foreign index); rebuild the folder")
        self._shard_of = shard_of
        n = shard_of.size
        if subset is not None:
            subset = np.asarray(subset, dtype=np.int64)
            if subset.ndim != 1 or (subset.size and (subset.min() < 0 or subset.max() >= n)):
                raise InvalidValue(f"subset must be 1-D global indices in 0..{n - 1}")
        full = meta.lengths(length_feature or self.features[0]).astype(np.int64) if lengths is None else None
        if lengths is not None:
            lengths = validate_lengths(lengths)
            want = n if subset is None else subset.size
            if lengths.size != want:
                raise InvalidValue(f"lengths has {lengths.size} entries, expected {want} (one per "
                                   f"{'subset item' if subset is not None else 'utterance'})")
            if subset is not None:
                full = np.zeros(n, dtype=np.int64)
                full[subset] = lengths
            else:
                full = lengths
        self.lengths = full  # budget frames per global index
        self.used = np.ones(n, dtype=bool) if subset is None else np.isin(np.arange(n), subset)
        self.budget = BatchBudget(int(max_frames), float(quadratic), max_items)
        self.pool_size, self.interleave = int(pool_size), int(interleave)
        self.seed, self.shuffle = int(seed), bool(shuffle)
        self.num_workers = int(num_workers)
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.collate = PadCollator(list(collate_features or features), pad_to_multiple=pad_to_multiple)
        self.item_transform, self.batch_transform = item_transform, batch_transform
        self.epoch = 0
        self._resume: int | None = None  # a pending resume: batches this rank consumed in this epoch
        self._start = 0  # where the pass in progress (or the last one) started
        self._plans: dict[tuple[int, int], StreamPlan] = {}
        self._fingerprint = hashlib.sha256(self.lengths.tobytes() + self.used.tobytes()).hexdigest()[:16]
        self._hashed: set[int] = set()  # local tars already checksummed in this process
        self._planner = StreamPlanner(self.lengths, self.used, self._offset, self.budget, pool_size=self.pool_size,
                                      interleave=self.interleave, seed=self.seed, shuffle=self.shuffle,
                                      world_size=self.world_size, num_workers=self.num_workers)

    # ---- epochs, plan, length, checkpoint ------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next pass plays. Setting the epoch being resumed again keeps the resume."""
        if epoch < 0:
            raise InvalidValue(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._resume = None
            self._start = 0

    def plan(self, epoch: int | None = None) -> StreamPlan:
        """The epoch's plan for every rank and worker (computed from the index only; cached per epoch)."""
        epoch = self.epoch if epoch is None else int(epoch)
        key = (epoch, self.num_workers)
        if key not in self._plans:
            self._plans = {key: self._planner.plan(epoch)}  # one epoch at a time: plans of old epochs are not needed
        return self._plans[key]

    def _offset_of_pass(self) -> int:
        return self._resume if self._resume is not None else self._start

    def __len__(self) -> int:
        """Batches this rank yields in the next pass, or in the pass in progress (the rest, when resumed)."""
        return self.plan().batches_per_rank - self._offset_of_pass()

    def state_dict(self, consumed_batches: int) -> dict[str, Any]:
        """Position in the epoch: pass the batches this rank has trained on in this pass (enumerate index + 1)."""
        total = self.plan().batches_per_rank
        base = self._offset_of_pass()
        done = base + int(consumed_batches)
        if not base <= done <= total:
            raise InvalidValue(f"consumed_batches={consumed_batches} is outside this pass's 0..{total - base}")
        return {"format": STATE_FORMAT, "epoch": self.epoch, "consumed": done, "world_size": self.world_size,
                "num_workers": self.num_workers, "lengths_sha256": self._fingerprint, "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next pass yields exactly this rank's batches that follow the saved position."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise InvalidValue(f"not a WdsStream state (expected format {STATE_FORMAT!r})")
        if state["lengths_sha256"] != self._fingerprint:
            raise InvalidValue("the state was saved for other lengths or another subset (another corpus or index?)")
        if state["config"] != self._config():
            diff = {k: (v, self._config().get(k)) for k, v in state["config"].items() if self._config().get(k) != v}
            raise InvalidValue(f"the state was saved with another stream config (saved, now): {diff}")
        if (state["world_size"], state["num_workers"]) != (self.world_size, self.num_workers):
            raise InvalidValue(
                f"the state was saved with {state['world_size']} ranks x {state['num_workers']} workers, this run has "
                f"{self.world_size} x {self.num_workers}: a streaming plan cannot be re-dealt mid-epoch; resume with "
                "the same layout, start the next epoch, or use make_loader (mmap), which re-deals")
        self.epoch = int(state["epoch"])
        total = self.plan().batches_per_rank
        if not 0 <= int(state["consumed"]) <= total:
            raise InvalidValue(f"stream state says {state['consumed']} of {total} batches were consumed")
        self._resume = int(state["consumed"])

    def _config(self) -> dict[str, Any]:
        cfg = {"max_frames": self.budget.max_frames, "quadratic": self.budget.quadratic,
               "max_items": self.budget.max_items, "pool_size": self.pool_size, "interleave": self.interleave,
               "seed": self.seed, "shuffle": self.shuffle}
        return json.loads(json.dumps(cfg))

    # ---- iteration ---------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # The position is read now, not at the first next(): the caller clears a resume after starting a pass.
        info = torch.utils.data.get_worker_info()
        worker = 0 if info is None else info.id
        if info is None and self.num_workers > 0:
            raise InvalidValue(f"WdsStream was planned for num_workers={self.num_workers}; iterate it through a "
                               "DataLoader with that many workers (make_wds_loader), not directly")
        if info is not None and info.num_workers != self.num_workers:
            raise InvalidValue(f"WdsStream was planned for num_workers={self.num_workers}, but the DataLoader has "
                               f"{info.num_workers}; pass the same number to both (make_wds_loader does)")
        plan = self.plan()
        quotas = plan.quotas[self.rank]
        done = self._resume or 0  # only the first pass after load_state_dict() resumes
        if info is None:  # the main process plays the pass: it is now in progress
            self._start, self._resume = done, None
        taken = round_robin_taken(quotas, done)
        # A new DataLoader asks worker 0 first; rotate streams over workers so that worker 0 plays the stream
        # whose turn it was, and the resumed pass continues the interrupted order batch for batch.
        turn = round_robin_taken(quotas, done + 1) - taken
        first = int(np.argmax(turn)) if turn.any() else 0
        s = (first + worker) % len(quotas)
        return self._play(plan.stream(self.rank, s), int(taken[s]), int(quotas[s]))

    def _play(self, st: StreamBatches, start: int, stop: int) -> Iterator[dict[str, Any]]:
        if start >= stop:
            return
        wanted_batches = st.batches[start:stop]
        needed = np.concatenate(wanted_batches)
        # Read only as far as the last batch to yield needs; decode only the samples of yielded batches.
        horizon = int(st.ready[stop - 1])
        arrivals = st.arrivals[:horizon]
        need = np.isin(arrivals, needed)
        tar_of = self._shard_of[arrivals]
        last_use = {int(t): i for i, t in enumerate(tar_of) if need[i]}
        readers: dict[int, TarReader] = {}
        items: dict[int, dict[str, Any]] = {}
        b = start
        for i, gi in enumerate(arrivals.tolist()):
            t = int(tar_of[i])
            if t in last_use and i <= last_use[t]:
                if t not in readers:
                    readers[t] = self._open(t)
                reader = readers[t]
                sample = reader.take(gi - int(self._offset[t]))
                if need[i]:
                    where = f"tar {reader.name} ({reader.url}) sample {sample['__key__']!r}"
                    items[gi] = decode_sample(sample, gi, self.features, self.channels, where)
                if i == last_use[t]:
                    readers.pop(t).finish()
            while b < stop and st.ready[b] == i + 1:
                yield self._collate([items.pop(g) for g in st.batches[b].tolist()])
                b += 1
        for reader in readers.values():  # not reached when the plan is consistent; close pipes anyway
            reader.stream.close()

    def _collate(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        if self.item_transform is not None:
            items = [self.item_transform(x) for x in items]
        batch = self.collate(items)
        return self.batch_transform(batch) if self.batch_transform else batch

    def _open(self, t: int) -> TarReader:
        entry = self.manifest["shards"][t]
        tar = entry["tar"]
        name = entry["name"]
        local = self.tar_url is None
        url = str(self.root / tar["path"]) if local else self.tar_url.format(path=tar["path"], name=name)
        if local:
            p = Path(url)
            if not p.exists():
                raise ShardError(f"tar {name} is missing: {p}")
            size = p.stat().st_size
            if size != tar["bytes"]:
                raise ShardError(f"tar {name} ({p}) is {size} bytes, manifest says {tar['bytes']}: truncated or "
                                 "replaced; run `audiopipe verify`")
            if self.verify == "checksum" and t not in self._hashed:
                failed = checksum_fails(p, tar)
                if failed:
                    raise ShardError(f"tar {name} ({p}) {failed}: corrupted; rebuild it")
                self._hashed.add(t)
        expect = checksum_of(tar) if self.verify == "checksum" and not local else None
        base = int(self._offset[t])
        exts = {"json"} | {f"{f}.npy" for f in self.features} | ({"flac"} if "pcm" in self.features else set())
        return TarReader(url, name, int(entry["rows"]), int(tar["bytes"]), expect,
                          lambda r: wds_key(self._ids[base + r].as_py()), exts.__contains__)

