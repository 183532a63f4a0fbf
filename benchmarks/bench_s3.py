"""make_loader on shards in an S3 bucket next to the same shards in a local folder (mmap), side by side.

    python benchmarks/bench_s3.py --json benchmarks/results/s3_loader.json --plot docs/img/s3_loader.png
    python benchmarks/bench_s3.py --quick          # < 2 min
    python benchmarks/bench_s3.py --shards ./shards # a real shard folder instead of the synthetic one

The bucket is a real S3 server on 127.0.0.1 (moto's server mode, the one the tests use; `pip install
moto[server]`), the folder copied under a prefix with pyarrow.fs.copy_files. Without --shards, a synthetic
shard folder (random 100-band float32 mels of 1-12 s, written by audiopipe's own writer) is made first.

Per source and round (rounds interleave local and s3, so a load spike hits one round of each):
  audio_s_per_s              audio seconds of batches per second, the loader alone (no step), one epoch
  wait_share                 time in next(loader) / wall time, with a synthetic --step-ms step (time.sleep,
                             which releases the GIL as a CUDA step does), prefetch=2 and read_ahead=2; each
                             epoch's first batch excluded (reported as first_batch_ms)
  bytes_requested_per_byte_delivered, requests_per_batch   (s3 only, from the reader's diagnostics)
Target (issue 11): the s3 loader's wait_share < 1 % under a 50 ms step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from results_io import write_results  # benchmarks/ (the script's own folder is on sys.path)


def synthetic_shards(out: Path, utterances: int, per_shard: int, seed: int = 0) -> Path:
    """A shard folder of random mels through the real writer, index and manifest."""
    from audiopipe.decode.audio import resampler_info
    from audiopipe.features.registry import build_feature
    from audiopipe.index.lengths import build_index
    from audiopipe.shard.checksum import sha256_file
    from audiopipe.shard.manifest import assemble_manifest
    from audiopipe.shard.writer import ArrayColumn, write_arrow

    if (out / "manifest.json").exists():
        return out
    spec = build_feature("vocos_mel").specs[0]
    features = {spec.name: {**spec.to_dict(), "hash": spec.config_hash}}
    rng = np.random.default_rng(seed)
    records, total = [], 0
    for k in range(0, utterances, per_shard):
        rows = []
        for j in range(k, min(k + per_shard, utterances)):
            t = int(rng.uniform(1, 12) * 93.75)
            rows.append({"id": f"utt{j:07d}", "speaker": f"spk{j % 50}", "text": f"text {j}",
                         "source": f"utt{j}.wav", "duration": float(np.float32(t / 93.75)),
                         "arrays": {spec.name: rng.standard_normal((spec.channels, t)).astype(np.float32)},
                         "scalars": {}})
        name = f"shard-{len(records):06d}"
        arrow = out / "arrow" / f"{name}.arrow"
        write_arrow(arrow, rows, [ArrayColumn(spec.name, spec.dtype, spec.channels)], [],
                    {"features": features, "job": "bench_s3"})
        records.append({"name": name, "rows": len(rows), "duration": sum(r["duration"] for r in rows),
                        "rejects": [], "arrow": {"path": f"arrow/{name}.arrow", "bytes": arrow.stat().st_size,
                                                 "sha256": sha256_file(arrow)}})
        total += len(rows)
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, resampler_info(), {"presets": ["bench_s3"]}, total, 0, index)
    return out


def start_server():
    import logging

    from moto.server import ThreadedMotoServer
    from pyarrow import fs as pafs

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    os.environ.update(env)
    admin = pafs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1",
                              endpoint_override=f"{host}:{port}", scheme="http", allow_bucket_creation=True)
    admin.create_dir("bench")
    return server, admin


def _loader(src: str, feature: str, batch_frames: int, **kw):
    from audiopipe.reader.loader import make_loader

    return make_loader(src, [feature], max_frames=batch_frames, rank=0, world_size=1, seed=0, **kw)


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


def data_wait(src: str, feature: str, batch_frames: int, step_ms: float, passes: int) -> dict:
    loader = _loader(src, feature, batch_frames, prefetch=2, read_ahead=2)
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


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    srcs = ["local", "s3"]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
    for i, (key, label) in enumerate((("audio_s_per_s", "audio s / s (loader alone)"),
                                      ("wait_share", f"data-wait share, {result['config']['step_ms']:.0f} ms step"))):
        vals = [[r[s][key] * (100 if key == "wait_share" else 1) for r in result["rounds"]] for s in srcs]
        ax[i].bar(srcs, [float(np.median(v)) for v in vals], color=["#888", "#3a7"])
        for j, v in enumerate(vals):
            ax[i].plot([j] * len(v), v, "k.", ms=4)
        ax[i].set_title(label + (" (%)" if key == "wait_share" else ""), fontsize=9)
    if "wait_share" in result["summary"]:
        ax[1].axhline(1.0, color="r", lw=0.8, ls="--", label="target 1 %")
        ax[1].legend(fontsize=8)
    fig.suptitle(f"make_loader: local mmap vs s3:// (moto on 127.0.0.1) - {result['machine']}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default=None, help="local shard folder (default: a synthetic one in --work)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "audiopipe-bench-s3"))
    p.add_argument("--utterances", type=int, default=2000, help="synthetic corpus size (default 2000)")
    p.add_argument("--feature", default="mel")
    p.add_argument("--batch-frames", type=int, default=38400)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--passes", type=int, default=2, help="epochs per data-wait measurement (default 2)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="600 utterances, 1 pass, 2 rounds (< 2 min)")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers use the CPU at the same time")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.utterances, a.passes, a.rounds = 600, 1, 2
    local = Path(a.shards) if a.shards else synthetic_shards(Path(a.work) / f"shards-{a.utterances}",
                                                                a.utterances, per_shard=100)
    server, admin = start_server()
    try:
        from pyarrow import fs as pafs

        pafs.copy_files(str(local), "bench/corpus", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=admin)
        srcs = {"local": str(local), "s3": "s3://bench/corpus"}
        rounds = []
        for k in range(a.rounds):
            r = {}
            for name, src in srcs.items():
                r[name] = {**throughput(src, a.feature, a.batch_frames),
                           **data_wait(src, a.feature, a.batch_frames, a.step_ms, a.passes)}
                x = r[name]
                print(f"[{k + 1}/{a.rounds}] {name:<5} {x['audio_s_per_s']:9.0f} audio s/s  wait "
                      f"{100 * x['wait_share']:.2f} %  first batch {x['first_batch_ms']:.0f} ms"
                      + (f"  {x['bytes_requested_per_byte_delivered']:.3f} B asked/B delivered  "
                         f"{x['requests_per_batch']:.1f} requests/batch" if name == "s3" else ""), flush=True)
            rounds.append(r)
    finally:
        server.stop()

    def med(src, key):
        v = [r[src][key] for r in rounds]
        return {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v))}

    ratio = [r["s3"]["audio_s_per_s"] / r["local"]["audio_s_per_s"] for r in rounds]
    summary = {"s3_vs_local_audio_s_per_s": {"median": float(np.median(ratio)), "min": min(ratio), "max": max(ratio)},
               "local_wait_share": med("local", "wait_share"), "s3_wait_share": med("s3", "wait_share"),
               "s3_bytes_requested_per_byte_delivered": med("s3", "bytes_requested_per_byte_delivered"),
               "s3_requests_per_batch": med("s3", "requests_per_batch"),
               "target_s3_wait_share_below_1pct": bool(np.median([r["s3"]["wait_share"] for r in rounds]) < 0.01)}
    summary["wait_share"] = summary["s3_wait_share"]
    result = {"command": "python benchmarks/bench_s3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": a.machine, "python": platform.python_version(), "loadavg": os.getloadavg(),
              "config": {"utterances": a.utterances, "batch_frames": a.batch_frames, "step_ms": a.step_ms,
                         "passes": a.passes, "rounds": a.rounds, "shards": str(local), "prefetch": 2,
                         "read_ahead": 2},
              "rounds": rounds, "summary": summary}
    print(json.dumps(summary, indent=1))
    write_results(result, a.json, lambda path: plot(result, path), a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
