"""`audiopipe bench-loader`: time the audiopipe loaders against the usual alternatives on one shard folder.

    audiopipe bench-loader --shards ./shards [--full] [--batch-frames 38400] [--workers N] [--json out.json] [--plot out.png]

Each loader (see audiopipe/bench/loaders.py) runs in a process of its own, forked from this one once its
modules are imported (a fresh interpreter's imports took ~25 s per loader on a loaded 2-core machine), so its
peak memory is its own, after its files were read once by the parent (a warm page cache for all alike). A loader is timed from its
construction to its first batch (`first_batch_s`: opening, worker start-up, first read), then for --seconds
more (and at least --min-batches batches), epoch after epoch: batches/s, utterances/s, audio seconds/s and
MB/s of real (unpadded) feature bytes delivered, padding efficiency and batches over the padded budget.
A memcpy, timed in each loader's own process just before and just after it, is the physical ceiling.

--cold instead drops each loader's files from the page cache (posix_fadvise DONTNEED on those files only)
before it runs and times a single pass, so reads come from the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from audiopipe.bench.loaders import DESCRIPTIONS, LOADERS, LoaderSpec, build, evict, files_of, prepare, read_all
from audiopipe.errors import Failed, InvalidValue, NotFound
from audiopipe.features.names import column_name

# The default run: audiopipe's loader against one .npy per utterance, the usual layout, 3 s each, in about a
# minute (the estimate is printed first). --full: every loader, 10 s each, 3 rounds.
SHORT_LOADERS = ("mmap", "npy_per_utt")
FULL = {"loaders": ",".join(LOADERS), "seconds": 10.0, "rounds": 3}
SPAWN_S = 4.0  # this process' start (interpreter, torch import) on a quiet 2-core VM, when /proc cannot tell
MEMCPY_S = 0.5  # each of the two memcpy references timed in a loader's process
MEMCPY_BYTES = 64 << 20  # their two buffers: 4x a 32 MB L3, so DRAM's rate, and quick to prefault when loaded
# What each loader imports beyond torch and audiopipe's reader: loaded before its clock starts.
PRELOAD = {"wds": ("webdataset",), "on_the_fly": ("soundfile", "soxr"), "lhotse_shar": ("lhotse",)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", required=True, help="shard folder written by `audiopipe shard`, or "
                   "s3://bucket/prefix (then make_loader alone is timed: audiopipe/bench/s3_loader.py)")
    p.add_argument("--batch-frames", type=int, default=38400, help="padded frames per batch (default 38400)")
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader workers, the same for every loader (default 0, make_loader's own default)")
    p.add_argument("--feature", default="mel", help="feature to load (default mel)")
    p.add_argument("--seconds", type=float, default=None,
                   help="seconds timed per loader after its first batch (default 3; 10 with --full)")
    p.add_argument("--min-batches", type=int, default=3, help="time at least this many batches (default 3)")
    p.add_argument("--rounds", type=int, default=None,
                   help="run every loader this many times, interleaved, and report the median (default 1; 3 with "
                        "--full)")
    p.add_argument("--loaders", default=None,
                   help=f"comma-separated subset of {','.join(LOADERS)} (default {','.join(SHORT_LOADERS)}; all "
                        f"with --full)")
    p.add_argument("--full", action="store_true",
                   help="the long run: every loader, 10 s each, 3 rounds (several minutes, more on the first run, "
                        "which writes the baselines' copies of the corpus); the default run takes about a minute")
    p.add_argument("--corpus", default=None,
                   help="source audio for on_the_fly (default: the corpus recorded in the manifest)")
    p.add_argument("--cache", default=None,
                   help="folder for the one-time npy-per-utterance and lhotse Shar copies (default: a temp folder)")
    p.add_argument("--cold", action="store_true",
                   help="evict each loader's files from the page cache first and time one pass (disk reads)")
    p.add_argument("--step-ms", type=float, default=50.0,
                   help="data wait: after the timed batches, each loader feeds this many more batches to a loop "
                        "whose step sleeps this long (releasing the GIL, as a GPU step does) and reports the share "
                        "of the loop spent waiting for data (default 50; 0: skip)")
    p.add_argument("--step-batches", type=int, default=40, help="batches of the data-wait loop (default 40)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results as JSON here")
    p.add_argument("--plot", default=None, help="write a PNG plot here")


# ---- the child: one loader, timed ----------------------------------------------------------------------------


class TreeMemory(threading.Thread):
    """Samples resident memory of this process and its children (DataLoader workers) every 20 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak_rss = self.peak_private = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(0.02)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sample()

    def sample(self) -> None:
        rss = private = 0
        for pid in _tree(os.getpid()):
            fields = _status(pid)
            rss += fields.get("VmRSS", 0)
            private += fields.get("RssAnon", 0)
        self.peak_rss, self.peak_private = max(self.peak_rss, rss), max(self.peak_private, private)


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass  # the process ended between two reads
    return out


def _status(pid: int) -> dict[str, int]:
    """kB fields of /proc/<pid>/status (VmRSS, RssAnon, ...)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0])
    except OSError:
        pass
    return out


def _preload_imports(name: str) -> None:
    """Import what loader `name` imports, so that its time to the first batch is opening and reading, not imports
    (only its own: lhotse alone takes seconds to import on a busy 2-core machine)."""
    import importlib

    import pyarrow as pa

    pa.table({"x": [0]}).column("x").to_numpy()  # pyarrow pulls in pandas lazily on first use
    for module in PRELOAD.get(name, ()):
        try:
            importlib.import_module(module)
        except ImportError:
            pass


def time_loader(spec: LoaderSpec, seconds: float, min_batches: int, max_epochs: int = 10_000,
                memcpy_bytes: int = 0, step_ms: float = 0.0, step_batches: int = 0) -> dict[str, Any]:
    """Build one loader and consume it; the first batch is timed alone, the rest give the rates.

    memcpy_bytes: also time a memcpy of that many bytes for 1 s just before and just after (0: skip).
    step_ms, step_batches: then a training loop's view (data_wait): step_batches more batches, each followed by a
    step of step_ms that releases the GIL as a GPU step does (a sleep), timing how long each next() blocks."""
    import torch

    _preload_imports(spec.name)
    # One compute thread per process, as in DataLoader workers: the on-the-fly mel would otherwise use every
    # core from the main process, and torch's thread pool degrades badly on a busy machine.
    torch.set_num_threads(1)
    # The memcpy reference is taken in this process, just before and just after the loader runs: on a shared
    # machine memory bandwidth drifts from minute to minute, and a ratio of two rates measured minutes apart
    # mostly measures the drift. (Its buffers are freed before the memory of the loader is sampled.)
    copy_before = time_memcpy(memcpy_bytes, MEMCPY_S)["mb_per_s"] if memcpy_bytes else 0.0
    rss_start = sum(_status(pid).get("VmRSS", 0) for pid in _tree(os.getpid()))
    mem = TreeMemory()
    mem.start()
    t0 = time.perf_counter()
    loader = build(spec)
    first = start = None
    n = items = 0
    audio = nbytes = real = padded = 0.0
    over = 0
    worst = 0.0
    epoch = 0
    done = False
    f = spec.feature
    while not done and epoch < max_epochs:
        loader.set_epoch(epoch)
        got = 0
        for batch in loader:
            got += 1
            now = time.perf_counter()
            x: torch.Tensor = batch[f]
            lengths = batch[f"{f}_lengths"]
            b, t_max = x.shape[0], x.shape[1 if spec.name == "mmap_btc" else -1]  # BTC: time is axis 1
            frames = int(lengths.sum())
            real += frames
            padded += b * t_max
            over += int(b * t_max > spec.max_frames)
            worst = max(worst, b * t_max / spec.max_frames)
            if first is None:
                first = now - t0
                # make_loader loads the compiled copy kernel once its first batch is out (~0.4 s, once per
                # process, overlapping a trainer's first step): the rates below are the steady state after it.
                from audiopipe.collate.kernels import wait_for_kernels

                wait_for_kernels()
                start = time.perf_counter()
                continue
            n += 1
            items += b
            audio += float(sum(batch["duration"]))
            nbytes += frames * (x.numel() // (b * t_max)) * x.element_size()
            if now - start >= seconds and n >= min_batches:
                done = True
                break
        if got == 0:
            raise Failed(f"{spec.name}: an epoch without batches (budget too small for the corpus?)")
        epoch += 1
    elapsed = time.perf_counter() - start if start is not None else 0.0
    wait = data_wait(loader, epoch, step_ms, step_batches) if step_ms > 0 and step_batches > 0 else {}
    del loader
    mem.stop()
    copy_after = time_memcpy(memcpy_bytes, MEMCPY_S)["mb_per_s"] if memcpy_bytes else 0.0
    rate = (lambda v: v / elapsed) if elapsed > 0 else (lambda v: 0.0)
    return {
        "name": spec.name, "description": DESCRIPTIONS[spec.name], "workers": spec.workers,
        "batches_per_s": rate(n), "utterances_per_s": rate(items), "audio_s_per_s": rate(audio),
        "mb_per_s": rate(nbytes) / 1e6, "first_batch_s": first, "timed_s": elapsed, "timed_batches": n,
        "epochs": epoch, "rss_start_mb": rss_start / 1024, "peak_rss_mb": mem.peak_rss / 1024,
        "peak_private_mb": mem.peak_private / 1024,
        "padding_efficiency": real / padded if padded else 1.0, "over_budget_batches": over,
        "worst_padded_vs_budget": worst,
        "loadavg": os.getloadavg()[0],
        "memcpy_local_mb_per_s": (copy_before + copy_after) / 2, "memcpy_local_bytes": _memcpy_size(memcpy_bytes),
        "vs_memcpy_local": rate(nbytes) / 1e6 / ((copy_before + copy_after) / 2) if copy_before else 0.0,
        **wait,
    }


def data_wait(loader: Any, epoch: int, step_ms: float, batches: int) -> dict[str, Any]:
    """The share of a training loop's time spent waiting for the next batch, under a synthetic step of step_ms
    (a sleep: it releases the GIL as a CUDA step does, so the loader's threads and workers run meanwhile). The
    loop starts on a fresh epoch after its first batch, as a trainer's steady state."""
    waited = looped = 0.0
    n = 0
    while n < batches:
        loader.set_epoch(epoch)
        epoch += 1
        it = iter(loader)
        try:
            next(it)  # the epoch's first batch: start-up, reported as first_batch_s
        except StopIteration:
            raise Failed("an epoch without batches (budget too small for the corpus?)") from None
        time.sleep(step_ms / 1e3)
        t_loop = time.perf_counter()
        for _ in it:
            t_got = time.perf_counter()
            waited += t_got - t_loop
            time.sleep(step_ms / 1e3)
            n += 1
            t_loop = time.perf_counter()
            looped += t_loop - t_got
            if n >= batches:
                break
        del it
    total = waited + looped
    return {"step_ms": step_ms, "stepped_batches": n, "stepped_s": total, "data_wait_s": waited,
            "data_wait_share": waited / total if total else 0.0}


def _memcpy_size(nbytes: int) -> int:
    return int(min(nbytes, MEMCPY_BYTES)) // 4 * 4


def time_memcpy(nbytes: int, seconds: float) -> dict[str, Any]:
    """np.copyto between two prefaulted buffers of the corpus' payload size, at most 64 MB each: past the L3 cache
    either way, so the rate is DRAM's; buffers of the payload's size (2 x 502 MB) took seconds to prefault on a
    loaded 2-core machine, before and after every loader."""
    size = _memcpy_size(nbytes) // 4
    src = np.ones(size, dtype=np.float32)
    dst = np.zeros(size, dtype=np.float32)
    np.copyto(dst, src)
    reps = 0
    t0 = time.perf_counter()
    while reps < 3 or time.perf_counter() - t0 < seconds:
        np.copyto(dst, src)
        reps += 1
    dt = time.perf_counter() - t0
    return {"name": "memcpy", "bytes": size * 4, "reps": reps, "mb_per_s": size * 4 * reps / dt / 1e6,
            "loadavg": os.getloadavg()[0]}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    return time_loader(LoaderSpec(**job["spec"]), job["seconds"], job["min_batches"],
                       max_epochs=1 if job.get("cold") else 10_000, memcpy_bytes=job.get("memcpy_bytes", 0),
                       step_ms=job.get("step_ms", 0.0), step_batches=job.get("step_batches", 0))


def _forked(job: dict[str, Any], conn: Any) -> None:
    """A forked child's body: the result, or the error's last lines, sent back through `conn`."""
    try:
        conn.send(("ok", run_job(job)))
    except BaseException:  # noqa: BLE001 - reported by the parent as a failed loader
        import traceback

        conn.send(("error", "\n".join(traceback.format_exc().strip().splitlines()[-8:])))
    finally:
        conn.close()


# ---- the parent: prepare, spawn, report ------------------------------------------------------------------------


def _spawn(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one job in a child forked from this process (its imports already done; DataLoader workers fork the
    same way), and return its result; a child that fails or runs past `timeout` is a Failed."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not a daemon: a daemonic process may not start DataLoader workers (--workers N).
    proc = ctx.Process(target=_forked, args=(job, theirs))
    proc.start()
    theirs.close()
    name = job.get("spec", {}).get("name", "loader")
    try:
        if not mine.poll(timeout):
            raise Failed(f"{name}: no result within {timeout:.0f} s")
        status, value = mine.recv()
    except EOFError:
        status = "error"  # two statements: a ("code", "text") pair reads as a reject record to the docs check
        value = "the child ended without a result"
    finally:
        proc.join(10.0)  # a child that sent its result exits on its own
        if proc.is_alive():
            proc.terminate()
            proc.join()
        mine.close()
    if status != "ok":
        raise Failed(f"benchmark child failed (exit {proc.exitcode}):\n{value}")
    return value


def machine_info() -> dict[str, Any]:
    import pyarrow
    import soundfile
    import torch
    import webdataset

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    except OSError:
        pass
    mem_gb = 0.0
    try:
        mem_gb = int(next(ln.split()[1] for ln in open("/proc/meminfo") if ln.startswith("MemTotal"))) / 2**20
    except (OSError, StopIteration):
        pass
    versions = {"python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__,
                "pyarrow": pyarrow.__version__, "webdataset": getattr(webdataset, "__version__", "?"),
                "soundfile": soundfile.__version__}
    try:
        import lhotse

        versions["lhotse"] = lhotse.__version__
    except ImportError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)), "memory_gb": round(mem_gb, 1),
            "loadavg_start": os.getloadavg()[0], "versions": versions}


def _corpus_info(shards: Path, feature: str) -> dict[str, Any]:
    from audiopipe.index.lengths import LengthIndex
    from audiopipe.shard.manifest import read_manifest

    m = read_manifest(shards)
    feature = column_name(feature)
    if feature not in m["features"]:
        raise InvalidValue(f"{shards} has no feature {feature!r}; it has {sorted(m['features'])}")
    spec = m["features"][feature]
    idx = LengthIndex.open(shards)
    frames = idx.frames(feature).astype(np.int64)
    per_frame = max(1, spec["channels"]) * np.dtype(spec["dtype"]).itemsize
    return {"utterances": int(frames.size), "hours": float(idx.duration.sum() / 3600), "shards": len(m["shards"]),
            "payload_mb": float(frames.sum() * per_frame / 1e6), "feature": feature,
            "feature_shape": f"[{spec['channels']}, T] {spec['dtype']}" if spec["channels"] else f"[T] {spec['dtype']}",
            "median_s": float(np.median(idx.duration)), "job_corpus": m.get("job", {}).get("corpus")}


def _defaults(args: argparse.Namespace) -> None:
    """--seconds, --rounds and --loaders not given: the short run's, or --full's."""
    short = {"loaders": ",".join(SHORT_LOADERS), "seconds": 3.0, "rounds": 1}
    for key, value in (FULL if getattr(args, "full", False) else short).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def own_start_s() -> float:
    """Seconds since this process started (interpreter, imports of torch, numpy, pyarrow, numba): a measure of
    what CPU-bound work costs on this machine at its present load; SPAWN_S where /proc cannot tell."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return max(0.5, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return SPAWN_S


def estimate_s(args: argparse.Namespace, loaders: int, payload_mb: float, cache_ready: bool,
               spawn_s: float = SPAWN_S) -> float:
    """Seconds the run should take here: each loader's child (forked: no imports of its own), whose untimed work
    (memcpy buffers, the loader's set-up and the copy kernel's load, the epochs' starts) costs about what this
    process' own start did (spawn_s; measured at load averages 1-28), then its two memcpy references, timed
    seconds and data-wait loop; and (first run only) the baselines' copies of the corpus at ~100 MB/s."""
    per_loader = (spawn_s + 2 * MEMCPY_S + args.seconds
                  + (args.step_batches * args.step_ms / 1000 if args.step_ms else 0))
    return args.rounds * loaders * per_loader + (0.0 if cache_ready else payload_mb / 100.0)


def run(args: argparse.Namespace) -> int:
    _defaults(args)
    from audiopipe.storage.s3 import is_s3

    if is_s3(args.shards):  # from a bucket only make_loader can read: audiopipe/bench/s3_loader.py times it
        from audiopipe.bench.s3_loader import run_s3

        return run_s3(args)
    shards = Path(args.shards)
    if not (shards / "manifest.json").exists():
        raise NotFound(f"{shards}/manifest.json not found: point --shards at an `audiopipe shard` output")
    if args.batch_frames <= 0 or args.workers < 0 or args.seconds <= 0 or args.rounds < 1:
        raise InvalidValue("--batch-frames, --seconds and --rounds must be positive and --workers >= 0")
    names = [n.strip() for n in args.loaders.split(",") if n.strip()]
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        raise InvalidValue(f"unknown loader(s) {', '.join(unknown)}; choose from {', '.join(LOADERS)}")
    args.feature = column_name(args.feature)  # one note for an alias, then the column's name throughout
    corpus = _corpus_info(shards, args.feature)
    index_sha = json.loads((shards / "manifest.json").read_text())["index"]["sha256"]
    cache = Path(args.cache or Path(tempfile.gettempdir()) / f"audiopipe-bench-{index_sha[:12]}")
    audio_root = args.corpus or corpus["job_corpus"]
    machine = machine_info()
    print(f"corpus: {corpus['utterances']} utterances, {corpus['hours']:.2f} h, {corpus['shards']} shards, "
          f"{corpus['payload_mb']:.0f} MB of {args.feature} {corpus['feature_shape']}; workers {args.workers}; "
          f"{machine['usable_cpus']} CPUs, load {machine['loadavg_start']:.1f}", flush=True)
    cache_ready = cache.is_dir() and any(cache.iterdir())
    est = estimate_s(args, len(names), corpus["payload_mb"], cache_ready or not ({"npy_per_utt", "npy_amphion",
                                                                                   "lhotse_shar"} & set(names)),
                     spawn_s=own_start_s())
    print(f"{len(names)} loader(s) x {args.rounds} round(s), {args.seconds:g} s timed each: about {est:.0f} s"
          + ("" if getattr(args, "full", False) else " (the long run: --full)"), flush=True)
    specs: list[LoaderSpec] = []
    skipped: dict[str, str] = {}
    for name in names:
        spec = LoaderSpec(name, str(shards.resolve()), args.feature, args.batch_frames, args.workers, args.seed,
                          str(cache), audio_root)
        why = _unavailable(spec)
        if why:
            skipped[name] = why
            print(f"  {name:<12} skipped: {why}", flush=True)
        else:
            prepare(spec)
            specs.append(spec)
    rounds: dict[str, list[dict[str, Any]]] = {s.name: [] for s in specs}
    # Rounds interleave the loaders, so that a load spike on a shared machine hits one round of each, not
    # every round of one; the median round is reported.
    for k in range(args.rounds):
        for spec in specs:
            if spec.name in skipped:
                continue
            if args.cold:
                evict(files_of(spec))
            else:
                read_all(files_of(spec))
            job = {"kind": "loader", "spec": asdict(spec), "seconds": args.seconds, "min_batches": args.min_batches,
                   "cold": args.cold, "memcpy_bytes": int(corpus["payload_mb"] * 1e6),
                   # one cold pass is all a --cold run reads: no stepped loop after it
                   "step_ms": 0.0 if args.cold else args.step_ms, "step_batches": args.step_batches}
            try:
                r = _spawn(job, timeout=max(600.0, 20 * args.seconds))
            except RuntimeError as e:
                skipped[spec.name] = str(e).splitlines()[-1]
                print(f"  {spec.name:<12} FAILED: {e}", flush=True)
                continue
            rounds[spec.name].append(r)
            waits = (f"  data wait {100 * r['data_wait_share']:.2f}% of a {r['step_ms']:g} ms step"
                     if "data_wait_share" in r else "")
            print(f"  [{k + 1}/{args.rounds}] {spec.name:<12} {r['batches_per_s']:9.2f} batches/s "
                  f"{r['audio_s_per_s']:10.0f} audio s/s {r['mb_per_s']:9.1f} MB/s  first {r['first_batch_s']:.2f} s  "
                  f"peak RSS {r['peak_rss_mb']:.0f} MB  load {r['loadavg']:.1f}{waits}", flush=True)
    results = [_median_round(rs) for name, rs in rounds.items() if rs and name not in skipped]
    memcpy = memcpy_row([r for rs in rounds.values() for r in rs])
    report = {"command": "audiopipe bench-loader " + " ".join(_argv(args)), "machine": machine, "corpus": corpus,
              "config": {"batch_frames": args.batch_frames, "workers": args.workers, "seconds": args.seconds,
                         "min_batches": args.min_batches, "seed": args.seed, "feature": args.feature,
                         "rounds": args.rounds, "step_ms": args.step_ms, "step_batches": args.step_batches,
                         "page_cache": "cold (one pass)" if args.cold else "warm"},
              "loaders": results, "skipped": skipped, "memcpy": memcpy,
              "ratios": ratios({n: rs for n, rs in rounds.items() if rs and n not in skipped})}
    report["machine"]["loadavg_end"] = os.getloadavg()[0]
    # The whole run, from this process' start (imports included) to its report, beside what it estimated.
    report["run_s"] = {"estimate": round(est, 1), "measured": round(own_start_s(), 1)}
    print()
    print(markdown_table(report))
    for line in ratio_lines(report["ratios"]):
        print(line)
    print(f"took {report['run_s']['measured']:.0f} s (estimated {est:.0f} s)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(report, args.plot)
    return 0


def memcpy_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The memcpy row: the median of the references every loader's process timed around itself (each the mean
    of one before and one after), in run order in `rounds`."""
    local = [r["memcpy_local_mb_per_s"] for r in runs if r.get("memcpy_local_mb_per_s")]
    return {"name": "memcpy", "mb_per_s": float(np.median(local)) if local else 0.0, "rounds": local,
            "bytes": runs[0].get("memcpy_local_bytes", 0) if runs else 0,
            "seconds": 2 * MEMCPY_S, "loadavg": [r["loadavg"] for r in runs]}


def _median_round(rounds: list[dict[str, Any]], key: str = "audio_s_per_s") -> dict[str, Any]:
    """The round with the median rate, with every round's rate attached (spread on a shared machine)."""
    ranked = sorted(rounds, key=lambda r: r[key])
    out = dict(ranked[(len(ranked) - 1) // 2])
    out["rounds"] = [r[key] for r in rounds]
    if "vs_memcpy_local" in rounds[0]:
        local = [r["vs_memcpy_local"] for r in rounds]
        out["vs_memcpy_local_rounds"] = local
        out["vs_memcpy_local"] = float(np.median(local))
    return out


def _unavailable(spec: LoaderSpec) -> str | None:
    if spec.name == "on_the_fly" and not (spec.corpus and Path(spec.corpus).is_dir()):
        return f"source audio folder not found ({spec.corpus}); pass --corpus"
    if spec.name == "wds" and not files_of(spec):
        return "the shards have no WebDataset tars (--no-tar)"
    if spec.name == "lhotse_shar":
        try:
            import lhotse  # noqa: F401
        except ImportError:
            return "lhotse is not installed"
    return None


def _argv(args: argparse.Namespace) -> list[str]:
    out = [f"--shards {args.shards}", f"--batch-frames {args.batch_frames}", f"--workers {args.workers}",
           f"--seconds {args.seconds:g}", f"--rounds {args.rounds}"]
    if args.loaders != ",".join(SHORT_LOADERS):
        out.append(f"--loaders {args.loaders}")
    if args.cold:
        out.append("--cold")
    return out


def ratios(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each ratio is taken within a round (rounds interleave the loaders) and the median over rounds is kept;
    against memcpy, each round of mmap is divided by the memcpy timed in its own process around it."""
    out: dict[str, Any] = {}
    if "mmap" not in rounds:
        return out
    mmap = rounds["mmap"]
    for other in ("on_the_fly", "npy_per_utt", "npy_amphion"):
        if other not in rounds:
            continue
        per_round = [a["audio_s_per_s"] / b["audio_s_per_s"] for a, b in zip(mmap, rounds[other])
                     if b["audio_s_per_s"] > 0]
        if per_round:
            out[f"mmap_vs_{other}"] = {"ratio": float(np.median(per_round)), "rounds": per_round}
    local = [r["vs_memcpy_local"] for r in mmap if r.get("vs_memcpy_local")]
    if local:
        out["mmap_vs_memcpy"] = {"ratio": float(np.median(local)), "rounds": local}
    return out


def ratio_lines(t: dict[str, Any]) -> list[str]:
    names = {"mmap_vs_on_the_fly": "mmap vs on-the-fly decode+mel (audio s/s)",
             "mmap_vs_npy_per_utt": "mmap vs one .npy per utterance, our collate (audio s/s)",
             "mmap_vs_npy_amphion": "mmap vs one .npy per utterance, Amphion's collate (audio s/s)",
             "mmap_vs_memcpy": "mmap MB/s / memcpy MB/s (memcpy timed around it, same process)"}
    return [f"{names[k]}: {v['ratio']:.2f}x (rounds {min(v['rounds']):.2f}-{max(v['rounds']):.2f})"
            for k, v in t.items()]


def markdown_table(report: dict[str, Any]) -> str:
    mc = report["memcpy"]["mb_per_s"]
    rows = ["| loader | batches/s | utterances/s | audio s/s | MB/s | % of memcpy | first batch s | peak RSS MB "
            "| private MB | padding eff. | over budget | data wait |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["loaders"]:
        rows.append(f"| {r['name']} | {r['batches_per_s']:.2f} | {r['utterances_per_s']:.0f} | "
                    f"{r['audio_s_per_s']:.0f} | {r['mb_per_s']:.1f} | "
                    f"{100 * r.get('vs_memcpy_local', r['mb_per_s'] / mc):.1f}% | "
                    f"{r['first_batch_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['peak_private_mb']:.0f} | "
                    f"{100 * r['padding_efficiency']:.1f}% | {r['over_budget_batches']} | "
                    + (f"{100 * r['data_wait_share']:.2f}% of a {r['step_ms']:g} ms step |"
                       if "data_wait_share" in r else "- |"))
    rows.append(f"| memcpy | | | | {mc:.0f} | 100% | | | | | | |")
    return "\n".join(rows)


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["loaders"]
    names = [r["name"] for r in res]
    y = np.arange(len(res))
    panels = [("mb_per_s", "MB/s of real feature bytes (log)", True),
              ("first_batch_s", "time to first batch, s", False),
              ("peak_rss_mb", "peak RSS of the process tree, MB (black: private)", False),
              ("padding_efficiency", "padding efficiency", False)]
    if res and all("data_wait_share" in r for r in res):
        panels.append(("data_wait_share", f"data wait, share of a loop with a {res[0]['step_ms']:g} ms step",
                       False))
    fig, axes = plt.subplots(2, 3 if len(panels) > 4 else 2, figsize=(17 if len(panels) > 4 else 12, 7))
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    for ax, (key, title, log) in zip(axes.ravel(), panels):
        vals = [r[key] for r in res]
        ours = ("mmap", "mmap_ring1", "mmap_btc", "wds")
        ax.barh(y, vals, color=["#2a6f97" if n in ours else "#a0a0a0" for n in names])
        if key == "peak_rss_mb":  # the private (anonymous) part; the rest is mapped page cache and shared
            ax.barh(y, [r["peak_private_mb"] for r in res], height=0.35, color="#1b1b1b")
        ax.set_yticks(y, names)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
            ax.axvline(report["memcpy"]["mb_per_s"], color="#c0392b", ls="--", lw=1)
            ax.text(report["memcpy"]["mb_per_s"], len(res) - 0.5, " memcpy", color="#c0392b", fontsize=8, va="bottom")
        if key == "padding_efficiency":
            ax.set_xlim(0, 1)
        for yi, v in zip(y, vals):
            share = key in ("padding_efficiency", "data_wait_share")
            ax.text(v, yi, f" {v:.2%}" if share else f" {v:.3g}", va="center", fontsize=8)
    c = report["corpus"]
    from matplotlib.patches import Patch
    from matplotlib.lines import Line2D

    fig.legend(handles=[Patch(color="#2a6f97", label="audiopipe's loaders"),
                        Patch(color="#a0a0a0", label="other loaders (baselines)"),
                        Line2D([], [], color="#c0392b", ls="--", label="memcpy of the same bytes"),
                        Patch(color="#1b1b1b", label="private memory (of peak RSS)")],
               loc="lower right", ncol=4, fontsize=9, frameon=False)
    fig.suptitle(f"bench-loader: {c['utterances']} utterances, {c['hours']:.1f} h, {c['feature']} "
                 f"{c['feature_shape']}, {report['config']['batch_frames']} frames/batch, "
                 f"{report['config']['workers']} workers\nmachine: {report['machine'].get('cpu') or 'unknown CPU'}, "
                 f"{report['machine']['usable_cpus']} CPUs, {report['machine'].get('memory_gb', '?')} GB, "
                 f"page cache {report['config'].get('page_cache', 'warm')}", fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))  # room for the legend below the panels
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="audiopipe bench-loader", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
