"""Where the first batch's time goes: make_loader to the first batch in hand, stage by stage, in fresh processes.

    python benchmarks/bench_first_batch.py --shards /tmp/loaderbench/bigshards --rounds 5 \
        --json benchmarks/results/first_batch.json

Each round runs, in alternation, fresh processes (imports done before the clock starts, as bench-loader's
children do) that take the first batch three ways:
  prefetch2  make_loader's defaults (the prefetch thread builds the first batch) - what a user gets;
  prefetch0  make_loader(prefetch=0): built on the caller's thread;
  stages     make_loader(prefetch=0), then the first batch's stages called one by one on the caller's thread:
             the sampler's first batch (the epoch plan), the dataset's __getitems__ (mapping the shards it
             touches, reading their rows' metadata), the collate (the copy into a fresh ring slot), each with
             its wall time and its minor page faults; then the same rows collated again into the ring's second,
             also fresh, slot, and a third time into the first slot, already faulted in.
prefetch2 against prefetch0 says whether anything of the thread (its start, the copy kernel's background load,
the read-ahead) competes with the first batch; the stages say what the batch itself costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from results_io import child_result  # benchmarks/ (the script's own folder is on sys.path)

TAG = "FIRST_BATCH "


def child(shards: str, way: str, budget: int) -> dict:
    import resource

    import pyarrow as pa
    import torch

    from audiopipe.reader.loader import make_loader

    torch.set_num_threads(1)
    pa.table({"x": [0]}).column("x").to_numpy()  # pyarrow's lazy pandas import, as bench-loader preloads it

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    out: dict = {"way": way}
    t0 = time.perf_counter()
    if way != "stages":
        loader = make_loader(shards, ["mel"], max_frames=budget, prefetch=2 if way == "prefetch2" else 0)
        out["make_loader_s"] = time.perf_counter() - t0
        next(iter(loader))
        out["first_batch_s"] = time.perf_counter() - t0
        return out
    stamps = []

    def stage(name: str, fn):
        f0, t = faults(), time.perf_counter()
        got = fn()
        stamps.append((name, time.perf_counter() - t, faults() - f0))
        return got

    loader = stage("make_loader", lambda: make_loader(shards, ["mel"], max_frames=budget, prefetch=0))
    idx = stage("plan", lambda: next(iter(loader.sampler)))
    view, collate = loader.dataloader.dataset, loader.dataloader.collate_fn
    rows = stage("rows", lambda: view.__getitems__(idx))
    batch = stage("collate", lambda: collate(rows))
    out["first_batch_s"] = time.perf_counter() - t0
    out["batch_mb"] = batch["mel"].numel() * batch["mel"].element_size() / 1e6
    stage("collate_fresh_slot", lambda: collate(rows))
    stage("collate_faulted_slot", lambda: collate(rows))
    out["stages"] = {n: {"s": s, "minor_faults": f} for n, s, f in stamps}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch-frames", type=int, default=38_400)
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU (other jobs running)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    runs: dict[str, list] = {"prefetch2": [], "prefetch0": [], "stages": []}
    loads = []
    for r in range(a.rounds):
        for way in runs:
            cmd = [sys.executable, __file__, "--child", json.dumps([a.shards, way, a.batch_frames])]
            res = child_result(cmd, TAG, what=way)
            runs[way].append(res)
            loads.append(os.getloadavg()[0])
            print(f"[{r + 1}/{a.rounds}] {way:<10} first batch {res['first_batch_s']:.3f} s"
                  + (" | " + ", ".join(f"{n} {v['s'] * 1e3:.1f} ms ({v['minor_faults']} faults)"
                                       for n, v in res["stages"].items()) if "stages" in res else ""), flush=True)
    summary = {w: {"median_s": float(np.median([x["first_batch_s"] for x in rs])),
                   "range_s": [min(x["first_batch_s"] for x in rs), max(x["first_batch_s"] for x in rs)]}
               for w, rs in runs.items()}
    stages = runs["stages"][0]["stages"]
    summary["stages_median_ms"] = {n: float(np.median([x["stages"][n]["s"] for x in runs["stages"]]) * 1e3)
                                   for n in stages}
    summary["stages_minor_faults"] = {n: int(np.median([x["stages"][n]["minor_faults"] for x in runs["stages"]]))
                                      for n in stages}
    result = {"command": "python benchmarks/bench_first_batch.py " + " ".join(sys.argv[1:]),
              "machine": a.machine, "shards": a.shards, "batch_frames": a.batch_frames, "rounds": a.rounds,
              "load_avg": loads, "summary": summary, "runs": runs}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        print(TAG + json.dumps(child(*json.loads(sys.argv[2]))), flush=True)
    else:
        main()
