"""Mel, fbank and codec codes on a GPU (or any torch device): x real time one utterance at a time against batches,
on real speech, each batched result checked against the one-at-a-time one, with the library's own batched torch
code. The GPU proof's `features` part runs it (benchmarks/gpu_proof.py --parts features); docs/extraction.md ("On a
GPU") says what it measures and how.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from results_io import spread  # benchmarks/ is on sys.path

RATES = {"mel": 24000, "fbank": 16000, "codec": 24000}
# Compared only where the one-at-a-time value is this far above the log floor: below it float32 FFT rounding
# alone moves a band by up to ~1 nat between any two implementations (audiopipe.features.mel.stft_magnitude).
STRONG_ABOVE_FLOOR = math.log(1e3)


def load_clips(corpus: Path, seconds: float, piece_s: float | None = None) -> dict[int, list[np.ndarray]]:
    """Real utterances of `corpus` (sorted paths) until `seconds` of audio, at each feature's rate; piece_s: each
    cut into consecutive pieces of at most that long (a CPU rehearsal's few short clips)."""
    from audiopipe.decode.audio import load_audio, resample

    files = sorted(p for p in corpus.rglob("*") if p.suffix.lower() in (".wav", ".flac", ".ogg", ".mp3"))
    if not files:
        raise FileNotFoundError(f"no audio files under {corpus}")
    clips: dict[int, list[np.ndarray]] = {r: [] for r in sorted(set(RATES.values()))}
    total = 0.0
    for p in files:
        whole, sr = load_audio(p)
        step = int(piece_s * sr) if piece_s else len(whole)
        for i in range(0, len(whole), step):
            for rate in clips:
                clips[rate].append(np.clip(resample(whole[i:i + step], sr, rate), -1.0, 1.0).astype(np.float32))
            total += len(whole[i:i + step]) / sr
            if total >= seconds:
                return clips
    return clips


def _pad(clips: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.array([len(c) for c in clips], dtype=np.int64)
    batch = np.zeros((len(clips), int(lengths.max())), dtype=np.float32)
    for row, c in enumerate(clips):
        batch[row, : len(c)] = c
    return batch, lengths


def mel_runner(device: torch.device) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    from audiopipe.features.mel import mel_spectrogram, stft_num_frames, vocos_mel_kwargs

    kw = vocos_mel_kwargs()

    def run(clips: list[np.ndarray]) -> list[np.ndarray]:
        batch, lengths = _pad(clips)
        with torch.inference_mode():
            lens = torch.from_numpy(lengths).to(device) if len(clips) > 1 else None
            out = mel_spectrogram(torch.from_numpy(batch).to(device), lengths=lens, **kw).cpu().numpy()
        return [out[row, :, : stft_num_frames(int(n), kw["n_fft"], kw["hop_length"], kw["padding"])]
                for row, n in enumerate(lengths)]

    return run


def fbank_runner(device: torch.device) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    from audiopipe.features.fbank import KaldiFbank, kaldi_fbank_torch

    frames = KaldiFbank().num_frames  # the same defaults as kaldi_fbank_torch's

    def run(clips: list[np.ndarray]) -> list[np.ndarray]:
        batch, lengths = _pad(clips)
        with torch.inference_mode():
            out = kaldi_fbank_torch(torch.from_numpy(batch).to(device)).cpu().numpy()  # [B, T, 80]
        return [out[row, : frames(int(n))] for row, n in enumerate(lengths)]

    return run


def codec_runner(device: torch.device) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    from audiopipe.features.codec import EncodecEncoder

    # A budget no batch here reaches: the batch size is the benchmark's choice, not the tokenizer's.
    return EncodecEncoder(random_init=True, device=str(device), max_batch_samples=1 << 40).encode_batch


RUNNERS = {"mel": mel_runner, "fbank": fbank_runner, "codec": codec_runner}


def batches(clips: list[np.ndarray], size: int) -> list[list[int]]:
    """Indices in batches of `size`, longest first, so each batch holds utterances of similar length."""
    order = sorted(range(len(clips)), key=lambda i: -len(clips[i]))
    return [order[i:i + size] for i in range(0, len(order), size)]


def equal_lengths(clips: list[np.ndarray], size: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """Batches of `size` clips of one exact length: length-sorted groups, each cut to its shortest clip (from the
    start). The codec's codes of a padded clip are defined by its padding mask, but only equal lengths need none;
    mel and fbank then pad nothing. Returns the cut clips (input order) and the batches of their indices."""
    plan = batches(clips, size)
    cut = list(clips)
    for b in plan:
        n = min(len(clips[i]) for i in b)
        for i in b:
            cut[i] = clips[i][:n]
    return cut, plan


def padding_efficiency(clips: list[np.ndarray], plan: list[list[int]]) -> float:
    return sum(len(clips[i]) for b in plan for i in b) / sum(len(b) * max(len(clips[i]) for i in b) for b in plan)


def run_pass(run: Callable, clips: list[np.ndarray], plan: list[list[int]], device: torch.device
             ) -> tuple[float, list[np.ndarray]]:
    out: list = [None] * len(clips)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for b in plan:
        for i, y in zip(b, run([clips[i] for i in b])):
            out[i] = y
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0, out


def compare(feature: str, single: list[np.ndarray], other: list[np.ndarray]) -> dict[str, float]:
    """How far `other` is from the one-at-a-time result, utterance by utterance."""
    shapes = all(a.shape == b.shape for a, b in zip(single, other))
    if feature == "codec":
        equal = sum(int((a == b).sum()) for a, b in zip(single, other)) / sum(a.size for a in single)
        return {"codes_equal": equal if shapes else 0.0, "shapes_equal": shapes}
    if not shapes:
        return {"shapes_equal": False}
    floor = min(float(a.min()) for a in single)  # the log floor (clamped silence)
    diffs = [np.abs(a - b) for a, b in zip(single, other)]
    strong = [d[a > floor + STRONG_ABOVE_FLOOR] for a, d in zip(single, diffs)]
    return {"shapes_equal": True, "max_abs_diff": float(max(d.max() for d in diffs)),
            "max_abs_diff_strong": float(max((s.max() for s in strong if s.size), default=0.0))}


def measure(feature: str, clips: list[np.ndarray], device: torch.device, sizes: list[int], rounds: int,
            equal: bool = False) -> dict:
    """The rows of one feature: every method timed `rounds` times, side by side with the one-at-a-time pass over
    the same clips, and its output compared with that pass's."""
    run, rate = RUNNERS[feature](device), RATES[feature]
    whole_s = sum(len(c) for c in clips) / rate
    # (clips, [(method, batch, plan)]): the clips as they are, then per B the clips cut to equal lengths
    groups = [(clips, [("one at a time", 1, [[i] for i in range(len(clips))])]
               + [(f"batch {b}", b, batches(clips, b)) for b in sizes if b > 1])]
    if equal:
        for b in (b for b in sizes if b > 1):
            cut, plan = equal_lengths(clips, b)
            groups.append((cut, [(f"one at a time, cut for batch {b}", 1, [[i] for i in range(len(cut))]),
                                 (f"equal batch {b}", b, plan)]))
    rows = []
    for group, methods in groups:
        for _, _, plan in methods:
            run_pass(run, group, plan, device)  # warm-up: kernels, FFT plans for these shapes, the allocator
        walls: list[list[float]] = [[] for _ in methods]
        outs: list = [None] * len(methods)
        for _ in range(rounds):
            for j, (_, _, plan) in enumerate(methods):
                wall, outs[j] = run_pass(run, group, plan, device)
                walls[j].append(wall)
        audio_s = sum(len(c) for c in group) / rate
        for j, (name, b, plan) in enumerate(methods):
            rows.append({"feature": feature, "method": name, "batch": b, "equal": group is not clips,
                         "audio_s": audio_s, "audio_kept": audio_s / whole_s, "wall_s": spread(walls[j]),
                         "x_rt": spread([audio_s / w for w in walls[j]]),
                         "vs_one_at_a_time": spread([w1 / w for w1, w in zip(walls[0], walls[j])]),
                         "padding_efficiency": padding_efficiency(group, plan),
                         "parity": compare(feature, outs[0], outs[j])})
    return {"rows": rows}


def run(clips: dict[int, list[np.ndarray]], device: str, sizes: list[int], rounds: int, equal: bool = False,
        features: tuple[str, ...] = tuple(RATES)) -> dict:
    """Every feature measured on the clips at its rate: the figures, with the device and torch they ran on."""
    dev = torch.device(device)
    results = []
    for f in features:
        t0 = time.perf_counter()
        results.append(measure(f, clips[RATES[f]], dev, sizes, rounds, equal))
        print(f"[features] {f}: {time.perf_counter() - t0:.1f} s", flush=True)
    return {"device": str(dev), "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "torch": torch.__version__, "rounds": rounds, "equal": equal, "sizes": sizes,
            "clips": {r: {"count": len(c), "audio_s": sum(len(x) for x in c) / r} for r, c in clips.items()},
            "results": results}
