"""Batching strategies compared on the same length arrays, over corpus sizes and length distributions.

    python benchmarks/bench_batching.py --json benchmarks/results/batching.json --plot docs/img/batching.png

Strategies (all under the same budget, 38,400 frames by default), each on the SAME length array:
  audiopipe  BucketBatchSampler defaults (random pools sorted and packed, min_efficiency 0.97), dealt to
             --world-size ranks (all ranks' batches counted)
  f5_sort    F5-TTS DynamicBatchSampler: sort by length once, pack greedily while the SUM of frames fits, keep
             these batches and only shuffle their order each epoch (padding is not counted when packing)
  lhotse     lhotse DynamicBucketingSampler (30 buckets, max_duration = budget / frame rate; counts padding)

Corpora (audiopipe/bench/synthetic_lengths.py, seeded): short_clip (median 3 s, 0.5-15 s) and libritts_like
(median 5.5 s, 1-20 s), --sizes items each, at 93.75 frames/s (hop 256 at 24 kHz).

Epoch 0 is measured; "pairs together again" is the share of epoch 1's item pairs that shared a batch in
epoch 0. --resume and --collate add the resume-cost and collate-throughput measurements on the largest corpus.

--shapes 8,16,32 adds audiopipe with at most K batch shapes (sampler/shapes.py); its padded frames are those of
the shape each batch is padded to (rows x edge), so its padding efficiency is what the GPU really computes.
--passes adds audiopipe with passes=None (by corpus size: several passes an epoch on a corpus of fewer than 4
budgets, or fewer than 64 whose one pass leaves its batches more than half empty, sampler/repeat.py); on other
corpora it plans the same batches as one pass.

    python benchmarks/bench_batching.py --sizes 1000,10000,100000 --shapes 8,16,32 --no-lhotse \
        --json benchmarks/results/batching_shapes.json --plot docs/img/batching_shapes.png
    python benchmarks/bench_batching.py --sizes 78,1000,10000 --passes --world-size 1 --no-lhotse \
        --json benchmarks/results/batching_small.json
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
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ (the script's own folder is on sys.path)

Batches = list[np.ndarray]


# ---- strategies: (lengths, epoch) -> the epoch's global batches -------------------------------------------


def audiopipe_batches(
    lengths: np.ndarray, max_frames: int, seed: int, world: int, **options: float
) -> Callable[[int], Batches]:
    samplers = [
        BucketBatchSampler(lengths, max_frames, seed=seed, rank=r, world_size=world, **options) for r in range(world)
    ]

    def plan(epoch: int) -> Batches:
        out = []
        for s in samplers:
            s.set_epoch(epoch)
            out += [np.asarray(b) for b in s]
        return out

    plan.samplers = samplers  # type: ignore[attr-defined]
    return plan


def lhotse_batches(lengths: np.ndarray, max_frames: int, seed: int, frame_rate: float) -> Callable[[int], Batches]:
    import warnings

    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.testing.dummies import dummy_cut

    cuts = CutSet.from_cuts(
        dummy_cut(i, duration=float(n) / frame_rate, recording_duration=float(n) / frame_rate)
        for i, n in enumerate(lengths.tolist())
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "eagerly read CutSet": fine for a benchmark
        sampler = DynamicBucketingSampler(
            cuts, max_duration=max_frames / frame_rate, num_buckets=30, shuffle=True, seed=seed, drop_last=False
        )

    def plan(epoch: int) -> Batches:
        sampler.set_epoch(epoch)
        return [np.asarray([int(c.id.rsplit("-", 1)[1]) for c in batch]) for batch in sampler]

    return plan


# ---- metrics ---------------------------------------------------------------------------------------------


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
    return {
        "strategy": name,
        "batches": len(e0),
        "items_placed": int(np.unique(placed).size),
        "items_repeated": int(placed.size - np.unique(placed).size),
        "items_missing": int(lengths.size - np.unique(placed).size),
        "padding_efficiency": real / float(padded.sum()),
        "fill_ratio": float(padded.mean() / max_frames),
        "frame_fill": real / len(e0) / max_frames if e0 else 0.0,
        "shapes_seen": len({(a, b) for a, b in zip(sizes.tolist(), longest.tolist())}) if not shaped else
        len(set(samplers[0].shapes.shape(int(a), int(b)) for a, b in zip(sizes, longest))),
        "over_budget_batches": int((padded > max_frames).sum()),
        "worst_padded_over_budget": float(padded.max() / max_frames),
        "same_batches_next_epoch": same / max(len(multi1), 1),
        "pairs_together_next_epoch": kept / max(pairs, 1),
        "plan_seconds": t_plan,
    }


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
    """Collate throughput in GB/s of real item bytes, items being contiguous read-only views into one large
    buffer (what mmap'd Arrow shards give), against the machine's memcpy bandwidth (one large copy, out of
    cache) and against allocating a zeroed padded tensor per batch."""
    import torch

    rng = np.random.default_rng(seed)
    sampler = BucketBatchSampler(lengths, max_frames, seed=seed)
    plan = list(sampler)[:batches]
    pool = rng.standard_normal(64 * 2**20 // 4, dtype=np.float32)  # 64 MiB, bigger than the caches
    pool.setflags(write=False)
    item_batches = []
    for b in plan:
        items = []
        for i in b:
            t = int(lengths[i])
            off = int(rng.integers(0, pool.size - channels * t))
            items.append({"mel": pool[off : off + channels * t].reshape(channels, t)})
        item_batches.append(items)
    real_bytes = sum(it["mel"].nbytes for items in item_batches for it in items)

    def fresh_zeroed(items: list[dict]) -> torch.Tensor:
        t_max = max(it["mel"].shape[-1] for it in items)
        out = torch.zeros(len(items), channels, t_max)
        dst = out.numpy()
        for i, it in enumerate(items):
            dst[i, :, : it["mel"].shape[-1]] = it["mel"]
        return out

    big_src = np.concatenate([pool] * 4)  # 256 MiB
    big_dst = np.empty_like(big_src)
    collate = PadCollator(["mel"])  # default ring of 2 buffers
    collate_one = PadCollator(["mel"], ring_size=1)
    runs = {
        "memcpy": (lambda: np.copyto(big_dst, big_src), big_src.nbytes),
        "pad_collator": (lambda: [collate(items) for items in item_batches], real_bytes),
        "pad_collator_ring1": (lambda: [collate_one(items) for items in item_batches], real_bytes),
        "fresh_zeroed": (lambda: [fresh_zeroed(items) for items in item_batches], real_bytes),
    }
    best = {name: float("inf") for name in runs}
    # Interleaved rounds, best of each: on a shared machine the load changes between runs.
    for _ in range(6):
        for name, (fn, _nbytes) in runs.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    del big_src, big_dst
    gb_s = {k: runs[k][1] / best[k] / 1e9 for k in runs}
    memcpy, padded, fresh = gb_s["memcpy"], gb_s["pad_collator"], gb_s["fresh_zeroed"]
    return {
        "collate_batches": len(item_batches),
        "collate_items_gb": real_bytes / 1e9,
        "memcpy_gb_s": memcpy,
        "pad_collator_gb_s": padded,
        "fresh_zeroed_gb_s": fresh,
        "pad_collator_vs_memcpy": padded / memcpy,
        "pad_collator_ring1_gb_s": gb_s["pad_collator_ring1"],
        "pad_collator_ring1_vs_memcpy": gb_s["pad_collator_ring1"] / memcpy,
        "fresh_zeroed_vs_memcpy": fresh / memcpy,
    }


def sweep(lengths: np.ndarray, max_frames: int, seed: int, world: int) -> list[dict]:
    """The pools knob: more pools, fresher pairs; the padding they cost is split away (lower fill) where the
    epoch would fall below min_efficiency (0.97)."""
    rows = []
    for pools in (1, 2, 4, 8, 12, 16, 24, 32):
        plan = audiopipe_batches(lengths, max_frames, seed, world, pools=pools)
        rows.append({"pools": pools, **evaluate(f"pools={pools}", plan, lengths, max_frames)})
    return rows


def tradeoff(corpora: list[tuple[str, np.ndarray]], max_frames: int, seed: int, world: int,
             frame_rate: float) -> list[dict]:
    """Padding efficiency against pair overlap for the pools knob, with and without the efficiency splits
    (min_efficiency 0: pure pooled sort-and-pack), next to lhotse and F5 on the same lengths."""
    rows = []
    for name, lengths in corpora:
        for min_eff in (0.0, 0.97):
            for pools in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32):
                plan = audiopipe_batches(lengths, max_frames, seed, world, pools=pools, min_efficiency=min_eff)
                rows.append({"corpus": name, "items": int(lengths.size), "pools": pools, "min_efficiency": min_eff,
                             **evaluate(f"audiopipe pools={pools} min_efficiency={min_eff}", plan, lengths,
                                        max_frames)})
        for label, plan in (("f5_sort", f5_sort_batches(lengths, max_frames, seed)),
                            ("lhotse_dynamic_bucketing (30 buckets)",
                             lhotse_batches(lengths, max_frames, seed, frame_rate))):
            rows.append({"corpus": name, "items": int(lengths.size), **evaluate(label, plan, lengths, max_frames)})
        print(f"  trade-off {name} {lengths.size}: done", flush=True)
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
        ax.axvline(0.05, color="grey", linestyle="dotted", label="5 % pairs")
        ax.axhline(0.97, color="grey", linestyle="dashed", label="97 % efficiency")
        ax.set_xscale("log")
        ax.set_xlabel("pairs together again next epoch")
        ax.set_ylabel("padding efficiency")
        ax.set_title(f"{corpus}, {n:,} utterances", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"bench_batching --tradeoff (point labels: pools; 38,400-frame budget)\n{machine}", fontsize=9)
    save(fig, path)


def markdown_sweep(rows: list[dict]) -> str:
    lines = ["| pools | batches | padding eff. | fill | pairs together again |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['pools']} | {r['batches']} | {r['padding_efficiency']:.2%} | {r['fill_ratio']:.2%} | "
                     f"{r['pairs_together_next_epoch']:.1%} |")
    return "\n".join(lines)


def markdown_tradeoff(rows: list[dict]) -> str:
    lines = ["| corpus | items | strategy | padding eff. | fill | batches | pairs together again |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['corpus']} | {r['items']:,} | {r['strategy']} | {r['padding_efficiency']:.2%} | "
                     f"{r['fill_ratio']:.2%} | {r['batches']:,} | {r['pairs_together_next_epoch']:.1%} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    head = ("corpus", "items", "strategy", "batches", "padding eff.", "fill", "over budget", "worst padded/budget",
            "pairs together again", "missing / repeated", "plan s/epoch")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(
            f"| {r['corpus']} | {r['items']:,} | {r['strategy']} | {r['batches']:,} | {r['padding_efficiency']:.2%} | "
            f"{r['fill_ratio']:.2%} | {r['over_budget_batches']} | {r['worst_padded_over_budget']:.3f} | "
            f"{r['pairs_together_next_epoch']:.1%} | {r['items_missing']} / {r['items_repeated']} | "
            f"{r['plan_seconds']:.2f} |"
        )
    return "\n".join(lines)


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
        for target, lo, hi in ((0.97, 1_000, 10_000), (0.985, 100_000, 1_000_000)):
            axes[0][c].hlines(target, lo, hi, colors="grey", linestyles="dashed")
        axes[1][c].axhline(0.05, color="grey", linestyle="dashed")
        axes[0][c].set_title(f"{corpus}: padding efficiency (dashed: targets)")
        axes[1][c].set_title(f"{corpus}: pairs together again next epoch (dashed: 5 %)")
        for ax in (axes[0][c], axes[1][c]):
            ax.set_xscale("log")
            ax.set_xlabel("utterances")
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
    p.add_argument("--frame-rate", type=float, default=24_000 / 256)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-lhotse", action="store_true")
    p.add_argument("--lhotse-max-items", type=int, default=1_000_000, help="skip lhotse above this corpus size")
    p.add_argument("--resume", action="store_true", help="also time load_state_dict + first batch")
    p.add_argument("--collate", action="store_true", help="also the collate throughput against memcpy")
    p.add_argument("--sweep", action="store_true", help="also sweep pools on the corpora of 3,000 and 100,000 items")
    p.add_argument("--tradeoff", action="store_true",
                   help="ONLY the efficiency / pair-overlap trade-off of the pools knob (with and without "
                        "min_efficiency) on --sizes, next to lhotse and F5; --json/--plot get its results")
    p.add_argument("--shapes", default="", help="comma-separated K: also audiopipe with at most K batch shapes")
    p.add_argument("--passes", action="store_true", help="also audiopipe with passes=None (by corpus size)")
    output_args(p)
    args = p.parse_args()

    corpora = [(kind, synthetic_lengths(kind, int(n), args.seed, args.frame_rate))
               for kind in args.distributions.split(",") for n in args.sizes.split(",")]
    if args.tradeoff:
        rows = tradeoff(corpora, args.max_frames, args.seed, args.world_size, args.frame_rate)
        result = {"command": " ".join(["python", "benchmarks/bench_batching.py", *sys.argv[1:]]),
                  "machine": host(args.machine),
                  "budget_frames": args.max_frames, "world_size": args.world_size, "rows": rows}
        print(markdown_tradeoff(rows))
        write_results(result, args.json, lambda path: plot_tradeoff(rows, path, args.machine), args.plot)
        return
    rows = []
    diagnostics = []
    sweeps = {}
    for name, lengths in corpora:
        print(f"{name}: {lengths.size} items, {lengths.sum() / args.frame_rate / 3600:.1f} h, "
              f"median {np.median(lengths) / args.frame_rate:.1f} s", flush=True)
        ours = audiopipe_batches(lengths, args.max_frames, args.seed, args.world_size)
        strategies = [(f"audiopipe (W={args.world_size})", ours),
                      ("f5_sort", f5_sort_batches(lengths, args.max_frames, args.seed))]
        for k in [int(x) for x in args.shapes.split(",") if x]:
            strategies.append((f"audiopipe shapes={k} (W={args.world_size})",
                               audiopipe_batches(lengths, args.max_frames, args.seed, args.world_size, shapes=k)))
        if args.passes:
            strategies.append((f"audiopipe passes=auto (W={args.world_size})",
                               audiopipe_batches(lengths, args.max_frames, args.seed, args.world_size, passes=None)))
        if not args.no_lhotse and lengths.size <= args.lhotse_max_items:
            strategies.append(("lhotse_dynamic_bucketing (30 buckets)",
                               lhotse_batches(lengths, args.max_frames, args.seed, args.frame_rate)))
        for j, (label, plan) in enumerate(strategies):
            row = {"corpus": name, "items": int(lengths.size), **evaluate(label, plan, lengths, args.max_frames)}
            if label.startswith("audiopipe"):
                row["plan_seconds"] /= args.world_size  # every rank plans the whole epoch: one rank's time
            rows.append(row)
            print("  " + markdown([row]).splitlines()[-1], flush=True)
        first = ours.samplers[0]  # type: ignore[attr-defined]
        first.set_epoch(0)
        diag = first.diagnostics
        diagnostics.append({"corpus": name, "items": int(lengths.size), "pair_overlap": diag.pair_overlap,
                            **{k: v for k, v in vars(diag).items()
                               if not isinstance(v, np.ndarray) and not callable(v)}})
        print("  " + diag.summary(), flush=True)
        if args.sweep and lengths.size in (3_000, 100_000):
            sweeps[f"{name} {lengths.size}"] = sweep(lengths, args.max_frames, args.seed, args.world_size)
            print(markdown_sweep(sweeps[f"{name} {lengths.size}"]), flush=True)
    result = {
        "command": " ".join(["python", "benchmarks/bench_batching.py", *sys.argv[1:]]),
        "machine": host(args.machine),
        "budget_frames": args.max_frames,
        "world_size": args.world_size,
        "corpora": {k: {"median_s": v[0], "sigma": v[1], "min_s": v[2], "max_s": v[3]} for k, v in DISTRIBUTIONS.items()},
        "rows": rows,
        "audiopipe_diagnostics": diagnostics,
    }
    name, largest = max(corpora, key=lambda c: c[1].size)
    if args.resume:
        result["resume"] = bench_resume(largest, args.max_frames, args.seed, args.world_size)
    if args.collate:
        result["collate"] = bench_collate(largest, args.max_frames, args.seed)
    if sweeps:
        result["sweep"] = sweeps
    print(markdown(rows))
    if "resume" in result:
        r = result["resume"]
        print(f"resume ({name}): load_state_dict + first batch at step 0: {r['resume_at_first_step_seconds'] * 1e3:.1f} ms, "
              f"at step {r['steps_per_rank'] - 1}: {r['resume_at_last_step_seconds'] * 1e3:.1f} ms")
    if "collate" in result:
        c = result["collate"]
        print(f"collate ({c['collate_batches']} batches, {c['collate_items_gb']:.2f} GB of [100, T] float32 items): "
              f"memcpy {c['memcpy_gb_s']:.2f} GB/s, "
              f"PadCollator {c['pad_collator_gb_s']:.2f} GB/s ({c['pad_collator_vs_memcpy']:.0%}; with ring_size=1 "
              f"{c['pad_collator_ring1_gb_s']:.2f} GB/s, {c['pad_collator_ring1_vs_memcpy']:.0%}), "
              f"fresh zeroed tensor per batch {c['fresh_zeroed_gb_s']:.2f} GB/s ({c['fresh_zeroed_vs_memcpy']:.0%})")
    write_results(result, args.json, lambda path: plot(rows, path, args.machine), args.plot)


if __name__ == "__main__":
    main()
