"""Mel, fbank and codec codes on a GPU (or any torch device): x real time one utterance at a time against
length-sorted batches, on real speech, each batched result checked against the one-at-a-time one.

    # here (soundfile + soxr): real utterances as 24 kHz and 16 kHz mono 16-bit WAV
    python benchmarks/bench_gpu_features.py --make-clips .gpuclips --corpus /tmp/extractbench/wav --seconds 480
    # on the GPU machine (numpy + torch; transformers for the codec; the clips are read with the stdlib):
    python benchmarks/bench_gpu_features.py --clips .gpuclips --device cuda --batch 1,16,64 \\
        --json $OUT/gpu_features.json --machine "nvidia-h100-x1"
    (480 s of clips is ~38 MB: with the repository it fits the 64 MiB a device call carries.)

Features (the library's own batched torch code, on --device):
- mel: `mel_spectrogram` with the vocos (F5-TTS) settings at 24 kHz; batches pass `lengths`, so each row is
  reflect-padded at its own end and its frames equal those of the utterance alone;
- fbank: `kaldi_fbank_torch` (80 bins, 3D-Speaker defaults) at 16 kHz; snip-edges framing never reaches
  past an utterance's own samples, so zero-padding changes none of its frames;
- codec: `EncodecEncoder` (EnCodec 24 kHz, random-init weights: same compute as the released model, no hub
  download), whose `encode_batch` defines batched codes to equal one-at-a-time codes.

Per feature, per method ("one at a time", "batch B": clips sorted by length, B per batch), each round times
the whole pass: host padding, host -> device copy, compute, device -> host copy, one array per utterance, so
x real time is what an extraction job would get from that device. A warm-up pass (kernels, FFT plans, the
allocator) comes first and is not timed. After the timed rounds every batched result is compared with the
one-at-a-time one (max |difference| over each utterance's frames; for codes, the share of equal codes) and,
where torchaudio imports, mel and fbank are compared with torchaudio's (the F5-TTS and 3D-Speaker references).

--equal adds batches of equal length (length bucketing at its tightest): each group of B length-sorted clips is
cut to its shortest clip, timed in those batches and one at a time on the same cut clips, side by side; the rows
record the share of the audio the cut keeps. Padding efficiency is then 1, and the codec's codes need no mask.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
import wave
from pathlib import Path
from typing import Callable

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RATES = {"mel": 24000, "fbank": 16000, "codec": 24000}
FEATURES = ("mel", "fbank", "codec")
# Compared only where the one-at-a-time value is this far above the log floor: below it float32 FFT rounding
# alone moves a band by up to ~1 nat between any two implementations (audiopipe.features.mel.stft_magnitude).
STRONG_ABOVE_FLOOR = math.log(1e3)


# ------------------------------------------------------------------ clips

def make_clips(corpus: Path, dest: Path, seconds: float, piece_s: float | None = None) -> dict:
    """Decode real utterances from `corpus` (sorted paths) until `seconds` of audio, written as mono int16 WAV
    at each feature's rate: dest/24000/NNNNN.wav and dest/16000/NNNNN.wav. piece_s: cut each utterance into
    consecutive pieces of at most that long (a CPU rehearsal's few short clips)."""
    import soundfile as sf

    from audiopipe.decode.audio import load_audio, resample

    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"--make-clips: {dest} is not empty (clips of an earlier run would mix in)")
    files = sorted(p for p in corpus.rglob("*") if p.suffix.lower() in (".wav", ".flac", ".ogg", ".mp3"))
    if not files:
        raise SystemExit(f"--make-clips: no audio files under {corpus}")
    total, n = 0.0, 0
    for p in files:
        whole, sr = load_audio(p)
        step = int(piece_s * sr) if piece_s else len(whole)
        for wav in (whole[i:i + step] for i in range(0, len(whole), step)):
            for rate in sorted(set(RATES.values())):
                out = dest / str(rate) / f"{n:05d}.wav"
                out.parent.mkdir(parents=True, exist_ok=True)
                sf.write(out, np.clip(resample(wav, sr, rate), -1.0, 1.0), rate, subtype="PCM_16")
            total += len(wav) / sr
            n += 1
            if total >= seconds:
                break
        if total >= seconds:
            break
    return {"clips": n, "audio_s": total, "from": str(corpus)}


def read_clips(folder: Path) -> list[np.ndarray]:
    """float32 mono clips of one rate folder, in name order; the stdlib reads them (no soundfile needed)."""
    clips = []
    for p in sorted(folder.glob("*.wav")):
        with wave.open(str(p), "rb") as w:
            if w.getnchannels() != 1 or w.getsampwidth() != 2:
                raise SystemExit(f"{p}: expected mono 16-bit WAV (made by --make-clips)")
            data = w.readframes(w.getnframes())
        clips.append(np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0)
    if not clips:
        raise SystemExit(f"no clips in {folder}: make them with --make-clips")
    return clips


# ------------------------------------------------------------------ the features, one at a time and batched

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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
            x = torch.from_numpy(batch).to(device, non_blocking=False)
            lens = torch.from_numpy(lengths).to(device) if len(clips) > 1 else None
            out = mel_spectrogram(x, lengths=lens, **kw).cpu().numpy()
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
    tok = EncodecEncoder(random_init=True, device=str(device), max_batch_samples=1 << 40)
    return tok.encode_batch


RUNNERS = {"mel": mel_runner, "fbank": fbank_runner, "codec": codec_runner}


def batches(clips: list[np.ndarray], size: int) -> list[list[int]]:
    """Indices in batches of `size`, longest first, so each batch holds utterances of similar length."""
    order = sorted(range(len(clips)), key=lambda i: -len(clips[i]))
    return [order[i:i + size] for i in range(0, len(order), size)]


def equal_lengths(clips: list[np.ndarray], size: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """Batches of `size` clips of one exact length: the clips sorted by length, each group cut to its shortest
    clip (from the start). The codec needs exact lengths (its codes of a padded clip are defined by the padding
    mask, but a shard job's clips are not cut); mel and fbank then pad nothing. Returns the cut clips (in the
    input order) and the batches of their indices."""
    order = sorted(range(len(clips)), key=lambda i: -len(clips[i]))
    plan = [order[i:i + size] for i in range(0, len(order), size)]
    cut: list[np.ndarray] = list(clips)
    for b in plan:
        n = min(len(clips[i]) for i in b)
        for i in b:
            cut[i] = clips[i][:n]
    return cut, plan


def padding_efficiency(clips: list[np.ndarray], plan: list[list[int]]) -> float:
    real = sum(len(clips[i]) for b in plan for i in b)
    padded = sum(len(b) * max(len(clips[i]) for i in b) for b in plan)
    return real / padded


def run_pass(run: Callable, clips: list[np.ndarray], plan: list[list[int]], device: torch.device
             ) -> tuple[float, list[np.ndarray | None]]:
    out: list[np.ndarray | None] = [None] * len(clips)
    _sync(device)
    t0 = time.perf_counter()
    for b in plan:
        for i, y in zip(b, run([clips[i] for i in b])):
            out[i] = y
    _sync(device)
    return time.perf_counter() - t0, out


def compare(feature: str, single: list[np.ndarray], other: list[np.ndarray]) -> dict[str, float]:
    """How far `other` is from the one-at-a-time result, utterance by utterance."""
    if feature == "codec":
        equal = sum(int((a == b).sum()) for a, b in zip(single, other))
        total = sum(a.size for a in single)
        shapes = all(a.shape == b.shape for a, b in zip(single, other))
        return {"codes_equal": equal / total if shapes else 0.0, "shapes_equal": shapes}
    if not all(a.shape == b.shape for a, b in zip(single, other)):
        return {"shapes_equal": False}
    floor = min(float(a.min()) for a in single)  # the log floor (clamped silence)
    diffs = [np.abs(a - b) for a, b in zip(single, other)]
    strong = [d[a > floor + STRONG_ABOVE_FLOOR] for a, d in zip(single, diffs)]
    return {"shapes_equal": True, "max_abs_diff": float(max(d.max() for d in diffs)),
            "max_abs_diff_strong": float(max((s.max() for s in strong if s.size), default=0.0))}


def torchaudio_reference(feature: str, clips: list[np.ndarray], device: torch.device) -> list[np.ndarray] | None:
    """torchaudio's own mel (vocos / F5-TTS) or Kaldi fbank (3D-Speaker) per utterance, where it imports."""
    try:
        import torchaudio
    except Exception:  # noqa: BLE001 - absent or broken (its PyPI wheel fails with CPU torch): no reference
        return None
    out = []
    with torch.inference_mode():
        if feature == "mel":
            t = torchaudio.transforms.MelSpectrogram(
                sample_rate=24000, n_fft=1024, win_length=1024, hop_length=256, n_mels=100, f_min=0.0,
                f_max=12000.0, power=1.0, center=True, pad_mode="reflect", norm=None, mel_scale="htk").to(device)
            for c in clips:
                out.append(torch.log(torch.clamp(t(torch.from_numpy(c).to(device)), min=1e-5)).cpu().numpy())
        elif feature == "fbank":
            for c in clips:
                y = torchaudio.compliance.kaldi.fbank(torch.from_numpy(c).to(device)[None], num_mel_bins=80,
                                                      sample_frequency=16000, dither=0.0, low_freq=20.0,
                                                      high_freq=0.0, window_type="povey", snip_edges=True)
                out.append(y.cpu().numpy())
        else:
            return None
    return out


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_equal(feature: str, clips: list[np.ndarray], device: torch.device, sizes: list[int], rounds: int
                  ) -> list[dict]:
    """Per batch size B > 1: the clips cut to equal lengths in groups of B (equal_lengths), timed one at a time
    and in those batches side by side on the same cut clips; what the cut keeps of the audio is recorded."""
    run = RUNNERS[feature](device)
    rate = RATES[feature]
    rows = []
    for b in (b for b in sizes if b > 1):
        cut, plan = equal_lengths(clips, b)
        singles = [[i] for i in range(len(cut))]
        audio_s = sum(len(c) for c in cut) / rate
        for p in (singles, plan):
            run_pass(run, cut, p, device)  # warm-up
        walls: dict[str, list[float]] = {"one": [], "batch": []}
        outs: dict[str, list] = {}
        for _ in range(rounds):
            for key, p in (("one", singles), ("batch", plan)):
                wall, outs[key] = run_pass(run, cut, p, device)
                walls[key].append(wall)
        kept = audio_s / (sum(len(c) for c in clips) / rate)
        for key, p, name in (("one", singles, f"one at a time, cut for batch {b}"), ("batch", plan, f"equal batch {b}")):
            rows.append({"feature": feature, "method": name, "batch": 1 if key == "one" else b, "equal": True,
                         "audio_s": audio_s, "audio_kept": kept, "wall_s": stats(walls[key]),
                         "x_rt": stats([audio_s / w for w in walls[key]]),
                         "vs_one_at_a_time": stats([w1 / w for w1, w in zip(walls["one"], walls[key])]),
                         "padding_efficiency": padding_efficiency(cut, p),
                         "parity": compare(feature, outs["one"], outs[key])})
    return rows


def measure(feature: str, clips: list[np.ndarray], device: torch.device, sizes: list[int], rounds: int,
            equal: bool = False) -> dict:
    run = RUNNERS[feature](device)
    rate = RATES[feature]
    audio_s = sum(len(c) for c in clips) / rate
    plans = {1: [[i] for i in range(len(clips))], **{b: batches(clips, b) for b in sizes if b > 1}}
    for plan in plans.values():
        run_pass(run, clips, plan, device)  # warm-up: kernels, FFT plans for these shapes, the allocator
    walls: dict[int, list[float]] = {b: [] for b in plans}
    outputs: dict[int, list] = {}
    for _ in range(rounds):
        for b, plan in plans.items():  # side by side within a round
            wall, outputs[b] = run_pass(run, clips, plan, device)
            walls[b].append(wall)
    rows = []
    for b, plan in plans.items():
        rows.append({"feature": feature, "method": "one at a time" if b == 1 else f"batch {b}", "batch": b,
                     "audio_s": audio_s, "wall_s": stats(walls[b]),
                     "x_rt": stats([audio_s / w for w in walls[b]]),
                     "vs_one_at_a_time": stats([w1 / w for w1, w in zip(walls[1], walls[b])]),
                     "padding_efficiency": padding_efficiency(clips, plan),
                     "parity": compare(feature, outputs[1], outputs[b])})
    if equal:
        rows += measure_equal(feature, clips, device, sizes, rounds)
    ref = torchaudio_reference(feature, clips, device)
    reference = ({"torchaudio": compare(feature, ref, outputs[max(plans)])} if ref is not None
                 else {"torchaudio": "not importable here"})
    return {"rows": rows, "reference": reference}


def table(results: list[dict]) -> str:
    lines = ["| feature | method | x real time (median, range) | vs one at a time | padding efficiency | "
             "batched vs one at a time |", "|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            p = r["parity"]
            par = ("codes equal {:.4f}".format(p["codes_equal"]) if "codes_equal" in p
                   else "max diff {:.1e} (strong bands {:.1e})".format(p["max_abs_diff"], p["max_abs_diff_strong"])
                   if p.get("shapes_equal") else "shapes differ")
            x, v = r["x_rt"], r["vs_one_at_a_time"]
            lines.append(f"| {r['feature']} | {r['method']} | {x['median']:.0f} ({x['min']:.0f}-{x['max']:.0f}) | "
                         f"{v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) | {r['padding_efficiency']:.3f} | "
                         f"{par} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description="Mel, fbank and codec codes on a torch device: x real time one "
                                 "utterance at a time against length-sorted batches, on real speech.",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--make-clips", type=Path, metavar="DIR", help="write the clips to DIR and stop (needs "
                    "soundfile and soxr; run it where the corpus is)")
    ap.add_argument("--corpus", type=Path, default=Path("/tmp/extractbench/wav"),
                    help="real speech to take the clips from (--make-clips)")
    ap.add_argument("--seconds", type=float, default=480.0, help="audio to take (--make-clips; default 480)")
    ap.add_argument("--clips", type=Path, help="the folder --make-clips wrote")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="torch device (default: cuda where torch sees one, else cpu)")
    ap.add_argument("--batch", default="1,16,64", help="batch sizes; 1 is always measured (default 1,16,64)")
    ap.add_argument("--features", default=",".join(FEATURES), help=f"of {','.join(FEATURES)}")
    ap.add_argument("--rounds", type=int, default=3, help="timed passes per method, side by side (default 3)")
    ap.add_argument("--equal", action="store_true", help="also batches of equal length: each group of B "
                    "length-sorted clips cut to its shortest, against the same cut clips one at a time")
    ap.add_argument("--machine", default="", help="a label for the machine, stored with the figures")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args()

    if a.make_clips is not None:
        info = make_clips(a.corpus, a.make_clips, a.seconds)
        print(f"{info['clips']} clips, {info['audio_s']:.0f} s of audio from {info['from']} -> {a.make_clips}")
        return 0
    if a.clips is None:
        ap.error("give --clips DIR (made by --make-clips) or --make-clips DIR")
    features = [f for f in a.features.split(",") if f]
    unknown = sorted(set(features) - set(FEATURES))
    if unknown:
        ap.error(f"unknown feature(s) {', '.join(unknown)}: choose from {', '.join(FEATURES)}")
    sizes = sorted({1} | {int(b) for b in a.batch.split(",")})
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu")
    print(f"device {device} ({name}), torch {torch.__version__}, batches {sizes}", flush=True)
    clips = {rate: read_clips(a.clips / str(rate)) for rate in sorted({RATES[f] for f in features})}
    results = []
    for f in features:
        t0 = time.perf_counter()
        results.append(measure(f, clips[RATES[f]], device, sizes, a.rounds, a.equal))
        print(f"{f}: {time.perf_counter() - t0:.1f} s", flush=True)
    doc = {"machine": a.machine, "device": str(device), "device_name": name, "torch": torch.__version__,
           "platform": platform.platform(), "command": " ".join(sys.argv), "rounds": a.rounds, "equal": a.equal,
           "clips": {rate: {"count": len(c), "audio_s": sum(len(x) for x in c) / rate} for rate, c in clips.items()},
           "results": results}
    print(table(results))
    for res in results:
        print(f"{res['rows'][0]['feature']} against torchaudio: {res['reference']['torchaudio']}")
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
