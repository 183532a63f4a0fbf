"""make_loader from an S3 server at a real round trip, by rows and by block windows, next to the local folder.

    python benchmarks/bench_s3.py --rtt-ms 25 --json benchmarks/results/s3_loader.json --plot docs/img/s3_loader.png
    python benchmarks/bench_s3.py --quick                  # ~3 min: 1,000 small shards, 1 round
    python benchmarks/bench_s3.py --endpoint http://host:9000 --bucket b --prefix corpus   # any S3 server

Corpus: --shards synthetic shards (default 1,000, more than the reader's max_open=128) of --shard-mb each,
random 100-band float32 mels of 1-12 s written by audiopipe's own writer, index and manifest. Server: without
--endpoint, nanio (`pip install nanio`, an S3 server that checks SigV4 and serves files from a folder) in its own
process on 127.0.0.1, the shard folder hard-linked into its data folder. --rtt-ms puts a delay proxy
(benchmarks/delay_proxy.py, its own process; this kernel has no netem) between the loader and the server: every
request reaches the server that much later, answers stream back at once.

Per round, side by side (one loader each, fresh, prefetch=2):
  local       the same folder through the mmap reader (rows)
  s3_rows     s3://..., Reading(mode="rows"): the global plan, rows by byte range, prefetch batches ahead
  s3_blocks   s3://..., Reading(mode="blocks"): windows of --window blocks of <= --block-mb fetched --ahead ahead
For epoch 0 (first) and epoch 1 (later), after the epoch's first batch (reported apart as first_batch_ms):
--batches batches, each followed by a --step-ms step (time.sleep: it releases the GIL as a CUDA step does).
  wait_share            time in next(loader) / wall time of those batches
  requests_per_batch    GETs and HEADs sent during the epoch's batches / batches (the first one included)
  bytes_asked_per_byte  bytes requested / feature bytes delivered to batches
  cpu_ms_per_batch      this process's CPU time (every thread: fetch pool, prefetch, collate) / batch
The open (manifest, index, every shard's footer, header and small buffers) is reported as open_s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from results_io import output_args, pyplot, save, spread, write_results  # benchmarks/ (the script's own folder is on sys.path)

HERE = Path(__file__).resolve().parent
MODES = ("local", "s3_rows", "s3_blocks")
KEY, SECRET = "benchkey", "benchsecret-0123456789"


def synthetic_shards(out: Path, shards: int, shard_mb: float, seed: int = 0) -> Path:
    """`shards` shards of about shard_mb MB of mel each, through the real writer, index and manifest. Values
    are slices of one random pool (generating fresh noise per utterance would dominate the build)."""
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
    pool = rng.standard_normal(spec.channels * 1200 * 4).astype(np.float32)
    per_frame = spec.channels * 4
    records, total, uid = [], 0, 0
    for k in range(shards):
        rows, size = [], 0
        while size < shard_mb * 1e6:
            t = int(rng.uniform(1, 12) * 93.75)
            a = int(rng.integers(0, pool.size - spec.channels * t))
            rows.append({"id": f"utt{uid:08d}", "speaker": f"spk{uid % 97}", "text": f"text {uid}",
                         "source": f"utt{uid}.wav", "duration": float(np.float32(t / 93.75)),
                         "arrays": {spec.name: pool[a:a + spec.channels * t].reshape(spec.channels, t)},
                         "scalars": {}})
            size += t * per_frame
            uid += 1
        name = f"shard-{k:06d}"
        digest = write_arrow(out / "arrow" / f"{name}.arrow", rows, [ArrayColumn(spec.name, spec.dtype, spec.channels)],
                             [], {"features": features, "job": "bench_s3"})
        records.append({"name": name, "rows": len(rows), "duration": sum(r["duration"] for r in rows),
                        "rejects": [], "arrow": digest.entry(f"arrow/{name}.arrow")})
        total += len(rows)
        if (k + 1) % 100 == 0:
            print(f"  wrote {k + 1}/{shards} shards", flush=True)
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, resampler_info(), {"presets": ["bench_s3"]}, total, 0, index)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


def start_nanio(data: Path) -> tuple[subprocess.Popen, str]:
    """nanio serving `data` (buckets are its folders) on a free port of 127.0.0.1, in its own process."""
    port = _free_port()
    exe = shutil.which("nanio") or str(Path(sys.executable).with_name("nanio"))
    env = dict(os.environ, NANIO_ACCESS_KEY=KEY, NANIO_SECRET_KEY=SECRET)
    proc = subprocess.Popen([exe, "serve", "--data-dir", str(data), "--host", "127.0.0.1", "--port", str(port),
                             "--no-access-log", "--log-level", "warning"], env=env, stdout=subprocess.DEVNULL)
    _wait_port(port, proc, "nanio")
    return proc, f"http://127.0.0.1:{port}"


def start_proxy(endpoint: str, rtt_ms: float) -> tuple[subprocess.Popen, str]:
    host_port = endpoint.split("://", 1)[-1].rstrip("/")
    proc = subprocess.Popen([sys.executable, str(HERE / "delay_proxy.py"), "--target", host_port, "--rtt-ms",
                             str(rtt_ms)], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    _wait_port(port, proc, "delay proxy")
    return proc, f"http://127.0.0.1:{port}"


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link a shard folder under nanio's data folder (no copy; nanio derives metadata from the files)."""
    for p in src.rglob("*"):
        if p.is_file():
            q = dst / p.relative_to(src)
            q.parent.mkdir(parents=True, exist_ok=True)
            if not q.exists():
                try:
                    os.link(p, q)
                except OSError:
                    shutil.copy2(p, q)


def server_rate(url: str, seconds: float = 2.0) -> dict:
    """What the endpoint (through the proxy) serves: small ranged GETs/s 64 at a time, and MB/s of 8 MB GETs."""
    from concurrent.futures import ThreadPoolExecutor

    from audiopipe.storage.s3 import parse_s3
    from audiopipe.storage.s3_ranges import RangeReader

    r, u = RangeReader(), parse_s3(url)
    size = r.size(u)
    out = {}
    for name, n, threads in (("small_gets_per_s", 40_000, 64), ("mb_per_s_8mb_gets", min(8 << 20, size), 8)):
        done, nbytes, t0 = 0, 0, time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            while time.perf_counter() - t0 < seconds:
                got = list(pool.map(lambda i: len(r.read(u, (i * 7919) % max(size - n, 1), n)), range(threads)))
                done, nbytes = done + len(got), nbytes + sum(got)
        dt = time.perf_counter() - t0
        out[name] = done / dt if name.startswith("small") else nbytes / dt / 1e6
    return out


def measure(mode: str, src: str, a: argparse.Namespace) -> dict:
    from audiopipe.reader.loader import make_loader
    from audiopipe.reader.reading import Reading

    reading = Reading(mode="rows") if mode != "s3_blocks" else Reading(
        mode="blocks", block_bytes=int(a.block_mb * 2**20), window=a.window, ahead=a.ahead)
    t0 = time.perf_counter()
    loader = make_loader(src, ["mel"], max_frames=a.batch_frames, rank=0, world_size=1, seed=0, prefetch=a.prefetch,
                         reading=reading)
    out: dict = {"open_s": time.perf_counter() - t0}
    ds = loader.dataset
    if mode != "local":
        d = ds.diagnostics()
        out.update(fetch_threads=d["fetch_threads"], round_trip_ms=d["round_trip_ms"])
    for epoch, label in ((0, "first"), (1, "later")):
        loader.set_epoch(epoch)
        before = ds.diagnostics()
        cpu0 = time.process_time()
        it = iter(loader)
        t = time.perf_counter()
        next(it)
        first_ms = (time.perf_counter() - t) * 1e3
        wait = 0.0
        n = 0
        t_loop = time.perf_counter()
        while n < a.batches:
            t = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                break
            wait += time.perf_counter() - t
            n += 1
            time.sleep(a.step_ms / 1e3)
        wall = time.perf_counter() - t_loop
        cpu = time.process_time() - cpu0 - 0.0
        loader.set_epoch(epoch + 100)  # stops the prefetch thread before the counters are read
        after = ds.diagnostics()
        e = {"wait_share": wait / wall, "wait_ms_per_batch": 1e3 * wait / max(n, 1), "first_batch_ms": first_ms,
             "timed_batches": n, "cpu_ms_per_batch": 1e3 * cpu / (n + 1)}
        if "requests" in after:
            delivered = after["bytes_delivered"] - before.get("bytes_delivered", 0)
            e.update(requests_per_batch=(after["requests"] - before["requests"]) / (n + 1),
                     bytes_asked_per_byte=((after["bytes_requested"] - before["bytes_requested"]) / delivered
                                           if delivered else None),
                     retries=after["retries"] - before["retries"])
        out[label] = e
        print(f"  {mode:<10} {label:<5} wait {100 * e['wait_share']:6.2f} %  first batch {first_ms:6.0f} ms  "
              f"{e.get('requests_per_batch', float('nan')):6.2f} requests/batch  "
              f"{e.get('bytes_asked_per_byte') or float('nan'):.3f} B asked/B  {e['cpu_ms_per_batch']:.1f} ms CPU/batch",
              flush=True)
    if mode == "s3_blocks":
        d = loader.sampler.diagnostics
        out["sampler"] = {"blocks_per_batch": d.blocks_per_batch, "shards_per_batch": d.shards_per_batch,
                          "pair_overlap": d.pair_overlap, "padding_efficiency": d.padding_efficiency,
                          "max_resident_mib": d.max_resident_bytes / 2**20, "window": d.window,
                          "row_mode": d.row_mode}
    del loader
    return out


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    rounds = result["rounds"]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    x = np.arange(len(MODES))
    for j, (label, color) in enumerate((("first", "#4a8"), ("later", "#37c"))):
        vals = [[100 * r[m][label]["wait_share"] for r in rounds] for m in MODES]
        ax[0].bar(x + (j - 0.5) * 0.38, [np.median(v) for v in vals], 0.36, color=color, label=f"{label} epoch")
        for i, v in enumerate(vals):
            ax[0].plot([x[i] + (j - 0.5) * 0.38] * len(v), v, "k.", ms=4)
        req = [[r[m][label].get("requests_per_batch", 0.0) for r in rounds] for m in MODES]
        ax[1].bar(x + (j - 0.5) * 0.38, [np.median(v) for v in req], 0.36, color=color, label=f"{label} epoch")
    ax[0].axhline(1.0, color="r", lw=0.8, ls="--", label="target 1 % (blocks)")
    ax[0].set_xticks(x, MODES)
    ax[0].set_title(f"data-wait share (%), {result['config']['step_ms']:g} ms step", fontsize=9)
    ax[0].legend(fontsize=7)
    ax[1].set_xticks(x, MODES)
    ax[1].set_yscale("symlog")
    ax[1].set_title("requests per batch", fontsize=9)
    ax[1].legend(fontsize=7)
    c = result["config"]
    fig.suptitle(f"{c['shards']} shards of ~{c['shard_mb']:g} MB, {c['rtt_ms']:g} ms added round trip, "
                 f"{result['server']}, load avg {result['loadavg'][0]:.1f} on {os.cpu_count()} cores", fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--endpoint", default=None,
                   help="an S3 server's URL (e.g. http://host:9000) with credentials in AWS_ACCESS_KEY_ID/"
                        "AWS_SECRET_ACCESS_KEY; the corpus is uploaded under --bucket/--prefix unless there. "
                        "Default: nanio on 127.0.0.1")
    p.add_argument("--bucket", default="bench")
    p.add_argument("--prefix", default=None, help="key prefix of the corpus (default: named after its shape)")
    p.add_argument("--rtt-ms", type=float, default=25.0, help="round trip added by the delay proxy (0: none)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "audiopipe-bench-s3"))
    p.add_argument("--shards", type=int, default=1000, help="synthetic shards (default 1000)")
    p.add_argument("--shard-mb", type=float, default=8.0, help="MB of mel per shard (default 8)")
    p.add_argument("--batch-frames", type=int, default=9600)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--batches", type=int, default=300, help="timed batches per epoch and mode (default 300)")
    p.add_argument("--prefetch", type=int, default=2,
                   help="batches made ready ahead; in row mode their rows are fetched ahead too (default 2)")
    p.add_argument("--block-mb", type=float, default=16.0, help="block mode: block size, MB (default 16)")
    p.add_argument("--window", type=int, default=8, help="block mode: blocks per window (default 8)")
    p.add_argument("--ahead", type=int, default=1, help="block mode: windows fetched ahead (default 1)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="1,000 shards of 1 MB, 100 batches, 1 round")
    output_args(p, "2-core shared CPU VM, no GPU; other engineers' jobs run at the same time")
    a = p.parse_args(argv)
    if a.quick:
        a.shard_mb, a.batches, a.rounds = 1.0, 100, 1
    local = synthetic_shards(Path(a.work) / f"shards-{a.shards}x{a.shard_mb:g}MB", a.shards, a.shard_mb)
    prefix = a.prefix or local.name
    procs: list[subprocess.Popen] = []
    try:
        if a.endpoint is None:
            data = Path(a.work) / "nanio"
            link_tree(local, data / a.bucket / prefix)
            proc, endpoint = start_nanio(data)
            procs.append(proc)
            os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
            server = "nanio " + subprocess.run([sys.executable, "-c", "import importlib.metadata as m; "
                                                "print(m.version('nanio'))"], capture_output=True,
                                               text=True).stdout.strip()
        else:
            endpoint, server = a.endpoint, a.endpoint
        os.environ.setdefault("AWS_REGION", "us-east-1")
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        url = f"s3://{a.bucket}/{prefix}"
        if a.endpoint is not None:
            from pyarrow import fs as pafs

            from audiopipe.storage.s3 import filesystem

            dst = filesystem()
            if dst.get_file_info(f"{a.bucket}/{prefix}/manifest.json").type == pafs.FileType.NotFound:
                pafs.copy_files(str(local), f"{a.bucket}/{prefix}", source_filesystem=pafs.LocalFileSystem(),
                                destination_filesystem=dst)
        if a.rtt_ms > 0:
            proc, proxied = start_proxy(endpoint, a.rtt_ms)
            procs.append(proc)
            os.environ["AWS_ENDPOINT_URL"] = proxied
        first = json.loads((local / "manifest.json").read_text())["shards"][0]["arrow"]["path"]
        rate = server_rate(f"{url}/{first}")
        print(f"server through the proxy: {rate['small_gets_per_s']:.0f} small GETs/s (64 at a time), "
              f"{rate['mb_per_s_8mb_gets']:.0f} MB/s in 8 MB GETs (8 at a time); load {os.getloadavg()[0]:.1f}",
              flush=True)
        rounds = []
        for k in range(a.rounds):
            print(f"round {k + 1}/{a.rounds} (load {os.getloadavg()[0]:.1f})", flush=True)
            r = {}
            for mode in MODES:
                r[mode] = measure(mode, str(local) if mode == "local" else url, a)
                r[mode]["loadavg"] = os.getloadavg()[0]
            rounds.append(r)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()

    summary: dict = {}
    for mode in MODES:
        for label in ("first", "later"):
            for key in ("wait_share", "requests_per_batch", "bytes_asked_per_byte", "cpu_ms_per_batch",
                        "first_batch_ms"):
                vals = [r[mode][label].get(key) for r in rounds]
                if any(v is not None for v in vals):
                    summary[f"{mode}_{label}_{key}"] = spread(vals)
        summary[f"{mode}_open_s"] = spread([r[mode]["open_s"] for r in rounds])
    targets = {"s3_blocks": (0.01, 0.01, 2.0), "s3_rows": (0.05, 0.02, None)}
    summary["targets_met"] = {
        mode: {"wait_first": summary[f"{mode}_first_wait_share"]["median"] < t[0],
               "wait_later": summary[f"{mode}_later_wait_share"]["median"] < t[1],
               **({"requests_per_batch": max(summary[f"{mode}_{x}_requests_per_batch"]["median"]
                                             for x in ("first", "later")) <= t[2]} if t[2] else {})}
        for mode, t in targets.items()}
    result = {"command": "python benchmarks/bench_s3.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": a.machine, "cores": os.cpu_count(), "python": platform.python_version(),
              "loadavg": os.getloadavg(), "server": server, "server_rate": rate,
              "config": {"shards": a.shards, "shard_mb": a.shard_mb, "rtt_ms": a.rtt_ms, "batch_frames": a.batch_frames,
                         "step_ms": a.step_ms, "batches": a.batches, "prefetch": a.prefetch,
                         "block_mb": a.block_mb, "window": a.window, "ahead": a.ahead, "rounds": a.rounds,
                         "corpus": str(local)},
              "rounds": rounds, "summary": summary}
    print(json.dumps(summary, indent=1))
    write_results(result, a.json, lambda path: plot(result, path), a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
