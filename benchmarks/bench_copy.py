"""Where a batch's bytes go: the stages of an mmap batch and the copy kernels side by side, on real shards.

    python benchmarks/bench_copy.py --shards /tmp/loaderbench/shortshards --shards /tmp/loaderbench/bigshards \\
        --rounds 5 --json benchmarks/results/bench_copy.json --plot docs/img/bench_copy.png
    python benchmarks/bench_copy.py --shards /tmp/loaderbench/shortshards --quick      # < 1 min

One process, one thread, every batch of one epoch of make_loader's plan (BucketBatchSampler, 38,400 padded
frames), warm page cache. Per round and corpus, interleaved, each copy variant writes every batch into one reused
buffer (as PadCollator's ring does), whole passes repeated for 0.3 s, and is reported in MB/s of real (unpadded)
feature bytes, divided by a memcpy of the same bytes timed just before and just after it (`np.copyto` between two
prefaulted buffers of the pass' size, 0.3 s each):

  slice_copy   the kernel before this version: numba slice assignment per [C] row (an element loop)
  bct          audiopipe's kernel (layout "BCT", the default): one libc memcpy per row into [B, C, T_max]
  btc          audiopipe's layout "BTC": each [C, T] row transposed into [B, T_max, C]
  tc_stored    what storing [T, C] in the shards would give: one memcpy per item into [B, T_max, C]
               (the rows are transposed once before timing; not a shard format, a measurement of one)

and the stages of a batch: `rows` (ShardDataset.__getitems__: locating rows, reading metadata), `collate`
(PadCollator on the RowBatch: the copy plus lengths, mask and statistics), per batch in ms; and the whole
loader the way `audiopipe bench-loader` times it (`loader`: make_loader, num_workers=0, epoch after epoch, the
batch's lengths and durations read as bench-loader does) next to `sampler` (its BucketBatchSampler alone, with
the read-ahead hook make_loader gives it, set_epoch and each epoch's plan included), so that
`other` = loader - sampler - rows - collate is the DataLoader and the loop around them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

from audiopipe.collate.kernels import _UINT, _copy_elems, _pad_rows, _pad_rows_time_major
from audiopipe.collate.pad import PadCollator
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.loader import make_loader
from audiopipe.sampler.bucket import BucketBatchSampler
from results_io import host, output_args, pyplot, save, write_results  # benchmarks/ (the script's own folder is on sys.path)

VARIANTS = ("slice_copy", "bct", "btc", "tc_stored")


@numba.njit(cache=True, nogil=True)
def _slice_copy(src, starts, frames, positions, channels, t_max, pad, dst):  # pragma: no cover - numba
    # The kernel as it was (commit 3d4da07), kept here as the reference it is measured against.
    for k in range(starts.size):
        t = frames[k]
        s = starts[k]
        base = positions[k] * channels * t_max
        for c in range(channels):
            o = base + c * t_max
            dst[o:o + t] = src[s + c * t:s + (c + 1) * t]
            dst[o + t:o + t_max] = pad
    return -1


@numba.njit(cache=True, nogil=True)
def _items_copy(src, starts, frames, positions, channels, t_max, pad, dst):  # pragma: no cover - numba
    # [T, C] rows: an item is one contiguous run of t * C values, its slot one of t_max * C.
    for k in range(starts.size):
        n = frames[k] * channels
        o = positions[k] * channels * t_max
        _copy_elems(dst, o, src, starts[k], n)
        dst[o + n:o + channels * t_max] = pad
    return -1


def _plan(shards: Path, budget: int, seed: int, feature: str):
    ds = ShardDataset(shards, [feature])
    sampler = BucketBatchSampler(ds.lengths(feature).astype(np.int64), budget, seed=seed)
    sampler.set_epoch(0)
    return ds, [np.asarray(b, dtype=np.int64) for b in sampler]


def _time_major_copy(parts, channels: int):
    """Each part's rows transposed to [T, C], in a new flat buffer per part (what a [T, C] shard would hold)."""
    out = []
    for rows in parts:
        flat = np.empty(int(rows.frames.sum()) * channels, dtype=rows.values.dtype)
        starts = np.empty_like(rows.starts)
        at = 0
        for k, (s, t) in enumerate(zip(rows.starts.tolist(), rows.frames.tolist())):
            flat[at:at + t * channels] = rows.values[s:s + channels * t].reshape(channels, t).T.reshape(-1)
            starts[k] = at
            at += t * channels
        out.append((flat, starts, rows.frames, rows.positions))
    return out


def _per_batch(epochs, least: float = 0.5) -> tuple[float, float]:
    """(wall, CPU) seconds per batch over whole epochs (epoch 1, 2, ...) repeated for at least `least` seconds;
    epoch 0 is run first and not timed (first touches, kernel load). The CPU time is this thread's: on a
    loaded machine the wall time also counts the waits for a core, the CPU time does not."""
    sum(1 for _ in epochs(0))
    n, e, t0, c0 = 0, 1, time.perf_counter(), time.thread_time()
    while n == 0 or time.perf_counter() - t0 < least:
        n += sum(1 for _ in epochs(e))
        e += 1
    return (time.perf_counter() - t0) / n, (time.thread_time() - c0) / n


def loader_stages(shards: Path, budget: int, seed: int, feature: str) -> dict:
    """The whole loader per batch, and its sampler alone, in ms (make_loader with its defaults, workers 0)."""
    loader = make_loader(shards, [feature], max_frames=budget, seed=seed)

    def loader_epoch(e: int):
        loader.set_epoch(e)
        for batch in loader:  # what bench-loader's loop reads of every batch
            int(batch[f"{feature}_lengths"].sum())
            float(sum(batch["duration"]))
            yield batch

    def sampler_epoch(e: int):
        loader.sampler.set_epoch(e)
        return iter(loader.sampler)

    loader_wall, loader_cpu = _per_batch(loader_epoch)
    sampler_wall, sampler_cpu = _per_batch(sampler_epoch)
    return {"loader_ms_per_batch": 1e3 * loader_wall, "loader_cpu_ms_per_batch": 1e3 * loader_cpu,
            "sampler_ms_per_batch": 1e3 * sampler_wall, "sampler_cpu_ms_per_batch": 1e3 * sampler_cpu}


def measure(shards: Path, budget: int, seed: int, feature: str, max_batches: int | None) -> dict:
    ds, batches = _plan(shards, budget, seed, feature)
    if max_batches:
        batches = batches[:max_batches]
    ch = ds.channels[feature]
    width = max(ch, 1)
    # Stages of a real batch: locating rows, then PadCollator on them (one ring slot, as a steady loop).
    collate = PadCollator([feature], ring_size=1)
    collate(ds.__getitems__(batches[0]))  # the kernel's first call loads it (numba's cache): not a batch's cost
    prepared = []
    real_bytes = 0
    for b in batches:
        parts = ds.__getitems__(b).arrays[feature]
        lengths = np.concatenate([p.frames for p in parts])
        itemsize = parts[0].values.dtype.itemsize
        real_bytes += int(lengths.sum()) * width * itemsize
        prepared.append((parts, _time_major_copy(parts, width), int(lengths.max()), int(b.size)))
    # The stages, on a second pass (the first mapped the shards' pages into this process, once per process).
    t_rows = t_coll = c_rows = c_coll = 0.0
    for b in batches:
        t0, c0 = time.perf_counter(), time.thread_time()
        rb = ds.__getitems__(b)
        t1, c1 = time.perf_counter(), time.thread_time()
        collate(rb)
        t_coll += time.perf_counter() - t1
        c_coll += time.thread_time() - c1
        t_rows += t1 - t0
        c_rows += c1 - c0
    uint = _UINT[itemsize]
    dst = np.empty(max(n * width * t for _, _, t, n in prepared) + 64, dtype=uint)
    pad = uint(0)

    def once(name: str) -> None:
        for parts, tc, t_max, n in prepared:
            out = dst[:n * width * t_max]
            if name == "tc_stored":
                for flat, starts, frames, positions in tc:
                    _items_copy(flat.view(uint), starts, frames, positions, width, t_max, pad, out)
                continue
            kernel = {"slice_copy": _slice_copy, "bct": _pad_rows, "btc": _pad_rows_time_major}[name]
            for p in parts:
                kernel(p.values.view(uint), p.starts, p.frames, p.positions, width, t_max, pad, out)

    a = np.ones(real_bytes // 8, dtype=np.uint64)
    c = np.ones_like(a)  # written once: its pages are mapped before the clock starts

    def seconds_per_pass(fn, least: float = 0.3) -> float:
        """Whole passes repeated for at least `least` seconds; the mean pass."""
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            if time.perf_counter() - t0 >= least:
                return (time.perf_counter() - t0) / n

    for name in VARIANTS:  # compile / load from cache, and touch the buffers once
        once(name)
    result = {"batches": len(prepared), "real_mb": real_bytes / 1e6,
              "items_per_batch": float(np.mean([n for *_, n in prepared])),
              "rows_ms_per_batch": 1e3 * t_rows / len(prepared),
              "collate_ms_per_batch": 1e3 * t_coll / len(prepared),
              "rows_cpu_ms_per_batch": 1e3 * c_rows / len(prepared),
              "collate_cpu_ms_per_batch": 1e3 * c_coll / len(prepared)}
    if not max_batches:  # whole epochs only
        result.update(loader_stages(shards, budget, seed, feature))
        for t in ("", "_cpu"):
            result[f"other{t}_ms_per_batch"] = result[f"loader{t}_ms_per_batch"] - sum(
                result[f"{stage}{t}_ms_per_batch"] for stage in ("sampler", "rows", "collate"))
        # The loader's MB/s against this round's memcpy, as bench-loader reports it (real bytes per batch).
        mb_per_batch = real_bytes / len(prepared) / 1e6
        result["loader_mb_per_s"] = mb_per_batch / (result["loader_ms_per_batch"] / 1e3)
    for name in VARIANTS:
        # memcpy of the same bytes just before and after each variant: bandwidth on a shared VM drifts
        before = seconds_per_pass(lambda: np.copyto(c, a))
        s = seconds_per_pass(lambda: once(name))
        after = seconds_per_pass(lambda: np.copyto(c, a))
        result[f"{name}_mb_per_s"] = real_bytes / s / 1e6
        result[f"{name}_ms_per_batch"] = 1e3 * s / len(prepared)
        result[f"{name}_memcpy_mb_per_s"] = 2 * real_bytes / (before + after) / 1e6
        result[f"{name}_vs_memcpy"] = result[f"{name}_mb_per_s"] / result[f"{name}_memcpy_mb_per_s"]
    result["memcpy_mb_per_s"] = float(np.mean([result[f"{v}_memcpy_mb_per_s"] for v in VARIANTS]))
    if "loader_mb_per_s" in result:
        result["loader_vs_memcpy"] = result["loader_mb_per_s"] / result["memcpy_mb_per_s"]
    return result


def summarize(runs: list[dict]) -> dict:
    out = {"rounds": len(runs)}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        out[key] = float(np.median(vals))
        out[f"{key}_min"], out[f"{key}_max"] = float(min(vals)), float(max(vals))
    return out


def markdown(rows: dict[str, dict]) -> str:
    lines = ["| corpus | items/batch | rows ms/batch | collate ms/batch | memcpy MB/s | "
             + " | ".join(f"{v} MB/s (% of memcpy, range)" for v in VARIANTS) + " |",
             "|" + "---|" * (5 + len(VARIANTS))]
    for name, r in rows.items():
        cells = [f"{r[f'{v}_mb_per_s']:,.0f} ({r[f'{v}_vs_memcpy']:.0%}, {r[f'{v}_vs_memcpy_min']:.0%}-"
                 f"{r[f'{v}_vs_memcpy_max']:.0%})" for v in VARIANTS]
        lines.append(f"| {name} | {r['items_per_batch']:.0f} | {r['rows_ms_per_batch']:.2f} | "
                     f"{r['collate_ms_per_batch']:.2f} | {r['memcpy_mb_per_s']:,.0f} | " + " | ".join(cells) + " |")
    if all("loader_ms_per_batch" in r for r in rows.values()):
        lines += ["", "| corpus | clock | loader ms/batch | sampler | rows | collate | other | copy kernel alone | "
                      "loader % of memcpy (range) |", "|" + "---|" * 9]
        for name, r in rows.items():
            for t, clock in (("", "wall"), ("_cpu", "thread CPU")):
                cells = " | ".join(f"{r[f'{stage}{t}_ms_per_batch']:.2f}"
                                   for stage in ("loader", "sampler", "rows", "collate", "other"))
                share = (f"{r['loader_vs_memcpy']:.0%} ({r['loader_vs_memcpy_min']:.0%}-"
                         f"{r['loader_vs_memcpy_max']:.0%})") if not t else ""
                lines.append(f"| {name} | {clock} | {cells} | {r['bct_ms_per_batch']:.2f} | {share} |")
    return "\n".join(lines)


def plot(rows: dict[str, dict], path: Path, machine: str) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(rows)
    for j, (name, r) in enumerate(rows.items()):
        x = np.arange(len(VARIANTS)) + j * width
        vals = [100 * r[f"{v}_vs_memcpy"] for v in VARIANTS]
        err = [[100 * (r[f"{v}_vs_memcpy"] - r[f"{v}_vs_memcpy_min"]) for v in VARIANTS],
               [100 * (r[f"{v}_vs_memcpy_max"] - r[f"{v}_vs_memcpy"]) for v in VARIANTS]]
        ax.bar(x, vals, width, yerr=err, capsize=3, label=name)
    ax.axhline(50, color="grey", linestyle="dashed", label="target 50 %")
    ax.set_xticks(np.arange(len(VARIANTS)) + 0.4 - width / 2, VARIANTS)
    ax.set_ylabel("% of memcpy (median round, range)")
    ax.set_title("copy kernels on real shards, 38,400-frame batches", fontsize=10)
    ax.legend(fontsize=8)
    fig.suptitle(machine, fontsize=8)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, action="append", required=True,
                   help="shard folder (give it once per corpus)")
    p.add_argument("--feature", default="mel")
    p.add_argument("--budget", type=int, default=38_400, help="padded frames per batch (default 38400)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, corpora interleaved (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 rounds of at most 20 batches per corpus")
    output_args(p)
    args = p.parse_args()
    for s in args.shards:
        if not (s / "manifest.json").is_file():
            p.error(f"{s} is not a shard folder (no manifest.json)")
    rounds, limit = (2, 20) if args.quick else (args.rounds, None)
    if rounds < 1:
        p.error("--rounds must be >= 1")
    runs: dict[str, list[dict]] = {str(s): [] for s in args.shards}
    for r in range(rounds):
        for s in args.shards:
            res = measure(s, args.budget, args.seed, args.feature, limit)
            runs[str(s)].append(res)
            print(f"round {r}: {s.name}: " + ", ".join(f"{v} {res[f'{v}_vs_memcpy']:.0%}" for v in
                                                       (*VARIANTS, "loader") if f"{v}_vs_memcpy" in res)
                  + f" of memcpy ({res['memcpy_mb_per_s']:,.0f} MB/s)", flush=True)
    rows = {Path(k).name: summarize(v) for k, v in runs.items()}
    print(markdown(rows))
    result = {"command": " ".join(["python", "benchmarks/bench_copy.py", *sys.argv[1:]]),
              "machine": host(args.machine, numba=numba.__version__),
              "budget_frames": args.budget, "corpora": rows, "rounds": {k: v for k, v in runs.items()}}
    write_results(result, args.json, lambda path: plot(rows, path, args.machine), args.plot)


if __name__ == "__main__":
    main()
