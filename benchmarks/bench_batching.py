"""Batching strategies on the same seeded length arrays, over corpus sizes and length distributions.

    python benchmarks/bench_batching.py --sweep --resume --collate --json benchmarks/results/batching.json \
        --plot docs/img/batching.png
    python benchmarks/bench_batching.py --sizes 78,1000,10000 --passes --world-size 1 --no-lhotse \
        --json benchmarks/results/batching_small.json
    python benchmarks/bench_batching.py --sizes 1000,10000,100000 --shapes 8,16,32 --no-lhotse \
        --json benchmarks/results/batching_shapes.json --plot docs/img/batching_shapes.png
    python benchmarks/bench_batching.py --tradeoff --sizes 1000,10000,100000 \
        --json benchmarks/results/batching_tradeoff.json --plot docs/img/batching_tradeoff.png

Under one padded budget (38,400 frames): `audiopipe` (BucketBatchSampler's defaults, dealt to --world-size ranks,
all ranks' batches counted; --shapes K: at most K batch shapes, padded frames counted as rows x edge; --passes:
passes=None), `f5_sort` (F5-TTS's DynamicBatchSampler: sort once, pack while the SUM of frames fits, shuffle the
batch order) and `lhotse` (DynamicBucketingSampler, 30 buckets). Corpora: audiopipe/bench/synthetic_lengths.py at
93.75 frames/s. Epoch 0 is measured; `pairs_together_next_epoch` is the share of epoch 1's item pairs that shared
a batch in epoch 0. --sweep: the pools knob on the 3,000- and 100,000-item corpora; --resume: load_state_dict and
the first batch at the first and last step; --collate: PadCollator on item lists against memcpy and a fresh zeroed
batch; --tradeoff (alone): pools 1-32 with and without min_efficiency, next to lhotse and F5.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from audiopipe.bench.loaders import f5_sort_plan as f5_sort_batches  # F5-TTS DynamicBatchSampler
from audiopipe.bench.synthetic_lengths import DISTRIBUTIONS, synthetic_lengths
from audiopipe.collate.pad import PadCollator
from audiopipe.sampler.bucket import BucketBatchSampler
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ is on sys.path

Batches = list[np.ndarray]
FRAME_RATE = 24_000 / 256  # hop 256 at 24 kHz


# A strategy: (lengths, ...) -> plan(epoch) -> that epoch's batches over all ranks.


def audiopipe_batches(lengths: np.ndarray, max_frames: int, seed: int, world: int, **options) -> Callable[[int], Batches]:
    samplers = [BucketBatchSampler(lengths, max_frames, seed=seed, rank=r, world_size=world, **options)
                for r in range(world)]

    def plan(epoch: int) -> Batches:
        out = []
        for s in samplers:
            s.set_epoch(epoch)
            out += [np.asarray(b) for b in s]
        return out

    plan.samplers = samplers  # type: ignore[attr-defined]
    return plan


def lhotse_batches(lengths: np.ndarray, max_frames: int, seed: int) -> Callable[[int], Batches]:
    import warnings

    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(dummy_cut(i, duration=n / FRAME_RATE, recording_duration=n / FRAME_RATE)
                            for i, n in enumerate(lengths.tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "eagerly read CutSet": fine for a benchmark
        sampler = DynamicBucketingSampler(cuts, max_duration=max_frames / FRAME_RATE, num_buckets=30, shuffle=True,
                                          seed=seed, drop_last=False)

    def plan(epoch: int) -> Batches:
        sampler.set_epoch(epoch)
        return [np.asarray([int(c.id.rsplit("-", 1)[1]) for c in batch]) for batch in sampler]

    return plan


def evaluate(name: str, plan: Callable[[int], Batches], lengths: np.ndarray, max_frames: int) -> dict:
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
    # Composition change: identical multi-item batches, and item pairs still together, from epoch 0 to 1.
    where = np.full(lengths.size, -1)
    for j, b in enumerate(e0):
        where[b] = j
    multi0 = {frozenset(b.tolist()) for b in e0 if b.size > 1}
    multi1 = [frozenset(b.tolist()) for b in e1 if b.size > 1]
    same = sum(b in multi0 for b in multi1)
    pairs = kept = 0
    for b in e1:
        _, c = np.unique(where[b], return_counts=True)
        kept += int((c * (c - 1) // 2).sum())
        pairs += b.size * (b.size - 1) // 2
    unique = int(np.unique(placed).size)
    return {"strategy": name, "batches": len(e0), "items_placed": unique, "items_repeated": int(placed.size - unique),
            "items_missing": int(lengths.size - unique), "padding_efficiency": real / float(padded.sum()),
            "fill_ratio": float(padded.mean() / max_frames), "frame_fill": real / len(e0) / max_frames if e0 else 0.0,
            "shapes_seen": len({samplers[0].shapes.shape(int(a), int(b)) if shaped else (a, b)
                                for a, b in zip(sizes.tolist(), longest.tolist())}),
            "over_budget_batches": int((padded > max_frames).sum()),
            "worst_padded_over_budget": float(padded.max() / max_frames),
            "same_batches_next_epoch": same / max(len(multi1), 1), "pairs_together_next_epoch": kept / max(pairs, 1),
            "plan_seconds": t_plan}


def bench_resume(lengths: np.ndarray, max_frames: int, seed: int, world: int) -> dict:
    """load_state_dict + first batch at the start vs. near the end of an epoch: no replay, so about equal."""
    s = BucketBatchSampler(lengths, max_frames, seed=seed, rank=0, world_size=world)
    steps = len(s)
    out = {}
    for label, k in (("first_step", 0), ("last_step", steps - 1)):
        probe = BucketBatchSampler(lengths, max_frames, seed=seed, rank=0, world_size=world)
        it = iter(probe)
        for _ in range(k):
            next(it)
        state = probe.state_dict()
        times = []
        for _ in range(3):
            fresh = BucketBatchSampler(lengths, max_frames, seed=seed, rank=0, world_size=world)
            t0 = time.perf_counter()
            fresh.load_state_dict(state)
            next(iter(fresh))
            times.append(time.perf_counter() - t0)
        out[f"resume_at_{label}_seconds"] = min(times)
    out["steps_per_rank"] = steps
    return out


def bench_collate(lengths: np.ndarray, max_frames: int, seed: int, channels: int = 100, batches: int = 16) -> dict:
    """Collate throughput in GB/s of real item bytes, the items read-only views into one large buffer (as mmap'd
    shards give), against memcpy (one large copy, out of cache) and a zeroed padded tensor allocated per batch.
    Interleaved rounds, the best of each: on a shared machine the load changes between runs."""
    import torch

    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(64 * 2**20 // 4, dtype=np.float32)  # 64 MiB, bigger than the caches
    pool.setflags(write=False)
    item_batches = []
    for b in list(BucketBatchSampler(lengths, max_frames, seed=seed))[:batches]:
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


def pools_rows(name: str, lengths: np.ndarray, frames: int, seed: int, world: int, min_efficiencies: tuple,
               pools: tuple = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)) -> list[dict]:
    """The pools knob, with and without the efficiency splits (min_efficiency 0: pure pooled sort-and-pack)."""
    return [{"corpus": name, "items": int(lengths.size), "pools": k, "min_efficiency": m,
             **evaluate(f"audiopipe pools={k} min_efficiency={m}",
                        audiopipe_batches(lengths, frames, seed, world, pools=k, min_efficiency=m), lengths, frames)}
            for m in min_efficiencies for k in pools]


def tradeoff(corpora: list[tuple[str, np.ndarray]], frames: int, seed: int, world: int) -> list[dict]:
    """Padding efficiency against pair overlap for the pools knob, next to lhotse and F5 on the same lengths."""
    rows = []
    for name, lengths in corpora:
        rows += pools_rows(name, lengths, frames, seed, world, (0.0, 0.97))
        for label, plan in (("f5_sort", f5_sort_batches(lengths, frames, seed)),
                            ("lhotse_dynamic_bucketing (30 buckets)", lhotse_batches(lengths, frames, seed))):
            rows.append({"corpus": name, "items": int(lengths.size), **evaluate(label, plan, lengths, frames)})
    return rows


def plot_tradeoff(rows: list[dict], path: Path, machine: str) -> None:
    plt = pyplot()
    cases = sorted({(r["corpus"], r["items"]) for r in rows}, key=lambda c: (c[0], c[1]))
    cols = min(3, len(cases))
    rows_ = -(-len(cases) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, 4.4 * rows_), squeeze=False)
    for ax, (corpus, n) in zip(axes.ravel(), cases):
        here = [r for r in rows if r["corpus"] == corpus and r["items"] == n]
        for min_eff, style in ((0.0, "o-"), (0.97, "s--")):
            pts = sorted((r["pools"], r["pairs_together_next_epoch"], r["padding_efficiency"], r["fill_ratio"])
                         for r in here if r.get("min_efficiency") == min_eff)
            ax.plot([p[1] for p in pts], [p[2] for p in pts], style,
                    label=f"audiopipe, pools 1-32, min_efficiency={min_eff}")
            for pools, x, y, _ in pts:
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
    plt = pyplot()
    corpora = sorted({r["corpus"] for r in rows})
    fig, axes = plt.subplots(2, len(corpora), figsize=(5.5 * len(corpora), 7.5), squeeze=False)
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
    p.add_argument("--distributions", default=",".join(DISTRIBUTIONS), help=f"of {sorted(DISTRIBUTIONS)}")
    p.add_argument("--max-frames", type=int, default=38_400)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lhotse", action="store_true")
    p.add_argument("--resume", action="store_true", help="also time load_state_dict + first batch")
    p.add_argument("--collate", action="store_true", help="also the collate throughput against memcpy")
    p.add_argument("--sweep", action="store_true", help="also sweep pools on the corpora of 3,000 and 100,000 items")
    p.add_argument("--tradeoff", action="store_true", help="only the pools / min_efficiency trade-off (see above)")
    p.add_argument("--shapes", default="", help="comma-separated K: also audiopipe with at most K batch shapes")
    p.add_argument("--passes", action="store_true", help="also audiopipe with passes=None (by corpus size)")
    output_args(p)
    a = p.parse_args()
    frames, world, seed = a.max_frames, a.world_size, a.seed
    corpora = [(kind, synthetic_lengths(kind, int(n), seed, FRAME_RATE))
               for kind in a.distributions.split(",") for n in a.sizes.split(",")]
    result = {"command": " ".join(["python", "benchmarks/bench_batching.py", *sys.argv[1:]]), "machine": host(a.machine),
              "budget_frames": frames, "world_size": world}
    if a.tradeoff:
        result["rows"] = rows = tradeoff(corpora, frames, seed, world)
        return write_results(result, a.json, lambda path: plot_tradeoff(rows, path, a.machine), a.plot)
    rows, diagnostics, sweeps = [], [], {}
    for name, lengths in corpora:
        print(f"{name}: {lengths.size} items", flush=True)
        ours = audiopipe_batches(lengths, frames, seed, world)
        strategies = [(f"audiopipe (W={world})", ours), ("f5_sort", f5_sort_batches(lengths, frames, seed))]
        strategies += [(f"audiopipe shapes={k} (W={world})", audiopipe_batches(lengths, frames, seed, world, shapes=k))
                       for k in [int(x) for x in a.shapes.split(",") if x]]
        if a.passes:
            strategies.append((f"audiopipe passes=auto (W={world})",
                               audiopipe_batches(lengths, frames, seed, world, passes=None)))
        if not a.no_lhotse:
            strategies.append(("lhotse_dynamic_bucketing (30 buckets)", lhotse_batches(lengths, frames, seed)))
        for label, plan in strategies:
            rows.append({"corpus": name, "items": int(lengths.size), **evaluate(label, plan, lengths, frames)})
            if label.startswith("audiopipe"):
                rows[-1]["plan_seconds"] /= world  # every rank plans the whole epoch: one rank's time
        first = ours.samplers[0]  # type: ignore[attr-defined]
        first.set_epoch(0)
        diag = first.diagnostics
        diagnostics.append({"corpus": name, "items": int(lengths.size), "pair_overlap": diag.pair_overlap,
                            **{k: v for k, v in vars(diag).items() if not isinstance(v, np.ndarray) and not callable(v)}})
        if a.sweep and lengths.size in (3_000, 100_000):
            sweeps[f"{name} {lengths.size}"] = pools_rows(name, lengths, frames, seed, world, (0.97,),
                                                          (1, 2, 4, 8, 12, 16, 24, 32))
    result.update(corpora={k: dict(zip(("median_s", "sigma", "min_s", "max_s"), v)) for k, v in DISTRIBUTIONS.items()},
                  rows=rows, audiopipe_diagnostics=diagnostics)
    largest = max(corpora, key=lambda c: c[1].size)[1]
    if a.resume:
        result["resume"] = bench_resume(largest, frames, seed, world)
    if a.collate:
        result["collate"] = bench_collate(largest, frames, seed)
    if sweeps:
        result["sweep"] = sweeps
    write_results(result, a.json, lambda path: plot(rows, path, a.machine), a.plot)


if __name__ == "__main__":
    main()
