"""How well this machine itself scales the extraction floor from 1 to N processes: the ceiling any pipeline's
scaling is measured against.

    python benchmarks/bench_scaling_ceiling.py --corpus /tmp/extractbench/wav --files 480 --procs 2 --rounds 3 \
        --json benchmarks/results/scaling_ceiling.json

The floor of bench_extract.py (decode -> mono, soxr to 24 kHz, the stored vocos mel; one torch thread) runs on
the same files in 1 process, then in N independent processes at once, each on all the files (no pool, no
queue, no shared state, nothing written: only what a worker cannot avoid). Scaling is
(N x files / wall time of the N processes) / (N x files / wall time of 1 process) = t_1 / t_N. Where it is
below a target (issue 12: >= 90 % from 1 to 2 workers), no pipeline can reach that target on this machine:
the cores share caches, memory bandwidth, and on a VM whatever the hypervisor maps them to.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_extract import corpus_files, measure_floor  # noqa: E402


def _one(files: list[str], start, out) -> None:
    measure_floor([Path(f) for f in files[:3]])  # imports, kernels and first-touch costs before the clock
    start.wait()
    t0 = time.perf_counter()
    parts = measure_floor([Path(f) for f in files])
    out.put((time.perf_counter() - t0, os.getpid(), len(files), sum(parts.values())))


def run(files: list[str], procs: int) -> tuple[float, list[dict]]:
    """Wall seconds for `procs` processes each running the floor over every file, started together, and what
    each process reports (pid, files it ran, seconds inside the floor's three stages)."""
    ctx = mp.get_context("spawn")  # a clean interpreter each, as a Ray worker or a Pool child is
    start, out = ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_one, args=(files, start, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    time.sleep(5.0)  # every child past its warm-up (imports take ~2 s here)
    start.set()
    got = [out.get(timeout=1800) for _ in ps]
    for p in ps:
        p.join()
    return max(g[0] for g in got), [{"pid": g[1], "files": g[2], "floor_s": g[3]} for g in got]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", type=Path, default=Path("/tmp/extractbench/wav"))
    p.add_argument("--files", type=int, default=480, help="every k-th file of the corpus (0: all)")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="benchmarks/results/scaling_ceiling.json")
    p.add_argument("--machine", default="2-core CPU VM, no GPU, nothing else running")
    a = p.parse_args()
    all_files = corpus_files(a.corpus)
    if not all_files:
        p.error(f"no audio files under {a.corpus}")
    step = max(1, len(all_files) // a.files) if a.files else 1
    files = [str(f) for f in all_files[::step][:a.files or None]]
    rounds = []
    for r in range(a.rounds):
        t1, one = run(files, 1)
        tn, many = run(files, a.procs)
        rounds.append({"t1_s": t1, f"t{a.procs}_s": tn, "scaling": t1 / tn, "processes": [*one, *many]})
        print(f"round {r}: 1 process {t1:.2f} s, {a.procs} processes {tn:.2f} s -> scaling {t1 / tn:.2f}",
              flush=True)
    s = sorted(x["scaling"] for x in rounds)
    result = {"machine": a.machine, "cpus": os.cpu_count(), "platform": platform.platform(),
              "corpus": str(a.corpus), "files": len(files), "procs": a.procs, "rounds": rounds,
              "scaling_median": s[len(s) // 2], "scaling_range": [s[0], s[-1]],
              "command": " ".join(["python", *sys.argv])}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"scaling 1 -> {a.procs} of the floor: {result['scaling_median']:.2f} "
          f"({s[0]:.2f}-{s[-1]:.2f}) over {a.rounds} rounds; {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
