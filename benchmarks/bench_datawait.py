"""Data-wait of a training loop fed by make_loader: how long the step waits for a batch that is not ready.

    python benchmarks/make_loader_corpus.py /tmp/loaderbench/big
    audiopipe shard --corpus /tmp/loaderbench/big --out /tmp/loaderbench/bigshards --preset f5tts --shard-size 32MB
    python benchmarks/bench_datawait.py --shards /tmp/loaderbench/bigshards \\
        --json benchmarks/results/datawait.json --plot docs/img/datawait.png

The step is synthetic and releases the GIL as a real one does (CUDA launches and syncs do): `sleep` is
time.sleep(step), `gemm` repeats a 256 x 256 float32 torch.mm on one thread until it has run ~step ms
(calibrated first). Steps of 20, 50 and 200 ms. Loaders (same corpus, sampler, budget and seed):

  prefetch0   make_loader(num_workers=0, prefetch=0): the batch is built on the training thread when asked (no
              overlap)
  prefetch2   make_loader(num_workers=0, prefetch=2): built by a background thread while the step runs
  workers2    make_loader(num_workers=2, prefetch=0): two DataLoader worker processes, one batch ready each
              (torch's prefetch_factor 1; the results in docs/bench-loader.md were measured with 2), no thread

Per loader and step: `wait_share` = time spent in next(loader) / wall time of the loop, over --passes whole
epochs, each epoch's first batch excluded (the start of a pass is reported apart: `first_batch_ms`).
`loader_ms` is the loader's own time per batch with no step at all (the time it would need to keep up);
`step_ms_measured` what the step really took (on a busy machine a calibrated GEMM drifts). The target:
wait_share < 0.5 % whenever loader_ms < the step's time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from audiopipe.reader.loader import make_loader
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ (the script's own folder is on sys.path)

LOADERS = {"prefetch0": {"prefetch": 0, "num_workers": 0},
           "prefetch2": {"prefetch": 2, "num_workers": 0},
           "workers2": {"prefetch": 0, "num_workers": 2}}


class Step:
    """A synthetic training step of about `ms` milliseconds that releases the GIL."""

    def __init__(self, kind: str, ms: float):
        self.kind, self.ms = kind, ms
        self.reps = 0
        if kind == "gemm":
            self.a = torch.randn(256, 256)
            self.b = torch.randn(256, 256)
            for _ in range(20):  # warm up
                torch.mm(self.a, self.b)
            t0 = time.perf_counter()
            n = 200
            for _ in range(n):
                torch.mm(self.a, self.b)
            per = (time.perf_counter() - t0) / n
            self.reps = max(1, round(ms / 1e3 / per))
        elif kind != "sleep":
            raise ValueError(f"step kind must be sleep or gemm, got {kind!r}")

    def __call__(self, batch: dict) -> None:
        if self.kind == "sleep":
            time.sleep(self.ms / 1e3)
            return
        for _ in range(self.reps):
            torch.mm(self.a, self.b)


def loader_alone(shards: Path, name: str, budget: int, seed: int) -> tuple[float, int]:
    """Mean seconds per batch of one pass with no step (first batch excluded), and the pass' batch count."""
    loader = make_loader(shards, ["mel"], max_frames=budget, seed=seed, **LOADERS[name])
    loader.set_epoch(0)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    n = sum(1 for _ in it)
    return (time.perf_counter() - t0) / max(n, 1), n + 1


def run(shards: Path, name: str, step: Step, budget: int, seed: int, passes: int) -> dict:
    loader = make_loader(shards, ["mel"], max_frames=budget, seed=seed, **LOADERS[name])
    waits, wall, firsts, batches, stepping, each = 0.0, 0.0, [], 0, 0.0, []
    for epoch in range(passes):
        loader.set_epoch(epoch)
        t_start = time.perf_counter()
        it = iter(loader)
        batch = next(it)
        firsts.append(time.perf_counter() - t_start)
        step(batch)
        t_loop = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            waits += t1 - t0
            each.append(t1 - t0)
            step(batch)
            stepping += time.perf_counter() - t1
            batches += 1
        wall += time.perf_counter() - t_loop
        del it, batch
    return {"loader": name, "step_kind": step.kind, "step_ms": step.ms, "batches": batches,
            "wait_share": waits / wall if wall else 0.0, "wait_ms_per_batch": 1e3 * waits / max(batches, 1),
            "step_ms_measured": 1e3 * stepping / max(batches, 1),
            # A few long waits (the thread got no CPU on a busy machine) or many short ones?
            "wait_ms_median": 1e3 * float(np.median(each)) if each else 0.0,
            "wait_ms_p95": 1e3 * float(np.percentile(each, 95)) if each else 0.0,
            "wait_ms_max": 1e3 * max(each) if each else 0.0,
            "first_batch_ms": 1e3 * float(np.median(firsts))}


def markdown(rows: list[dict]) -> str:
    head = ("step", "step ms measured", "loader", "loader ms/batch alone", "data-wait share", "wait ms/batch",
            "wait ms median / p95 / max", "range over rounds",
            "epoch start ms", "target met")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        met = ("yes" if r["wait_share"] < 0.005 else
               "no" if r["loader_ms"] < r["step_ms_measured"] else "n/a (loader slower)")
        lines.append(f"| {r['step_kind']} {r['step_ms']:g} ms | {r['step_ms_measured']:.1f} | {r['loader']} | "
                     f"{r['loader_ms']:.1f} | "
                     f"{r['wait_share']:.2%} | {r['wait_ms_per_batch']:.2f} | "
                     f"{r['wait_ms_median']:.2f} / {r['wait_ms_p95']:.1f} / {r['wait_ms_max']:.0f} | "
                     f"{r['wait_share_min']:.2%}-{r['wait_share_max']:.2%} | {r['first_batch_ms']:.0f} | {met} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    plt = pyplot()

    kinds = sorted({r["step_kind"] for r in rows})
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    names = [n for n in LOADERS if any(r["loader"] == n for r in rows)]
    for ax, kind in zip(axes[0], kinds):
        steps = sorted({r["step_ms"] for r in rows if r["step_kind"] == kind})
        width = 0.8 / len(names)
        for j, name in enumerate(names):
            vals = [next((r["wait_share"] for r in rows if r["step_kind"] == kind and r["step_ms"] == s
                          and r["loader"] == name), np.nan) for s in steps]
            ax.bar(np.arange(len(steps)) + j * width, [max(v, 1e-5) for v in vals], width, label=name)
        ax.axhline(0.005, color="grey", linestyle="dashed", label="target 0.5 %")
        ax.set_yscale("log")
        ax.set_xticks(np.arange(len(steps)) + 0.4 - width / 2, [f"{s:g} ms" for s in steps])
        ax.set_title(f"{kind} step: data-wait share of the loop")
        ax.legend(fontsize=8)
    fig.suptitle(f"bench_datawait (mmap loader, f5tts mels, 38,400-frame batches); {machine}", fontsize=9)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, required=True)
    p.add_argument("--steps-ms", default="20,50,200")
    p.add_argument("--kinds", default="sleep,gemm")
    p.add_argument("--loaders", default=",".join(LOADERS))
    p.add_argument("--budget", type=int, default=38_400)
    p.add_argument("--passes", type=int, default=2, help="epochs per measurement")
    p.add_argument("--rounds", type=int, default=2, help="all measurements this many times, interleaved")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="about a minute: sleep steps of 20 ms only, 1 pass, 1 round (overrides those options)")
    output_args(p)
    args = p.parse_args()
    if args.quick:
        args.steps_ms, args.kinds, args.passes, args.rounds = "20", "sleep", 1, 1
    torch.set_num_threads(1)  # the step uses one core, the loader's thread (or workers) the other
    names = args.loaders.split(",")
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        p.error(f"unknown loader(s) {', '.join(unknown)}; choose from {', '.join(LOADERS)}")
    alone = {}
    for name in names:
        per, n = loader_alone(args.shards, name, args.budget, args.seed)
        alone[name] = per
        print(f"{name}: {1e3 * per:.2f} ms per batch with no step, {n} batches per epoch", flush=True)
    steps = [Step(kind, float(ms)) for kind in args.kinds.split(",") for ms in args.steps_ms.split(",")]
    by_key: dict[tuple, list[dict]] = {}
    for r in range(args.rounds):
        for step in steps:
            for name in names:
                row = run(args.shards, name, step, args.budget, args.seed, args.passes)
                by_key.setdefault((step.kind, step.ms, name), []).append(row)
                print(f"round {r}: {step.kind} {step.ms:g} ms {name}: wait {row['wait_share']:.3%} "
                      f"({row['wait_ms_per_batch']:.2f} ms/batch)", flush=True)
    rows = []
    for (kind, ms, name), runs in by_key.items():
        shares = [x["wait_share"] for x in runs]
        mid = runs[int(np.argsort(shares)[len(shares) // 2])]  # the median round (the upper one of two)
        rows.append({**mid, "loader_ms": 1e3 * alone[name], "wait_share_min": min(shares),
                     "wait_share_max": max(shares), "rounds": len(runs)})
    table = markdown(rows)
    print(table)
    result = {"command": " ".join(["python", "benchmarks/bench_datawait.py", *sys.argv[1:]]),
              "machine": host(args.machine, torch=torch.__version__),
              "shards": str(args.shards), "budget_frames": args.budget, "rows": rows}
    write_results(result, args.json, lambda path: plot(rows, path, args.machine), args.plot)


if __name__ == "__main__":
    main()
