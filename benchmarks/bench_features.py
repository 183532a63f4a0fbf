"""Feature extraction speed (x real time per core, CPU time of this process), one stage at a time, on one thread;
the command and the table: docs/features.md#speed."""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before numpy/torch/numba load their thread pools: one thread everywhere

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402
import soxr  # noqa: E402
import torch  # noqa: E402

from results_io import ROOT, host, write_results  # noqa: E402  (benchmarks/ is the script's folder)

sys.path.insert(0, str(ROOT))

from audiopipe.corpus.demo import ASTERISK_SOUNDS, usable_asterisk_prompts  # noqa: E402
from audiopipe.features.energy import Energy  # noqa: E402
from audiopipe.features.f0 import F0  # noqa: E402
from audiopipe.features.fbank import KaldiFbank, kaldi_fbank_torch  # noqa: E402
from audiopipe.features.mel import SlaneyMel, VocosMel, mel_spectrogram, vocos_mel_kwargs  # noqa: E402


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


def speed_table(n_prompts: int, repeat: int) -> list[dict]:
    # The material: Asterisk prompts (8 kHz real speech), resampled to 24 kHz and joined.
    paths = [ASTERISK_SOUNDS / f"{name}.wav" for name, _ in usable_asterisk_prompts(n_prompts, max_s=12.0)]
    speech24 = np.concatenate([soxr.resample(*sf.read(p, dtype="float32"), 24000).astype(np.float32) for p in paths])
    seconds = len(speech24) / 24000
    speech8, speech16, speech22 = (soxr.resample(speech24, 24000, sr).astype(np.float32)
                                   for sr in (8000, 16000, 22050))
    decoded_s = sum(sf.info(str(p)).duration for p in paths)
    vocos, slaney, energy, fbank, f0 = VocosMel(), SlaneyMel(), Energy(), KaldiFbank(), F0()
    batch24 = torch.from_numpy(speech24[: 24000 * 4 * (len(speech24) // (24000 * 4))].reshape(-1, 24000 * 4))
    batch16 = torch.from_numpy(speech16[: 16000 * 4 * (len(speech16) // (16000 * 4))].reshape(-1, 16000 * 4))
    trainer_mel = torch.inference_mode()(lambda: mel_spectrogram(batch24, **vocos_mel_kwargs()))
    trainer_fbank = torch.inference_mode()(lambda: kaldi_fbank_torch(batch16))

    rows = [
        ("decode", "soundfile, 8 kHz int16 wav -> float32", decoded_s,
         lambda: [sf.read(p, dtype="float32") for p in paths]),
        ("resample", "soxr HQ 8 -> 24 kHz", seconds, lambda: soxr.resample(speech8, 8000, 24000)),
        ("resample", "soxr HQ 24 -> 16 kHz", seconds, lambda: soxr.resample(speech24, 24000, 16000)),
        ("vocos_mel", "VocosMel, 24 kHz, float32 STFT", seconds, lambda: vocos(speech24)),
        ("slaney_mel", "SlaneyMel, 22.05 kHz, float32 STFT", seconds, lambda: slaney(speech22)),
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True, help="write results here")
    p.add_argument("--prompts", type=int, default=30, help="Asterisk prompts (the material)")
    p.add_argument("--repeat", type=int, default=3, help="runs per speed measurement (best is kept)")
    a = p.parse_args(argv)
    import kaldi_native_fbank
    import numba

    info = host("1 thread", numpy=np.__version__, torch=torch.__version__, numba=numba.__version__,
                soxr=soxr.__version__, soundfile=sf.__version__, torch_threads=torch.get_num_threads(),
                kaldi_native_fbank=getattr(kaldi_native_fbank, "__version__", "?"))
    write_results({"machine": info, "speed": speed_table(a.prompts, a.repeat)}, a.json, lambda path: None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
