"""The data side of the two 3D-Speaker trainers (train_eres2net.py, train_campplus.py): which utterances train,
and what one training example is.

In order (3D-Speaker's recipe):
  speakers from index.arrow -> whole speakers held out for the EER trials (`split_speakers`)
  -> stored int16 PCM @16 kHz -> random crop (3 s; shorter utterances repeat-padded)
  -> speed perturbation 1.0/0.9/1.1, the class becoming speaker * 3 + speed index
  -> optional additive noise / reverberation from user folders
     [the draws and slices in `SpeakerCrops`, the loader's item_transform, from a generator seeded by
      (seed, epoch, utterance): a resumed run sees the very same crops, with or without DataLoader workers]
  -> on the training device, for the whole batch: speed, reverb and noise (speaker_augment.DeviceAugment),
     then Kaldi fbank 80 (dither 0) minus each crop's mean over time (`fbank_batch`).
  (`--augment-on cpu`: speed, reverb and noise per crop in the item transform, with soxr and scipy, instead.)
`speaker_data` wires these into make_loader's arguments for core.train.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import multiprocessing.context
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from audiopipe.features.fbank import kaldi_fbank_torch, mean_normalize
from audiopipe.features.pcm import INT16_SCALE
from audiopipe.index.lengths import LengthIndex
from audiopipe.shard.manifest import read_manifest

import core
from speaker_augment import (SAMPLE_RATE, DeviceAugment, first_output, labels_as_tensor, source_samples,
                             speed_rates, stack_for_device)

NUM_MEL_BINS = 80
SPEEDS = (1.0, 0.9, 1.1)  # index 0 is the unperturbed speed, so class speaker * 3 is the original voice
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")


# ----------------------------------------------------------------------------- speakers and the held-out split

# --heldout-speakers auto: this many speakers are held out for the EER once the corpus has HOLD_OUT_FROM usable
# speakers, so that at least 4 train; a smaller corpus (the 3-speaker demo) trains on all and has no EER: two held
# out of three would leave one speaker, a classifier of one voice.
AUTO_HELDOUT, HOLD_OUT_FROM = 2, 6


def heldout_count(value: str) -> int | None:
    """--heldout-speakers: 'auto' (None) or a whole number."""
    return None if value == "auto" else int(value)


@dataclass(frozen=True)
class SpeakerSplit:
    """Which utterances train, which are held out for the EER trials, and each one's class."""

    label_of: np.ndarray  # int64 [utterances]: training speaker id, -1 when not trained on
    train: np.ndarray  # global indices of the training utterances
    heldout: np.ndarray  # global indices of the held-out utterances
    train_speakers: list[str]  # id k is train_speakers[k]
    heldout_speakers: list[str]
    skipped_short: int  # shorter than min_samples (either side)
    skipped_unlabelled: int  # empty speaker string


def split_speakers(speakers: Sequence[str], num_samples: np.ndarray, *, heldout: int | None, seed: int,
                   min_samples: int) -> SpeakerSplit:
    """Map speaker strings to ids and hold `heldout` whole speakers out (seeded, the same on every rank);
    None: AUTO_HELDOUT from HOLD_OUT_FROM usable speakers on, else none."""
    speakers = [str(s) for s in speakers]
    num_samples = np.asarray(num_samples, dtype=np.int64)
    if len(speakers) != len(num_samples):
        raise ValueError(f"{len(speakers)} speaker names for {len(num_samples)} utterances")
    if heldout is not None and (heldout < 0 or heldout == 1):
        raise ValueError(f"--heldout-speakers must be 0 (no EER) or at least 2 (non-target trials need two "
                         f"speakers), got {heldout}")
    unlabelled = np.array([s == "" for s in speakers], dtype=bool)
    short = num_samples < min_samples
    usable = ~unlabelled & ~short
    names = sorted({s for s, ok in zip(speakers, usable) if ok})
    if not names:
        raise ValueError(f"no usable utterance: {int(unlabelled.sum())} have no speaker label and "
                         f"{int(short.sum())} are shorter than {min_samples} samples")
    if heldout is None:
        heldout = AUTO_HELDOUT if len(names) >= HOLD_OUT_FROM else 0
    if heldout >= len(names):
        fix = f"at most {len(names) - 1}, or 0 for no EER" if len(names) > 2 else "0 (no EER)"
        raise ValueError(f"--heldout-speakers {heldout} leaves no speaker to train on: the shards have "
                         f"{len(names)} speakers with usable utterances; hold out {fix}")
    rng = np.random.default_rng([seed, 0x5E1D])
    out = sorted(rng.choice(np.array(names, dtype=object), size=heldout, replace=False).tolist()) if heldout else []
    train_names = [n for n in names if n not in set(out)]
    ids = {n: k for k, n in enumerate(train_names)}
    label_of = np.array([ids.get(s, -1) if ok else -1 for s, ok in zip(speakers, usable)], dtype=np.int64)
    held = np.array([ok and s in set(out) for s, ok in zip(speakers, usable)], dtype=bool)
    return SpeakerSplit(label_of, np.flatnonzero(label_of >= 0), np.flatnonzero(held), train_names, out,
                        int((short & ~unlabelled).sum()), int(unlabelled.sum()))


def read_speaker_index(shards: str | Path) -> tuple[list[str], np.ndarray]:
    """Speaker strings and PCM sample counts from index.arrow, after checking the shards hold 16 kHz PCM."""
    feats = read_manifest(shards)["features"]
    if "pcm" not in feats:
        raise SystemExit(f"{shards} has no 'pcm' feature (it has {sorted(feats)}): shard the corpus with "
                         f"`audiopipe shard --preset eres2net` (or campplus)")
    if int(feats["pcm"]["sample_rate"]) != SAMPLE_RATE:
        raise SystemExit(f"{shards} stores PCM at {feats['pcm']['sample_rate']} Hz; the speaker trainers need "
                         f"{SAMPLE_RATE} Hz (the eres2net/campplus presets)")
    idx = LengthIndex.open(shards)
    return [s or "" for s in idx.table.column("speaker").to_pylist()], idx.frames("pcm").astype(np.int64)


# ----------------------------------------------------------------------------- crops, speed, augmentation

def pick_segment(pcm: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n consecutive samples at a random start (a view), or the whole utterance when it is shorter than n."""
    if len(pcm) >= n:
        start = int(rng.integers(0, len(pcm) - n + 1))
        return pcm[start:start + n]
    return pcm


def take_segment(pcm: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n consecutive samples at a random start; a shorter utterance is repeated from its start to fill n."""
    return np.resize(pick_segment(pcm, n, rng), n)  # a copy; np.resize repeats a short array cyclically


def speed_soxr(src: np.ndarray, n: int, speed: float) -> np.ndarray:
    """The per-utterance path's speed perturbation: `source_samples(n, speed)` int16 samples -> a float32 crop of
    n samples in [-1, 1] of them played `speed` times faster (sox's `speed` + `rate`, through soxr, SoX's
    resampler). The device path (speaker_augment.DeviceAugment) makes the same crop from the same samples."""
    wav = src.astype(np.float32) / np.float32(INT16_SCALE)
    if speed == 1.0:
        return wav
    import soxr  # here: only this path resamples on the CPU, and the reader and trainers import without it

    first = first_output(speed)
    return np.ascontiguousarray(soxr.resample(wav, speed * SAMPLE_RATE, SAMPLE_RATE)[first:first + n])


class AudioFolder:
    """Every .wav/.flac/.ogg under a folder, read on first use as mono float32 at 16 kHz (a few cached)."""

    def __init__(self, root: str | Path, what: str, cache_files: int = 64):
        self.root = Path(root)
        if not self.root.is_dir():
            raise SystemExit(f"{what} folder {self.root} does not exist")
        self.files = sorted(p for p in self.root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES)
        if not self.files:
            raise SystemExit(f"{what} folder {self.root} holds no {'/'.join(AUDIO_SUFFIXES)} files")
        self.what, self.cache_files = what, cache_files
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.files)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}  # each worker reads its own

    def load(self, i: int) -> np.ndarray:
        x = self._cache.get(i)
        if x is None:
            import soundfile as sf

            try:
                data, sr = sf.read(str(self.files[i]), dtype="float32", always_2d=True)
            except (RuntimeError, sf.LibsndfileError) as e:
                raise RuntimeError(f"{self.what} file {self.files[i]} is unreadable: {e}") from e
            x = data.mean(axis=1)
            if sr != SAMPLE_RATE:
                import soxr

                x = soxr.resample(x, sr, SAMPLE_RATE)
            if x.size == 0 or not np.isfinite(x).all():
                raise RuntimeError(f"{self.what} file {self.files[i]} is empty or holds NaN/inf")
            if len(self._cache) >= self.cache_files:
                self._cache.pop(next(iter(self._cache)))
            self._cache[i] = x = np.ascontiguousarray(x, dtype=np.float32)
        return x

    def pick(self, rng: np.random.Generator) -> np.ndarray:
        return self.load(int(rng.integers(len(self.files))))


def _energy_db(x: np.ndarray) -> float:
    return 10.0 * math.log10(float(np.mean(np.square(x, dtype=np.float64))) + 1e-6)


def add_noise(wav: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """wav + noise (as long as wav) scaled to snr_db below the speech."""
    gain = 10.0 ** ((_energy_db(wav) - _energy_db(noise) - snr_db) / 20.0)
    return (wav + gain * noise).astype(np.float32)


def add_reverb(wav: np.ndarray, rir: np.ndarray) -> np.ndarray:
    """wav convolved with an energy-normalised room impulse response, cut to wav's length."""
    from scipy.signal import fftconvolve

    rir = rir / max(float(np.sqrt(np.sum(np.square(rir, dtype=np.float64)))), 1e-12)
    return fftconvolve(wav, rir.astype(np.float32), mode="full")[: len(wav)].astype(np.float32)


@dataclass
class Augment:
    """With probability `prob`: noise, reverb, or reverb then noise (one chosen at random among those given).

    `draw` makes the random choices and slices (the impulse response, a crop-long stretch of noise, repeated
    when short); the device path applies them to the batch, the per-utterance path with `apply`. No peak
    normalisation afterwards (3D-Speaker rescales to peak 1): the per-crop mean normalisation of the log fbank
    removes an overall gain anyway.
    """

    noise: AudioFolder | None = None
    rir: AudioFolder | None = None
    prob: float = 0.2
    snr_db: tuple[float, float] = (0.0, 15.0)

    def __post_init__(self) -> None:
        if not 0.0 <= self.prob <= 1.0:
            raise SystemExit(f"--aug-prob must be in [0, 1], got {self.prob}")
        if self.snr_db[0] > self.snr_db[1]:
            raise SystemExit(f"--snr-low {self.snr_db[0]} is above --snr-high {self.snr_db[1]}")
        self.kinds = [k for k, ok in ((("noise",), self.noise), (("reverb",), self.rir),
                                      (("reverb", "noise"), self.noise and self.rir)) if ok]

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray | None, np.ndarray | None, float]:
        """(impulse response or None, n samples of noise or None, SNR in dB) for one crop of n samples."""
        if not self.kinds or rng.random() >= self.prob:
            return None, None, 0.0
        kind = self.kinds[int(rng.integers(len(self.kinds)))]
        rir = self.rir.pick(rng) if "reverb" in kind else None
        if "noise" not in kind:
            return rir, None, 0.0
        noise = self.noise.pick(rng)
        snr = float(rng.uniform(*self.snr_db))
        return rir, take_segment(noise, n, rng), snr

    @staticmethod
    def apply(wav: np.ndarray, rir: np.ndarray | None, noise: np.ndarray | None, snr: float) -> np.ndarray:
        if rir is not None:
            wav = add_reverb(wav, rir)
        if noise is not None:
            wav = add_noise(wav, noise, snr)
        return wav

    def __call__(self, wav: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.apply(wav, *self.draw(len(wav), rng))


class SpeakerCrops:
    """The loader's item_transform: {"pcm", "index", ...} -> one crop's draws and slices.

    on_device=True (the trainers' default): {"wav": int16 source samples, a view of the mmap (the
    `source_samples(crop, speed)` the crop reads, or the whole utterance when it is shorter: the device repeats
    it), "speed": index into speeds, "rir", "noise", "snr" (Augment.draw), "label", "index"}, which
    `stack_for_device` (the batch transform) and `DeviceAugment` finish per batch.
    on_device=False (`--augment-on cpu`): {"wav": float32 [crop], "label", "index"}, finished here per crop with
    soxr and scipy, 3D-Speaker's way. The two make the same crops from the same draws, within the resamplers'
    difference.

    Every random draw comes from np.random.default_rng([seed, epoch, index]), so an utterance's crop depends
    only on where the run is, never on what ran before: resuming gives the same crops. The epoch lives in
    shared memory so DataLoader workers (forked once, persistent) follow set_epoch too.
    """

    def __init__(self, label_of: np.ndarray, *, seed: int, crop_samples: int = 3 * SAMPLE_RATE,
                 speeds: Sequence[float] = SPEEDS, augment: Augment | None = None, on_device: bool = True):
        if crop_samples < 400:
            raise SystemExit(f"a crop of {crop_samples} samples is shorter than one 25 ms fbank frame")
        self.label_of = np.asarray(label_of, dtype=np.int64)
        self.seed, self.crop_samples = int(seed), int(crop_samples)
        self.speeds = tuple(float(s) for s in speeds)
        if not self.speeds or any(not 0.5 <= s <= 2.0 for s in self.speeds):
            raise SystemExit(f"speeds must be in [0.5, 2], got {self.speeds}")
        for s in self.speeds:
            speed_rates(s)  # a speed sox's `speed` cannot express at 16 kHz is refused here
        self.augment, self.on_device = augment, bool(on_device)
        if augment is not None and augment.rir is not None and not on_device:
            try:
                import scipy.signal  # noqa: F401
            except ImportError as e:
                raise SystemExit("--rir-dir with --augment-on cpu needs scipy (pip install scipy)") from e
        self._epoch: Any = multiprocessing.Value("q", 0, lock=False)

    @property
    def epoch(self) -> int:
        return int(self._epoch.value) if hasattr(self._epoch, "value") else int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self._epoch, "value"):
            self._epoch.value = int(epoch)
        else:
            self._epoch = int(epoch)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if multiprocessing.context.get_spawning_popen() is None:
            state["_epoch"] = self.epoch  # plain pickling (not a worker being spawned): a snapshot
        return state

    def __call__(self, item: dict[str, Any]) -> dict[str, Any]:
        index = int(item["index"])
        spk = int(self.label_of[index])
        if spk < 0:
            raise ValueError(f"utterance {item.get('id')!r} (index {index}) is not a training utterance")
        rng = np.random.default_rng([self.seed, self.epoch, index])
        n, k = self.crop_samples, int(rng.integers(len(self.speeds)))
        need = source_samples(n, self.speeds[k])
        src = pick_segment(item["pcm"], need, rng)
        rir, noise, snr = self.augment.draw(n, rng) if self.augment is not None else (None, None, 0.0)
        label = spk * len(self.speeds) + k
        if self.on_device:  # slices only: DeviceAugment repeats a short one and finishes the batch
            return {"wav": src, "speed": k, "rir": rir, "noise": noise, "snr": snr, "label": label, "index": index}
        wav = Augment.apply(speed_soxr(np.resize(src, need), n, self.speeds[k]), rir, noise, snr)
        return {"wav": wav, "label": label, "index": index}


# ----------------------------------------------------------------------------- features on the device

def fbank_batch(wav: torch.Tensor) -> torch.Tensor:
    """[B, N] waveform in [-1, 1] -> [B, T, 80] Kaldi fbank minus each crop's mean over time (fp32 always).

    3D-Speaker's FBank(80, mean_nor=True) per crop, done for the whole batch on wav's device.
    """
    with torch.autocast(wav.device.type, enabled=False):
        feats = kaldi_fbank_torch(wav.float(), sample_rate=SAMPLE_RATE, num_mel_bins=NUM_MEL_BINS)
        return mean_normalize(feats, time_axis=1)


# ----------------------------------------------------------------------------- make_loader arguments

@dataclass
class SpeakerData:
    split: SpeakerSplit
    speakers: list[str]
    crops: SpeakerCrops
    loader_kw: dict[str, Any]
    num_classes: int
    finish: DeviceAugment | None  # None: the loader hands finished crops (--augment-on cpu)


def speaker_data(cfg: core.RunConfig, args: argparse.Namespace, d: core.Dist, name: str) -> SpeakerData:
    """The held-out split, the crop transform, the device side and make_loader's arguments for core.train."""
    verbose = d.main
    crop = int(round(args.crop_seconds * SAMPLE_RATE))
    if cfg.batch_frames < crop:
        raise SystemExit(f"--batch-frames {cfg.batch_frames} holds no crop: a batch of B crops of "
                         f"{args.crop_seconds} s is B * {crop}")
    speakers, num_samples = [], []
    dirs = core.shard_dirs(cfg)
    for s in dirs:  # several folders are mixed: a speaker is one of its own corpus (its labels get the folder)
        spk, n = read_speaker_index(s)
        speakers += [f"{s}:{x}" if x and len(dirs) > 1 else x for x in spk]
        num_samples.append(n)
    num_samples = np.concatenate(num_samples)
    try:
        split = split_speakers(speakers, num_samples, heldout=args.heldout_speakers, seed=cfg.seed,
                               min_samples=max(400, int(args.min_seconds * SAMPLE_RATE)))
    except ValueError as e:  # the same on every rank: rank 0 says it in one line
        core._fail(f"{name}: error: {e}", d)
    augment = None
    if args.noise_dir or args.rir_dir:
        augment = Augment(AudioFolder(args.noise_dir, "--noise-dir") if args.noise_dir else None,
                          AudioFolder(args.rir_dir, "--rir-dir") if args.rir_dir else None,
                          args.aug_prob, (args.snr_low, args.snr_high))
    on_device = args.augment_on == "device"
    crops = SpeakerCrops(split.label_of, seed=cfg.seed, crop_samples=crop,
                         speeds=(1.0,) if args.no_speed_perturb else SPEEDS, augment=augment, on_device=on_device)
    if verbose and args.heldout_speakers is None and not split.heldout_speakers:
        print(f"[speaker] {len(split.train_speakers)} speakers, fewer than {HOLD_OUT_FROM}: all of them train and "
              f"there is no EER (--heldout-speakers auto holds {AUTO_HELDOUT} out from {HOLD_OUT_FROM} speakers on; "
              f"--heldout-speakers N holds N out)", flush=True)
    if verbose:
        print(f"[speaker] {len(split.train)} training utterances of {len(split.train_speakers)} speakers "
              f"(x{len(crops.speeds)} speeds = {len(split.train_speakers) * len(crops.speeds)} classes); "
              f"held out for EER: {len(split.heldout)} utterances of {split.heldout_speakers}; left out: "
              f"{split.skipped_short} shorter than {args.min_seconds} s, {split.skipped_unlabelled} without "
              f"speaker", flush=True)
    subset, repeats = fill_last_batch(split.train, crops_per_batch(cfg, crop), cfg.seed)
    if verbose and repeats:
        print(f"[speaker] {repeats} training utterances listed twice so that every batch is full "
              f"(the other side of 3D-Speaker's drop_last; CAM++'s last BatchNorm needs 2+ crops)", flush=True)
    loader_kw = {"item_transform": crops, "subset": subset, "collate_features": ["wav"],
                 "batch_transform": stack_for_device if on_device else labels_as_tensor,
                 "lengths": np.full(len(subset), crop, dtype=np.int64)}  # the budget counts crops, not sources
    return SpeakerData(split, speakers, crops, loader_kw, len(split.train_speakers) * len(crops.speeds),
                       DeviceAugment(crops.speeds, crop) if on_device else None)


def crops_per_batch(cfg: core.RunConfig, crop: int) -> int:
    """How many crops the sampler's budget (n * m + quadratic * n * m^2 <= batch_frames) puts in a batch."""
    n = int(cfg.batch_frames // (crop + cfg.quadratic * crop * crop))
    return max(1, min(n, cfg.max_items) if cfg.max_items else n)


def fill_last_batch(train: np.ndarray, batch: int, seed: int) -> tuple[np.ndarray, int]:
    """The training list, with a few utterances (seeded) listed twice when its length is not a multiple of
    the batch size: otherwise the sampler's last batch can hold a single crop."""
    n = len(train)
    extra = (-n) % max(1, min(batch, n))
    if extra == 0:
        return train, 0
    pick = np.random.default_rng([seed, 0xF111]).choice(n, size=extra, replace=extra > n)
    return np.concatenate([train, train[np.sort(pick)]]), extra
