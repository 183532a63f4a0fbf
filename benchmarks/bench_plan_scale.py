"""The sampler's start-up at scale: build, first batch, mid-epoch resume and peak memory, 1M to 50M utterances
x 1,024 ranks. Each case runs in a fresh process per round (its own peak memory and numba cache load); the median
round is reported with the range. The commands and what each figure covers: docs/sampler.md ("Plans at scale").
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import numpy as np

from results_io import child_env, child_result, host, output_args, peak_rss_mb, pyplot, save, write_results

CHUNK = 1_000_000
KIND, MAX_FRAMES, SEED, WORLD = "libritts_like", 38_400, 0, 1024


def lengths_of(n: int, kind: str, seed: int) -> np.ndarray:
    from audiopipe.bench.synthetic_lengths import synthetic_lengths

    out = np.empty(n, dtype=np.int64)
    for j, s in enumerate(range(0, n, CHUNK)):
        out[s : s + CHUNK] = synthetic_lengths(kind, min(CHUNK, n - s), seed=seed * 100_003 + j)
    return out


def child(n: int, world: int) -> dict:
    from audiopipe.sampler.bucket import BucketBatchSampler

    lengths = lengths_of(n, KIND, SEED)
    out = {"utterances": n, "world_size": world, "rss_after_lengths_mb": peak_rss_mb()}
    t0 = time.perf_counter()
    s = BucketBatchSampler(lengths, MAX_FRAMES, seed=SEED, rank=world // 2, world_size=world)
    out["build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    it = iter(s)
    first = next(it)
    out["first_batch_s"] = time.perf_counter() - t0
    out.update(build_and_first_batch_s=out["build_s"] + out["first_batch_s"], first_batch_items=len(first),
               items_computed_for_first_batch=int(s._plan(0).items_computed), steps_per_rank=len(s), pools=s.pools)
    mid = len(s) // 2
    for _ in range(mid - 1):
        next(it)
    state = json.loads(json.dumps(s.state_dict()))
    want = next(it)
    out["peak_rss_to_first_batch_mb"] = peak_rss_mb()
    # A real resume is a new process: the first sampler is gone before the fresh one is built.
    del s, it
    gc.collect()
    t0 = time.perf_counter()
    fresh = BucketBatchSampler(lengths, MAX_FRAMES, seed=SEED, rank=world // 2, world_size=world)
    out["resume_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    fresh.load_state_dict(state)
    got = next(iter(fresh))
    out["resume_s"] = time.perf_counter() - t0
    if got != want:
        raise SystemExit(f"resumed batch at step {mid} differs from the uninterrupted one")
    out.update(resume_with_build_s=out["resume_build_s"] + out["resume_s"], resume_step=mid,
               peak_rss_mb=peak_rss_mb())
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
    for ax, unit in ((ax_t, "seconds"), (ax_m, "MB")):
        ax.set(xscale="log", xlabel="utterances", ylabel=unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"bench_plan_scale: BucketBatchSampler, {WORLD:,} ranks; {machine}", fontsize=9)
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
