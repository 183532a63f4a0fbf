"""make_loader's batches, epoch after epoch, for a given time, taken by a loop that does nothing else: the process
to attach a profiler to (docs/bench-loader.md, "Where the CPU goes").

    python benchmarks/loader_loop.py --shards /tmp/loaderbench/bigshards --seconds 45 &
    sleep 20; perf record -F 1999 -p $! -o /tmp/loader.perf -- sleep 15
    perf report -i /tmp/loader.perf -s pid,dso --stdio     # per thread: the prefetch thread, the loop

It prints MB/s of real feature bytes and the process' CPU time over wall time at the end.
"""

from __future__ import annotations

import argparse
import time

import torch

from audiopipe.collate.kernels import wait_for_kernels
from audiopipe.reader.loader import make_loader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True)
    p.add_argument("--seconds", type=float, default=45.0)
    p.add_argument("--prefetch", type=int, default=2, help="make_loader's prefetch (default 2, its own default)")
    p.add_argument("--batch-frames", type=int, default=38_400)
    a = p.parse_args()
    torch.set_num_threads(1)
    loader = make_loader(a.shards, ["mel"], max_frames=a.batch_frames, prefetch=a.prefetch)
    it = iter(loader)
    batch = next(it)
    per_frame = batch["mel"][0, :, 0].numel() * batch["mel"].element_size()
    del it, batch
    wait_for_kernels()  # the steady state: the compiled copy kernel loaded
    t0, c0, epoch, nbytes = time.perf_counter(), time.process_time(), 0, 0
    while time.perf_counter() - t0 < a.seconds:
        epoch += 1
        loader.set_epoch(epoch)
        for batch in loader:
            nbytes += int(batch["mel_lengths"].sum()) * per_frame
    wall = time.perf_counter() - t0
    print(f"prefetch {a.prefetch}: {nbytes / wall / 1e6:.0f} MB/s, CPU/wall {(time.process_time() - c0) / wall:.2f}")


if __name__ == "__main__":
    main()
