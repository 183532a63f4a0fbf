"""EnCodec 24 kHz encoding throughput per device and batch size (x real time), on real speech.

    python benchmarks/bench_codec.py --json benchmarks/results/codec.json [--batch 1,8] [--seconds 30]

Uses random-initialised weights (same architecture, same compute as facebook/encodec_24khz; no hub here).
On a GPU machine it measures cuda too. Threads: torch's default for the device (on CPU, all cores).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audiopipe.corpus.demo import build_demo_corpus  # noqa: E402
from audiopipe.decode.audio import load_audio, resample  # noqa: E402
from audiopipe.features.codec import EncodecEncoder  # noqa: E402


def speech(seconds: float) -> list[np.ndarray]:
    root = Path(tempfile.mkdtemp(prefix="audiopipe-codec-")) / "wavs"
    build_demo_corpus(root, per_voice=12)  # 4 recorded voices
    clips, total = [], 0.0
    for p in sorted(root.rglob("*.wav")):
        wav, sr = load_audio(p)
        clips.append(resample(wav, sr, 24000))
        total += len(clips[-1]) / 24000
        if total >= seconds:
            break
    return clips


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default="benchmarks/results/codec.json")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--seconds", type=float, default=30.0, help="audio per measurement")
    a = ap.parse_args()
    clips = speech(a.seconds)
    audio_s = sum(len(c) for c in clips) / 24000
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for dev in devices:
        tok = EncodecEncoder(random_init=True, device=dev)
        tok.encode_batch(clips[:2])  # warm-up (kernels, allocator)
        for bs in [int(b) for b in a.batch.split(",")]:
            t0 = time.perf_counter()
            for i in range(0, len(clips), bs):
                tok.encode_batch(clips[i:i + bs])
            if dev == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            rows.append({"device": dev, "device_name": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
                         "batch": bs, "audio_s": audio_s, "wall_s": dt, "x_realtime": audio_s / dt,
                         "threads": torch.get_num_threads()})
            print(f"{dev} batch {bs}: {audio_s / dt:.1f}x real time", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"machine": {"platform": platform.platform(), "cpus": torch.get_num_threads()},
                                        "rows": rows}, indent=1))
    print("\n| device | batch | x real time |\n|---|---|---|")
    for r in rows:
        print(f"| {r['device']} ({r['device_name']}) | {r['batch']} | {r['x_realtime']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
