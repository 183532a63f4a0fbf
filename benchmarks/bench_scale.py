"""Scale rehearsal: the whole user path on a corpus of hundreds of thousands of real-speech utterances, stage by
stage, each stage its own process at niceness 10, measured from outside. The corpus, the stages, the commands that
made the figures and the plot (`bench_scale.py plot OUT.png RESULT.json...`): docs/scale.md.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from tqdm import tqdm
from results_io import ROOT, child_env, host, pyplot, save

sys.path.insert(0, str(ROOT / "tests"))
from ray_cluster import Cluster, descendants, job_env  # noqa: E402  (tests/: the harness the cluster tests share)
from shard_helpers import done_shards, tree_digest  # noqa: E402

PY = sys.executable
PAGE, TICK = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_CLK_TCK")
SR, MIN_S, MAX_S, PER_SPEAKER = 8000, 0.5, 4.0, 250
WORKERS = 2

# ------------------------------------------------------------------ the corpus

_SOURCES: tuple[list[np.ndarray], list[str]] = ([], [])


def _load_sources() -> None:
    """The usable prompts (float32) and their texts, in sorted order, for this process's utterances."""
    global _SOURCES
    from audiopipe.corpus.demo import ASTERISK_SOUNDS, usable_asterisk_prompts

    audio, texts = [], []
    for name, text in usable_asterisk_prompts(max_s=10.0):
        x, sr = sf.read(str(ASTERISK_SOUNDS / f"{name}.wav"), dtype="float32")
        if sr == SR and x.ndim == 1:
            audio.append(x)
            texts.append(text)
    _SOURCES = audio, texts


def make_utterance(i: int, seed: int) -> tuple[np.ndarray, str]:
    """Utterance i: int16 samples and the text of the prompts its window was cut from (it may clip the first
    and last words: good for lengths and tokens, not for ASR)."""
    audio, texts = _SOURCES
    rng = np.random.default_rng([seed, i])
    target = int(rng.uniform(MIN_S, MAX_S) * SR)
    speed = rng.uniform(0.9, 1.1)
    need = int(target * speed) + 2
    parts, words = [], []
    while sum(len(p) for p in parts) < need:  # join prompts until the window fits
        k = int(rng.integers(len(audio)))
        parts.append(audio[k])
        words.append(texts[k])
    src = np.concatenate(parts)
    start = int(rng.integers(0, len(src) - need + 1))
    y = np.interp(start + np.arange(target) * speed, np.arange(len(src)), src)  # speed change by interpolation
    y *= 10 ** (rng.uniform(-12.0, 3.0) / 20)
    rms = float(np.sqrt(np.mean(y * y))) or 1e-4
    y += rng.standard_normal(target) * rms * 10 ** (-rng.uniform(15.0, 40.0) / 20)
    return np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16), " ".join(words)


def _speaker(job: tuple[Path, int, int, int, int]) -> tuple[int, int, list[bytes]]:
    """Write one speaker folder (its metadata.csv last); one already finished is only read and hashed.
    Returns (files, bytes, content digests)."""
    root, seed, n, per_speaker, spk = job
    d, ids = root / f"spk{spk:04d}", range(spk * per_speaker, min(n, (spk + 1) * per_speaker))
    done = (d / "metadata.csv").is_file()
    (d / "wavs").mkdir(parents=True, exist_ok=True)
    blobs, lines = [], []
    for i in ids:
        wav = d / "wavs" / f"u{i:07d}.wav"
        if done:
            blobs.append(wav.read_bytes())
            continue
        pcm, text = make_utterance(i, seed)
        buf = io.BytesIO()
        sf.write(buf, pcm, SR, subtype="PCM_16", format="WAV")
        blobs.append(buf.getvalue())
        wav.write_bytes(blobs[-1])
        lines.append(f"u{i:07d}|{text}|{text}")
    if not done:
        (d / "metadata.csv").write_bytes(("\n".join(lines) + "\n").encode())
    return (len(blobs) + 1, sum(map(len, blobs)) + (d / "metadata.csv").stat().st_size,
            [hashlib.blake2b(b, digest_size=16).digest() for b in blobs])


def build(root: Path, n: int, seed: int = 0, per_speaker: int = PER_SPEAKER, processes: int = 1,
          progress: bool = True) -> dict:
    """Write the corpus (or finish an interrupted build); returns its statistics."""
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    speakers = -(-n // per_speaker)
    seen: set[bytes] = set()
    files = nbytes = 0
    with (mp.get_context("fork").Pool(processes, initializer=_load_sources) as pool,
          tqdm(total=n, unit="utt", desc="corpus", disable=not progress, file=sys.stderr) as bar):
        for f, b, digests in pool.imap(_speaker, [(root, seed, n, per_speaker, s) for s in range(speakers)]):
            files, nbytes = files + f, nbytes + b
            if seen & set(digests) or len(set(digests)) < len(digests):
                raise RuntimeError("two utterances came out byte-identical")
            seen.update(digests)
            bar.update(len(digests))
    return {"utterances": len(seen), "unique_contents": len(seen), "speakers": speakers, "files": files,
            "bytes": nbytes, "seconds": round(time.perf_counter() - t0, 1), "seed": seed, "sample_rate": SR,
            "per_speaker": per_speaker}


def corpus_for(data: Path, n: int) -> tuple[Path, dict[str, Any]]:
    """<data>/corpus with at least n utterances (built when missing); a smaller n: its first speaker folders."""
    stats_path = data / "corpus_stats.json"
    if not stats_path.is_file():
        stats_path.write_text(json.dumps(build(data / "corpus", n, processes=2), indent=2) + "\n")
    stats = json.loads(stats_path.read_text())
    if n > stats["utterances"]:
        raise SystemExit(f"{data / 'corpus'} holds {stats['utterances']} utterances, {n} asked for")
    if n == stats["utterances"]:
        return data / "corpus", stats
    per = stats["per_speaker"]
    if n % per:
        raise SystemExit(f"--utterances must be a multiple of {per} below the whole corpus")
    sub = data / f"sub_{n}"
    sub.mkdir(exist_ok=True)
    for link in (sub / f"spk{s:04d}" for s in range(n // per)):
        if not link.is_symlink():  # a link an interrupted run made is kept
            link.symlink_to(data / "corpus" / link.name)
    return sub, {**stats, "utterances": n, "subset_of": stats["utterances"]}


# ------------------------------------------------------------------ measuring a process tree

def _sample(pid: int) -> tuple[int, float]:
    """A process's RSS (bytes) and CPU-seconds, from /proc/PID/stat; (0, 0.0) once it has gone."""
    try:  # the fields after the command name, which may hold spaces and parentheses
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0.0
    return int(f[21]) * PAGE, (int(f[11]) + int(f[12])) / TICK


class TreeMonitor(threading.Thread):
    """Polls the driver and every process below it: peak RSS of each, first/last RSS of each worker, CPU; kills
    the process group (SIGKILL) once `kill_when()` is true."""

    def __init__(self, pid: int, kill_when: Any = None, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.kill_when, self.period = pid, kill_when, period
        self.driver_peak, self.killed = 0, False
        self.workers: dict[int, dict[str, float]] = {}
        self.cpu: dict[int, float] = {}  # CPU-seconds of each process of the tree, at its last sample
        self.stop_flag = threading.Event()

    def run(self) -> None:
        while not self.stop_flag.is_set():
            now = time.monotonic()
            r, cpu = _sample(self.pid)
            self.driver_peak = max(self.driver_peak, r)
            self.cpu[self.pid] = cpu or self.cpu.get(self.pid, 0.0)
            for c in descendants(self.pid):
                r, cpu = _sample(c)
                if r:
                    self.cpu[c] = cpu
                    w = self.workers.setdefault(c, {"first": r, "peak": r, "t0": now})
                    w["peak"] = max(w["peak"], r)
                    w["last"], w["t1"] = r, now
            if self.kill_when is not None and not self.killed and self.kill_when():
                with contextlib.suppress(ProcessLookupError):  # it may have ended on its own meanwhile
                    os.killpg(self.pid, signal.SIGKILL)
                    self.killed = True
            self.stop_flag.wait(self.period)

    def summary(self) -> dict[str, Any]:
        mb = lambda b: round(b / 2**20, 1)  # noqa: E731
        ws = [w for w in self.workers.values() if w.get("t1", 0) - w["t0"] >= 5.0]  # long-lived ones
        out: dict[str, Any] = {"driver_peak_rss_mb": mb(self.driver_peak), "processes_below": len(self.workers),
                               "workers_peak_rss_mb": mb(max((w["peak"] for w in self.workers.values()), default=0))}
        if ws:
            out["workers_long_lived"] = len(ws)
            for k in ("first", "last", "peak"):
                out[f"workers_rss_{k}_mb"] = [mb(w[k]) for w in ws]
        return out


def tree_size(path: Path) -> tuple[int, int]:
    sizes = [os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names]
    return len(sizes), sum(sizes)


def run_stage(cmd: list[str], out: Path | None, env: dict[str, str] | None = None, kill_when: Any = None) -> dict:
    """Run `cmd` at niceness 10 and measure it; `kill_when()` true -> SIGKILL of its whole process group."""
    before = tree_size(out) if out else (0, 0)
    load0, ru0, t0 = os.getloadavg(), resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    niced = ["nice", "-n", str(10 - os.nice(0))] if os.nice(0) < 10 else []  # at niceness 10, not 10 more
    p = subprocess.Popen([*niced, *cmd], env=env or child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, cwd=ROOT)  # `python -c` imports from its folder first
    mon = TreeMonitor(p.pid, kill_when)
    mon.start()
    stdout, stderr = p.communicate()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    mon.stop_flag.set()
    mon.join()
    after = tree_size(out) if out else (0, 0)
    shown = [os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c for c in cmd]
    if shown[1:2] == ["-c"]:
        shown[2] = "<snippet>"
    res = {"cmd": " ".join(shown), "rc": p.returncode, "wall_s": round(wall, 2),
           "cpu_s": round(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 2), **mon.summary(),
           "files_written": after[0] - before[0], "bytes_written": after[1] - before[1],
           "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()]}
    if mon.killed:  # its CPU never reached RUSAGE_CHILDREN: the tree's own counters at their last sample
        res.update(killed=True, cpu_s=round(sum(mon.cpu.values()), 2))
    elif p.returncode != 0:
        res["stderr_tail"] = stderr[-3000:]
        print(stderr[-3000:], file=sys.stderr)
    res["stdout_tail"] = stdout[-1500:]
    for line in stdout.splitlines():  # a snippet's own figures
        if line.startswith("RESULT "):
            res.update(json.loads(line[7:]))
    return res


# ------------------------------------------------------------------ the stages

def shard_cmd(a: argparse.Namespace, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [PY, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out), "--no-progress",
            *(["--features", a.features] if a.features else ["--preset", a.preset]),
            *(["--no-tar"] if a.no_tar else []), *(["--shard-size", a.shard_size] if a.shard_size else []), *extra]


def local(timings: Path | None = None) -> list[str]:
    return ["--workers", str(WORKERS), "--engine", "local", *(["--timings", str(timings)] if timings else [])]


def deciles(timings: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """Shard throughput over time: tasks in finishing order, in ten equal groups, audio s / CPU s each."""
    dur = {s["name"]: s["duration"] for s in manifest["shards"]}
    rows = sorted((t["end"], dur.get(t["name"], 0.0), t["cpu"]) for t in timings["tasks"])
    out = []
    for k in range(10):
        g = rows[k * len(rows) // 10:(k + 1) * len(rows) // 10]
        if g:
            audio, cpu = sum(r[1] for r in g), sum(r[2] for r in g)
            out.append({"decile": k + 1, "tasks": len(g), "audio_s": round(audio, 1),
                        "x_rt_per_cpu_s": round(audio / cpu, 1) if cpu else None})
    res: dict[str, Any] = {"deciles": out}
    if out and out[0]["x_rt_per_cpu_s"] and out[-1]["x_rt_per_cpu_s"]:
        res["last_over_first"] = round(out[-1]["x_rt_per_cpu_s"] / out[0]["x_rt_per_cpu_s"], 3)
    return res


def compare_trees(a: Path, b: Path) -> dict[str, Any]:
    da, db = tree_digest(a), tree_digest(b)
    diff = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    return {"files": len(da), "identical": not diff, "differing": diff[:20]}


def compared(r: dict[str, Any], out: Path, dst: Path, key: str) -> dict[str, Any]:
    """The totals of the run that wrote `dst` and, under `key`, its files against the shard stage's (`out`); `dst`
    is deleted when they are identical (`compare` looks at the runs that differed). Returns the totals."""
    r.update({"totals": json.loads((dst / "manifest.json").read_text())["totals"], key: compare_trees(out, dst)})
    if r[key]["identical"]:
        shutil.rmtree(dst)
    return r["totals"]


def stage_corpus(a, corpus, out, res) -> dict[str, Any]:
    return res["corpus"]


def stage_shard(a, corpus, out, res) -> dict[str, Any]:
    timings = a.data / f"timings_{a.tag}.json"
    shutil.rmtree(out, ignore_errors=True)
    r = run_stage(shard_cmd(a, corpus, out, *local(timings)), out)
    if r["rc"] == 0:
        man, tl = json.loads((out / "manifest.json").read_text()), json.loads(timings.read_text())
        audio_s, cpu = man["totals"]["hours"] * 3600, sum(t["cpu"] for t in tl["tasks"])
        r.update(totals=man["totals"], shards=len(man["shards"]), phases=tl.get("phases"),
                 x_rt_wall=round(audio_s / r["wall_s"], 1), x_rt_per_cpu_s=round(audio_s / cpu, 1) if cpu else None,
                 throughput=deciles(tl, man))
    return r


def stage_noop(a, corpus, out, res) -> dict[str, Any]:
    return run_stage(shard_cmd(a, corpus, out, *local()), out)


_VERIFY = r"""
import json, sys, time
from audiopipe.shard.verify import verify
t, c = time.perf_counter(), time.process_time()
rep = verify(sys.argv[1], tars=sys.argv[2] == "1")
print("RESULT " + json.dumps({"verify_wall_s": round(time.perf_counter() - t, 3), "verify_cpu_s":
      round(time.process_time() - c, 3), "ok": rep.ok, "records": rep.records, "shards": rep.shards}))
"""


def stage_verify(a, corpus, out, res) -> dict[str, Any]:
    """verify() on the page cache (every file read once first): bytes per CPU-second of verify() itself (its
    imports apart)."""
    nbytes = tree_size(out)[1]
    for p in (p for p in out.rglob("*") if p.is_file()):  # into the page cache
        p.read_bytes()
    r = run_stage([PY, "-c", _VERIFY, str(out), "0" if a.no_tar else "1"], None)
    r.update(bytes_checked=nbytes,
             gb_per_cpu_s=round(nbytes / r["verify_cpu_s"] / 1e9, 3) if r.get("verify_cpu_s") else None)
    return r


def stage_inspect(a, corpus, out, res) -> dict[str, Any]:
    return run_stage([PY, "-m", "audiopipe.cli", "inspect", str(out), "--json",
                      "--plot", str(a.data / f"durations_{a.tag}.png")], None)


_LOADER = r"""
import json, sys, time
t0 = time.perf_counter()
from audiopipe.reader.loader import make_loader
res = {"import_s": round(time.perf_counter() - t0, 3)}
out, feature, world, resume_k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
open_ = lambda: make_loader(out, [feature], max_frames=20_000, rank=0, world_size=world)
if resume_k == 0:
    t = time.perf_counter()
    loader = open_()
    res["open_s"] = round(time.perf_counter() - t, 3)
    b = next(iter(loader))
    res.update(open_first_batch_s=round(time.perf_counter() - t, 3), batches_per_epoch_rank0=len(loader),
               first_batch_items=int(b[feature].shape[0]))
else:
    loader = open_()
    loader.set_epoch(3)
    resume_k = min(resume_k, len(loader) // 2)
    it = iter(loader)
    for _ in range(resume_k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict(consumed_batches=resume_k)))
    expect = next(it)
    del it, loader
    t = time.perf_counter()
    loader = open_()
    loader.load_state_dict(state)
    loader.set_epoch(3)
    b = next(iter(loader))
    res.update(resume_open_first_batch_s=round(time.perf_counter() - t, 3), resumed_after_batches=resume_k,
               same_batch_as_uninterrupted=bool(b[feature].shape == expect[feature].shape
                                                and (b[feature] == expect[feature]).all()))
print("RESULT " + json.dumps(res))
"""


def stage_loader(a, corpus, out, res) -> dict[str, Any]:
    return {f"world_{w}": run_stage([PY, "-c", _LOADER, str(out), a.loader_feature, str(w), "0"], None)
            for w in (1, 64)}


def stage_resume(a, corpus, out, res) -> dict[str, Any]:
    return {f"world_{w}": run_stage([PY, "-c", _LOADER, str(out), a.loader_feature, str(w), str(k)], None)
            for w, k in ((1, 20), (64, 5))}


def stage_export(a, corpus, out, res) -> dict[str, Any]:
    r = {}
    for cmd in ("export-lhotse", "export-hf"):
        dst = a.data / f"{cmd}_{a.tag}"
        shutil.rmtree(dst, ignore_errors=True)
        r[cmd] = run_stage([PY, "-m", "audiopipe.cli", cmd, "--shards", str(out), "--out", str(dst),
                            "--no-progress"], dst)
    return r


def stage_kill9(a, corpus, out, res) -> dict[str, Any]:
    n_shards = res["stages"].get("shard", {}).get("shards")
    if not n_shards:
        raise SystemExit("kill9 needs the shard stage's result (its shard count and output)")
    dst = a.data / f"shards_{a.tag}_kill9"
    shutil.rmtree(dst, ignore_errors=True)
    first = run_stage(shard_cmd(a, corpus, dst, *local()), dst, kill_when=lambda: done_shards(dst) >= n_shards // 2)
    r: dict[str, Any] = {"killed_run": first, "done_at_kill": done_shards(dst), "shards": n_shards}
    timings = a.data / f"timings_{a.tag}_kill9_rerun.json"
    r["rerun"] = run_stage(shard_cmd(a, corpus, dst, *local(timings)), dst)
    if r["rerun"]["rc"] == 0:
        totals = compared(r, out, dst, "compare_with_uninterrupted")
        written_or_rejected = totals["written"] + totals["rejected"]
        r.update(rerun_built_shards=len(json.loads(timings.read_text()).get("tasks", [])),  # {}: nothing to do
                 accounted=written_or_rejected == totals["discovered"] == res["corpus"]["utterances"])
    return r


def stage_ray(a, corpus, out, res) -> dict[str, Any]:
    dst = a.data / f"shards_{a.tag}_ray"
    shutil.rmtree(dst, ignore_errors=True)
    cluster = Cluster()
    t0 = time.perf_counter()
    cluster.start()
    cluster.add_worker()  # a third raylet: head + 2 worker nodes, one CPU each
    start_s = time.perf_counter() - t0
    try:
        r = run_stage(shard_cmd(a, corpus, dst, "--timings", str(a.data / f"timings_{a.tag}_ray.json"),
                                "--ray-address", cluster.address, "--engine", "ray"), dst, env=job_env(cluster, ROOT))
    finally:
        cluster.stop()
    r.update(raylets=3, cluster_start_s=round(start_s, 1))
    if r["rc"] == 0:
        compared(r, out, dst, "compare_with_local_engine")
    return r


def stage_compare(a, corpus, out, res) -> dict[str, Any]:
    runs = {k: a.data / f"shards_{a.tag}_{k}" for k in ("kill9", "ray")}
    r: dict[str, Any] = {}
    if all(p.is_dir() for p in runs.values()):
        r["kill9_vs_ray"] = compare_trees(runs["kill9"], runs["ray"])
    ref = json.loads((out / "plan.json").read_text())
    for k, p in runs.items():
        if (p / "plan.json").is_file():
            r[f"plan_json_{k}_equal_by_content"] = json.loads((p / "plan.json").read_text()) == ref
    return r


STAGES = {name[len("stage_"):]: fn for name, fn in globals().items() if name.startswith("stage_")}


def plot(results: list[Path], png: Path) -> None:
    """Shard throughput per decile of each run's shards (x real time per CPU-second of the shard tasks)."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for path in results:
        r = json.loads(path.read_text())
        d = r["stages"].get("shard", {}).get("throughput", {}).get("deciles", [])
        if d:
            ax.plot([x["decile"] for x in d], [x["x_rt_per_cpu_s"] for x in d], marker="o",
                    label=f"{r['corpus']['utterances']:,} utt, {r.get('features') or r.get('preset')}")
    ax.set(xlabel="decile of shards, in the order they finished", ylabel="x real time per CPU-second",
           title="shard throughput over the run", ylim=(0, None))
    ax.legend(fontsize=8)
    save(fig, png)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":
        plot([Path(x) for x in argv[2:]], Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="bench_scale.py plot OUT.png RESULT.json...: the figure of docs/scale.md")
    p.add_argument("--data", type=Path, required=True, help="folder for the corpus and shards (outside git)")
    p.add_argument("--utterances", type=int, default=500_000)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", default="eres2net")
    g.add_argument("--features", help="feature kinds instead of a preset")
    p.add_argument("--no-tar", action="store_true")
    p.add_argument("--shard-size", help="passed to audiopipe shard (small features: as many shards as a big "
                                       "feature would make)")
    p.add_argument("--loader-feature", default="fbank")
    p.add_argument("--stages", default="shard,noop,verify,inspect,loader,resume", help=",".join(STAGES))
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args(argv)
    if set(a.stages.split(",")) - set(STAGES):
        p.error(f"--stages: unknown {sorted(set(a.stages.split(',')) - set(STAGES))}; known: {', '.join(STAGES)}")
    a.tag = f"{a.utterances // 1000}k_{(a.features or a.preset).replace(',', '+')}"
    a.data.mkdir(parents=True, exist_ok=True)
    corpus, stats = corpus_for(a.data, a.utterances)
    out = a.data / f"shards_{a.tag}"
    res: dict[str, Any] = json.loads(a.json.read_text()) if a.json.is_file() else {}
    res.update(machine=host("2-core shared CPU VM, no GPU; other engineers used the CPU at the same time"),
               corpus=stats, features=a.features, preset=None if a.features else a.preset, no_tar=a.no_tar,
               workers=WORKERS, shard_size=a.shard_size)
    res.setdefault("stages", {})
    res.setdefault("commands", []).append("benchmarks/bench_scale.py " + " ".join(argv))  # each one that added stages
    for name in a.stages.split(","):
        print(f"== {name} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        res["stages"][name] = STAGES[name](a, corpus, out, res)
        res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
