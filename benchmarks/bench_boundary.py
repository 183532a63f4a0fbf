"""The data wait at epoch boundaries: make_loader's look-ahead, which runs on into the next epoch, against a
look-ahead started afresh at every pass, under a synthetic step of fixed length.

    python benchmarks/bench_boundary.py --shards /tmp/loaderbench/bigshards \\
        --json benchmarks/results/boundary.json --plot docs/img/boundary.png

An epoch of 5 batches (the first rows of the corpus, as many as make 5 batches at --budget), 20 epochs, a step of
--step-ms (time.sleep: it releases the GIL as a GPU step does). Loaders, side by side, rounds interleaved:

  runs_on     make_loader(prefetch=2), num_workers=0: one thread builds batches from epoch e into e+1
  per_pass    the same loader's DataLoader wrapped at every pass in a new PrefetchIterator(depth 2): the thread
              starts when the pass does (how every pass began before the look-ahead ran on)
  prefetch0   make_loader(prefetch=0): every batch built on the training thread when asked

A batch's wait is the time from the end of the step before it until the batch is in hand; at a boundary that
includes set_epoch() and iter(). Reported per loader: the median and worst wait at the 19 boundaries and at the
80 batches inside epochs (the run's first batch is left out: nothing comes before it).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

from audiopipe.reader.loader import make_loader
from audiopipe.reader.prefetch import PrefetchIterator
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ (the script's own folder is on sys.path)

LOADERS = ("runs_on", "per_pass", "prefetch0")


def five_batch_subset(shards: Path, budget: int, seed: int) -> np.ndarray:
    """The first n rows of the corpus, n the largest that makes 5 batches an epoch (bisected: more rows never
    make fewer batches)."""
    def batches(n: int) -> int:
        return len(make_loader(shards, ["mel"], max_frames=budget, seed=seed, prefetch=0, subset=np.arange(n)))

    lo, hi = 1, len(make_loader(shards, ["mel"], max_frames=budget, seed=seed, prefetch=0).dataset)
    while lo < hi:  # the largest n with at most 5 batches
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if batches(mid) <= 5 else (lo, mid - 1)
    if batches(lo) != 5:
        raise SystemExit(f"bench_boundary: no prefix of the corpus makes 5 batches at --budget {budget}")
    return np.arange(lo)


def run(shards: Path, name: str, subset: np.ndarray, budget: int, seed: int, step_s: float, epochs: int) -> dict:
    loader = make_loader(shards, ["mel"], max_frames=budget, seed=seed, subset=subset,
                         prefetch=0 if name == "prefetch0" else 2)
    boundary, inside = [], []
    ready_at = time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        it = PrefetchIterator(iter(loader.dataloader), 2) if name == "per_pass" else iter(loader)
        j = 0
        while True:
            batch = next(it, None)
            waited = time.perf_counter() - ready_at
            if batch is None:
                break
            if epoch or j:
                (boundary if j == 0 else inside).append(waited)
            time.sleep(step_s)  # the step
            j += 1
            ready_at = time.perf_counter()
        if j != 5:
            raise RuntimeError(f"{name}: epoch {epoch} gave {j} batches, not 5")
    ms = lambda xs: [round(1000 * x, 3) for x in xs]  # noqa: E731
    return {"loader": name, "boundary_ms": ms(boundary), "inside_ms": ms(inside)}


def summarise(rounds: list[dict], step_ms: float) -> dict:
    b = np.concatenate([r["boundary_ms"] for r in rounds])
    i = np.concatenate([r["inside_ms"] for r in rounds])
    return {"loader": rounds[0]["loader"], "boundary_median_ms": float(np.median(b)), "boundary_max_ms": float(b.max()),
            "inside_median_ms": float(np.median(i)), "inside_max_ms": float(i.max()),
            "boundary_share_of_step": float(np.median(b) / step_ms), "per_round": rounds}


def markdown(rows: list[dict], step_ms: float) -> str:
    out = [f"| loader | wait at a boundary, median (max) | wait inside an epoch, median (max) | step |",
           "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['loader']} | {r['boundary_median_ms']:.2f} ms ({r['boundary_max_ms']:.1f}) | "
                   f"{r['inside_median_ms']:.2f} ms ({r['inside_max_ms']:.1f}) | {step_ms:g} ms |")
    return "\n".join(out)


def plot(rows: list[dict], path: Path, title: str) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 3.6))
    y = np.arange(len(rows))
    ax.barh(y - 0.18, [r["boundary_median_ms"] for r in rows], height=0.36, color="#c0392b",
            label="first batch of an epoch (19 boundaries a round)")
    ax.barh(y + 0.18, [r["inside_median_ms"] for r in rows], height=0.36, color="#2a6f97",
            label="batches inside an epoch (80 a round)")
    ax.set_yticks(y, [r["loader"] for r in rows])
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlabel("median wait for the batch, ms (symlog)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, required=True)
    p.add_argument("--budget", type=int, default=38_400, help="padded frames per batch")
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="every loader this many times, interleaved")
    p.add_argument("--loaders", default=",".join(LOADERS))
    p.add_argument("--seed", type=int, default=0)
    output_args(p)
    a = p.parse_args()
    names = [n for n in a.loaders.split(",") if n]
    subset = five_batch_subset(a.shards, a.budget, a.seed)
    load_start = os.getloadavg()
    per: dict[str, list[dict]] = {n: [] for n in names}
    for k in range(a.rounds):
        for n in names:
            per[n].append(run(a.shards, n, subset, a.budget, a.seed, a.step_ms / 1000, a.epochs))
            r = per[n][-1]
            print(f"[{k + 1}/{a.rounds}] {n:<10} boundary median {np.median(r['boundary_ms']):7.2f} ms, inside "
                  f"median {np.median(r['inside_ms']):7.2f} ms, load {os.getloadavg()[0]:.1f}", flush=True)
    rows = [summarise(per[n], a.step_ms) for n in names]
    print(markdown(rows, a.step_ms))
    result = {"command": "python benchmarks/bench_boundary.py " + " ".join(
                  f"--{k} {v}" for k, v in (("budget", a.budget), ("step-ms", a.step_ms), ("epochs", a.epochs),
                                            ("rounds", a.rounds))),
              "machine": {**host(a.machine), "load_average": list(load_start)},
              "load_average_end": list(os.getloadavg()),
              "utterances_per_epoch": int(subset.size), "batches_per_epoch": 5, "step_ms": a.step_ms,
              "loaders": rows}
    title = (f"wait for the batch, 20 epochs of 5 batches, {a.step_ms:g} ms step\n{a.machine}, "
             f"load {load_start[0]:.0f}-{os.getloadavg()[0]:.0f}")
    write_results(result, a.json, lambda path: plot(rows, path, title), a.plot)


if __name__ == "__main__":
    main()
