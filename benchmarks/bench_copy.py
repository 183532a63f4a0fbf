"""Where a batch's time goes: the stages of an mmap batch and the copy kernels, on real shards.

    python benchmarks/bench_copy.py --shards /tmp/loaderbench/shortshards --shards /tmp/loaderbench/bigshards \\
        --rounds 5 --json benchmarks/results/bench_copy.json --plot docs/img/bench_copy.png
    python benchmarks/bench_copy.py --shards /tmp/loaderbench/shortshards --quick      # < 1 min
    python benchmarks/bench_copy.py --guard --json benchmarks/results/loader_guard.json
    python benchmarks/bench_copy.py --shards /tmp/loaderbench/bigshards --loop 45 &   # a process to profile
    sleep 20; perf record -F 1999 -p $! -o /tmp/loader.perf -- sleep 15
    perf report -i /tmp/loader.perf -s pid,dso --stdio     # per thread: the prefetch thread, the loop

One process, one thread, every batch of one epoch of make_loader's plan, warm page cache, rounds and corpora
interleaved. The stages of a batch, in wall and CPU ms (the process's, all threads): `rows` (ShardDataset.__getitems__: locating the
rows, reading their metadata), `collate` (PadCollator on the RowBatch: the copy plus lengths, mask, statistics),
`sampler` (its BucketBatchSampler alone, with make_loader's read-ahead hook) and `loader` (make_loader with its
defaults, epoch after epoch, each batch's lengths and durations read as bench-loader does), so that `other` =
loader - sampler - rows - collate is the DataLoader and the loop around them. The copy kernels, each writing
every batch into one reused buffer for 0.3 s of whole passes, in MB/s of real feature bytes and divided by a memcpy
of the same bytes timed just before and after it (memory bandwidth on a shared VM drifts): `bct` (the default
layout: one libc memcpy per [C] row into [B, C, T_max]) and `btc` (layout "BTC": each [C, T] row transposed into
[B, T_max, C]). --loop SECONDS only runs make_loader's batches for that long and prints MB/s and CPU/wall.
--guard: the figure tests/test_loader_guard.py compares with, on its own small synthetic corpus: make_loader's CPU
time against a plain numpy loop copying the same batches (audiopipe/bench/guard.py says what each side does).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from audiopipe.collate.kernels import _UINT, _pad_rows, _pad_rows_time_major, wait_for_kernels
from audiopipe.collate.pad import PadCollator
from audiopipe.reader.loader import make_loader
from results_io import host, output_args, pyplot, save, spread, write_results  # benchmarks/ is on sys.path

KERNELS = {"bct": _pad_rows, "btc": _pad_rows_time_major}


def per_batch(epochs, least: float = 0.5) -> tuple[float, float]:
    """(wall, CPU) seconds per batch over whole epochs 1, 2, ... repeated for at least `least` seconds, after an
    untimed epoch 0 (first touches, kernel load). The CPU time is the process's, so that the prefetch thread's work
    counts; on a loaded machine the wall time also counts waits for a core."""
    sum(1 for _ in epochs(0))
    n, e, t0, c0 = 0, 1, time.perf_counter(), time.process_time()
    while n == 0 or time.perf_counter() - t0 < least:
        n += sum(1 for _ in epochs(e))
        e += 1
    return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


def seconds_per_pass(fn, least: float = 0.3) -> float:
    n, t0 = 0, time.perf_counter()
    while not n or time.perf_counter() - t0 < least:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n


def measure(shards: Path, a: argparse.Namespace, max_batches: int | None) -> dict:
    loader = make_loader(shards, [a.feature], max_frames=a.budget, seed=a.seed)
    ds = loader.dataset
    loader.sampler.set_epoch(0)
    batches = [np.asarray(b, dtype=np.int64) for b in loader.sampler][:max_batches]
    width = max(ds.channels[a.feature], 1)
    collate = PadCollator([a.feature], ring_size=1)
    collate(ds.__getitems__(batches[0]))  # the kernel's first call loads it (numba's cache): not a batch's cost
    parts = [ds.__getitems__(b).arrays[a.feature] for b in batches]  # maps the shards, once per process
    itemsize = parts[0][0].values.dtype.itemsize
    t_max = [int(max(p.frames.max() for p in ps)) for ps in parts]
    real_bytes = sum(int(p.frames.sum()) for ps in parts for p in ps) * width * itemsize
    out = {"batches": len(batches), "real_mb": real_bytes / 1e6, "items_per_batch": float(np.mean([b.size for b in batches]))}
    clock = {"rows": [0.0, 0.0], "collate": [0.0, 0.0]}
    for b in batches:
        t0, c0 = time.perf_counter(), time.process_time()
        rb = ds.__getitems__(b)
        t1, c1 = time.perf_counter(), time.process_time()
        collate(rb)
        clock["rows"][0] += t1 - t0
        clock["rows"][1] += c1 - c0
        clock["collate"][0] += time.perf_counter() - t1
        clock["collate"][1] += time.process_time() - c1
    for stage, (wall, cpu) in clock.items():
        out[f"{stage}_ms_per_batch"], out[f"{stage}_cpu_ms_per_batch"] = 1e3 * wall / len(batches), 1e3 * cpu / len(batches)
    if not max_batches:  # whole epochs only

        def loader_epoch(e: int):
            loader.set_epoch(e)
            for batch in loader:  # what bench-loader's loop reads of every batch
                int(batch[f"{a.feature}_lengths"].sum())
                float(sum(batch["duration"]))
                yield batch

        def sampler_epoch(e: int):
            loader.sampler.set_epoch(e)
            return iter(loader.sampler)

        for stage, epochs in (("loader", loader_epoch), ("sampler", sampler_epoch)):
            wall, cpu = per_batch(epochs)
            out[f"{stage}_ms_per_batch"], out[f"{stage}_cpu_ms_per_batch"] = 1e3 * wall, 1e3 * cpu
        for t in ("", "_cpu"):
            out[f"other{t}_ms_per_batch"] = out[f"loader{t}_ms_per_batch"] - sum(
                out[f"{stage}{t}_ms_per_batch"] for stage in ("sampler", "rows", "collate"))
    uint = _UINT[itemsize]
    dst = np.empty(max(b.size * width * t for b, t in zip(batches, t_max)) + 64, dtype=uint)
    src, copy = np.ones(real_bytes // 8, dtype=np.uint64), np.ones(real_bytes // 8, dtype=np.uint64)  # prefaulted

    def once(kernel) -> None:
        for b, ps, t in zip(batches, parts, t_max):
            for p in ps:
                kernel(p.values.view(uint), p.starts, p.frames, p.positions, width, t, uint(0), dst[:b.size * width * t])

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
    loader = make_loader(shards, [a.feature], max_frames=a.budget, seed=a.seed)
    batch = next(iter(loader))
    per_frame = batch[a.feature][0, ..., 0].numel() * batch[a.feature].element_size()
    del batch
    wait_for_kernels()  # the steady state: the compiled copy kernel loaded
    t0, c0, epoch, nbytes = time.perf_counter(), time.process_time(), 0, 0
    while time.perf_counter() - t0 < a.loop:
        epoch += 1
        loader.set_epoch(epoch)
        nbytes += sum(int(b[f"{a.feature}_lengths"].sum()) for b in loader) * per_frame
    wall = time.perf_counter() - t0
    print(f"{nbytes / wall / 1e6:.0f} MB/s, CPU/wall {(time.process_time() - c0) / wall:.2f}")


def plot(rows: dict[str, dict], path: Path, machine: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(rows)
    for j, (name, r) in enumerate(rows.items()):
        v = [r[f"{k}_vs_memcpy"] for k in KERNELS]
        ax.bar(np.arange(len(KERNELS)) + j * width, [100 * x["median"] for x in v], width, capsize=3, label=name,
               yerr=[[100 * (x["median"] - x["min"]) for x in v], [100 * (x["max"] - x["median"]) for x in v]])
    ax.set_xticks(np.arange(len(KERNELS)) + 0.4 - width / 2, list(KERNELS))
    ax.set_ylabel("% of memcpy (median round, range)")
    ax.set_title(f"copy kernels on real shards, 38,400-frame batches\n{machine}", fontsize=9)
    ax.legend(fontsize=8)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, action="append", help="shard folder (once per corpus)")
    p.add_argument("--feature", default="mel")
    p.add_argument("--budget", type=int, default=38_400, help="padded frames per batch")
    p.add_argument("--rounds", type=int, default=5, help="rounds, corpora interleaved")
    p.add_argument("--seed", type=int, default=0)
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
