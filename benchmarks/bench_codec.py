"""EnCodec 24 kHz encoding speed on real speech: one clip at a time against batches, per CPU-second and by the clock.

    python benchmarks/bench_codec.py --threads 1 --batch 1,8 --rounds 3 --json benchmarks/results/codec.json

Random-initialised weights (the architecture and compute of facebook/encodec_24khz; no hub here), on the demo
corpus's recorded voices resampled to 24 kHz. `--threads 1` is what the shard stage's CPU codec actor runs
with. Per batch size and round (sizes interleaved within a round): x real time by the wall clock, and per
CPU-second of the encoding thread(s) (process CPU time), which does not depend on how many other processes share
the cores. On a CUDA machine the GPU is measured too (wall clock).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audiopipe.corpus.demo import build_demo_corpus  # noqa: E402
from audiopipe.decode.audio import load_audio, resample  # noqa: E402
from audiopipe.features.codec import EncodecEncoder  # noqa: E402
from results_io import host, spread, write_results  # noqa: E402  (benchmarks/ is the script's folder)


def speech(seconds: float) -> list:
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
    ap.add_argument("--json", type=Path)
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes (clips per encode_batch call)")
    ap.add_argument("--seconds", type=float, default=30.0, help="audio per measurement")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--machine", default="2-core shared CPU VM, no GPU (other jobs running)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    machine = host(a.machine, torch=torch.__version__)  # the load average as the run starts
    clips = speech(a.seconds)
    audio_s = sum(len(c) for c in clips) / 24000
    sizes = [int(b) for b in a.batch.split(",")]
    runs = []
    for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        codec = EncodecEncoder(random_init=True, device=dev)
        codec.encode_batch(clips[:2])  # warm-up (kernels, allocator)
        for rnd in range(a.rounds):
            for bs in sizes:
                w0, c0 = time.perf_counter(), time.process_time()
                for i in range(0, len(clips), bs):
                    codec.encode_batch(clips[i:i + bs])
                if dev == "cuda":
                    torch.cuda.synchronize()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                runs.append({"device": dev, "batch": bs, "round": rnd, "wall_s": wall, "cpu_s": cpu,
                             "x_rt_wall": audio_s / wall, "x_rt_cpu": audio_s / cpu})
                print(f"round {rnd} {dev} batch {bs}: {audio_s / wall:.1f}x real time by the clock, "
                      f"{audio_s / cpu:.1f}x per CPU-second", flush=True)
    rows = [{"device": dev, "batch": bs, **{k: spread([r[k] for r in runs if (r["device"], r["batch"]) == (dev, bs)])
                                            for k in ("x_rt_wall", "x_rt_cpu")}}
            for dev, bs in dict.fromkeys((r["device"], r["batch"]) for r in runs)]
    print("\n| device | batch | x real time per CPU-second | x real time by the clock |\n|---|---|---|---|")
    for r in rows:
        cpu, wall = r["x_rt_cpu"], r["x_rt_wall"]
        print(f"| {r['device']} | {r['batch']} | {cpu['median']:.1f} ({cpu['min']:.1f}-{cpu['max']:.1f}) | "
              f"{wall['median']:.1f} ({wall['min']:.1f}-{wall['max']:.1f}) |")
    result = {"command": " ".join(["python", "benchmarks/bench_codec.py", *sys.argv[1:]]),
              "machine": machine, "threads": torch.get_num_threads(),
              "clips": len(clips), "audio_s": audio_s, "rows": rows, "runs": runs}
    write_results(result, a.json, lambda path: None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
