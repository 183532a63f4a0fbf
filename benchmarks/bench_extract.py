"""Extraction throughput of `audiopipe shard` on Ray, from 1 to N workers, on the demo corpus of real speech.

    python benchmarks/bench_extract.py --json benchmarks/results/extract.json [--workers 1,2] [--preset f5tts]

Each point is a fresh output folder and a fresh local Ray (started once per point, its start-up reported apart),
so the numbers are what a user sees. Throughput is audio seconds per wall second (x real time), and per worker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from audiopipe.corpus.demo import build_demo_corpus  # noqa: E402


def corpus_seconds(root: Path) -> float:
    return sum(sf.info(str(p)).duration for p in root.rglob("*.wav"))


def run_point(corpus: Path, out: Path, preset: str, workers: int, extra: list[str]) -> dict:
    env = dict(os.environ, RAY_AUTH_MODE="disabled")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out),
                        "--preset", preset, "--workers", str(workers), "--shard-size", "8MB", "--no-progress", *extra],
                       capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"shard failed with {workers} workers:\n{r.stderr}")
    m = json.loads((out / "manifest.json").read_text())
    return {"workers": workers, "wall_s": wall, "hours": m["totals"]["hours"], "written": m["totals"]["written"],
            "shards": len(m["shards"])}


def ray_startup_seconds(workers: int) -> float:
    code = ("import os,time; os.environ['RAY_AUTH_MODE']='disabled'; import ray; t=time.perf_counter(); "
            f"ray.init(num_cpus={workers}, include_dashboard=False, log_to_driver=False); "
            "print(time.perf_counter()-t); ray.shutdown()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return float(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default="benchmarks/results/extract.json")
    p.add_argument("--workers", default=None, help="comma list (default 1..cpu_count)")
    p.add_argument("--preset", default="f5tts")
    p.add_argument("--corpus", default=None, help="corpus folder (default: build the demo corpus in a temp dir)")
    a = p.parse_args()
    ncpu = os.cpu_count() or 1
    points = [int(w) for w in a.workers.split(",")] if a.workers else list(range(1, ncpu + 1))
    tmp = Path(tempfile.mkdtemp(prefix="audiopipe-bench-"))
    corpus = Path(a.corpus) if a.corpus else tmp / "wavs"
    if not a.corpus:
        build_demo_corpus(corpus)
    audio_s = corpus_seconds(corpus)
    startup = ray_startup_seconds(max(points))
    rows = []
    for w in points:
        res = run_point(corpus, tmp / f"out{w}", a.preset, w, [])
        # The CLI's wall time includes Python/torch import and Ray start-up; both are reported.
        res["audio_s"] = audio_s
        res["x_realtime"] = audio_s / res["wall_s"]
        res["x_realtime_excl_startup"] = audio_s / max(res["wall_s"] - startup, 1e-9)
        res["x_realtime_per_worker"] = res["x_realtime_excl_startup"] / w
        rows.append(res)
        print(f"workers {w}: {res['wall_s']:.1f} s wall, {res['x_realtime']:.0f}x real time "
              f"({res['x_realtime_excl_startup']:.0f}x without Ray start-up, {res['x_realtime_per_worker']:.0f}x per worker)",
              flush=True)
    base = rows[0]["x_realtime_excl_startup"]
    for r in rows:
        r["speedup_vs_first"] = r["x_realtime_excl_startup"] / base
    out = {"machine": {"cpus": ncpu, "platform": platform.platform(), "python": platform.python_version()},
           "preset": a.preset, "corpus_hours": audio_s / 3600, "ray_startup_s": startup, "points": rows}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1))
    print("\n| workers | wall s | x real time | x RT excl. Ray start | x RT per worker | speed-up |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['wall_s']:.1f} | {r['x_realtime']:.0f} | {r['x_realtime_excl_startup']:.0f} | "
              f"{r['x_realtime_per_worker']:.0f} | {r['speedup_vs_first']:.2f} |")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
