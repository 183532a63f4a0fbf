"""The loader's regression guard: make_loader's raw throughput as a ratio to a reference loop in the same process.

A small fixed synthetic corpus (seeded random 100-bin mels written by the real shard writer) is read two ways,
alternating, `rounds` times:
  loader     make_loader(shards, ["mel"], max_frames=BUDGET) with its defaults (prefetch 2, no workers), every
             batch of an epoch taken by a consumer that does nothing else;
  reference  the same batches (the same sampler's plan) copied by a plain numpy loop into one padded buffer per
             batch, from row views located before the clock starts: the bytes any loader must move, and no more.
ratio = the reference's CPU time / the loader's CPU time (the process's, all threads: the prefetch thread's work
counts, a wait does not), from the cheapest round of each (1.0: the loader costs nothing beyond the copy). CPU
time, not wall time: on this 2-core machine at a load of 25-35, wall-time ratios of single rounds ranged 0.01-1.8
(each hand-over to the prefetch thread waits for a core), while CPU time only counts the work. The wall-time ratio
is reported beside it. The ratio is compared with the committed value and fails only below half of it
(benchmarks/bench_copy.py --guard, tests/test_loader_guard.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from audiopipe.errors import Failed
from audiopipe.features.registry import build_feature
from audiopipe.index.lengths import build_index
from audiopipe.reader.loader import make_loader
from audiopipe.shard.manifest import assemble_manifest
from audiopipe.shard.writer import ArrayColumn, write_arrow

UTTERANCES = (120, 120, 120)  # rows per shard
FRAMES = (40, 600)  # mel frames per utterance, uniform
BUDGET = 6_000  # padded frames per batch: ~20 batches an epoch
SEED = 11


def write_guard_corpus(out: Path) -> Path:
    """The guard's shard folder at `out` (about 40 MB of float32 mels), written once; returns `out`."""
    if (out / "manifest.json").exists():
        return out
    spec = build_feature("vocos_mel").specs[0]
    cols = [ArrayColumn(spec.name, spec.dtype, spec.channels)]
    features = {spec.name: {**spec.to_dict(), "hash": spec.config_hash}}
    rng = np.random.default_rng(SEED)
    records, total = [], 0
    for k, n in enumerate(UTTERANCES):
        rows = []
        for j in range(n):
            t = int(rng.integers(*FRAMES))
            rows.append({"id": f"guard/{k}-{j:04d}", "speaker": f"s{j % 4}", "text": "", "source": f"{k}-{j}.wav",
                         "duration": t * 256 / 24000, "scalars": {},
                         "arrays": {spec.name: rng.standard_normal((spec.channels, t)).astype(np.float32)}})
        name = f"shard-{k:06d}"
        digest = write_arrow(out / "arrow" / f"{name}.arrow", rows, cols, [], {"features": features, "job": "guard"})
        records.append({"name": name, "rows": n, "duration": sum(r["duration"] for r in rows), "rejects": [],
                        "arrow": digest.entry(f"arrow/{name}.arrow")})
        total += n
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, {}, {"presets": ["guard"]}, total, 0, index)
    return out


def _loader_epoch(loader, epoch: int) -> tuple[float, float, int]:
    """(wall s, process CPU s, values padded) of one epoch taken from `loader`."""
    loader.set_epoch(epoch)
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for batch in loader:
        n += batch["mel"].numel()
    return time.perf_counter() - t0, time.process_time() - c0, n


def _reference_epoch(views: list[np.ndarray], batches: list[list[int]]) -> tuple[float, float, int]:
    t0, c0 = time.perf_counter(), time.process_time()
    n = 0
    for rows in batches:
        t_max = max(views[i].shape[-1] for i in rows)
        out = np.empty((len(rows), views[rows[0]].shape[0], t_max), dtype=np.float32)
        for b, i in enumerate(rows):
            v = views[i]
            out[b, :, : v.shape[-1]] = v
            out[b, :, v.shape[-1]:] = 0
        n += out.size
    return time.perf_counter() - t0, time.process_time() - c0, n


def measure(shards: Path, rounds: int = 9) -> dict:
    """The reference/loader CPU-time ratio of the cheapest whole epochs of the guard corpus, the same in wall
    time, and every round's figures."""
    loader = make_loader(shards, ["mel"], max_frames=BUDGET, seed=SEED)
    _loader_epoch(loader, 0)  # warm: pages in the cache, the copy kernel loaded
    plan = make_loader(shards, ["mel"], max_frames=BUDGET, seed=SEED, prefetch=0)
    views = [plan.dataset[i]["mel"] for i in range(len(plan.dataset))]
    side: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in ("loader", "reference")}
    for r in range(rounds):
        plan.sampler.set_epoch(1 + r)
        batches = list(plan.sampler)
        ref = _reference_epoch(views, batches)
        got = _loader_epoch(loader, 1 + r)
        if got[2] != ref[2]:
            raise Failed(f"the loader padded {got[2]} values, the reference {ref[2]}: not the same batches")
        for k, m in (("loader", got), ("reference", ref)):
            side[k]["wall"].append(round(m[0], 5))
            side[k]["cpu"].append(round(m[1], 5))
    ratio = {c: min(side["reference"][c]) / min(side["loader"][c]) for c in ("cpu", "wall")}
    return {"ratio": ratio["cpu"], "wall_ratio": ratio["wall"], "rounds": rounds, **side, "batches": len(batches),
            "bytes_per_epoch": int(ref[2] * 4), "load_avg": list(os.getloadavg())}
