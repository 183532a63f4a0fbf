"""EnCodec 24 kHz encoding speed on real speech: one clip at a time against batches, per CPU-second and by the clock
(docs/extraction.md#codec-encodec-24-khz-16-codebooks). Random-init weights have the released model's compute; a
CUDA machine adds the GPU.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from results_io import MACHINE, ROOT, host, spread, write_results

sys.path.insert(0, str(ROOT))

from audiopipe.corpus.demo import build_demo_corpus  # noqa: E402
from audiopipe.decode.audio import load_audio, resample  # noqa: E402
from audiopipe.features.codec import EncodecEncoder  # noqa: E402


def speech() -> list:
    """At least 30 s of the demo corpus's 4 recorded voices, as 24 kHz clips."""
    with tempfile.TemporaryDirectory(prefix="audiopipe-codec-") as d:
        build_demo_corpus(Path(d) / "wavs", per_voice=12)
        clips = []
        for p in sorted(Path(d).rglob("*.wav")):
            clips.append(resample(*load_audio(p), 24000))
            if sum(map(len, clips)) >= 30 * 24000:
                break
    return clips


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8", help="comma-separated batch sizes (clips per encode_batch call)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads on the CPU (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--machine", default=MACHINE, help="label for the JSON")
    ap.add_argument("--json", type=Path, required=True, help="write the results here")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    machine = host(a.machine, torch=torch.__version__)  # the load average as the run starts
    clips = speech()
    audio_s = sum(map(len, clips)) / 24000
    runs = []
    for dev in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
        codec = EncodecEncoder(random_init=True, device=dev)
        codec.encode_batch(clips[:2])  # warm-up (kernels, allocator)
        for rnd in range(a.rounds):
            for bs in (int(b) for b in a.batch.split(",")):
                w0, c0 = time.perf_counter(), time.process_time()
                for i in range(0, len(clips), bs):
                    codec.encode_batch(clips[i:i + bs])
                if dev == "cuda":
                    torch.cuda.synchronize()
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                runs.append({"device": dev, "batch": bs, "round": rnd, "wall_s": wall, "cpu_s": cpu,
                             "x_rt_wall": audio_s / wall, "x_rt_cpu": audio_s / cpu})
    rows = [{"device": dev, "batch": bs, **{k: spread([r[k] for r in runs if (r["device"], r["batch"]) == (dev, bs)])
                                            for k in ("x_rt_wall", "x_rt_cpu")}}
            for dev, bs in dict.fromkeys((r["device"], r["batch"]) for r in runs)]
    result = {"command": " ".join(["python", "benchmarks/bench_codec.py", *sys.argv[1:]]), "machine": machine,
              "threads": torch.get_num_threads(), "clips": len(clips), "audio_s": audio_s, "rows": rows, "runs": runs}
    write_results(result, a.json, lambda path: None, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
