"""What opening a shard folder costs as the corpus grows: time to a ready loader and first batch, and memory.

    python benchmarks/bench_open.py --out /tmp/openbench --sizes 10000,100000,1000000 --index-sizes 50000000 \
        --json benchmarks/results/open.json

For each size a shard folder is written once with the real writer, index and manifest (rows of a small uint8
feature, lengths log-normal 50-2000 frames: the payload does not matter here, the row count does). Then, in a
fresh process per size: ShardDataset open, make_loader (which plans the first epoch over all lengths), the
first batch, and 200 more; wall time of each step and the process' resident memory (RSS, and its private
part: what is not page cache of the mapped files).

--index-sizes: the length index alone at a scale no shard folder here can hold (50M utterances). An
index.arrow with build_index's schema (id, speaker, duration, voiced_frames, shard, row; one record batch) is
written directly from arrays, then in a fresh process: LengthIndex.open (memory-mapped: no column is read),
the frames column as numpy (zero-copy), the BucketBatchSampler built on it and its first batch (1,024 ranks),
with the peak RSS. Target (issue 11.3): open < 1 s at 50M.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from results_io import MACHINE, child_result, host, pyplot, save  # benchmarks/ (the script's own folder is on sys.path)

ROWS_PER_SHARD = 10_000
FEATURE = "voiced"


def build(out: Path, n: int, seed: int = 0) -> Path:
    """Write a folder of n utterances (skipped when it exists already)."""
    from audiopipe.decode.audio import resampler_info
    from audiopipe.features.registry import build_feature
    from audiopipe.index.lengths import build_index
    from audiopipe.shard.manifest import assemble_manifest
    from audiopipe.shard.writer import ArrayColumn, write_arrow

    root = out / f"n{n}"
    if (root / "manifest.json").exists():
        return root
    spec = next(s for s in build_feature("f0", sample_rate=16000, hop_length=160).specs if s.name == FEATURE)
    cols = [ArrayColumn(spec.name, spec.dtype, spec.channels)]
    features = {spec.name: {**spec.to_dict(), "hash": spec.config_hash}}
    rng = np.random.default_rng(seed)
    records, done = [], 0
    while done < n:
        k = len(records)
        m = min(ROWS_PER_SHARD, n - done)
        frames = np.clip(np.exp(rng.normal(np.log(500), 0.6, m)), 50, 2000).astype(int)
        rows = [{"id": f"spk{(done + j) % 997}/utt{done + j:08d}", "speaker": f"spk{(done + j) % 997}",
                 "text": "a short transcript of the utterance", "source": f"utt{done + j:08d}.wav",
                 "duration": float(t) / 100, "arrays": {FEATURE: np.ones(t, np.uint8)}, "scalars": {}}
                for j, t in enumerate(frames.tolist())]
        name = f"shard-{k:06d}"
        path = root / "arrow" / f"{name}.arrow"
        digest = write_arrow(path, rows, cols, [], {"features": features, "job": "bench_open"})
        records.append({"name": name, "rows": m, "duration": float(frames.sum()) / 100, "rejects": [],
                        "arrow": digest.entry(f"arrow/{name}.arrow")})
        done += m
    index = build_index(root, [r["arrow"]["path"] for r in records])
    assemble_manifest(root, records, features, resampler_info(), {"presets": ["bench_open"]}, n, 0, index)
    return root


def build_index_only(out: Path, n: int, seed: int = 0) -> Path:
    """A folder holding just an index.arrow of n rows (skipped when it exists already)."""
    import pyarrow as pa

    from audiopipe.index.lengths import INDEX_NAME

    root = out / f"index{n}"
    if (root / INDEX_NAME).exists():
        return root
    root.mkdir(parents=True, exist_ok=True)

    def fixed_strings(prefix: bytes, numbers: np.ndarray, digits: int) -> pa.Array:
        # n ids as one data buffer + offsets (50M Python strings would take minutes).
        width = len(prefix) + digits
        data = np.empty((numbers.size, width), dtype=np.uint8)
        data[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        rest = numbers.copy()
        for d in range(digits - 1, -1, -1):
            data[:, len(prefix) + d] = ord("0") + rest % 10
            rest //= 10
        offsets = np.arange(numbers.size + 1, dtype=np.int64) * width
        return pa.LargeStringArray.from_buffers(numbers.size, pa.py_buffer(offsets), pa.py_buffer(data))

    rng = np.random.default_rng(seed)
    frames = np.clip(np.exp(rng.normal(np.log(500), 0.6, n)), 50, 2000).astype(np.int32)
    i = np.arange(n, dtype=np.int64)
    table = pa.table({
        "id": fixed_strings(b"utt", i, 9).cast(pa.string()) if n * 12 < 2**31 else fixed_strings(b"utt", i, 9),
        "speaker": fixed_strings(b"spk", i % 997, 3).cast(pa.string()),
        "duration": pa.array(frames.astype(np.float32) / 100),
        f"{FEATURE}_frames": pa.array(frames),
        "shard": pa.array((i // ROWS_PER_SHARD).astype(np.int32)),
        "row": pa.array((i % ROWS_PER_SHARD).astype(np.int32)),
    })
    path = root / INDEX_NAME
    with pa.OSFile(str(path) + ".tmp", "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table.combine_chunks())
    os.replace(str(path) + ".tmp", path)
    return root


REPO = Path(__file__).resolve().parent.parent


def run_child(args: list[str]) -> dict:
    """This file in a fresh process."""
    return child_result([sys.executable, __file__, *args], what=f"child {args}")


def child_index(root: str) -> dict:
    import resource

    from audiopipe.index.lengths import LengthIndex
    from audiopipe.sampler.bucket import BucketBatchSampler

    out = {"rss_start_mb": memory_mb()[0]}
    t0 = time.perf_counter()
    idx = LengthIndex.open(root)
    out["open_s"] = time.perf_counter() - t0
    out["rss_open_mb"], out["private_open_mb"] = memory_mb()
    t0 = time.perf_counter()
    frames = idx.frames(FEATURE)
    out["frames_column_s"] = time.perf_counter() - t0
    out["utterances"] = len(idx)
    t0 = time.perf_counter()
    sampler = BucketBatchSampler(frames.astype(np.int64), 38_400, seed=0, rank=0, world_size=1024)
    out["sampler_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    next(iter(sampler))
    out["sampler_first_batch_s"] = time.perf_counter() - t0
    out["open_to_first_batch_s"] = out["open_s"] + out["frames_column_s"] + out["sampler_build_s"] + \
        out["sampler_first_batch_s"]
    out["rss_after_mb"], out["private_after_mb"] = memory_mb()
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def memory_mb() -> tuple[float, float]:
    """(RSS, private RSS) of this process in MB, from /proc/self/status."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("RssAnon", 0.0)


def child(root: str) -> dict:
    import torch

    from audiopipe.reader.arrow_dataset import ShardDataset
    from audiopipe.reader.loader import make_loader

    torch.set_num_threads(1)
    out = {"rss_start_mb": memory_mb()[0]}
    t0 = time.perf_counter()
    ds = ShardDataset(root, [FEATURE])
    out["open_s"] = time.perf_counter() - t0
    out["rss_open_mb"], out["private_open_mb"] = memory_mb()
    from audiopipe.collate import kernels

    t0 = time.perf_counter()
    loader = make_loader(root, [FEATURE], max_frames=38_400, seed=0)
    out["make_loader_s"] = time.perf_counter() - t0
    it = iter(loader)
    next(it)
    out["loader_and_first_batch_s"] = time.perf_counter() - t0
    # Was the compiled copy kernel loaded by then, or did the first batch take the numpy path meanwhile?
    out["kernel_ready_at_first_batch"] = kernels.kernels_ready()
    out["utterances"] = len(ds)
    out["batches_per_epoch"] = len(loader)
    t0 = time.perf_counter()
    epoch = 0
    for _ in range(200):
        try:
            next(it)
        except StopIteration:  # a small corpus: go on with the next epoch
            epoch += 1
            loader.set_epoch(epoch)
            it = iter(loader)
            next(it)
    out["next_200_batches_s"] = time.perf_counter() - t0
    out["rss_after_mb"], out["private_after_mb"] = memory_mb()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for the generated shard folders (reused when present)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated utterance counts")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per size; the median is reported")
    p.add_argument("--index-sizes", default="", help="comma-separated utterance counts of index-only folders")
    p.add_argument("--plot", default=None, help="PNG of make_loader -> first batch per size")
    p.add_argument("--quick", action="store_true",
                   help="1,000,000 utterances only, no index-only sizes (< 2 min once the folder exists)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-index", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.index_sizes = "1000000", ""
    if args.child:
        print("RESULT " + json.dumps(child(args.child)))
        return
    if args.child_index:
        print("RESULT " + json.dumps(child_index(args.child_index)))
        return
    results, index_results = measure(args)
    if args.json:
        report = {"command": "python benchmarks/bench_open.py " + " ".join(argv or sys.argv[1:]),
                  "machine": host(MACHINE),
                  "results": results, "index_only": index_results}
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot and results:
        plot(results, Path(args.plot))


def plot(results: list[dict], path: Path) -> None:
    plt = pyplot()

    n = [r["utterances"] for r in results]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    y = [r["loader_and_first_batch_s"] for r in results]
    lo = [v - r["loader_and_first_batch_s_range"][0] for v, r in zip(y, results)]
    hi = [r["loader_and_first_batch_s_range"][1] - v for v, r in zip(y, results)]
    ax.errorbar(n, y, yerr=[lo, hi], marker="o", capsize=3, label="make_loader -> first batch")
    ax.axhline(0.1, color="grey", linestyle="dashed", label="target 0.1 s (issue 10.2)")
    ax.set_xscale("log")
    ax.set_xlabel("utterances")
    ax.set_ylabel("make_loader -> first batch, s (median, range)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("bench_open: 2-core shared CPU VM, no GPU, other jobs running", fontsize=9)
    save(fig, path)
    print(f"wrote {path}")


def median_of(runs: list[dict]) -> dict:
    """The median round (by make_loader to first batch), with the range over rounds and every round's figure."""
    firsts = [x["loader_and_first_batch_s"] for x in runs]
    r = dict(runs[int(np.argsort(firsts)[len(firsts) // 2])])
    r["loader_and_first_batch_s_range"] = [min(firsts), max(firsts)]
    r["loader_and_first_batch_s_rounds"] = firsts
    r["rounds"] = len(runs)
    return r


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    results = []
    index_results = []
    for n in [int(s) for s in args.index_sizes.split(",") if s]:
        t0 = time.perf_counter()
        root = build_index_only(Path(args.out), n)
        built = time.perf_counter() - t0
        runs = [run_child(["--out", args.out, "--child-index", str(root)]) for _ in range(args.rounds)]
        opens = [x["open_s"] for x in runs]
        r = dict(runs[int(np.argsort(opens)[len(opens) // 2])])
        r["open_s_range"] = [min(opens), max(opens)]
        firsts = [x["open_to_first_batch_s"] for x in runs]
        r["open_to_first_batch_s_range"] = [min(firsts), max(firsts)]
        r["rounds"], r["build_s"] = len(runs), built
        r["index_bytes"] = (root / "index.arrow").stat().st_size
        index_results.append(r)
        print(f"{n:>11,} utterances (index only, {r['index_bytes'] / 1e9:.1f} GB): open {r['open_s']:.3f} s "
              f"(range {min(opens):.3f}-{max(opens):.3f}), frames column {r['frames_column_s']:.3f} s, sampler "
              f"build {r['sampler_build_s']:.2f} s + first batch {r['sampler_first_batch_s']:.2f} s, "
              f"RSS {r['rss_open_mb']:.0f} MB after open ({r['private_open_mb']:.0f} private), peak "
              f"{r['peak_rss_mb']:.0f} MB", flush=True)
    for n in [int(s) for s in args.sizes.split(",") if s]:
        t0 = time.perf_counter()
        root = build(Path(args.out), n)
        built = time.perf_counter() - t0
        r = median_of([run_child(["--out", args.out, "--child", str(root)]) for _ in range(args.rounds)])
        r["build_s"] = built
        results.append(r)
        firsts = r["loader_and_first_batch_s_range"]
        print(f"{n:>9,} utterances: open {r['open_s']:.3f} s, make_loader {r['make_loader_s']:.3f} s, loader + "
              f"first batch {r['loader_and_first_batch_s']:.3f} s (range {firsts[0]:.3f}-{firsts[1]:.3f}, "
              f"kernel ready: {r['kernel_ready_at_first_batch']}), 200 batches {r['next_200_batches_s']:.2f} s, "
              f"RSS {r['rss_open_mb']:.0f} MB after open ({r['private_open_mb']:.0f} private), "
              f"{r['rss_after_mb']:.0f} MB after 201 batches ({r['private_after_mb']:.0f} private)", flush=True)
    return results, index_results


if __name__ == "__main__":
    main()
