"""Feature extraction speed (x real time per core) and F0 accuracy against pyworld harvest.

    python benchmarks/bench_features.py --json bench_features.json

Everything runs on one thread (torch, numba, BLAS/OpenMP pinned to 1), so "x RT" is audio seconds per CPU
second of one core: multiply by the cores a shard job gets. Speeds are measured on real speech (Asterisk
prompts, upsampled) as CPU time of this process (best of --repeat), so other load on the machine inflates
them less than wall time would. The F0 table compares each backend with harvest on Asterisk prompts and
espeak-ng sentences: GPE = frames both call voiced where F0 is > 20 % off; VDE = frames whose voicing differs.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy/torch/numba load their thread pools

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import soxr  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from audiopipe.corpus.demo import (ASTERISK_SOUNDS, ESPEAK_SENTENCES, ESPEAK_VOICES,  # noqa: E402
                                   usable_asterisk_prompts, speak)
from audiopipe.features.energy import Energy  # noqa: E402
from audiopipe.features.f0 import F0  # noqa: E402
from audiopipe.features.fbank import KaldiFbank, kaldi_fbank_torch  # noqa: E402
from audiopipe.features.mel import SlaneyMel, VocosMel, mel_spectrogram, vocos_mel_kwargs  # noqa: E402
from results_io import cpu_name  # noqa: E402  (benchmarks/ is the script's folder)

warnings.filterwarnings("ignore", message="pkg_resources is deprecated")


def cpu_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best CPU seconds, best wall seconds) over `repeat` runs, after one warm-up run."""
    fn()
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return min(cpu), min(wall)


def machine_info() -> dict:
    import kaldi_native_fbank
    import librosa
    import numba

    versions = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                "numba": numba.__version__, "soxr": soxr.__version__, "soundfile": sf.__version__,
                "kaldi_native_fbank": getattr(kaldi_native_fbank, "__version__", "?"), "librosa": librosa.__version__}
    for mod in ("pyworld", "parselmouth"):
        try:
            versions[mod] = __import__(mod).__version__
        except ImportError:
            versions[mod] = None
    return {"cpu": cpu_name(), "logical_cores": os.cpu_count(), "platform": platform.platform(),
            "threads_used": 1, "versions": versions,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def load_material(n_prompts: int, n_espeak: int, workdir: Path) -> tuple[list[Path], list[tuple[str, np.ndarray]]]:
    """Asterisk prompt paths (8 kHz) and [(name, 24 kHz float32)] for prompts + espeak-ng sentences."""
    paths = [ASTERISK_SOUNDS / f"{name}.wav" for name, _ in usable_asterisk_prompts(n_prompts, max_s=12.0)]
    clips = []
    for p in paths:
        x, sr = sf.read(p, dtype="float32")
        clips.append((f"asterisk/{p.stem}", soxr.resample(x, sr, 24000).astype(np.float32)))
    for k in range(n_espeak):
        voice, wpm, pitch = ESPEAK_VOICES[k % len(ESPEAK_VOICES)]
        wav = workdir / f"espeak{k}.wav"
        speak(ESPEAK_SENTENCES[k % len(ESPEAK_SENTENCES)], voice, wpm, pitch, wav)
        x, sr = sf.read(wav, dtype="float32")
        clips.append((f"espeak/{voice}", soxr.resample(x, sr, 24000).astype(np.float32)))
    return paths, clips


def speed_table(paths: list[Path], speech24: np.ndarray, repeat: int) -> list[dict]:
    seconds = len(speech24) / 24000
    speech8 = soxr.resample(speech24, 24000, 8000).astype(np.float32)
    speech16 = soxr.resample(speech24, 24000, 16000).astype(np.float32)
    speech22 = soxr.resample(speech24, 24000, 22050).astype(np.float32)
    decoded_s = sum(sf.info(str(p)).duration for p in paths)
    vocos, slaney, energy, fbank, f0 = VocosMel(), SlaneyMel(), Energy(), KaldiFbank(), F0()
    batch24 = torch.from_numpy(speech24[: 24000 * 4 * (len(speech24) // (24000 * 4))].reshape(-1, 24000 * 4))
    batch16 = torch.from_numpy(speech16[: 16000 * 4 * (len(speech16) // (16000 * 4))].reshape(-1, 16000 * 4))

    def trainer_mel() -> None:
        with torch.inference_mode():
            mel_spectrogram(batch24, **vocos_mel_kwargs())

    def trainer_fbank() -> None:
        with torch.inference_mode():
            kaldi_fbank_torch(batch16)

    rows = [
        ("decode", "soundfile, 8 kHz int16 wav -> float32", decoded_s,
         lambda: [sf.read(p, dtype="float32") for p in paths]),
        ("resample", "soxr HQ 8 -> 24 kHz", seconds, lambda: soxr.resample(speech8, 8000, 24000)),
        ("resample", "soxr HQ 24 -> 16 kHz", seconds, lambda: soxr.resample(speech24, 24000, 16000)),
        ("vocos_mel", "VocosMel, 24 kHz, float64 STFT", seconds, lambda: vocos(speech24)),
        ("slaney_mel", "SlaneyMel, 22.05 kHz, float64 STFT", seconds, lambda: slaney(speech22)),
        ("mel (trainer)", "mel_spectrogram float32, 4 s crops batched", batch24.numel() / 24000, trainer_mel),
        ("energy", "Energy, 24 kHz hop 256", seconds, lambda: energy(speech24)),
        ("kaldi_fbank", "KaldiFbank (kaldi-native-fbank), 16 kHz", seconds, lambda: fbank(speech16)),
        ("fbank (trainer)", "kaldi_fbank_torch float32, 4 s crops batched", batch16.numel() / 16000, trainer_fbank),
        ("f0 yin", "F0 default backend, 24 kHz hop 256", seconds, lambda: f0(speech24)),
    ]
    out = []
    for name, what, audio_s, fn in rows:
        cpu, wall = cpu_seconds(fn, repeat)
        out.append({"stage": name, "what": what, "audio_s": round(audio_s, 2),
                    "x_rt_cpu": audio_s / cpu, "x_rt_wall": audio_s / wall})
    return out


def f0_accuracy(clips: list[tuple[str, np.ndarray]], backends: list[str]) -> tuple[list[dict], list[dict]]:
    """Per-backend GPE/VDE against harvest (per source and overall) and per-backend speed on the same clips."""
    tracks: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    speed = []
    for backend in ["harvest"] + backends:
        feat = F0(backend=backend)
        feat(clips[0][1][:24000])  # warm-up (numba compile / imports)
        res, cpu, wall = [], 0.0, 0.0
        for _, x in clips:
            c0, w0 = time.process_time(), time.perf_counter()
            out = feat(x)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            res.append((out["f0"], out["voiced"].astype(bool)))
        tracks[backend] = res
        audio_s = sum(len(x) for _, x in clips) / 24000
        speed.append({"stage": f"f0 {backend}", "what": f"per clip, {len(clips)} clips", "audio_s": round(audio_s, 2),
                      "x_rt_cpu": audio_s / cpu, "x_rt_wall": audio_s / wall})
    table = []
    for backend in backends:
        for source in ("asterisk", "espeak", "all"):
            idx = [i for i, (name, _) in enumerate(clips) if source == "all" or name.startswith(source)]
            if not idx:
                continue
            ref_f0 = np.concatenate([tracks["harvest"][i][0] for i in idx])
            ref_v = np.concatenate([tracks["harvest"][i][1] for i in idx])
            f0 = np.concatenate([tracks[backend][i][0] for i in idx])
            v = np.concatenate([tracks[backend][i][1] for i in idx])
            both = ref_v & v
            gross = np.abs(f0[both] / ref_f0[both] - 1) > 0.2
            table.append({"backend": backend, "source": source, "clips": len(idx), "frames": int(len(v)),
                          "gpe": float(gross.mean()), "vde": float(np.mean(ref_v != v)),
                          "voiced_ref": float(ref_v.mean()), "voiced": float(v.mean())})
    if {"dio", "praat"} <= set(tracks):
        # harvest has its own octave errors (espeak's female voices): GPE on the frames where dio and praat
        # both agree with harvest within 20 % is a cleaner reading of pitch accuracy.
        ref_f0 = np.concatenate([f for f, _ in tracks["harvest"]])
        confirmed = ref_f0 > 0
        for other in ("dio", "praat"):
            f = np.concatenate([f for f, _ in tracks[other]])
            confirmed &= (f > 0) & (np.abs(f / np.maximum(ref_f0, 1e-9) - 1) <= 0.2)
        for backend in [b for b in backends if b not in ("dio", "praat")]:
            f0 = np.concatenate([f for f, _ in tracks[backend]])
            v = np.concatenate([v for _, v in tracks[backend]])
            both = confirmed & v
            table.append({"backend": backend, "source": "all, harvest confirmed by dio+praat",
                          "clips": len(clips), "frames": int(confirmed.sum()),
                          "gpe": float(np.mean(np.abs(f0[both] / ref_f0[both] - 1) > 0.2)), "vde": None,
                          "voiced_ref": 1.0, "voiced": float(v[confirmed].mean())})
    return table, speed


def markdown(speed: list[dict], accuracy: list[dict], info: dict) -> str:
    lines = [f"Machine: {info['cpu']}, 1 thread; torch {info['versions']['torch']}, "
             f"numba {info['versions']['numba']}.", "",
             "| stage | what | audio (s) | x RT per core (CPU time) | x RT (wall) |", "|---|---|---:|---:|---:|"]
    for r in speed:
        lines.append(f"| {r['stage']} | {r['what']} | {r['audio_s']:.0f} | {r['x_rt_cpu']:,.0f} | {r['x_rt_wall']:,.0f} |")
    lines += ["", "| F0 backend vs harvest | source | clips | frames | GPE | VDE | voiced (harvest) | voiced |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in accuracy:
        vde = "-" if r["vde"] is None else f"{100 * r['vde']:.1f} %"
        lines.append(f"| {r['backend']} | {r['source']} | {r['clips']} | {r['frames']} | {100 * r['gpe']:.1f} % | "
                     f"{vde} | {100 * r['voiced_ref']:.0f} % | {100 * r['voiced']:.0f} % |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write results here")
    p.add_argument("--prompts", type=int, default=30, help="Asterisk prompts (speed and accuracy material)")
    p.add_argument("--espeak", type=int, default=8, help="espeak-ng sentences for the F0 accuracy table")
    p.add_argument("--repeat", type=int, default=3, help="runs per speed measurement (best is kept)")
    p.add_argument("--f0-backends", default="yin,dio,praat", help="compared with harvest")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import numba

    numba.set_num_threads(1)
    t0 = time.perf_counter()
    info = machine_info()
    with tempfile.TemporaryDirectory() as tmp:
        paths, clips = load_material(a.prompts, a.espeak, Path(tmp))
    speech24 = np.concatenate([x for name, x in clips if name.startswith("asterisk")])
    speed = speed_table(paths, speech24, a.repeat)
    accuracy, f0_speed = f0_accuracy(clips, [b for b in a.f0_backends.split(",") if b])
    speed += f0_speed
    info["bench_seconds"] = round(time.perf_counter() - t0, 1)
    print(markdown(speed, accuracy, info))
    print(f"\n({info['bench_seconds']} s)")
    if a.json:
        a.json.write_text(json.dumps({"machine": info, "speed": speed, "f0_accuracy": accuracy}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
