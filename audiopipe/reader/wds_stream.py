"""Stream the WebDataset tars of a shard folder with the batching rules and samples of the mmap loader.

The whole epoch is planned from index.arrow and the manifest before a byte of payload is read: which tars
each (rank, DataLoader worker) stream reads, in which interleaved order its samples arrive, and how every pool
of arrivals is packed into padded-budget batches (plan.BatchBudget + plan.pack_greedy). Reading a tar then
only fills batches whose members are already known. Because every rank can plan every other rank's streams
from the same small files, all ranks stop at the same batch count without talking to each other; what that
drops is counted in `StreamPlan`.

    loader = make_wds_loader("./shards", ["mel"], max_frames=38400, num_workers=4)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...
            ckpt["stream"] = loader.state_dict(consumed_batches=step + 1)

Tars are opened with webdataset's `gopen`, so `tar_url="pipe:aws s3 cp s3://bucket/shards/{path} -"` or
`"https://host/shards/{path}"` stream from object storage; manifest.json and index.arrow are read locally.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import soundfile as sf
import torch
from webdataset.tariterators import base_plus_ext, group_by_keys, tar_file_expander

from audiopipe.collate.pad import PadCollator
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import ShardError
from audiopipe.sampler.plan import BatchBudget, pack_greedy, validate_lengths
from audiopipe.shard.checksum import sha256_file
from audiopipe.shard.writer import wds_key

_gopen = importlib.import_module("webdataset.gopen").gopen  # `webdataset.gopen` the attribute is the function

STATE_FORMAT = "audiopipe.WdsStream/1"
_TARS, _ASSIGN, _STREAM = 0, 1, 2  # random stream ids, so different purposes draw independently


# ---- planning: a pure function of (seed, epoch, index, world size, workers) --------------------------------


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


# ---- reading: follow the plan through the tars --------------------------------------------------------------


class _CheckedStream:
    """A read-only file object that counts (and optionally hashes) the bytes tarfile pulls through it."""

    BLOCK = 1 << 20  # tarfile asks for 10 KB at a time; one large read serves ~100 of those

    def __init__(self, raw: Any, hashing: bool):
        self.raw = raw
        self.bytes = 0
        self.sha = hashlib.sha256() if hashing else None
        self._buf = memoryview(b"")

    def _fill(self) -> bool:
        data = self.raw.read(self.BLOCK)
        if not data:
            return False
        self.bytes += len(data)
        if self.sha is not None:
            self.sha.update(data)
        self._buf = memoryview(data)
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [bytes(self._buf)]
            self._buf = memoryview(b"")
            while self._fill():
                parts.append(bytes(self._buf))
            self._buf = memoryview(b"")
            return b"".join(parts)
        if not self._buf and not self._fill():
            return b""
        out, self._buf = self._buf[:n], self._buf[n:]
        return bytes(out)

    def drain(self) -> None:
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self.raw.close()


class _TarReader:
    """The samples of one tar in row order, checked against the index; `take(row)` skips to that row."""

    def __init__(self, url: str, name: str, rows: int, expect_bytes: int, expect_sha: str | None, hashing: bool,
                 key_of: Callable[[int], str], wanted: Callable[[str], bool]):
        self.url, self.name, self.rows = url, name, rows
        self.expect_bytes, self.expect_sha = expect_bytes, expect_sha
        self.key_of = key_of
        self.next_row = 0
        try:
            self.stream = _CheckedStream(_gopen(url), hashing)
        except Exception as e:  # gopen raises whatever its scheme's opener raises
            raise ShardError(f"tar {name} ({url}) cannot be opened: {type(e).__name__}: {e}") from e
        files = tar_file_expander([{"url": url, "stream": self.stream}], select_files=wanted, eof_value=None)
        self.samples = group_by_keys(files)

    def take(self, row: int) -> dict[str, Any]:
        while True:
            if self.next_row >= self.rows:
                raise ShardError(f"tar {self.name} ({self.url}): row {row} asked for, but it has {self.rows} rows")
            try:
                sample = next(self.samples)
            except StopIteration:
                raise ShardError(f"tar {self.name} ({self.url}) ends after {self.next_row} of {self.rows} samples: "
                                 "truncated; run `audiopipe verify`") from None
            except Exception as e:  # tarfile.ReadError, EOFError, a pipe's exit status, ...
                raise ShardError(f"tar {self.name} ({self.url}) is unreadable after {self.next_row} samples: "
                                 f"{type(e).__name__}: {e}; run `audiopipe verify`") from e
            r = self.next_row
            self.next_row += 1
            want = self.key_of(r)
            if sample["__key__"] != want:
                raise ShardError(f"tar {self.name} ({self.url}): sample {r} is {sample['__key__']!r}, the index says "
                                 f"{want!r}: the tar does not belong to this index (corrupted or replaced)")
            if r == row:
                return sample

    def finish(self) -> None:
        """Read to the end and check size and hash: catches a truncated or altered tail."""
        try:
            for _ in self.samples:
                pass
            self.stream.drain()
        except Exception as e:
            raise ShardError(f"tar {self.name} ({self.url}) is unreadable at its end: {type(e).__name__}: {e}") from e
        finally:
            try:
                self.stream.close()
            except Exception as e:  # a pipe: command that failed reports it at close
                raise ShardError(f"tar {self.name} ({self.url}): {type(e).__name__}: {e}") from e
        if self.stream.bytes != self.expect_bytes:
            raise ShardError(f"tar {self.name} ({self.url}) is {self.stream.bytes} bytes, the manifest says "
                             f"{self.expect_bytes}: truncated or replaced")
        if self.stream.sha is not None and self.stream.sha.hexdigest() != self.expect_sha:
            raise ShardError(f"tar {self.name} ({self.url}) fails its sha256 check: corrupted; rebuild it")


def _passthrough(batch: Any) -> Any:
    return batch


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
    verify: "size" (local tars: size checked before opening; every tar: bytes counted to its end) or "sha256"
            (local tars hashed before first use; URLs hashed while streaming, checked at the tar's end).
    """

    def __init__(self, shards_dir: str | Path, features: Sequence[str], *, max_frames: int,
                 length_feature: str | None = None, lengths: np.ndarray | None = None,
                 subset: np.ndarray | None = None, quadratic: float = 0.0, max_items: int | None = None,
                 pool_size: int = 1000, interleave: int = 4, seed: int = 0, shuffle: bool = True,
                 num_workers: int = 0, rank: int | None = None, world_size: int | None = None,
                 expect: dict[str, str] | None = None, verify: str = "size", tar_url: str | None = None,
                 pad_to_multiple: int = 1, item_transform: Callable | None = None,
                 batch_transform: Callable | None = None, collate_features: Sequence[str] | None = None):
        super().__init__()
        if verify not in ("size", "sha256"):
            raise ValueError(f"verify must be 'size' or 'sha256', got {verify!r}")
        if pool_size < 1 or interleave < 1 or num_workers < 0:
            raise ValueError(f"need pool_size >= 1, interleave >= 1, num_workers >= 0; got {pool_size}, "
                             f"{interleave}, {num_workers}")
        if int(seed) < 0:
            raise ValueError(f"seed must be >= 0, got {seed!r}")
        # ShardDataset's constructor reads only manifest.json and index.arrow and refuses unknown features and
        # config-hash mismatches; reuse those checks (check_shards=False: the Arrow shards may not be here at all).
        meta = ShardDataset(shards_dir, features, expect=expect, check_shards=False)
        self.root = meta.root
        self.manifest = meta.manifest
        self.features = list(features)
        self.channels = meta.channels
        self.verify = verify
        if tar_url is not None:
            try:
                tar_url.format(path="wds/x.tar", name="x")
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"tar_url {tar_url!r} may use only {{path}} and {{name}} "
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
                raise ValueError(f"subset must be 1-D global indices in 0..{n - 1}")
        full = meta.lengths(length_feature or self.features[0]).astype(np.int64) if lengths is None else None
        if lengths is not None:
            lengths = validate_lengths(lengths)
            want = n if subset is None else subset.size
            if lengths.size != want:
                raise ValueError(f"lengths has {lengths.size} entries, expected {want} (one per "
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
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.collate = PadCollator(list(collate_features or features), pad_to_multiple=pad_to_multiple)
        self.item_transform, self.batch_transform = item_transform, batch_transform
        self.epoch = 0
        self._resume: int | None = None  # a pending resume: batches this rank consumed in this epoch
        self._start = 0  # where the pass in progress (or the last one) started
        self._plans: dict[tuple[int, int], StreamPlan] = {}
        self._fingerprint = hashlib.sha256(self.lengths.tobytes() + self.used.tobytes()).hexdigest()[:16]
        self._hashed: set[int] = set()  # local tars already sha256-checked in this process

    # ---- epochs, plan, length, checkpoint ------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next pass plays. Setting the epoch being resumed again keeps the resume."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._resume = None
            self._start = 0

    def plan(self, epoch: int | None = None) -> StreamPlan:
        """The epoch's plan for every rank and worker (computed from the index only; cached per epoch)."""
        epoch = self.epoch if epoch is None else int(epoch)
        key = (epoch, self.num_workers)
        if key not in self._plans:
            self._plans = {key: self._make_plan(epoch)}  # one epoch at a time: plans of old epochs are not needed
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
            raise ValueError(f"consumed_batches={consumed_batches} is outside this pass's 0..{total - base}")
        return {"format": STATE_FORMAT, "epoch": self.epoch, "consumed": done, "world_size": self.world_size,
                "num_workers": self.num_workers, "lengths_sha256": self._fingerprint, "config": self._config()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The next pass yields exactly this rank's batches that follow the saved position."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a WdsStream state (expected format {STATE_FORMAT!r})")
        if state["lengths_sha256"] != self._fingerprint:
            raise ValueError("the state was saved for other lengths or another subset (another corpus or index?)")
        if state["config"] != self._config():
            diff = {k: (v, self._config().get(k)) for k, v in state["config"].items() if self._config().get(k) != v}
            raise ValueError(f"the state was saved with another stream config (saved, now): {diff}")
        if (state["world_size"], state["num_workers"]) != (self.world_size, self.num_workers):
            raise ValueError(
                f"the state was saved with {state['world_size']} ranks x {state['num_workers']} workers, this run has "
                f"{self.world_size} x {self.num_workers}: a streaming plan cannot be re-dealt mid-epoch; resume with "
                "the same layout, start the next epoch, or use make_loader (mmap), which re-deals")
        self.epoch = int(state["epoch"])
        total = self.plan().batches_per_rank
        if not 0 <= int(state["consumed"]) <= total:
            raise ValueError(f"stream state says {state['consumed']} of {total} batches were consumed")
        self._resume = int(state["consumed"])

    def _config(self) -> dict[str, Any]:
        cfg = {"max_frames": self.budget.max_frames, "quadratic": self.budget.quadratic,
               "max_items": self.budget.max_items, "pool_size": self.pool_size, "interleave": self.interleave,
               "seed": self.seed, "shuffle": self.shuffle}
        return json.loads(json.dumps(cfg))

    def _rng(self, *keys: int) -> np.random.Generator | None:
        return np.random.default_rng([self.seed, *keys]) if self.shuffle else None

    def _make_plan(self, epoch: int) -> StreamPlan:
        W = max(self.num_workers, 1)
        S = self.world_size * W
        n = self.lengths.size
        fits = self.budget.fits_alone(self.lengths)
        empty = self.used & (self.lengths == 0)
        too_long = self.used & ~fits & (self.lengths > 0)
        keep = self.used & fits & (self.lengths > 0)
        n_tars = len(self.manifest["shards"])
        split = "tar" if n_tars >= S else "sample"
        rng_tars = self._rng(_TARS, epoch)
        tar_order = rng_tars.permutation(n_tars) if rng_tars is not None else np.arange(n_tars)
        kept_rows = [np.flatnonzero(keep[self._offset[t]:self._offset[t + 1]]) + self._offset[t] for t in range(n_tars)]
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

    # ---- iteration ---------------------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # The position is read now, not at the first next(): the caller clears a resume after starting a pass.
        info = torch.utils.data.get_worker_info()
        worker = 0 if info is None else info.id
        if info is None and self.num_workers > 0:
            raise ValueError(f"WdsStream was planned for num_workers={self.num_workers}; iterate it through a "
                             "DataLoader with that many workers (make_wds_loader), not directly")
        if info is not None and info.num_workers != self.num_workers:
            raise ValueError(f"WdsStream was planned for num_workers={self.num_workers}, but the DataLoader has "
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
        readers: dict[int, _TarReader] = {}
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
                    items[gi] = self._decode(sample, gi, reader)
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

    def _open(self, t: int) -> _TarReader:
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
            if self.verify == "sha256" and t not in self._hashed:
                if sha256_file(p) != tar["sha256"]:
                    raise ShardError(f"tar {name} ({p}) fails its sha256 check: corrupted; rebuild it")
                self._hashed.add(t)
        hashing = self.verify == "sha256" and not local
        base = int(self._offset[t])
        exts = {"json"} | {f"{f}.npy" for f in self.features} | ({"flac"} if "pcm" in self.features else set())
        return _TarReader(url, name, int(entry["rows"]), int(tar["bytes"]), tar.get("sha256"), hashing,
                          lambda r: wds_key(self._ids[base + r].as_py()), lambda fname: base_plus_ext(fname)[1] in exts)

    def _decode(self, sample: dict[str, Any], gi: int, reader: _TarReader) -> dict[str, Any]:
        where = f"tar {reader.name} ({reader.url}) sample {sample['__key__']!r}"
        try:
            meta = json.loads(sample["json"])
            item: dict[str, Any] = {"id": meta["id"], "speaker": meta["speaker"], "text": meta["text"],
                                    "duration": meta["duration"], "index": gi}
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            raise ShardError(f"{where}: unreadable json ({type(e).__name__}: {e})") from e
        for f in self.features:
            try:
                if f == "pcm" and "flac" in sample:
                    arr = sf.read(io.BytesIO(sample["flac"]), dtype="int16")[0]
                else:
                    arr = np.load(io.BytesIO(sample[f"{f}.npy"]), allow_pickle=False)
            except KeyError:
                raise ShardError(f"{where} has no member for feature {f!r}") from None
            except Exception as e:  # np.load / soundfile on corrupted bytes: ValueError, RuntimeError, EOFError
                raise ShardError(f"{where}: feature {f} is undecodable ({type(e).__name__}: {e})") from e
            ch = self.channels.get(f, 0)
            frames = meta.get(f"{f}_frames")
            shape_ok = arr.ndim == (2 if ch else 1) and (not ch or arr.shape[0] == ch)
            if not shape_ok or arr.shape[-1] != frames:
                raise ShardError(f"{where}: feature {f} has shape {list(arr.shape)}, expected "
                                 f"{[ch, frames] if ch else [frames]} (corrupted)")
            item[f] = arr
        return item


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise torch.distributed when initialized; otherwise a single process."""
    if (rank is None or world_size is None) and torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank() if rank is None else rank
        world_size = torch.distributed.get_world_size() if world_size is None else world_size
    rank, world_size = int(rank or 0), int(world_size or 1)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


@dataclass
class WdsLoader:
    """A DataLoader over a WdsStream, with the Loader interface of make_loader."""

    stream: WdsStream
    dataloader: torch.utils.data.DataLoader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = self.stream._resume or 0
        it = iter(self.dataloader)  # workers start here and take the resume position with them
        self.stream._start, self.stream._resume = start, None
        return it

    def __len__(self) -> int:
        return len(self.stream)

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def plan(self) -> StreamPlan:
        return self.stream.plan()

    def state_dict(self, consumed_batches: int) -> dict[str, Any]:
        return self.stream.state_dict(consumed_batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)

    def shm_bytes_per_worker(self) -> int:
        """Upper bound of shared memory one worker holds: prefetch_factor padded batches at the frame budget."""
        if self.dataloader.num_workers == 0:
            return 0
        return int(self.dataloader.prefetch_factor * self.stream.budget.max_frames * _bytes_per_frame(self.stream))

    def pool_bytes_per_worker(self) -> int:
        """About what one stream holds decoded while a pool fills: pool_size items of the corpus' mean length."""
        mean = float(self.stream.lengths[self.stream.used].mean()) if self.stream.used.any() else 0.0
        return int(self.stream.pool_size * mean * _bytes_per_frame(self.stream, mask=False))


def _bytes_per_frame(stream: WdsStream, mask: bool = True) -> int:
    total = 0
    for f in stream.collate.features:
        ch = max(1, stream.channels.get(f, 0))
        spec = stream.manifest["features"].get(f)
        itemsize = np.dtype(spec["dtype"]).itemsize if spec else np.dtype("int64").itemsize
        total += ch * itemsize + (1 if mask else 0)
    return total


def make_wds_loader(shards_dir: str | Path, features: Sequence[str], *, max_frames: int, num_workers: int = 0,
                    prefetch_factor: int = 2, pin_memory: bool = False, **stream_kw: Any) -> WdsLoader:
    """WdsStream (see its parameters) in a DataLoader with `num_workers` workers; same batches as the plan.

    Workers are not persistent: each pass forks them afresh so that set_epoch() and a resume reach them.
    """
    stream = WdsStream(shards_dir, features, max_frames=max_frames, num_workers=num_workers, **stream_kw)
    kw: dict[str, Any] = {"prefetch_factor": prefetch_factor} if num_workers > 0 else {}
    dl = torch.utils.data.DataLoader(stream, batch_size=None, collate_fn=_passthrough, num_workers=num_workers,
                                     pin_memory=pin_memory, **kw)
    return WdsLoader(stream, dl)
