"""The data wait of a training loop fed by make_loader: how long each step waits for a batch that is not ready.
The commands, the results and what each figure counts: docs/bench-loader.md (data-wait under a training step) and
docs/loader.md (the wait at an epoch boundary).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from audiopipe.reader.loader import make_loader
from results_io import grouped_bars, host, output_args, pyplot, save, spread, write_results

LOADERS = {"prefetch0": {"prefetch": 0, "num_workers": 0},  # each batch built on the training thread when asked
           "prefetch2": {"prefetch": 2, "num_workers": 0},  # make_loader's default: a thread builds while a step runs
           "workers2": {"prefetch": 0, "num_workers": 2}}
STEPS_MS = (20.0, 50.0, 200.0)


class Step:
    """A synthetic training step of about `ms` milliseconds that releases the GIL: `sleep`, or `gemm` (a 256 x 256
    float32 torch.mm repeated on one thread, calibrated to the step: `step_ms_measured` says what it took)."""

    def __init__(self, kind: str, ms: float):
        self.kind, self.ms, self.reps = kind, ms, 0
        if kind == "gemm":
            self.a, self.b = torch.randn(256, 256), torch.randn(256, 256)
            for _ in range(20):  # warm up
                torch.mm(self.a, self.b)
            t0 = time.perf_counter()
            for _ in range(200):
                torch.mm(self.a, self.b)
            self.reps = max(1, round(ms / 1e3 / ((time.perf_counter() - t0) / 200)))

    def __call__(self) -> None:
        if self.kind == "sleep":
            time.sleep(self.ms / 1e3)
        for _ in range(self.reps):
            torch.mm(self.a, self.b)


def timeline(loader, epochs: int, step) -> list[list[tuple[float, float]]]:
    """Per epoch, per batch: (wait, step) seconds."""
    out, ready = [], time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        rows = []
        for _ in loader:
            t = time.perf_counter()
            step()
            rows.append((t - ready, time.perf_counter() - t))
            ready = time.perf_counter()
        out.append(rows)
    return out


def datawait(shards: Path, name: str, step: Step, a: argparse.Namespace) -> dict:
    loader = make_loader(shards, ["mel"], max_frames=a.budget, **LOADERS[name])
    epochs = timeline(loader, a.passes, step)
    waits = np.array([w for e in epochs for w, _ in e[1:]])
    steps = np.array([s for e in epochs for _, s in e[1:]])
    return {"loader": name, "step_kind": step.kind, "step_ms": step.ms, "batches": int(waits.size),
            "wait_share": float(waits.sum() / (waits.sum() + steps.sum())),
            "wait_ms_per_batch": 1e3 * float(waits.mean()), "step_ms_measured": 1e3 * float(steps.mean()),
            # a few long waits (the thread got no core on a busy machine) or many short ones?
            "wait_ms_median": 1e3 * float(np.median(waits)), "wait_ms_p95": 1e3 * float(np.percentile(waits, 95)),
            "wait_ms_max": 1e3 * float(waits.max()),
            "first_batch_ms": 1e3 * float(np.median([e[0][0] for e in epochs]))}


def five_batch_subset(shards: Path, budget: int) -> np.ndarray:
    """The first n rows, n the largest that makes 5 batches in one pass (bisected: more rows never make fewer)."""
    def batches(n: int) -> int:
        return len(make_loader(shards, ["mel"], max_frames=budget, prefetch=0, passes=1, subset=np.arange(n)))

    lo, hi = 1, len(make_loader(shards, ["mel"], max_frames=budget, prefetch=0, passes=1).dataset)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if batches(mid) <= 5 else (lo, mid - 1)
    if batches(lo) != 5:
        raise SystemExit(f"bench_datawait: no prefix of the corpus makes 5 batches at --budget {budget}")
    return np.arange(lo)


def boundary(a: argparse.Namespace) -> dict:
    """20 epochs of one pass of 5 batches (the first rows of the corpus that make 5), a 50 ms sleep: the waits at the
    19 boundaries (set_epoch() and iter() included) and at the 80 batches inside epochs, over all rounds."""
    subset = five_batch_subset(a.shards, a.budget)
    step = Step("sleep", 50.0)
    per: dict[str, dict[str, list]] = {n: {"boundary_ms": [], "inside_ms": []} for n in ("prefetch2", "prefetch0")}
    for k in range(a.rounds):
        for name, got in per.items():
            loader = make_loader(a.shards, ["mel"], max_frames=a.budget, subset=subset, passes=1, **LOADERS[name])
            epochs = timeline(loader, 20, step)
            if any(len(e) != 5 for e in epochs):
                raise RuntimeError(f"{name}: an epoch did not give 5 batches")
            got["boundary_ms"] += [1e3 * e[0][0] for e in epochs[1:]]
            got["inside_ms"] += [1e3 * w for e in epochs for w, _ in e[1:]]
            print(f"[{k + 1}/{a.rounds}] {name}: boundary median {np.median(got['boundary_ms']):.2f} ms", flush=True)
    rows = [{"loader": n, **{f"{k[:-3]}_{f}_ms": float(getattr(np, f)(v)) for k, v in got.items()
                             for f in ("median", "max")}, **got} for n, got in per.items()]
    return {"utterances_per_epoch": int(subset.size), "batches_per_epoch": 5, "epochs": 20, "step_ms": 50.0,
            "loaders": rows}


def plot_boundary(rows: list[dict], path: Path, title: str) -> None:
    fig, ax = pyplot().subplots(figsize=(8, 3.5))
    series = {label: [spread(r[f"{key}_ms"]) for r in rows]
              for key, label in (("boundary", "first batch of an epoch"), ("inside", "batches inside an epoch"))}
    grouped_bars(ax, [r["loader"] for r in rows], series)
    ax.set(yscale="log", ylabel="wait for the batch, ms (median, range; log)")
    ax.set_title(title, fontsize=9)
    save(fig, path)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    kinds = sorted({r["step_kind"] for r in rows})
    fig, axes = pyplot().subplots(1, len(kinds), figsize=(6 * len(kinds), 4.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        here = sorted((r for r in rows if r["step_kind"] == kind), key=lambda r: r["step_ms"])
        series: dict[str, list[dict]] = {}
        for r in here:
            share = {"median": r["wait_share"], "min": r["wait_share_min"], "max": r["wait_share_max"]}
            series.setdefault(r["loader"], []).append({k: max(v, 1e-5) for k, v in share.items()})  # log scale
        grouped_bars(ax, [f"{s:g} ms" for s in sorted({r["step_ms"] for r in here})], series)
        ax.set_yscale("log")
        ax.set_title(f"{kind} step: data-wait share of the loop (median round, range)")
    fig.suptitle(f"bench_datawait (mmap loader, f5tts mels, 38,400-frame batches); {machine}", fontsize=9)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, required=True, help="a shard folder with a `mel` feature")
    p.add_argument("--boundary", action="store_true", help="only the wait at epoch boundaries: 20 epochs of 5 "
                   "batches, a 50 ms sleep, prefetch2 and prefetch0")
    p.add_argument("--loaders", default=",".join(LOADERS), help="comma-separated: prefetch0 (on the training "
                   "thread), prefetch2 (make_loader's default: a background thread), workers2 (2 DataLoader workers)")
    p.add_argument("--budget", type=int, default=38_400, help="padded frames per batch")
    p.add_argument("--passes", type=int, default=2, help="epochs per measurement")
    p.add_argument("--rounds", type=int, default=2, help="every measurement this many times, interleaved")
    output_args(p)
    a = p.parse_args()
    torch.set_num_threads(1)  # the step uses one core, the loader's thread (or workers) the other
    result = {"command": " ".join(["python", "benchmarks/bench_datawait.py", *sys.argv[1:]]),
              "machine": host(a.machine, torch=torch.__version__), "shards": str(a.shards), "budget_frames": a.budget}
    if a.boundary:
        result.update(boundary(a))
        title = f"wait for the batch, 20 epochs of 5 batches, 50 ms step\n{a.machine}"
        return write_results(result, a.json, lambda path: plot_boundary(result["loaders"], path, title), a.plot)
    names = a.loaders.split(",")
    if set(names) - set(LOADERS):
        p.error(f"--loaders are of {', '.join(LOADERS)}")
    alone = {}
    for name in names:
        e = timeline(make_loader(a.shards, ["mel"], max_frames=a.budget, **LOADERS[name]), 1, lambda: 0)
        alone[name] = 1e3 * float(np.mean([w for w, _ in e[0][1:]]))
    runs: dict[tuple, list[dict]] = {}
    steps = [Step(kind, ms) for kind in ("sleep", "gemm") for ms in STEPS_MS]
    for k in range(a.rounds):
        for step in steps:
            for name in names:
                row = datawait(a.shards, name, step, a)
                runs.setdefault((step.kind, step.ms, name), []).append(row)
                print(f"[{k + 1}/{a.rounds}] {step.kind} {step.ms:g} ms {name}: wait {row['wait_share']:.3%}",
                      flush=True)
    rows = []
    for (_, _, name), rs in runs.items():
        shares = [x["wait_share"] for x in rs]
        rows.append({**rs[int(np.argsort(shares)[len(shares) // 2])], "loader_ms": alone[name], "rounds": len(rs),
                     "wait_share_min": min(shares), "wait_share_max": max(shares)})
    result["rows"] = rows
    write_results(result, a.json, lambda path: plot(rows, path, a.machine), a.plot)


if __name__ == "__main__":
    main()
