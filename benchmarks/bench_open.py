"""From make_loader to the first batch in hand, in fresh processes (imports done before the clock starts). The
commands and the results: docs/bench-loader.md#first-batch (--shards), docs/sampler.md#plans-at-scale and
docs/loader.md (--out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from results_io import child_result, host, output_args, peak_rss_mb, pyplot, save, spread, write_results

ROWS_PER_SHARD = 10_000
FEATURE = "voiced"
BUDGET = 38_400  # padded frames per batch


def write_folder(root: Path, shards: list[list[dict]], spec, job: str) -> Path:
    """A shard folder of these rows (one list per shard) through the real writer, index and manifest."""
    from audiopipe.decode.audio import resampler_info
    from audiopipe.index.lengths import build_index
    from audiopipe.shard.manifest import assemble_manifest
    from audiopipe.shard.writer import ArrayColumn, write_arrow

    features = {spec.name: {**spec.to_dict(), "hash": spec.config_hash}}
    columns = [ArrayColumn(spec.name, spec.dtype, spec.channels)]
    records = []
    for k, rows in enumerate(shards):
        name = f"shard-{k:06d}"
        digest = write_arrow(root / "arrow" / f"{name}.arrow", rows, columns, [], {"features": features, "job": job})
        records.append({"name": name, "rows": len(rows), "duration": sum(r["duration"] for r in rows),
                        "rejects": [], "arrow": digest.entry(f"arrow/{name}.arrow")})
    index = build_index(root, [r["arrow"]["path"] for r in records])
    assemble_manifest(root, records, features, resampler_info(), {"presets": [job]}, sum(len(s) for s in shards), 0,
                      index)
    return root


def _frames(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(np.exp(rng.normal(np.log(500), 0.6, n)), 50, 2000).astype(np.int32)


def build(out: Path, n: int) -> Path:
    """A folder of n utterances under `out` (kept when it exists)."""
    from audiopipe.features.registry import build_feature

    root = out / f"n{n}"
    if (root / "manifest.json").exists():
        return root
    spec = next(s for s in build_feature("f0", sample_rate=16000, hop_length=160).specs if s.name == FEATURE)
    rng = np.random.default_rng(0)
    shards = []
    for start in range(0, n, ROWS_PER_SHARD):
        frames = _frames(rng, min(ROWS_PER_SHARD, n - start))
        shards.append([{"id": f"spk{i % 997}/utt{i:08d}", "speaker": f"spk{i % 997}", "source": f"utt{i:08d}.wav",
                        "text": "a short transcript of the utterance", "duration": float(t) / 100, "scalars": {},
                        "arrays": {FEATURE: np.ones(t, np.uint8)}} for i, t in enumerate(frames.tolist(), start)])
    return write_folder(root, shards, spec, "bench_open")


def build_index_only(out: Path, n: int) -> Path:
    """A folder holding only an index.arrow of n rows, with build_index's schema (kept when it exists)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from audiopipe.index.lengths import INDEX_NAME
    from audiopipe.storage.atomic import atomic_path

    root = out / f"index{n}"
    if (root / INDEX_NAME).exists():
        return root

    def strings(prefix: str, numbers: np.ndarray, digits: int) -> pa.Array:  # in Arrow: 50M Python strings take minutes
        padded = pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), digits, "0")
        return pc.binary_join_element_wise(prefix, padded, "")

    frames = _frames(np.random.default_rng(0), n)
    i = np.arange(n, dtype=np.int64)
    table = pa.table({"id": strings("utt", i, 9), "speaker": strings("spk", i % 997, 3),
                      "duration": pa.array(frames.astype(np.float32) / 100), f"{FEATURE}_frames": pa.array(frames),
                      "shard": pa.array((i // ROWS_PER_SHARD).astype(np.int32)),
                      "row": pa.array((i % ROWS_PER_SHARD).astype(np.int32))})
    with atomic_path(root / INDEX_NAME, durable=False) as tmp, pa.ipc.new_file(str(tmp), table.schema) as w:
        w.write_table(table.combine_chunks())
    return root


def memory_mb() -> tuple[float, float]:
    """(RSS, private RSS) of this process in MB."""
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmRSS", "RssAnon")))
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["RssAnon"].split()[0]) / 1024


def child(kind: str, path: str) -> dict:
    """One process's figures: `index` (an index.arrow alone), `size` (a generated folder), or on a real corpus
    `prefetch2`, `prefetch0` or `stages` (prefetch=0, the first batch's stages called one by one, then the same rows
    collated into the second, also fresh, ring slot and into the first, already faulted in)."""
    import resource

    from audiopipe.index.lengths import LengthIndex
    from audiopipe.sampler.bucket import BucketBatchSampler

    if kind != "index":  # an index alone is read without torch: its memory is the index's and the sampler's
        import pyarrow as pa
        import torch

        from audiopipe.collate import kernels
        from audiopipe.reader.arrow_dataset import ShardDataset
        from audiopipe.reader.loader import make_loader

        torch.set_num_threads(1)
        pa.table({"x": [0]}).column("x").to_numpy()  # pyarrow's lazy pandas import, as bench-loader preloads it
    out: dict = {"rss_start_mb": memory_mb()[0]}
    stamps: dict[str, dict] = {}
    first = 0.0  # from make_loader to the first batch; for an index alone, from its open

    def stage(name: str, fn, to_first: bool = True):
        """fn(), its wall time and its minor page faults."""
        nonlocal first
        f0, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        got = fn()
        stamps[name] = {"s": time.perf_counter() - t, "minor_faults": resource.getrusage(
            resource.RUSAGE_SELF).ru_minflt - f0}
        first += stamps[name]["s"] if to_first else 0.0
        return got

    if kind == "index":
        idx = stage("open", lambda: LengthIndex.open(path))
        out["rss_open_mb"], out["private_open_mb"] = memory_mb()
        sampler = stage("sampler_build", lambda: BucketBatchSampler(idx.frames(FEATURE).astype(np.int64), BUDGET,
                                                                    seed=0, rank=0, world_size=1024))
        stage("sampler_first_batch", lambda: next(iter(sampler)))
        out["peak_rss_mb"] = peak_rss_mb()  # a child: its own peak, not the parent's carried over exec
    elif kind == "size":
        stage("open", lambda: ShardDataset(path, [FEATURE]), to_first=False)
        out["rss_open_mb"], out["private_open_mb"] = memory_mb()
        loader = stage("make_loader", lambda: make_loader(path, [FEATURE], max_frames=BUDGET, seed=0))
        it = iter(loader)
        stage("next", lambda: next(it))
        out["kernel_ready_at_first_batch"] = kernels.kernels_ready()  # or did the first batch take numpy's path?
        out["batches_per_epoch"] = len(loader)

        def next_200() -> None:
            nonlocal it
            for epoch in range(1, 201):
                if next(it, None) is None:  # a small corpus: on with the next epoch
                    loader.set_epoch(epoch)
                    it = iter(loader)
                    next(it)

        stage("next_200_batches", next_200, to_first=False)
        out["rss_after_mb"], out["private_after_mb"] = memory_mb()
    elif kind == "stages":
        loader = stage("make_loader", lambda: make_loader(path, ["mel"], max_frames=BUDGET, prefetch=0))
        idx = stage("plan", lambda: next(iter(loader.sampler)))
        rows = stage("rows", lambda: loader.dataloader.dataset.__getitems__(idx))
        batch = stage("collate", lambda: loader.dataloader.collate_fn(rows))
        out["batch_mb"] = batch["mel"].numel() * batch["mel"].element_size() / 1e6
        stage("collate_fresh_slot", lambda: loader.dataloader.collate_fn(rows), to_first=False)
        stage("collate_faulted_slot", lambda: loader.dataloader.collate_fn(rows), to_first=False)
        out["stages"] = stamps
    else:
        loader = stage("make_loader", lambda: make_loader(path, ["mel"], max_frames=BUDGET,
                                                          prefetch=2 if kind == "prefetch2" else 0))
        stage("next", lambda: next(iter(loader)))
    return {**out, "first_batch_s": first, **{f"{k}_s": v["s"] for k, v in stamps.items()}}


def rounds_of(kind: str, path: Path, rounds: int) -> list[dict]:
    cmd = [sys.executable, __file__, "--child", kind, str(path)]
    return [child_result(cmd, what=f"{kind} {path}") for _ in range(rounds)]


def figures_of(n: int, runs: list[dict], **extra) -> dict:
    """Every figure's median and range over the rounds, and the rounds."""
    figures = {k: spread(x[k] for x in runs) for k, v in runs[0].items() if isinstance(v, float)}
    return {"utterances": n, **extra, **figures, "runs": runs}


def plot(results: list[dict], path: Path, machine: str) -> None:
    fig, ax = pyplot().subplots(figsize=(6.5, 4))
    n = [r["utterances"] for r in results]
    s = [r["first_batch_s"] for r in results]
    ax.errorbar(n, [x["median"] for x in s], yerr=[[x["median"] - x["min"] for x in s],
                                                  [x["max"] - x["median"] for x in s]], marker="o", capsize=3)
    ax.set(xscale="log", xlabel="utterances", ylabel="make_loader -> first batch, s (median, range)")
    ax.grid(alpha=0.3)
    ax.set_title(f"bench_open: {machine}", fontsize=9)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=Path, help="a real shard folder with a `mel` feature: per round, in turn, "
                   "make_loader's defaults (prefetch2), prefetch=0 (prefetch0) and the first batch's stages (stages)")
    p.add_argument("--out", type=Path, help="folder for the generated shard folders (reused when present)")
    p.add_argument("--sizes", default="10000,100000,1000000", help="utterance counts of folders generated under "
                   "--out: open, make_loader, the first batch, 200 more, the RSS and its private part")
    p.add_argument("--index-sizes", default="", help="utterance counts of an index.arrow alone: its open, a "
                   "1,024-rank sampler on its frames column, the sampler's first batch, the peak RSS")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per size or way")
    p.add_argument("--quick", action="store_true", help="--out: 1,000,000 utterances only, no index-only sizes")
    output_args(p)
    a = p.parse_args()
    if (a.shards is None) == (a.out is None):
        p.error("give --shards (a real corpus) or --out (generated folders)")
    result: dict = {"command": " ".join(["python", "benchmarks/bench_open.py", *sys.argv[1:]]),
                    "machine": host(a.machine), "batch_frames": BUDGET, "rounds": a.rounds}
    if a.shards:
        runs: dict[str, list] = {"prefetch2": [], "prefetch0": [], "stages": []}
        for _ in range(a.rounds):  # the ways alternate within a round
            for way in runs:
                runs[way] += rounds_of(way, a.shards, 1)
        summary = {w: spread(x["first_batch_s"] for x in rs) for w, rs in runs.items()}
        for name in runs["stages"][0]["stages"]:
            summary[f"stage_{name}_ms"] = spread(1e3 * x["stages"][name]["s"] for x in runs["stages"])
            summary[f"stage_{name}_minor_faults"] = spread(x["stages"][name]["minor_faults"] for x in runs["stages"])
        result.update(shards=str(a.shards), summary=summary, runs=runs)
        print({k: round(v["median"], 4) for k, v in summary.items()})
    else:
        sizes, index_sizes = ("1000000", "") if a.quick else (a.sizes, a.index_sizes)
        result["index_only"] = []
        for n in [int(s) for s in index_sizes.split(",") if s]:
            root = build_index_only(a.out, n)
            result["index_only"].append(figures_of(n, rounds_of("index", root, a.rounds),
                                                index_bytes=(root / "index.arrow").stat().st_size))
            print(f"{n:,} (index only): open {result['index_only'][-1]['open_s']}", flush=True)
        result["results"] = []
        for n in [int(s) for s in sizes.split(",") if s]:
            result["results"].append(figures_of(n, rounds_of("size", build(a.out, n), a.rounds)))
            print(f"{n:,}: make_loader to first batch {result['results'][-1]['first_batch_s']}", flush=True)
    write_results(result, a.json, lambda path: plot(result.get("results", []), path, a.machine), a.plot)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":  # --child KIND PATH
        print("RESULT " + json.dumps(child(*sys.argv[2:])), flush=True)
    else:
        main()
