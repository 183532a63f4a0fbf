"""The sampler's start-up at scale: build, first batch, mid-epoch resume and peak memory, 1M to 50M utterances.

    python benchmarks/bench_plan_scale.py --json benchmarks/results/plan_scale.json --plot docs/img/plan_scale.png
    python benchmarks/bench_plan_scale.py --quick      # 1M utterances only (< 2 min)

Each case (corpus size x world size) runs in a FRESH process per round, so peak memory (ru_maxrss) and the
numba cache load are those of a real start. In it:
  lengths      libritts_like frame counts (audiopipe/bench/synthetic_lengths.py), made in chunks of 1M so that
               generating them does not set the memory peak; RSS after this is reported
  build        BucketBatchSampler(lengths, 38,400, rank=W/2, world_size=W)
  first batch  iter() + next(): plans epoch 0 and computes this rank's first batch
  resume       a second, fresh sampler (its build timed apart) + load_state_dict(state at the middle step of
               the epoch) + next(): the batch is checked equal to the one the first sampler yielded there
Targets at 50M x 1,024 ranks: first batch < 10 s, resume < 2 s, peak RSS < 2 GB. The median round is reported
with the range over rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

from results_io import child_env, child_result, host, output_args, pyplot, save, write_results  # benchmarks/ is on sys.path

CHUNK = 1_000_000
KIND, MAX_FRAMES, SEED, WORLD = "libritts_like", 38_400, 0, 1024


def lengths_of(n: int, kind: str, seed: int) -> np.ndarray:
    from audiopipe.bench.synthetic_lengths import synthetic_lengths

    out = np.empty(n, dtype=np.int64)
    for j, s in enumerate(range(0, n, CHUNK)):
        out[s : s + CHUNK] = synthetic_lengths(kind, min(CHUNK, n - s), seed=seed * 100_003 + j)
    return out


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(n: int, world: int) -> dict:
    from audiopipe.sampler.bucket import BucketBatchSampler

    lengths, max_frames, seed = lengths_of(n, KIND, SEED), MAX_FRAMES, SEED
    out = {"utterances": n, "world_size": world, "rss_after_lengths_mb": peak_mb()}
    rank = world // 2
    t0 = time.perf_counter()
    s = BucketBatchSampler(lengths, max_frames, seed=seed, rank=rank, world_size=world)
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    it = iter(s)
    first = next(it)
    out["first_batch_s"] = time.perf_counter() - t0
    out["build_and_first_batch_s"] = out["build_s"] + out["first_batch_s"]
    out["items_computed_for_first_batch"] = int(s._plan(0).items_computed)
    out["first_batch_items"] = len(first)
    out["steps_per_rank"] = len(s)
    out["pools"] = s.pools
    mid = len(s) // 2
    for _ in range(mid - 1):
        next(it)
    state = json.loads(json.dumps(s.state_dict()))
    want = next(it)
    out["peak_rss_to_first_batch_mb"] = peak_mb()
    # A real resume is a new process: the first sampler is gone before the fresh one is built.
    del s, it
    gc.collect()
    t0 = time.perf_counter()
    fresh = BucketBatchSampler(lengths, max_frames, seed=seed, rank=rank, world_size=world)
    out["resume_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh.load_state_dict(state)
    got = next(iter(fresh))
    out["resume_s"] = time.perf_counter() - t0
    out["resume_with_build_s"] = out["resume_build_s"] + out["resume_s"]
    out["resume_step"] = mid
    if got != want:
        raise SystemExit(f"resumed batch at step {mid} differs from the uninterrupted one")
    out["peak_rss_mb"] = peak_mb()
    return out


def median_round(runs: list[dict]) -> dict:
    """The round with the median build + first batch, with every timed figure's range over the rounds."""
    row = dict(sorted(runs, key=lambda r: r["build_and_first_batch_s"])[len(runs) // 2])
    for k in ("build_s", "first_batch_s", "build_and_first_batch_s", "resume_build_s", "resume_s",
              "resume_with_build_s", "peak_rss_mb"):
        row[f"{k}_range"] = [min(r[k] for r in runs), max(r[k] for r in runs)]
    row["rounds"] = len(runs)
    return row


def plot(rows: list[dict], path: Path, machine: str) -> None:
    n = [r["utterances"] for r in rows]
    fig, (ax_t, ax_m) = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for key, label in (("build_s", "build"), ("first_batch_s", "first batch (after build)"),
                       ("resume_s", "resume: load_state_dict + next"),
                       ("resume_with_build_s", "resume incl. a fresh build")):
        lo = [r[key] - r[f"{key}_range"][0] for r in rows]
        hi = [r[f"{key}_range"][1] - r[key] for r in rows]
        ax_t.errorbar(n, [r[key] for r in rows], yerr=[lo, hi], marker="o", capsize=3, label=label)
    ax_t.axhline(10, color="grey", linestyle="dashed", label="targets at 50M: first batch 10 s, resume 2 s")
    ax_t.axhline(2, color="grey", linestyle="dashed")
    ax_m.plot(n, [r["peak_rss_mb"] for r in rows], "o-", label="peak RSS")
    ax_m.plot(n, [r["rss_after_lengths_mb"] for r in rows], "s--", label="RSS with the lengths alone")
    ax_m.axhline(2048, color="grey", linestyle="dashed", label="target 2 GB")
    for ax, title in ((ax_t, "seconds"), (ax_m, "MB")):
        ax.set_xscale("log")
        ax.set_xlabel("utterances")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ranks = rows[0]["world_size"] if rows else 0
    fig.suptitle(f"bench_plan_scale: BucketBatchSampler, {ranks:,} ranks; {machine}", fontsize=9)
    save(fig, path)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:  # one case in this fresh process
        print("RESULT " + json.dumps(child(int(sys.argv[2]), int(sys.argv[3]))))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000000,10000000,50000000", help="comma-separated utterance counts")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per case; the median is reported")
    p.add_argument("--quick", action="store_true", help="1M utterances only")
    output_args(p, json_required=True)
    args = p.parse_args()
    rows = [median_round([child_result([sys.executable, __file__, "--child", str(n), str(WORLD)],
                                       what=f"case {n}", env=child_env()) for _ in range(args.rounds)])
            for n in ([1_000_000] if args.quick else [int(x) for x in args.sizes.split(",")])]
    result = {"command": " ".join(["python", "benchmarks/bench_plan_scale.py", *sys.argv[1:]]),
              "machine": host(args.machine), "budget_frames": MAX_FRAMES, "kind": KIND,
              "targets_at_50M": {"first_batch_s": 10, "resume_s": 2, "peak_rss_mb": 2048}, "rows": rows}
    write_results(result, args.json, lambda path: plot(rows, path, args.machine), args.plot)


if __name__ == "__main__":
    main()
