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

from audiopipe.bench.s3_loader import data_wait, throughput
from results_io import write_results  # benchmarks/ (the script's own folder is on sys.path)


def synthetic_shards(out: Path, utterances: int, per_shard: int, seed: int = 0) -> Path:
    """A shard folder of random mels through the real writer, index and manifest."""
    from audiopipe.decode.audio import resampler_info
    from audiopipe.features.registry import build_feature
    from audiopipe.index.lengths import build_index
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
        digest = write_arrow(arrow, rows, [ArrayColumn(spec.name, spec.dtype, spec.channels)], [],
                             {"features": features, "job": "bench_s3"})
        records.append({"name": name, "rows": len(rows), "duration": sum(r["duration"] for r in rows),
                        "rejects": [], "arrow": digest.entry(f"arrow/{name}.arrow")})
        total += len(rows)
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, resampler_info(), {"presets": ["bench_s3"]}, total, 0, index)
    return out


def start_server():
    """moto's S3 server in a process of its own (in this process it would compete with the loader for the GIL),
    on a free port of 127.0.0.1; returns (process, admin client)."""
    import socket
    import subprocess

    from pyarrow import fs as pafs

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import logging, time; logging.getLogger('werkzeug').setLevel(logging.ERROR); "
            "from moto.server import ThreadedMotoServer as S; "
            f"S(ip_address='127.0.0.1', port={port}, verbose=False).start(); time.sleep(1e9)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    os.environ.update(env)
    admin = pafs.S3FileSystem(access_key="bench", secret_key="bench", region="us-east-1",
                              endpoint_override=f"127.0.0.1:{port}", scheme="http", allow_bucket_creation=True)
    for _ in range(100):
        try:
            admin.create_dir("bench")
            return proc, admin
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the moto S3 server did not start")


def server_rate(url: str, seconds: float = 2.0) -> float:
    """Ranged GETs per second the server answers (16 at a time, 40 KB each, on the first shard)."""
    from concurrent.futures import ThreadPoolExecutor

    from audiopipe.storage.s3 import parse_s3
    from audiopipe.storage.s3_ranges import RangeReader

    r, u = RangeReader(), parse_s3(url)
    size = r.size(u)
    n = 0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        while time.perf_counter() - t0 < seconds:
            list(pool.map(lambda i: r.read(u, (i * 7919) % max(size - 40000, 1), 40000), range(32)))
            n += 32
    return n / (time.perf_counter() - t0)


SOURCES = {"local": {"prefetch": 2, "read_ahead": 2}, "s3": {"prefetch": 2, "read_ahead": 2},
           "s3_no_prefetch": {"prefetch": 0, "read_ahead": 0}}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result["config"]["steps_ms"]
    fig, ax = plt.subplots(1, 1 + len(steps), figsize=(4 + 3.2 * len(steps), 3.4))
    names = list(SOURCES)
    vals = [[r[n]["audio_s_per_s"] for r in result["rounds"]] for n in names[:2]]
    ax[0].bar(names[:2], [float(np.median(v)) for v in vals], color=["#888", "#3a7"])
    for j, v in enumerate(vals):
        ax[0].plot([j] * len(v), v, "k.", ms=4)
    ax[0].set_title("audio s / s, loader alone", fontsize=9)
    for i, step in enumerate(steps, start=1):
        vals = [[100 * r[n][f"wait_{step:g}ms"]["wait_share"] for r in result["rounds"]] for n in names]
        ax[i].bar(names, [float(np.median(v)) for v in vals], color=["#888", "#3a7", "#c75"])
        for j, v in enumerate(vals):
            ax[i].plot([j] * len(v), v, "k.", ms=4)
        ax[i].axhline(1.0, color="r", lw=0.8, ls="--", label="target 1 %")
        ax[i].set_title(f"data-wait share (%), {step:g} ms step", fontsize=9)
        ax[i].tick_params(axis="x", labelsize=7)
        ax[i].legend(fontsize=7)
    fig.suptitle(f"make_loader: local mmap vs s3:// (moto S3 server on 127.0.0.1, ~{result['server_requests_per_s']:.0f} "
                 f"ranged GETs/s) - {result['machine']}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", default=None, help="local shard folder (default: a synthetic one in --work)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "audiopipe-bench-s3"))
    p.add_argument("--utterances", type=int, default=1000, help="synthetic corpus size (default 1000)")
    p.add_argument("--per-shard", type=int, default=25,
                   help="synthetic utterances per shard (default 25, ~6 MB shards: moto copies the whole object "
                        "for every ranged GET, so its request rate falls with the object size)")
    p.add_argument("--feature", default="mel")
    p.add_argument("--batch-frames", type=int, default=38400)
    p.add_argument("--steps-ms", default="50,500", help="synthetic step times (default 50,500)")
    p.add_argument("--passes", type=int, default=1, help="epochs per data-wait measurement (default 1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="400 utterances, a 50 ms step, 2 rounds (< 2 min)")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers use the CPU at the same time")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    a = p.parse_args(argv)
    steps = [float(x) for x in a.steps_ms.split(",")]
    if a.quick:
        a.utterances, a.rounds, steps = 400, 2, [50.0]
    local = Path(a.shards) if a.shards else synthetic_shards(
        Path(a.work) / f"shards-{a.utterances}-{a.per_shard}", a.utterances, per_shard=a.per_shard)
    server, admin = start_server()
    try:
        from pyarrow import fs as pafs

        pafs.copy_files(str(local), "bench/corpus", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=admin)
        first = json.loads((local / "manifest.json").read_text())["shards"][0]["arrow"]["path"]
        rate = server_rate(f"s3://bench/corpus/{first}")
        print(f"server: {rate:.0f} ranged GETs/s (16 at a time)", flush=True)
        srcs = {"local": str(local), "s3": "s3://bench/corpus", "s3_no_prefetch": "s3://bench/corpus"}
        rounds = []
        for k in range(a.rounds):
            r: dict = {}
            for name, src in srcs.items():
                x = r[name] = throughput(src, a.feature, a.batch_frames) if name != "s3_no_prefetch" else {}
                for step in steps:
                    x[f"wait_{step:g}ms"] = data_wait(src, a.feature, a.batch_frames, step, a.passes, **SOURCES[name])
                    w = x[f"wait_{step:g}ms"]
                    print(f"[{k + 1}/{a.rounds}] {name:<15} {x.get('audio_s_per_s', float('nan')):9.0f} audio s/s  "
                          f"step {step:g} ms: wait {100 * w['wait_share']:6.2f} %  first batch "
                          f"{w['first_batch_ms']:.0f} ms" + (
                              f"  {w['bytes_requested_per_byte_delivered']:.3f} B asked/B delivered  "
                              f"{w['requests_per_batch']:.1f} requests/batch" if "requests" in w else ""), flush=True)
            rounds.append(r)
    finally:
        server.kill()
        server.wait()

    def spread(values) -> dict:
        return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values))}

    summary: dict = {"s3_vs_local_audio_s_per_s": spread([r["s3"]["audio_s_per_s"] / r["local"]["audio_s_per_s"]
                                                          for r in rounds])}
    for step in steps:
        key = f"wait_{step:g}ms"
        for name in srcs:
            summary[f"{name}_wait_share_{step:g}ms"] = spread([r[name][key]["wait_share"] for r in rounds])
        summary[f"s3_bytes_requested_per_byte_delivered_{step:g}ms"] = spread(
            [r["s3"][key]["bytes_requested_per_byte_delivered"] for r in rounds])
        summary[f"s3_requests_per_batch_{step:g}ms"] = spread([r["s3"][key]["requests_per_batch"] for r in rounds])
    key = f"wait_{steps[0]:g}ms"
    need = float(np.median([r["s3"][key]["requests_per_batch"] for r in rounds])) / (steps[0] / 1e3)
    summary[f"requests_per_s_needed_at_{steps[0]:g}ms"] = need
    summary["target_s3_wait_share_below_1pct_at_50ms"] = (
        bool(summary["s3_wait_share_50ms"]["median"] < 0.01) if 50.0 in steps else None)
    result = {"command": "python benchmarks/bench_s3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": a.machine, "python": platform.python_version(), "loadavg": os.getloadavg(),
              "server_requests_per_s": rate,
              "config": {"utterances": a.utterances, "per_shard": a.per_shard, "batch_frames": a.batch_frames,
                         "steps_ms": steps, "passes": a.passes, "rounds": a.rounds, "shards": str(local),
                         "sources": SOURCES},
              "rounds": rounds, "summary": summary}
    print(json.dumps(summary, indent=1))
    write_results(result, a.json, lambda path: plot(result, path), a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
