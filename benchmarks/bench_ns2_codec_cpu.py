"""The ns2 preset's speed on a CPU, split into what a machine's load changes and what it does not.

    python benchmarks/bench_ns2_codec_cpu.py --shards demo/shards_ast --codec-checkpoint demo/encodec \
        --json benchmarks/results/ns2_codec_cpu.json

Takes the clips of an existing ns2 shard job (its plan.json; every third utterance), decodes and resamples them
to 24 kHz, and encodes them with EnCodec on one thread (as the shard stage's CPU codec actor runs): one clip at a
time (what that actor does) and batched by `encode_batch` (up to 120 s of padded audio per pass), rounds
interleaved. Reports wall-clock and CPU-time real-time factors: CPU time does not depend on how many other
processes share the cores; wall time does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audiopipe.decode.audio import load_audio, resample  # noqa: E402
from audiopipe.features.codec import EncodecEncoder  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True, help="an ns2 shard folder (its plan.json names the clips)")
    p.add_argument("--codec-checkpoint", required=True)
    p.add_argument("--every", type=int, default=3, help="take every n-th utterance of the plan")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    plan = json.loads((Path(a.shards) / "plan.json").read_text())
    utts = [u for unit in plan["units"] for u in unit["utterances"]][:: a.every]
    wavs = []
    for u in utts:
        w, sr = load_audio(u["path"])
        wavs.append(resample(w, sr, 24000).astype(np.float32))
    audio = sum(map(len, wavs)) / 24000
    tok = EncodecEncoder(checkpoint=a.codec_checkpoint, device="cpu")
    tok.encode_batch(wavs[:1])
    res = []
    for rnd in range(a.rounds):
        for name, fn in (("one at a time", lambda: [tok.encode_batch([w]) for w in wavs]),
                         ("batched", lambda: tok.encode_batch(wavs))):
            load = os.getloadavg()[0]
            w0, c0 = time.perf_counter(), time.thread_time()
            fn()
            wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
            r = {"round": rnd, "mode": name, "clips": len(wavs), "audio_s": audio, "wall_s": wall, "cpu_s": cpu,
                 "x_rt_wall": audio / wall, "x_rt_cpu": audio / cpu, "load1_before": load}
            print(json.dumps(r), flush=True)
            res.append(r)
    Path(a.json).write_text(json.dumps({"cpus": os.cpu_count(), "threads": 1, "runs": res}, indent=1) + "\n")


if __name__ == "__main__":
    main()
