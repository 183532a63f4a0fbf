"""The loaders `audiopipe bench-loader` compares, each built the way its project would reasonably run it.

Every loader yields dicts with `<feature>` [B, C, T], `<feature>_lengths` and `duration` (a list of seconds),
and runs in the same DataLoader (same worker count) with PadCollator, so the comparison is about where the
data comes from and how batches are formed, not about collate code:

  mmap         audiopipe: make_loader (Arrow IPC mmap, zero-copy views, BucketBatchSampler)
  mmap_ring1   the same with prefetch=0 and PadCollator(ring_size=1): one batch buffer, which stays in the CPU cache
  mmap_btc     the same with make_loader(layout="BTC"): time-major [B, T, C] batches, transposed while copied
  wds          audiopipe: make_wds_loader (WebDataset tars streamed, batches planned from the index)
  npy_per_utt  one .npy file per utterance, np.load per item (Amphion NS2's layout), BucketBatchSampler
  npy_amphion  the same files with Amphion's own NS2Collator rule (pad_sequence of transposed tensors into a
               fresh zero-filled batch, float masks from torch.ones per item): Amphion's loader as it runs
  on_the_fly   decode the source audio, resample to the feature's rate, torch mel per item (F5-TTS's
               default CustomDataset), BucketBatchSampler
  random       mmap data, items shuffled and packed to the same PADDED budget (no length grouping)
  f5_sort      mmap data, F5-TTS's DynamicBatchSampler rule: sort by length once, pack while the SUM of
               frames fits, shuffle batch order per epoch
  lhotse_shar  lhotse Shar tars (numpy arrays) + DynamicBucketingSampler (30 buckets) via IterableDatasetWrapper,
               lhotse's own [T, F] layout and collate_matrices (a [B, F, T] view is handed on)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import soundfile as sf
import soxr
import torch

from audiopipe.collate.pad import PadCollator
from audiopipe.errors import InvalidValue, NotFound
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.bench.files_dataset import FilesDataset, export_per_utterance
from audiopipe.reader.loader import make_loader
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.plan import BatchBudget, pack_greedy

LOADERS = ("mmap", "mmap_ring1", "mmap_btc", "wds", "npy_per_utt", "npy_amphion", "on_the_fly", "random", "f5_sort",
           "lhotse_shar")

DESCRIPTIONS = {
    "mmap": "audiopipe make_loader: Arrow IPC mmap, zero-copy views, global bucketed sampler",
    "mmap_ring1": "make_loader(prefetch=0) with a 1-slot collate ring (batch k is overwritten by batch k+1)",
    "mmap_btc": "make_loader(layout='BTC'): [B, T, C] batches, each [C, T] row transposed while copied",
    "wds": "audiopipe make_wds_loader: WebDataset tars streamed, np.load per sample, batches planned from index",
    "npy_per_utt": "one .npy per utterance (Amphion NS2 layout, audiopipe FilesDataset), np.load per item, "
                   "same sampler",
    "npy_amphion": "one .npy per utterance with Amphion's NS2Collator (pad_sequence, fresh zeroed batch + masks)",
    "on_the_fly": "F5-TTS default: soundfile decode + soxr resample to 24 kHz + torch float32 mel per item, "
                  "same sampler",
    "random": "mmap data, random batches packed to the same padded budget",
    "f5_sort": "mmap data, F5-TTS DynamicBatchSampler: sort once, pack by SUM of frames, shuffle batch order",
    "lhotse_shar": "lhotse Shar (numpy arrays in tars) + DynamicBucketingSampler, IterableDatasetWrapper",
}


@dataclass
class LoaderSpec:
    """What a child process needs to build one loader."""

    name: str
    shards: str
    feature: str
    max_frames: int
    workers: int
    seed: int
    cache: str  # folder for the npy-per-utterance copy and the lhotse Shar export
    corpus: str | None  # audio root for on_the_fly


# ---- shared pieces ------------------------------------------------------------------------------------------


class _EpochBatches:
    """A batch sampler from a function epoch -> list of index arrays (random and f5_sort plans)."""

    def __init__(self, plan: Callable[[int], list[np.ndarray]]):
        self.plan, self.epoch = plan, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        return (b.tolist() for b in self.plan(self.epoch))

    def __len__(self) -> int:
        return len(self.plan(self.epoch))


def random_plan(lengths: np.ndarray, max_frames: int, seed: int) -> Callable[[int], list[np.ndarray]]:
    budget = BatchBudget(max_frames)
    keep = np.flatnonzero(budget.fits_alone(lengths) & (lengths > 0))
    return lambda epoch: pack_greedy(keep[np.random.default_rng([seed, epoch]).permutation(keep.size)], lengths, budget)


def f5_sort_plan(lengths: np.ndarray, max_frames: int, seed: int) -> Callable[[int], list[np.ndarray]]:
    """F5-TTS DynamicBatchSampler: sort once, pack while the sum of frames fits; only the batch order changes."""
    batches: list[np.ndarray] = []
    current: list[int] = []
    frames = 0
    for i in np.argsort(lengths, kind="stable").tolist():
        n = int(lengths[i])
        if frames + n <= max_frames:
            current.append(i)
            frames += n
            continue
        if current:
            batches.append(np.asarray(current))
        current, frames = ([i], n) if n <= max_frames else ([], 0)
    if current:
        batches.append(np.asarray(current))
    return lambda epoch: [batches[j] for j in np.random.default_rng([seed, epoch]).permutation(len(batches))]


class _Wrapped:
    """DataLoader + a set_epoch target; iterating yields padded batches."""

    def __init__(self, dataloader: torch.utils.data.DataLoader, sampler: Any):
        self.dataloader, self.sampler = dataloader, sampler

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dataloader)


def _dataloader(dataset: Any, batch_sampler: Any, collate: Callable, workers: int) -> torch.utils.data.DataLoader:
    kw: dict[str, Any] = {"prefetch_factor": 2, "persistent_workers": True} if workers else {}
    return torch.utils.data.DataLoader(dataset, batch_sampler=batch_sampler, collate_fn=collate,
                                       num_workers=workers, **kw)


# ---- baseline 3: one .npy per utterance (Amphion) ----------------------------------------------------------


def npy_cache(shards: str, feature: str, cache: str) -> Path:
    """The per-utterance export (audiopipe/bench/files_dataset.py, the one exporter of that layout), written
    once under <cache>/npy: <feature>/<row>.npy plus metadata.json, as Amphion keeps a file per utterance."""
    return export_per_utterance(shards, [feature], Path(cache) / "npy")


def npy_dataset(shards: str, feature: str, cache: str) -> FilesDataset:
    """Amphion's NS2Dataset pattern: a metadata list in memory, np.load of one file per feature per item, on
    every path (FilesDataset never reads a shard's rows)."""
    return FilesDataset(shards, [feature], cache=npy_cache(shards, feature, cache))


class AmphionPad:
    """Amphion NS2Collator's rule for a [C, T] feature: each item as a [T, C] tensor (torch.from_numpy(x).T),
    torch's pad_sequence into a freshly allocated, zero-filled [B, T_max, C] batch handed on as its [B, C, T_max]
    view, and a float mask padded the same way from torch.ones per item. Lengths and metadata as PadCollator."""

    def __init__(self, feature: str):
        self.feature = feature

    def __call__(self, items: Sequence[dict[str, Any]]) -> dict[str, Any]:
        from torch.nn.utils.rnn import pad_sequence

        f = self.feature
        arrays = [item[f] for item in items]
        out = {f: pad_sequence([torch.from_numpy(a).transpose(0, 1) for a in arrays], batch_first=True,
                               padding_value=0).transpose(1, 2),
               f"{f}_mask": pad_sequence([torch.ones(max(a.shape[1], 1)) for a in arrays], batch_first=True,
                                         padding_value=0),
               f"{f}_lengths": torch.tensor([a.shape[1] for a in arrays])}
        for k in items[0]:
            if k != f:
                out[k] = [item[k] for item in items]
        return out


# ---- baseline 4: decode + resample + mel on the fly (F5-TTS) ------------------------------------------------


class OnTheFlyMel(torch.utils.data.Dataset):
    """F5-TTS CustomDataset without preprocessed mels: decode, mono, resample, float32 torch mel, per item.

    Reasonable, not a strawman: soxr resampling (faster than building a torchaudio Resample per item, as F5
    does), the mel in float32 torch (F5's MelSpec), the same mel parameters the shards were made with.
    """

    def __init__(self, shards: str, feature: str, corpus: str):
        ds = ShardDataset(shards, [feature])
        spec = ds.spec(feature)
        if spec["kind"] not in ("vocos_mel", "slaney_mel"):
            raise InvalidValue(f"on_the_fly computes mels; feature {feature!r} is {spec['kind']}")
        self.params = dict(spec["params"])
        self.rate = int(spec["sample_rate"])
        self.feature = feature
        rows = []
        for entry in ds.manifest["shards"]:  # manifest order is the index's global order
            with pa.memory_map(str(ds.root / entry["arrow"]["path"])) as src:
                t = pa.ipc.open_file(src).read_all().select(["id", "speaker", "text", "duration", "source"])
            rows += t.to_pylist()
        self.rows = rows
        self.paths = [os.path.join(corpus, r["source"]) for r in rows]
        self._lengths = ds.lengths(feature).astype(np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def __getitem__(self, i: int) -> dict[str, Any]:
        from audiopipe.features.mel import mel_spectrogram

        wav, sr = sf.read(self.paths[i], dtype="float32", always_2d=True)
        wav = wav.mean(axis=1) if wav.shape[1] > 1 else wav[:, 0]
        if sr != self.rate:
            wav = soxr.resample(wav, sr, self.rate, quality="HQ")
        with torch.inference_mode():
            mel = mel_spectrogram(torch.from_numpy(np.ascontiguousarray(wav))[None], **self.params)[0].numpy()
        r = self.rows[i]
        return {"id": r["id"], "speaker": r["speaker"], "text": r["text"], "duration": r["duration"], "index": i,
                self.feature: mel}


# ---- lhotse Shar -------------------------------------------------------------------------------------------


def shar_export(shards: str, feature: str, cache: str, shard_size: int = 200) -> Path:
    """Export the shards' feature to lhotse Shar once: cuts.N.jsonl.gz + <feature>.N.tar (numpy arrays)."""
    import warnings

    from lhotse import CutSet, MonoCut

    root = Path(cache) / "shar"
    stamp = Path(cache) / "shar.done.json"  # beside, not inside: from_shar treats every file there as a field
    key = json.loads((Path(shards) / "manifest.json").read_text())["index"]["sha256"] + feature + "/TxC/v3"
    if stamp.exists() and json.loads(stamp.read_text()).get("key") == key:
        return root
    root.mkdir(parents=True, exist_ok=True)
    for old in root.iterdir():
        old.unlink()
    ds = ShardDataset(shards, [feature])
    spec = ds.spec(feature)
    shift = spec["hop_length"] / spec["sample_rate"]

    def cuts() -> Iterator[MonoCut]:
        for i in range(len(ds)):
            item = ds[i]
            # lhotse's array readers slice time on axis 0: store [T, C] as lhotse features are.
            arr = np.ascontiguousarray(item[feature].T)
            # The cut's duration is its frame count in seconds, so lhotse's max_duration is the same budget.
            cut = MonoCut(id=f"{i}", start=0.0, duration=arr.shape[0] * shift, channel=0)
            cut.custom = {"speaker": item["speaker"], "text": item["text"], "seconds": item["duration"]}
            yield cut.attach_tensor(feature, arr, frame_shift=shift, temporal_dim=0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        CutSet.from_cuts(cuts()).to_shar(root, fields={feature: "numpy"}, shard_size=shard_size)
    stamp.write_text(json.dumps({"key": key, "frame_shift": shift, "cuts": len(ds)}))
    return root


class LhotseMelDataset(torch.utils.data.Dataset):
    """lhotse's dataset contract: __getitem__ receives a CutSet (one batch) and returns the collated batch."""

    def __init__(self, feature: str):
        self.feature = feature

    def __getitem__(self, cuts: Any) -> dict[str, Any]:
        from lhotse.dataset.collation import collate_matrices

        arrays = [c.load_custom(self.feature) for c in cuts]
        x = collate_matrices(arrays)  # [B, T, C], zero padded
        return {self.feature: x.transpose(1, 2), f"{self.feature}_lengths": torch.tensor([a.shape[0] for a in arrays]),
                "duration": [c.custom["seconds"] for c in cuts], "id": [c.id for c in cuts]}


class _LhotseLoader:
    def __init__(self, spec: LoaderSpec):
        import warnings

        from lhotse import CutSet
        from lhotse.dataset import DynamicBucketingSampler
        from lhotse.dataset.iterable_dataset import IterableDatasetWrapper

        root = shar_export(spec.shards, spec.feature, spec.cache)
        shift = json.loads((Path(spec.cache) / "shar.done.json").read_text())["frame_shift"]
        warnings.filterwarnings("ignore", module="lhotse")
        # lhotse's recipe for workers: each worker reads its own subset of the (shuffled) Shar shards.
        cuts = CutSet.from_shar(in_dir=root, shuffle_shards=True, split_for_dataloading=spec.workers > 0,
                                seed=spec.seed)
        # max_duration counts the longest cut x number of cuts: the padded-frame budget in seconds.
        n_cuts = json.loads((Path(spec.cache) / "shar.done.json").read_text())["cuts"]
        # 30 buckets (lhotse's usual setting); fewer on a tiny corpus, as lhotse needs a cut per bucket.
        self.sampler = DynamicBucketingSampler(cuts, max_duration=spec.max_frames * shift,
                                               num_buckets=max(2, min(30, n_cuts // 4)), shuffle=True,
                                               seed=spec.seed, buffer_size=10000)
        dataset = LhotseMelDataset(spec.feature)
        if spec.workers > 0:
            self.dataloader = torch.utils.data.DataLoader(IterableDatasetWrapper(dataset, self.sampler),
                                                          batch_size=None, num_workers=spec.workers, prefetch_factor=2)
        else:
            self.dataloader = torch.utils.data.DataLoader(dataset, sampler=self.sampler, batch_size=None)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dataloader)


# ---- build one ----------------------------------------------------------------------------------------------


def build(spec: LoaderSpec) -> Any:
    """A loader with set_epoch() whose iteration yields PadCollator batches (with a `duration` list)."""
    f = spec.feature
    if spec.name in ("mmap", "mmap_ring1", "mmap_btc"):
        # mmap_ring1 has nothing built ahead (prefetch=0): a batch ahead would sit in the one slot being reused.
        ahead = {"prefetch": 0} if spec.name == "mmap_ring1" else {}
        # passes=1: the same one-pass plan as the other loaders' BucketBatchSampler, whatever the corpus size.
        loader = make_loader(spec.shards, [f], max_frames=spec.max_frames, num_workers=spec.workers, seed=spec.seed,
                             layout="BTC" if spec.name == "mmap_btc" else "BCT", passes=1, **ahead)
        if spec.name == "mmap_ring1":
            loader.collate.ring_size = 1  # before the first batch: the ring is created on first use
        return loader
    if spec.name == "wds":
        from audiopipe.reader.wds import make_wds_loader  # webdataset: only this loader needs it

        return make_wds_loader(spec.shards, [f], max_frames=spec.max_frames, num_workers=spec.workers, seed=spec.seed)
    if spec.name in ("random", "f5_sort"):
        ds = ShardDataset(spec.shards, [f])
        lengths = ds.lengths(f).astype(np.int64)
        plan = (random_plan if spec.name == "random" else f5_sort_plan)(lengths, spec.max_frames, spec.seed)
        sampler = _EpochBatches(plan)
        return _Wrapped(_dataloader(ds, sampler, PadCollator([f]), spec.workers), sampler)
    if spec.name == "npy_amphion":
        ds = npy_dataset(spec.shards, f, spec.cache)
        sampler = BucketBatchSampler(ds.lengths(), spec.max_frames, seed=spec.seed)
        return _Wrapped(_dataloader(ds, sampler, AmphionPad(f), spec.workers), sampler)
    if spec.name == "npy_per_utt":
        ds = npy_dataset(spec.shards, f, spec.cache)
    elif spec.name == "on_the_fly":
        if not spec.corpus or not Path(spec.corpus).is_dir():
            raise NotFound(f"on_the_fly needs the source audio; corpus folder not found: {spec.corpus}")
        ds = OnTheFlyMel(spec.shards, f, spec.corpus)
    elif spec.name == "lhotse_shar":
        return _LhotseLoader(spec)
    else:
        raise InvalidValue(f"unknown loader {spec.name!r}; choose from {', '.join(LOADERS)}")
    sampler = BucketBatchSampler(ds.lengths(), spec.max_frames, seed=spec.seed)
    return _Wrapped(_dataloader(ds, sampler, PadCollator([f]), spec.workers), sampler)


def files_of(spec: LoaderSpec) -> list[Path]:
    """The files a loader reads, so the parent can warm the page cache for every loader alike."""
    root = Path(spec.shards)
    m = json.loads((root / "manifest.json").read_text())
    if spec.name in ("mmap", "mmap_ring1", "mmap_btc", "random", "f5_sort"):
        return [root / s["arrow"]["path"] for s in m["shards"]]
    if spec.name == "wds":
        return [root / s["tar"]["path"] for s in m["shards"] if "tar" in s]
    if spec.name in ("npy_per_utt", "npy_amphion"):
        return sorted((Path(spec.cache) / "npy" / spec.feature).rglob("*.npy"))
    if spec.name == "lhotse_shar":
        return sorted((Path(spec.cache) / "shar").glob("*"))
    if spec.name == "on_the_fly" and spec.corpus:
        return [p for p in Path(spec.corpus).rglob("*") if p.suffix.lower() in (".wav", ".flac", ".mp3", ".ogg")]
    return []


def prepare(spec: LoaderSpec) -> None:
    """Build the loader's one-time cache (outside the timed child)."""
    if spec.name in ("npy_per_utt", "npy_amphion"):
        npy_cache(spec.shards, spec.feature, spec.cache)
    elif spec.name == "lhotse_shar":
        shar_export(spec.shards, spec.feature, spec.cache)


def evict(paths: Sequence[Path]) -> None:
    """Drop these files' pages from the page cache (only ours: posix_fadvise, no root, nothing global)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(paths: Sequence[Path]) -> int:
    """Read files once (page cache warm-up); returns bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb") as fh:
            while block := fh.read(1 << 22):
                total += len(block)
    return total
