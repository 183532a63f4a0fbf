"""Batching strategies on the same seeded length arrays (audiopipe/bench/synthetic_lengths.py) under one padded
budget of 38,400 frames: `audiopipe` (BucketBatchSampler dealt to --world-size ranks, all ranks' batches counted),
`f5_sort` (F5-TTS's DynamicBatchSampler) and `lhotse` (DynamicBucketingSampler, 30 buckets). docs/sampler.md gives
the commands (sections "Benchmark", "Small corpora" and "Few batch shapes"), what each figure counts and the results.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from audiopipe.bench.loaders import f5_sort_plan  # F5-TTS DynamicBatchSampler
from audiopipe.bench.synthetic_lengths import DISTRIBUTIONS, FRAME_RATE, synthetic_lengths
from audiopipe.collate.pad import PadCollator
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.plan import pair_overlap
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ is on sys.path

Batches = list[np.ndarray]
BUDGET = 38_400  # padded frames per batch, F5-TTS's
SEED = 0
LHOTSE = "lhotse_dynamic_bucketing (30 buckets)"


# A strategy: (lengths, ...) -> plan(epoch) -> that epoch's batches over all ranks.


def audiopipe_batches(lengths: np.ndarray, world: int, **options) -> Callable[[int], Batches]:
    samplers = [BucketBatchSampler(lengths, BUDGET, seed=SEED, rank=r, world_size=world, **options)
                for r in range(world)]

    def plan(epoch: int) -> Batches:
        out = []
        for s in samplers:
            s.set_epoch(epoch)
            out += [np.asarray(b) for b in s]
        return out

    plan.samplers = samplers  # type: ignore[attr-defined]
    return plan


def lhotse_batches(lengths: np.ndarray) -> Callable[[int], Batches]:
    import warnings

    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=n / FRAME_RATE, recording_duration=n / FRAME_RATE)
                            for i, n in enumerate(lengths.tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "eagerly read CutSet": fine for a benchmark
        sampler = DynamicBucketingSampler(cuts, max_duration=BUDGET / FRAME_RATE, num_buckets=30, shuffle=True,
                                          seed=SEED, drop_last=False)

    def plan(epoch: int) -> Batches:
        sampler.set_epoch(epoch)
        return [np.asarray([int(c.id.rsplit("-", 1)[1]) for c in batch]) for batch in sampler]

    return plan


def row(corpus: str, lengths: np.ndarray, name: str, plan: Callable[[int], Batches], **extra) -> dict:
    """One strategy's figures on one corpus (epoch 0, and how its batches change in epoch 1)."""
    t0 = time.perf_counter()
    e0 = plan(0)
    t_plan = time.perf_counter() - t0
    e1 = plan(1)
    sizes = np.array([b.size for b in e0], dtype=np.float64)
    longest = np.array([lengths[b].max() for b in e0], dtype=np.float64)
    samplers = getattr(plan, "samplers", None)
    shaped = samplers is not None and samplers[0].shapes is not None
    # With shapes a batch is padded to its shape (rows x edge), not to its own items x longest.
    padded = samplers[0].budget.padded(sizes, longest) if shaped else sizes * longest
    real = float(sum(lengths[b].sum() for b in e0))
    placed = np.concatenate(e0) if e0 else np.empty(0, dtype=np.int64)
    # Composition change from epoch 0 to 1: identical multi-item batches (and pair_overlap below).
    multi0 = {frozenset(b.tolist()) for b in e0 if b.size > 1}
    multi1 = [frozenset(b.tolist()) for b in e1 if b.size > 1]
    same = sum(b in multi0 for b in multi1)
    unique = int(np.unique(placed).size)
    return {"corpus": corpus, "items": int(lengths.size), **extra, "strategy": name, "batches": len(e0),
            "items_placed": unique, "items_repeated": int(placed.size - unique),
            "items_missing": int(lengths.size - unique), "padding_efficiency": real / float(padded.sum()),
            "fill_ratio": float(padded.mean() / BUDGET), "frame_fill": real / len(e0) / BUDGET if e0 else 0.0,
            "shapes_seen": len({samplers[0].shapes.shape(int(a), int(b)) if shaped else (a, b)
                                for a, b in zip(sizes.tolist(), longest.tolist())}),
            "over_budget_batches": int((padded > BUDGET).sum()),
            "worst_padded_over_budget": float(padded.max() / BUDGET),
            "same_batches_next_epoch": same / max(len(multi1), 1),
            "pairs_together_next_epoch": pair_overlap(e0, e1, lengths.size),
            "plan_seconds": t_plan}


def bench_resume(lengths: np.ndarray, world: int) -> dict:
    """load_state_dict + first batch at the start vs. near the end of an epoch: no replay, so about equal."""
    def sampler() -> BucketBatchSampler:
        return BucketBatchSampler(lengths, BUDGET, seed=SEED, rank=0, world_size=world)

    out = {"steps_per_rank": len(sampler())}
    for label, k in (("first_step", 0), ("last_step", out["steps_per_rank"] - 1)):
        probe = sampler()
        it = iter(probe)
        for _ in range(k):
            next(it)
        state = probe.state_dict()
        times = []
        for _ in range(3):
            fresh = sampler()
            t0 = time.perf_counter()
            fresh.load_state_dict(state)
            next(iter(fresh))
            times.append(time.perf_counter() - t0)
        out[f"resume_at_{label}_seconds"] = min(times)
    return out


def bench_collate(lengths: np.ndarray, channels: int = 100, batches: int = 16) -> dict:
    """Collate throughput in GB/s of real item bytes, the items read-only views into one large buffer (as mmap'd
    shards give), against memcpy (one large copy, out of cache) and a zeroed padded tensor allocated per batch.
    Interleaved rounds, the best of each: on a shared machine the load changes between runs."""
    import torch

    rng = np.random.default_rng(SEED)
    pool = rng.standard_normal(64 * 2**20 // 4, dtype=np.float32)  # 64 MiB, bigger than the caches
    pool.setflags(write=False)
    item_batches = []
    for b in list(BucketBatchSampler(lengths, BUDGET, seed=SEED))[:batches]:
        offsets = [(int(rng.integers(0, pool.size - channels * t)), t) for t in lengths[b].tolist()]
        item_batches.append([{"mel": pool[o:o + channels * t].reshape(channels, t)} for o, t in offsets])
    real_bytes = sum(it["mel"].nbytes for items in item_batches for it in items)

    def fresh_zeroed(items: list[dict]) -> torch.Tensor:
        out = torch.zeros(len(items), channels, max(it["mel"].shape[-1] for it in items))
        for i, it in enumerate(items):
            out.numpy()[i, :, : it["mel"].shape[-1]] = it["mel"]
        return out

    big_src = np.concatenate([pool] * 4)  # 256 MiB
    big_dst = np.empty_like(big_src)
    collate, collate_one = PadCollator(["mel"]), PadCollator(["mel"], ring_size=1)
    runs = {"memcpy": lambda: np.copyto(big_dst, big_src),
            "pad_collator": lambda: [collate(items) for items in item_batches],
            "pad_collator_ring1": lambda: [collate_one(items) for items in item_batches],
            "fresh_zeroed": lambda: [fresh_zeroed(items) for items in item_batches]}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(6):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    out = {"collate_batches": len(item_batches), "collate_items_gb": real_bytes / 1e9}
    out.update({f"{k}_gb_s": (big_src.nbytes if k == "memcpy" else real_bytes) / t / 1e9 for k, t in best.items()})
    out.update({f"{k}_vs_memcpy": out[f"{k}_gb_s"] / out["memcpy_gb_s"] for k in runs if k != "memcpy"})
    return out


def pools_rows(name: str, lengths: np.ndarray, world: int, min_efficiencies: tuple,
               pools: tuple = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)) -> list[dict]:
    """The pools knob, with and without the efficiency splits (min_efficiency 0: pure pooled sort-and-pack)."""
    return [row(name, lengths, f"audiopipe pools={k} min_efficiency={m}",
                audiopipe_batches(lengths, world, pools=k, min_efficiency=m), pools=k, min_efficiency=m)
            for m in min_efficiencies for k in pools]


def plot_tradeoff(rows: list[dict], path: Path, machine: str) -> None:
    cases = sorted({(r["corpus"], r["items"]) for r in rows})
    cols = min(3, len(cases))
    rows_ = -(-len(cases) // cols)
    fig, axes = pyplot().subplots(rows_, cols, figsize=(5.2 * cols, 4.4 * rows_), squeeze=False)
    for ax, (corpus, n) in zip(axes.ravel(), cases):
        here = [r for r in rows if r["corpus"] == corpus and r["items"] == n]
        for min_eff, style in ((0.0, "o-"), (0.97, "s--")):
            pts = sorted((r["pools"], r["pairs_together_next_epoch"], r["padding_efficiency"])
                         for r in here if r.get("min_efficiency") == min_eff)
            ax.plot([p[1] for p in pts], [p[2] for p in pts], style,
                    label=f"audiopipe, pools 1-32, min_efficiency={min_eff}")
            for pools, x, y in pts:
                ax.annotate(str(pools), (x, y), fontsize=6, textcoords="offset points", xytext=(3, 3))
        for r in here:
            if "pools" not in r:
                ax.plot(r["pairs_together_next_epoch"], r["padding_efficiency"], "*", markersize=11,
                        label=r["strategy"])
        ax.set(xscale="log", xlabel="pairs together again next epoch", ylabel="padding efficiency")
        ax.set_title(f"{corpus}, {n:,} utterances", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"bench_batching --tradeoff (point labels: pools; 38,400-frame budget)\n{machine}", fontsize=9)
    save(fig, path)


def plot(rows: list[dict], path: Path, machine: str) -> None:
    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = pyplot().subplots(2, len(corpora), figsize=(5.5 * len(corpora), 7.5), squeeze=False)
    for c, corpus in enumerate(corpora):
        for strategy in sorted({r["strategy"] for r in rows if r["corpus"] == corpus}):
            pts = sorted((r["items"], r["padding_efficiency"], r["pairs_together_next_epoch"]) for r in rows
                         if r["corpus"] == corpus and r["strategy"] == strategy)
            n = [p[0] for p in pts]
            axes[0][c].plot(n, [p[1] for p in pts], "o-", label=strategy)
            axes[1][c].plot(n, [p[2] for p in pts], "o-", label=strategy)
        axes[0][c].set_title(f"{corpus}: padding efficiency")
        axes[1][c].set_title(f"{corpus}: pairs together again next epoch")
        for ax in (axes[0][c], axes[1][c]):
            ax.set(xscale="log", xlabel="utterances")
            ax.grid(alpha=0.3)
        low = min(r["padding_efficiency"] for r in rows if r["corpus"] == corpus)
        axes[0][c].set_ylim(min(0.85, low - 0.02), 1.0)  # every strategy's points stay in view
        axes[1][c].set_yscale("log")
        axes[0][c].legend(fontsize=8)
    fig.suptitle(f"bench_batching, budget 38,400 padded frames; {machine}", fontsize=10)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1000,3000,10000,100000,1000000", help="comma-separated corpus sizes")
    p.add_argument("--world-size", type=int, default=8, help="ranks audiopipe deals to (all ranks' batches counted)")
    p.add_argument("--no-lhotse", action="store_true", help="leave lhotse's DynamicBucketingSampler out")
    p.add_argument("--resume", action="store_true", help="also time load_state_dict + first batch")
    p.add_argument("--collate", action="store_true", help="also the collate throughput against memcpy")
    p.add_argument("--sweep", action="store_true", help="also sweep pools on the corpora of 3,000 and 100,000 items")
    p.add_argument("--tradeoff", action="store_true",
                   help="only pools 1-32 with and without min_efficiency, next to lhotse and F5")
    p.add_argument("--shapes", default="", help="comma-separated K: also audiopipe with at most K batch shapes")
    p.add_argument("--passes", action="store_true", help="also audiopipe with passes=None (by corpus size)")
    output_args(p)
    a = p.parse_args()
    world = a.world_size
    corpora = [(kind, synthetic_lengths(kind, int(n), SEED)) for kind in DISTRIBUTIONS for n in a.sizes.split(",")]
    result = {"command": " ".join(["python", "benchmarks/bench_batching.py", *sys.argv[1:]]),
              "machine": host(a.machine), "budget_frames": BUDGET, "world_size": world}
    if a.tradeoff:
        rows = []
        for name, lengths in corpora:
            rows += pools_rows(name, lengths, world, (0.0, 0.97))
            rows += [row(name, lengths, "f5_sort", f5_sort_plan(lengths, BUDGET, SEED)),
                     row(name, lengths, LHOTSE, lhotse_batches(lengths))]
        result["rows"] = rows
        return write_results(result, a.json, lambda path: plot_tradeoff(rows, path, a.machine), a.plot)
    rows, diagnostics, sweeps = [], [], {}
    for name, lengths in corpora:
        print(f"{name}: {lengths.size} items", flush=True)
        ours = audiopipe_batches(lengths, world)
        strategies = [(f"audiopipe (W={world})", ours), ("f5_sort", f5_sort_plan(lengths, BUDGET, SEED))]
        strategies += [(f"audiopipe shapes={k} (W={world})", audiopipe_batches(lengths, world, shapes=k))
                       for k in [int(x) for x in a.shapes.split(",") if x]]
        if a.passes:
            strategies.append((f"audiopipe passes=auto (W={world})", audiopipe_batches(lengths, world, passes=None)))
        if not a.no_lhotse:
            strategies.append((LHOTSE, lhotse_batches(lengths)))
        for label, plan in strategies:
            rows.append(row(name, lengths, label, plan))
            if label.startswith("audiopipe"):
                rows[-1]["plan_seconds"] /= world  # every rank plans the whole epoch: one rank's time
        first = ours.samplers[0]  # type: ignore[attr-defined]
        first.set_epoch(0)
        diag = first.diagnostics
        fields = {k: v for k, v in vars(diag).items() if not isinstance(v, np.ndarray) and not callable(v)}
        diagnostics.append({"corpus": name, "items": int(lengths.size), "pair_overlap": diag.pair_overlap, **fields})
        if a.sweep and lengths.size in (3_000, 100_000):
            sweeps[f"{name} {lengths.size}"] = pools_rows(name, lengths, world, (0.97,), (1, 2, 4, 8, 12, 16, 24, 32))
    result.update(corpora={k: dict(zip(("median_s", "sigma", "min_s", "max_s"), v)) for k, v in DISTRIBUTIONS.items()},
                  rows=rows, audiopipe_diagnostics=diagnostics)
    largest = max(corpora, key=lambda c: c[1].size)[1]
    if a.resume:
        result["resume"] = bench_resume(largest, world)
    if a.collate:
        result["collate"] = bench_collate(largest)
    if sweeps:
        result["sweep"] = sweeps
    write_results(result, a.json, lambda path: plot(rows, path, a.machine), a.plot)


if __name__ == "__main__":
    main()
