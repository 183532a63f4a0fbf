"""make_loader from an S3 server at a real round trip, by rows and by block windows, next to the local folder.
docs/loader.md ("Benchmark: s3 at a 25 ms round trip") gives the commands and describes the corpus, the server, the
delay proxy, the loop, each figure and the results.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench_open import write_folder  # benchmarks/ is on sys.path
from results_io import grouped_bars, host, output_args, pyplot, save, spread, write_results

MODES = ("local", "s3_rows", "s3_blocks")
KEY, SECRET = "benchkey", "benchsecret-0123456789"
CONFIG = {"shards": 1000, "shard_mb": 8.0, "batch_frames": 9600, "step_ms": 50.0, "batches": 300, "prefetch": 2,
          "block_mb": 16.0, "window": 8, "ahead": 1}


def serve(target: tuple[str, int], rtt_s: float, ready: threading.Event | None = None,
          port_out: list | None = None) -> None:
    """A TCP proxy on 127.0.0.1 that adds `rtt_s` to every request/response exchange without limiting bandwidth, as
    a distant object store looks to a client with keep-alive connections: the client's bytes go on `rtt_s` after
    they arrived, the server's stream back at once (a handshake is not delayed)."""

    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection(*target)
        loop, due = asyncio.get_running_loop(), 0.0

        async def up() -> None:
            nonlocal due
            while data := await client_r.read(1 << 16):
                due = max(due, loop.time() + rtt_s)  # in order, whatever the timer heap does with equal times
                loop.call_at(due, server_w.write, data)
            loop.call_at(max(due, loop.time() + rtt_s), server_w.close)

        async def down() -> None:
            while data := await server_r.read(1 << 20):
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    async def main() -> None:
        server = await asyncio.start_server(connection, "127.0.0.1", 0, backlog=512)
        got = server.sockets[0].getsockname()[1]
        print(got, flush=True)
        if port_out is not None:
            port_out.append(got)
        if ready is not None:
            ready.set()
        await server.serve_forever()

    asyncio.run(main())


def synthetic_shards(out: Path, shards: int, shard_mb: float, seed: int = 0) -> Path:
    """Values are slices of one random pool (fresh noise per utterance would dominate the build)."""
    from audiopipe.features.registry import build_feature

    if (out / "manifest.json").exists():
        return out
    spec = build_feature("vocos_mel").specs[0]
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(spec.channels * 1200 * 4).astype(np.float32)
    rows, uid = [], 0
    for _ in range(shards):
        rows.append([])
        while sum(r["arrays"][spec.name].nbytes for r in rows[-1]) < shard_mb * 1e6:
            t = int(rng.uniform(1, 12) * 93.75)
            a = int(rng.integers(0, pool.size - spec.channels * t))
            rows[-1].append({"id": f"utt{uid:08d}", "speaker": f"spk{uid % 97}", "text": f"text {uid}", "scalars": {},
                             "source": f"utt{uid}.wav", "duration": float(np.float32(t / 93.75)),
                             "arrays": {spec.name: pool[a:a + spec.channels * t].reshape(spec.channels, t)}})
            uid += 1
    return write_folder(out, rows, spec, "bench_s3")


def start(cmd: list[str], port: int | None = None, **env: str) -> tuple[subprocess.Popen, str]:
    """A server process on `port`, or one that prints its port first; waits until it accepts connections."""
    proc = subprocess.Popen(cmd, env=dict(os.environ, **env), text=True,
                            stdout=subprocess.DEVNULL if port else subprocess.PIPE)
    port = port or int(proc.stdout.readline())
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{cmd[0]} did not listen on port {port}")


def nanio(data: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("nanio") or str(Path(sys.executable).with_name("nanio"))
    return start([exe, "serve", "--data-dir", str(data), "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
                  "--log-level", "warning"], port, NANIO_ACCESS_KEY=KEY, NANIO_SECRET_KEY=SECRET)


def server_rate(url: str, seconds: float = 2.0) -> dict:
    """What the endpoint serves through the proxy: small ranged GETs/s 64 at a time, and MB/s of 8 MB GETs."""
    from concurrent.futures import ThreadPoolExecutor

    from audiopipe.storage.s3 import parse_s3
    from audiopipe.storage.s3_ranges import RangeReader

    r, u = RangeReader(), parse_s3(url)
    size, out = r.size(u), {}
    for name, n, threads in (("small_gets_per_s", 40_000, 64), ("mb_per_s_8mb_gets", min(8 << 20, size), 8)):
        done, nbytes, t0 = 0, 0, time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            while time.perf_counter() - t0 < seconds:
                got = list(pool.map(lambda i: len(r.read(u, (i * 7919) % max(size - n, 1), n)), range(threads)))
                done, nbytes = done + len(got), nbytes + sum(got)
        dt = time.perf_counter() - t0
        out[name] = done / dt if name.startswith("small") else nbytes / dt / 1e6
    return out


def measure(mode: str, src: str, c: dict) -> dict:
    from audiopipe.reader.loader import make_loader
    from audiopipe.reader.reading import Reading

    reading = Reading(mode="rows") if mode != "s3_blocks" else Reading(
        mode="blocks", block_bytes=int(c["block_mb"] * 2**20), window=c["window"], ahead=c["ahead"])
    t0 = time.perf_counter()
    loader = make_loader(src, ["mel"], max_frames=c["batch_frames"], seed=0, prefetch=c["prefetch"], reading=reading)
    out: dict = {"open_s": time.perf_counter() - t0}
    ds = loader.dataset
    if mode != "local":
        out.update({k: ds.diagnostics()[k] for k in ("fetch_threads", "round_trip_ms")})
    for epoch, label in ((0, "first"), (1, "later")):
        loader.set_epoch(epoch)
        before, cpu0 = ds.diagnostics(), time.process_time()
        t = time.perf_counter()
        it = iter(loader)
        next(it)
        e = {"first_batch_ms": (time.perf_counter() - t) * 1e3}
        wait, n, t_loop = 0.0, 0, time.perf_counter()
        for n in range(1, c["batches"] + 1):
            t = time.perf_counter()
            if next(it, None) is None:
                break
            wait += time.perf_counter() - t
            time.sleep(c["step_ms"] / 1e3)
        e.update(wait_share=wait / (time.perf_counter() - t_loop), timed_batches=n,
                 cpu_ms_per_batch=1e3 * (time.process_time() - cpu0) / (n + 1))
        loader.set_epoch(epoch + 100)  # stops the prefetch thread before the counters are read
        after = ds.diagnostics()
        if "requests" in after:
            delivered = after["bytes_delivered"] - before.get("bytes_delivered", 0)
            e.update(requests_per_batch=(after["requests"] - before["requests"]) / (n + 1),
                     bytes_asked_per_byte=(after["bytes_requested"] - before["bytes_requested"]) / delivered
                     if delivered else None, retries=after["retries"] - before["retries"])
        out[label] = e
        print(f"  {mode} {label}: wait {e['wait_share']:.2%}, first batch {e['first_batch_ms']:.0f} ms", flush=True)
    if mode == "s3_blocks":
        d = loader.sampler.diagnostics
        out["sampler"] = {"blocks_per_batch": d.blocks_per_batch, "shards_per_batch": d.shards_per_batch,
                          "pair_overlap": d.pair_overlap, "padding_efficiency": d.padding_efficiency,
                          "max_resident_mib": d.max_resident_bytes / 2**20, "window": d.window, "row_mode": d.row_mode}
    return out


def plot(result: dict, path: Path) -> None:
    fig, ax = pyplot().subplots(1, 2, figsize=(10, 3.6))
    none = {"median": 0.0, "min": 0.0, "max": 0.0}  # the local folder sends no request
    for a, (key, scale) in zip(ax, (("wait_share", 100), ("requests_per_batch", 1))):
        series = {}
        for label in ("first", "later"):
            spreads = [result["summary"].get(f"{m}_{label}_{key}", none) for m in MODES]
            series[f"{label} epoch"] = [{k: scale * v for k, v in s.items()} for s in spreads]
        grouped_bars(a, list(MODES), series)
    ax[1].set_yscale("symlog")
    ax[0].set_title(f"data-wait share (%), {CONFIG['step_ms']:g} ms step (median round, range)", fontsize=9)
    ax[1].set_title("requests per batch", fontsize=9)
    c = result["config"]
    fig.suptitle(f"{c['shards']} shards of ~{c['shard_mb']:g} MB, {c['rtt_ms']:g} ms added round trip, "
                 f"{result['server']}, load avg {result['machine']['load_average'][0]:.1f}", fontsize=8)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rtt-ms", type=float, default=25.0, help="round trip added by the delay proxy (0: none)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the sources interleaved")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "audiopipe-bench-s3"),
                   help="folder for the corpus (kept between runs) and the server's data")
    p.add_argument("--quick", action="store_true", help="shards of 1 MB, 100 batches, 1 round")
    output_args(p)
    a = p.parse_args()
    c = {**CONFIG, "rtt_ms": a.rtt_ms, "rounds": a.rounds}
    if a.quick:
        c.update(shard_mb=1.0, batches=100, rounds=1)
    local = synthetic_shards(Path(a.work) / f"shards-{c['shards']}x{c['shard_mb']:g}MB", c["shards"], c["shard_mb"])
    url, data, procs = f"s3://bench/{local.name}", Path(a.work) / "nanio", []
    shutil.rmtree(data / "bench" / local.name, ignore_errors=True)  # hard links: no copy, nanio serves the files
    shutil.copytree(local, data / "bench" / local.name, copy_function=os.link)
    try:
        proc, endpoint = nanio(data)
        procs.append(proc)
        os.environ.update(AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET, AWS_REGION="us-east-1",
                          AWS_ENDPOINT_URL=endpoint)
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
        if a.rtt_ms > 0:
            target = endpoint.split("://", 1)[-1].rstrip("/")
            proc, proxied = start([sys.executable, __file__, "--proxy", target, str(a.rtt_ms)])
            procs.append(proc)
            os.environ["AWS_ENDPOINT_URL"] = proxied
        first = json.loads((local / "manifest.json").read_text())["shards"][0]["arrow"]["path"]
        rate = server_rate(f"{url}/{first}")
        print(f"server through the proxy: {rate}", flush=True)
        rounds = []
        for k in range(c["rounds"]):
            print(f"round {k + 1}/{c['rounds']} (load {os.getloadavg()[0]:.1f})", flush=True)
            rounds.append({m: {**measure(m, str(local) if m == "local" else url, c), "loadavg": os.getloadavg()[0]}
                           for m in MODES})
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    summary = {f"{m}_open_s": spread(r[m]["open_s"] for r in rounds) for m in MODES}
    for m in MODES:
        for label in ("first", "later"):
            for key in ("wait_share", "requests_per_batch", "bytes_asked_per_byte", "cpu_ms_per_batch",
                        "first_batch_ms"):
                if any(r[m][label].get(key) is not None for r in rounds):
                    summary[f"{m}_{label}_{key}"] = spread(r[m][label].get(key) for r in rounds)
    result = {"command": " ".join(["python", "benchmarks/bench_s3.py", *sys.argv[1:]]), "machine": host(a.machine),
              "server": f"nanio {importlib.metadata.version('nanio')}", "server_rate": rate, "summary": summary,
              "config": {**c, "corpus": str(local)}, "rounds": rounds}
    write_results(result, a.json, lambda path: plot(result, path), a.plot)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--proxy":  # the delay proxy's own process: --proxy HOST:PORT RTT_MS
        host_, _, port_ = sys.argv[2].rpartition(":")
        serve((host_, int(port_)), float(sys.argv[3]) / 1e3)
    else:
        main()
