"""Where a batch's time goes: the stages of an mmap batch and the copy kernels, on real shards (--loop: a process
for a profiler to attach to; --guard: the loader guard's figure). The commands, the stages and kernels, and what
each figure is: docs/bench-loader.md#where-the-bytes-go (the guard: its regression-guard section).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from audiopipe.collate.kernels import _UINT, _pad_rows, _pad_rows_time_major, wait_for_kernels
from audiopipe.collate.pad import PadCollator
from audiopipe.reader.loader import make_loader
from results_io import grouped_bars, host, output_args, pyplot, save, spread, write_results

KERNELS = {"bct": _pad_rows, "btc": _pad_rows_time_major}
FEATURE = "mel"


def now() -> np.ndarray:
    """(wall, CPU) seconds: the CPU time is the process's, so that the prefetch thread's work counts; on a loaded
    machine the wall time also counts waits for a core."""
    return np.array([time.perf_counter(), time.process_time()])


def per_unit(run, least: float) -> np.ndarray:
    """(wall, CPU) seconds per unit over calls of run() (each returns how many units it did) for at least `least`
    seconds."""
    n, t0 = 0, now()
    while n == 0 or now()[0] - t0[0] < least:
        n += run()
    return (now() - t0) / n


def seconds_per_pass(fn) -> float:
    return per_unit(lambda: fn() or 1, 0.3)[0]


def measure(shards: Path, a: argparse.Namespace, max_batches: int | None) -> dict:
    loader = make_loader(shards, [FEATURE], max_frames=a.budget)
    ds = loader.dataset
    loader.sampler.set_epoch(0)
    batches = [np.asarray(b, dtype=np.int64) for b in loader.sampler][:max_batches]
    width = max(ds.channels[FEATURE], 1)
    collate = PadCollator([FEATURE], ring_size=1)
    collate(ds.__getitems__(batches[0]))  # the kernel's first call loads it (numba's cache): not a batch's cost
    parts = [ds.__getitems__(b).arrays[FEATURE] for b in batches]  # maps the shards, once per process
    itemsize = parts[0][0].values.dtype.itemsize
    t_max = [int(max(p.frames.max() for p in ps)) for ps in parts]
    real_bytes = sum(int(p.frames.sum()) for ps in parts for p in ps) * width * itemsize
    out = {"batches": len(batches), "real_mb": real_bytes / 1e6,
           "items_per_batch": float(np.mean([b.size for b in batches]))}
    clock = {"rows": np.zeros(2), "collate": np.zeros(2)}
    for b in batches:
        t0 = now()
        rb = ds.__getitems__(b)
        t1 = now()
        collate(rb)
        clock["rows"] += t1 - t0
        clock["collate"] += now() - t1
    for stage, seconds in clock.items():
        out[f"{stage}_ms_per_batch"], out[f"{stage}_cpu_ms_per_batch"] = 1e3 * seconds / len(batches)
    if not max_batches:  # whole epochs only

        def loader_epoch(e: int):
            loader.set_epoch(e)
            for batch in loader:  # what bench-loader's loop reads of every batch
                int(batch[f"{FEATURE}_lengths"].sum())
                float(sum(batch["duration"]))
                yield batch

        def sampler_epoch(e: int):
            loader.sampler.set_epoch(e)
            return iter(loader.sampler)

        for stage, epochs in (("loader", loader_epoch), ("sampler", sampler_epoch)):
            sum(1 for _ in epochs(0))  # untimed: first touches, the kernel's load
            more = itertools.count(1)
            seconds = per_unit(lambda: sum(1 for _ in epochs(next(more))), 0.5)  # whole epochs
            out[f"{stage}_ms_per_batch"], out[f"{stage}_cpu_ms_per_batch"] = 1e3 * seconds
        for t in ("", "_cpu"):
            out[f"other{t}_ms_per_batch"] = out[f"loader{t}_ms_per_batch"] - sum(
                out[f"{stage}{t}_ms_per_batch"] for stage in ("sampler", "rows", "collate"))
    uint = _UINT[itemsize]
    dst = np.empty(max(b.size * width * t for b, t in zip(batches, t_max)) + 64, dtype=uint)
    src, copy = np.ones(real_bytes // 8, dtype=np.uint64), np.ones(real_bytes // 8, dtype=np.uint64)  # prefaulted

    def once(kernel) -> None:
        for b, ps, t in zip(batches, parts, t_max):
            for p in ps:
                into = dst[:b.size * width * t]
                kernel(p.values.view(uint), p.starts, p.frames, p.positions, width, t, uint(0), into)

    memcpy = []
    for name, kernel in KERNELS.items():
        once(kernel)
        before = seconds_per_pass(lambda: np.copyto(copy, src))
        s = seconds_per_pass(lambda: once(kernel))
        after = seconds_per_pass(lambda: np.copyto(copy, src))
        memcpy.append(2 * real_bytes / (before + after) / 1e6)
        out[f"{name}_mb_per_s"], out[f"{name}_ms_per_batch"] = real_bytes / s / 1e6, 1e3 * s / len(batches)
        out[f"{name}_vs_memcpy"] = out[f"{name}_mb_per_s"] / memcpy[-1]
    out["memcpy_mb_per_s"] = float(np.mean(memcpy))
    if "loader_ms_per_batch" in out:  # the loader's MB/s against this round's memcpy, as bench-loader reports it
        out["loader_vs_memcpy"] = real_bytes / len(batches) / out["loader_ms_per_batch"] / 1e3 / out["memcpy_mb_per_s"]
    return out


def loop(shards: Path, a: argparse.Namespace) -> None:
    """make_loader's batches, epoch after epoch, taken by a loop that does nothing else: what a profiler attaches to."""
    loader = make_loader(shards, [FEATURE], max_frames=a.budget)
    batch = next(iter(loader))
    per_frame = batch[FEATURE][0, ..., 0].numel() * batch[FEATURE].element_size()
    del batch
    wait_for_kernels()  # the steady state: the compiled copy kernel loaded
    epochs = itertools.count(1)

    def epoch_bytes() -> int:
        loader.set_epoch(next(epochs))
        return sum(int(b[f"{FEATURE}_lengths"].sum()) for b in loader) * per_frame

    wall, cpu = per_unit(epoch_bytes, a.loop)  # per byte
    print(f"{1 / wall / 1e6:.0f} MB/s, CPU/wall {cpu / wall:.2f}")


def plot(rows: dict[str, dict], path: Path, machine: str) -> None:
    fig, ax = pyplot().subplots(figsize=(7, 4))
    grouped_bars(ax, list(KERNELS), {name: [{k: 100 * v for k, v in r[f"{kernel}_vs_memcpy"].items()}
                                            for kernel in KERNELS] for name, r in rows.items()})
    ax.set_ylabel("% of memcpy (median round, range)")
    ax.set_title(f"copy kernels on real shards, 38,400-frame batches\n{machine}", fontsize=9)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, action="append", help="shard folder (once per corpus)")
    p.add_argument("--budget", type=int, default=38_400, help="padded frames per batch")
    p.add_argument("--rounds", type=int, default=5, help="rounds, corpora interleaved")
    p.add_argument("--quick", action="store_true", help="2 rounds of at most 20 batches per corpus")
    p.add_argument("--loop", type=float, default=0, help="only run the loader for this many seconds (to profile)")
    p.add_argument("--guard", action="store_true", help="only the loader guard's figure (9 rounds)")
    output_args(p)
    a = p.parse_args()
    if a.guard:
        from audiopipe.bench.guard import measure as guard, write_guard_corpus

        with tempfile.TemporaryDirectory() as tmp:
            result = {"command": "python benchmarks/bench_copy.py --guard", "machine": host(a.machine),
                      **guard(write_guard_corpus(Path(tmp) / "guard"))}
        print(f"reference / loader, CPU time {result['ratio']:.3f}, wall time {result['wall_ratio']:.3f}")
        return write_results(result, a.json, None, None)
    if not a.shards:
        p.error("--shards is required (but with --guard)")
    if a.loop:
        return loop(a.shards[0], a)
    rounds, limit = (2, 20) if a.quick else (a.rounds, None)
    runs: dict[str, list[dict]] = {s.name: [] for s in a.shards}
    for r in range(rounds):
        for s in a.shards:
            runs[s.name].append(measure(s, a, limit))
            print(f"round {r}: {s.name}: " + ", ".join(f"{k} {v:.0%}" for k, v in runs[s.name][-1].items()
                                                       if k.endswith("_vs_memcpy")) + " of memcpy", flush=True)
    rows = {name: {k: spread(x[k] for x in rs) for k in rs[0]} for name, rs in runs.items()}
    result = {"command": " ".join(["python", "benchmarks/bench_copy.py", *sys.argv[1:]]),
              "machine": host(a.machine, numba=numba.__version__), "budget_frames": a.budget, "corpora": rows,
              "rounds": runs}
    write_results(result, a.json, lambda path: plot(rows, path, a.machine), a.plot)


if __name__ == "__main__":
    main()
