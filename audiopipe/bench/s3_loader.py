"""`audiopipe bench-loader --shards s3://bucket/prefix`: make_loader reading from object storage, timed.

The local loaders bench-loader compares need local files; from a bucket there is one: make_loader itself, rows
fetched by byte range with read-ahead. Reported: audio seconds per second (the loader alone, one epoch), the
data-wait share of a loop with a synthetic 50 ms step (time.sleep, which releases the GIL as a CUDA step does;
prefetch=2; each epoch's first batch excluded), bytes requested per byte delivered and requests per
batch (from the reader's diagnostics). benchmarks/bench_s3.py runs the same measurements side by side with the
local folder against a test server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

STEP_MS = 50.0


def _loader(src: str, feature: str, batch_frames: int, **kw):
    from audiopipe.reader.loader import make_loader

    # passes=1: an epoch here is one pass over the corpus (its throughput, its requests), whatever its size.
    return make_loader(src, [feature], max_frames=batch_frames, rank=0, world_size=1, seed=0, passes=1, **kw)


def throughput(src: str, feature: str, batch_frames: int) -> dict:
    loader = _loader(src, feature, batch_frames, prefetch=2)
    loader.set_epoch(0)
    audio = batches = 0
    t0 = time.perf_counter()
    for b in loader:
        audio += float(sum(b["duration"]))
        batches += 1
    dt = time.perf_counter() - t0
    return {"audio_s_per_s": audio / dt, "batches": batches, "epoch_s": dt}


def data_wait(src: str, feature: str, batch_frames: int, step_ms: float, passes: int, prefetch: int = 2) -> dict:
    loader = _loader(src, feature, batch_frames, prefetch=prefetch)
    wait = wall = 0.0
    first = []
    batches = 0
    for epoch in range(passes):
        loader.set_epoch(epoch)
        it = iter(loader)
        t_start = time.perf_counter()
        next(it)
        first.append((time.perf_counter() - t_start) * 1e3)
        t_loop = time.perf_counter()
        while True:
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t
            batches += 1
            time.sleep(step_ms / 1e3)
        wall += time.perf_counter() - t_loop
    out = {"wait_share": wait / wall, "wait_ms_per_batch": wait / max(batches, 1) * 1e3,
           "first_batch_ms": float(np.median(first)), "timed_batches": batches}
    d = loader.dataset.diagnostics()
    if "requests" in d:
        total = batches + passes
        out.update(requests=d["requests"], bytes_requested=d["bytes_requested"],
                   bytes_delivered=d["bytes_delivered"],
                   bytes_requested_per_byte_delivered=d["bytes_requested_per_byte_delivered"],
                   requests_per_batch=d["requests"] / total, ranges_prefetched=d["ranges_prefetched"],
                   ranges_taken=d["ranges_taken"], retries=d["retries"])
    return out



def run_s3(args: argparse.Namespace) -> int:
    """bench-loader's entry for an s3:// --shards (its other flags but --batch-frames/--feature/--json ignored)."""
    t = throughput(args.shards, args.feature, args.batch_frames)
    w = data_wait(args.shards, args.feature, args.batch_frames, STEP_MS, passes=1)
    report = {"command": f"audiopipe bench-loader --shards {args.shards} --batch-frames {args.batch_frames}",
              "source": args.shards, "loader": "mmap (make_loader, rows by byte range, prefetch=2)",
              "loadavg": os.getloadavg()[0], **t, f"wait_{STEP_MS:g}ms": w}
    print(f"s3 {args.shards}: {t['audio_s_per_s']:.0f} audio s/s; with a {STEP_MS:g} ms step the loop waits "
          f"{100 * w['wait_share']:.2f} % of its time; {w['bytes_requested_per_byte_delivered']:.3f} bytes asked "
          f"per byte delivered, {w['requests_per_batch']:.1f} requests per batch")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
