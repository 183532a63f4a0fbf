"""Scale rehearsal: the whole user path on a corpus of hundreds of thousands of real-speech utterances.

    python benchmarks/bench_scale.py --data /work/scale-data --utterances 500000 --features energy \
        --stages shard,noop,verify,inspect,loader,resume,kill9 --json benchmarks/results/scale_500k.json
    python benchmarks/bench_scale.py --data /work/scale-data --utterances 50000 --preset eres2net --no-tar \
        --stages shard,ray --json benchmarks/results/scale_50k_ray.json

The corpus comes from benchmarks/scale_corpus.py (<data>/corpus, built when missing); a size below the whole
corpus takes its first speaker folders (symlinked under <data>/sub_N). Every stage runs as its own process and is
timed from outside: wall time, the peak RSS of the driver (the stage's own process) and of its workers (every
process below it, polled from /proc every 0.5 s, with each worker's RSS at its first and last sample so that
growth shows), the files and bytes it wrote, and the load average before and after. Stages:

- shard: `audiopipe shard` with --timings; throughput over time in deciles of the shards in the order they
  finished: audio seconds / CPU seconds of the shard tasks (x real time per core);
- noop: the same command again on the finished output (nothing to do);
- verify, inspect: the commands, verify's rate in bytes per second per CPU-second;
- plan_read: plan.json's fields and unit names as a no-op rerun reads them, against json.load of the whole file
  (CPU and peak RSS of a fresh process each; runs on a stopped shard stage's output too);
- loader: make_loader open + first batch, rank 0 of 1 and rank 0 of a simulated 64 (no process group);
- resume: take K batches, state_dict, a new loader loads it: open + first batch after the resume;
- export: export-lhotse and export-hf of the shard set (run it on a subset size);
- kill9: a fresh output, SIGKILL of the whole job once half of its shards are done, then the rerun; every file
  of the result compared (sha256) with the shard stage's output, every utterance accounted for;
- ray: the same job on a 3-raylet Ray cluster on 127.0.0.1 (bench_chaos.Cluster), compared file by file with
  the shard stage's output (the local engine);
- compare: the kill9 and ray outputs against each other, file by file, when both were kept (an output that
  equals the shard stage's is deleted), and each one's plan.json against the shard stage's by content.

Results are merged into --json after every stage, so a long run keeps what it has measured. --shard-deadline
stops a shard stage that has not finished by then and records what it got done (the driver's peak, its RSS every
5 s, when planning ended, the done shards); the stages after it are skipped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from bench_chaos import Cluster, descendants, job_env  # noqa: E402
from results_io import pyplot, save  # noqa: E402
from scale_corpus import build as build_corpus  # noqa: E402

PY = sys.executable
PAGE = os.sysconf("SC_PAGE_SIZE")


# ------------------------------------------------------------------ measuring a process tree

def _rss(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def _cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class TreeMonitor(threading.Thread):
    """Polls the driver and every process below it: peak RSS of each, first/last RSS of each worker."""

    def __init__(self, pid: int, period: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.period = pid, period
        self.driver_peak = 0
        self.workers: dict[int, dict[str, float]] = {}
        self.cpu: dict[int, float] = {}  # CPU-seconds of each process of the tree, at its last sample
        self.series: list[tuple[float, float]] = []  # (seconds since start, driver RSS MB), every 5 s
        self.stop_flag = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self.stop_flag.is_set():
            now = time.monotonic()
            rss = _rss(self.pid)
            self.driver_peak = max(self.driver_peak, rss)
            if rss and (not self.series or now - t0 - self.series[-1][0] >= 5.0):
                self.series.append((round(now - t0, 1), round(rss / 2**20, 1)))
            self.cpu[self.pid] = _cpu_s(self.pid) or self.cpu.get(self.pid, 0.0)
            for c in descendants(self.pid):
                r = _rss(c)
                if not r:
                    continue
                self.cpu[c] = _cpu_s(c) or self.cpu.get(c, 0.0)
                w = self.workers.setdefault(c, {"first": r, "peak": r, "t0": now})
                w["peak"] = max(w["peak"], r)
                w["last"], w["t1"] = r, now
            self.stop_flag.wait(self.period)

    def summary(self) -> dict[str, Any]:
        ws = [w for w in self.workers.values() if w.get("t1", 0) - w["t0"] >= 5.0]  # long-lived ones
        out: dict[str, Any] = {"driver_peak_rss_mb": round(self.driver_peak / 2**20, 1),
                               "workers_peak_rss_mb": round(max((w["peak"] for w in self.workers.values()),
                                                                default=0) / 2**20, 1),
                               "processes_below": len(self.workers)}
        if ws:
            out["workers_long_lived"] = len(ws)
            out["workers_rss_first_mb"] = [round(w["first"] / 2**20, 1) for w in ws]
            out["workers_rss_last_mb"] = [round(w["last"] / 2**20, 1) for w in ws]
            out["workers_rss_peak_mb"] = [round(w["peak"] / 2**20, 1) for w in ws]
        return out


def tree_size(path: Path) -> tuple[int, int]:
    files = nbytes = 0
    if path.exists():
        for dirpath, _, names in os.walk(path):
            for n in names:
                try:
                    nbytes += os.lstat(os.path.join(dirpath, n)).st_size
                    files += 1
                except OSError:
                    pass
    return files, nbytes


def run_stage(cmd: list[str], out: Path | None, env: dict[str, str] | None = None,
              kill_when: Any = None, cwd: Path = ROOT) -> dict[str, Any]:
    """Run `cmd` at niceness 10, measure it; `kill_when(monitor)` true -> SIGKILL of its whole process group."""
    before = tree_size(out) if out else (0, 0)
    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    niced = ["nice", "-n", str(10 - os.nice(0))] if os.nice(0) < 10 else []  # at niceness 10, not 10 more
    p = subprocess.Popen([*niced, *cmd], env=env or dict(os.environ, PYTHONPATH=str(ROOT)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                         cwd=cwd)  # `python -c` imports from its working folder first
    mon = TreeMonitor(p.pid)
    mon.start()
    killed = False
    if kill_when is not None:
        while p.poll() is None:
            if kill_when(mon):
                os.killpg(p.pid, signal.SIGKILL)
                killed = True
                break
            time.sleep(0.2)
    stdout, stderr = p.communicate()
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    mon.stop_flag.set()
    mon.join()
    after = tree_size(out) if out else (0, 0)
    shown = [c if not c.startswith(str(ROOT)) else os.path.relpath(c, ROOT) for c in cmd]
    if len(shown) > 2 and shown[1] == "-c":
        shown[2] = "<snippet>"
    res = {"cmd": " ".join(shown),
           "rc": p.returncode, "wall_s": round(wall, 2),
           "cpu_s": round(ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime, 2), **mon.summary(),
           "files_written": after[0] - before[0], "bytes_written": after[1] - before[1],
           "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in os.getloadavg()]}
    if killed:  # its CPU never reached RUSAGE_CHILDREN: the tree's own counters at their last sample
        res.update(killed=True, cpu_s=round(sum(mon.cpu.values()), 2), driver_rss_mb_every_5s=mon.series)
    if p.returncode != 0 and not killed:
        res["stderr_tail"] = stderr[-3000:]
        print(stderr[-3000:], file=sys.stderr)
    res["stdout_tail"] = stdout[-1500:]
    return res


# ------------------------------------------------------------------ the stages

def corpus_for(data: Path, n: int, seed: int) -> tuple[Path, dict[str, Any]]:
    """<data>/corpus with at least n utterances; a smaller n: its first speaker folders, symlinked."""
    full = data / "corpus"
    stats_path = data / "corpus_stats.json"
    if not stats_path.is_file() and not full.is_dir():
        stats = build_corpus(full, n, seed=seed, processes=2)
        stats_path.write_text(json.dumps(stats, indent=2) + "\n")
    if stats_path.is_file():
        stats = json.loads(stats_path.read_text())
    else:  # still being written by scale_corpus.py: a subset of its finished speaker folders
        stats = {"utterances": None, "per_speaker": 250, "seed": seed, "sample_rate": 8000,
                 "note": "a subset of the corpus while scale_corpus.py was still writing it"}
        last = full / f"spk{n // 250 - 1:04d}" / "metadata.csv"
        if not last.is_file():
            raise SystemExit(f"{full} is still being built and does not hold {n} utterances yet")
    if stats["utterances"] is not None and n > stats["utterances"]:
        raise SystemExit(f"{full} holds {stats['utterances']} utterances, {n} asked for")
    if n == stats["utterances"]:
        return full, stats
    per = stats["per_speaker"]
    if n % per:
        raise SystemExit(f"--utterances must be a multiple of {per} below the whole corpus")
    sub = data / f"sub_{n}"
    if not sub.is_dir():
        tmp = data / f".sub_{n}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for s in range(n // per):
            (tmp / f"spk{s:04d}").symlink_to(full / f"spk{s:04d}")
        tmp.rename(sub)
    return sub, {**stats, "utterances": n, "subset_of": stats["utterances"]}


def shard_cmd(a: argparse.Namespace, corpus: Path, out: Path, timings: Path | None = None,
              extra: list[str] | None = None) -> list[str]:
    cmd = [PY, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out), "--no-progress"]
    cmd += ["--features", a.features] if a.features else ["--preset", a.preset]
    if a.no_tar:
        cmd.append("--no-tar")
    if a.shard_size:
        cmd += ["--shard-size", a.shard_size]
    if timings:
        cmd += ["--timings", str(timings)]
    return cmd + (extra or [])


def deciles(timings: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """Shard throughput over time: tasks in finishing order, in ten equal groups, audio s / CPU s each."""
    dur = {s["name"]: s["duration"] for s in manifest["shards"]}
    rows = []
    for t in timings["tasks"]:
        rows.append((t["end"], dur.get(t["name"], 0.0), t["cpu"], t["end"] - t["start"]))
    rows.sort()
    n = len(rows)
    out = []
    for k in range(10):
        g = rows[k * n // 10:(k + 1) * n // 10]
        if not g:
            continue
        audio, cpu, busy = sum(r[1] for r in g), sum(r[2] for r in g), sum(r[3] for r in g)
        out.append({"decile": k + 1, "tasks": len(g), "audio_s": round(audio, 1),
                    "x_rt_per_cpu_s": round(audio / cpu, 1) if cpu else None,
                    "x_rt_per_busy_worker_s": round(audio / busy, 1) if busy else None})
    res: dict[str, Any] = {"deciles": out}
    if out and out[0]["x_rt_per_cpu_s"] and out[-1]["x_rt_per_cpu_s"]:
        res["last_over_first"] = round(out[-1]["x_rt_per_cpu_s"] / out[0]["x_rt_per_cpu_s"], 3)
    return res


def digest_tree(root: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_file() and not any(rel.startswith(s) for s in skip):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
            out[rel] = h.hexdigest()
    return out


def compare_trees(a: Path, b: Path) -> dict[str, Any]:
    da, db = digest_tree(a), digest_tree(b)
    diff = sorted(k for k in set(da) | set(db) if da.get(k) != db.get(k))
    return {"files": len(da), "identical": not diff, "differing": diff[:20]}


class PlanWatch:
    """kill_when for a shard run with a deadline: notes when plan.json appears (planning done) and the driver's
    peak until then; true once the deadline (Unix time) has passed."""

    def __init__(self, out: Path, deadline: float | None) -> None:
        self.out, self.deadline, self.t0 = out, deadline, time.monotonic()
        self.planned: dict[str, float] = {}

    def __call__(self, mon: TreeMonitor) -> bool:
        if not self.planned and (self.out / "plan.json").is_file():
            self.planned = {"plan_json_at_s": round(time.monotonic() - self.t0, 1),
                            "driver_peak_rss_mb_to_plan": round(mon.driver_peak / 2**20, 1)}
        return self.deadline is not None and time.time() >= self.deadline


def partial_shard(out: Path, r: dict[str, Any], watch: PlanWatch) -> None:
    """What a shard run stopped at its deadline got done: its shards in finishing order (done records' times),
    audio seconds per wall-second by decile of them, and how many the plan has."""
    from audiopipe.shard.plan import plan_summary

    r.update(watch.planned)
    summary = plan_summary(open(out / "plan.json", encoding="utf-8")) if (out / "plan.json").is_file() else None
    r["shards_planned"] = len(summary[1]) if summary else None
    done = sorted((p.stat().st_mtime, json.loads(p.read_text())["duration"])
                  for p in (out / "done").glob("*.json")) if (out / "done").is_dir() else []
    plan_at = (out / "plan.json").stat().st_mtime if summary else None
    r["shards_done"] = len(done)
    r["audio_s_done"] = round(sum(d for _, d in done), 1)
    r["x_rt_per_cpu_s_with_planning"] = round(r["audio_s_done"] / r["cpu_s"], 1) if r.get("cpu_s") else None
    rows, n = [], len(done)
    for k in range(10):
        g = done[k * n // 10:(k + 1) * n // 10]
        prev = done[k * n // 10 - 1][0] if k * n // 10 else plan_at  # the first group: from the plan's writing
        if len(g) and prev is not None:
            rows.append({"decile": k + 1, "shards": len(g), "audio_s": round(sum(d for _, d in g), 1),
                         "x_rt_wall": round(sum(d for _, d in g) / max(g[-1][0] - prev, 1e-9), 1)})
    r["done_deciles_x_rt_wall"] = rows


def stage_shard(a, corpus, out, res) -> dict[str, Any]:
    timings = a.data / f"timings_{a.tag}.json"
    shutil.rmtree(out, ignore_errors=True)
    watch = PlanWatch(out, a.shard_deadline)
    r = run_stage(shard_cmd(a, corpus, out, timings, ["--workers", str(a.workers), "--engine", "local"]), out,
                  kill_when=watch)
    if r.get("killed"):
        partial_shard(out, r, watch)
    elif r["rc"] == 0:
        man = json.loads((out / "manifest.json").read_text())
        tl = json.loads(timings.read_text())
        r["totals"] = man["totals"]
        r["shards"] = len(man["shards"])
        r["phases"] = tl.get("phases")
        audio_s = man["totals"]["hours"] * 3600
        cpu = sum(t["cpu"] for t in tl["tasks"])
        r["x_rt_wall"] = round(audio_s / r["wall_s"], 1)
        r["x_rt_per_cpu_s"] = round(audio_s / cpu, 1) if cpu else None
        r["hours_per_node_hour"] = round(audio_s / r["wall_s"], 1)
        r["throughput"] = deciles(tl, man)
    return r


def stage_noop(a, corpus, out, res) -> dict[str, Any]:
    return run_stage(shard_cmd(a, corpus, out, None, ["--workers", str(a.workers), "--engine", "local"]), out)


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
    imports apart), then the command as a user runs it."""
    _, nbytes = tree_size(out)
    for dirpath, _, names in os.walk(out):
        for n in names:
            with open(os.path.join(dirpath, n), "rb") as f:
                while f.read(1 << 24):
                    pass
    r = run_stage([PY, "-c", _VERIFY, str(out), "0" if a.no_tar else "1"], None)
    for line in r.get("stdout_tail", "").splitlines():
        if line.startswith("RESULT "):
            r.update(json.loads(line[7:]))
    r.update(bytes_checked=nbytes, gb_per_cpu_s=round(nbytes / r["verify_cpu_s"] / 1e9, 3)
             if r.get("verify_cpu_s") else None)
    cmd = [PY, "-m", "audiopipe.cli", "verify", str(out)] + (["--no-tar"] if a.no_tar else [])
    r["command"] = run_stage(cmd, None)
    return r


_PLAN_READ = r"""
import json, resource, sys, time
from audiopipe.shard.plan import plan_summary
path, how = sys.argv[1], sys.argv[2]
rss0, c = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()
names = []
if how == "summary":
    with open(path, encoding="utf-8") as f:
        names = plan_summary(f)[1]
elif how == "whole":
    with open(path, encoding="utf-8") as f:
        names = [u["name"] for u in json.load(f)["units"]]
print("RESULT " + json.dumps({"cpu_s": round(time.process_time() - c, 3), "units": len(names),
      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
      "peak_rss_mb_before": round(rss0 / 1024, 1)}))
"""


def stage_plan_read(a, corpus, out, res) -> dict[str, Any]:
    """What a rerun with nothing to do pays for plan.json: its fields and unit names read line by line
    (plan_summary, what the rerun does) against json.load of the whole file; CPU and peak RSS of a fresh
    process each (the imports alone: "none"). Runs on a finished or a stopped output alike."""
    plan = out / "plan.json"
    r: dict[str, Any] = {"plan_json_bytes": plan.stat().st_size}
    with open(plan, "rb") as f:  # on the page cache, as for a rerun right after a run
        while f.read(1 << 24):
            pass
    for how in ("none", "summary", "whole"):
        got = run_stage([PY, "-c", _PLAN_READ, str(plan), how], None)
        r[how] = next((json.loads(x[7:]) for x in got["stdout_tail"].splitlines() if x.startswith("RESULT ")),
                      {"rc": got["rc"], "stderr_tail": got.get("stderr_tail", "")[-500:]})
        r[how]["load_before"] = got["load_before"]
    return r


def stage_inspect(a, corpus, out, res) -> dict[str, Any]:
    return run_stage([PY, "-m", "audiopipe.cli", "inspect", str(out), "--json",
                      "--plot", str(a.data / f"durations_{a.tag}.png")], None)


_LOADER = r"""
import json, sys, time
t0 = time.perf_counter()
from audiopipe.reader.loader import make_loader
t_import = time.perf_counter() - t0
out, feature, world, resume_k = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
res = {"import_s": round(t_import, 3)}
if resume_k == 0:
    t = time.perf_counter()
    loader = make_loader(out, [feature], max_frames=20_000, rank=0, world_size=world)
    res["open_s"] = round(time.perf_counter() - t, 3)
    it = iter(loader)
    b = next(it)
    res["open_first_batch_s"] = round(time.perf_counter() - t, 3)
    res["batches_per_epoch_rank0"] = len(loader)
    res["first_batch_items"] = int(b[feature].shape[0])
else:
    loader = make_loader(out, [feature], max_frames=20_000, rank=0, world_size=world)
    loader.set_epoch(3)
    resume_k = min(resume_k, len(loader) // 2)
    it = iter(loader)
    for _ in range(resume_k):
        next(it)
    state = json.loads(json.dumps(loader.state_dict(consumed_batches=resume_k)))
    expect = next(it)
    del it, loader
    t = time.perf_counter()
    loader = make_loader(out, [feature], max_frames=20_000, rank=0, world_size=world)
    loader.load_state_dict(state)
    loader.set_epoch(3)
    b = next(iter(loader))
    res["resume_open_first_batch_s"] = round(time.perf_counter() - t, 3)
    res["same_batch_as_uninterrupted"] = bool((b["ids"] == expect["ids"]) if isinstance(b.get("ids"), list)
                                              else (b[feature].shape == expect[feature].shape and
                                                    bool((b[feature] == expect[feature]).all())))
    res["resumed_after_batches"] = resume_k
print("RESULT " + json.dumps(res))
"""


def _loader_run(a, out, world: int, resume_k: int) -> dict[str, Any]:
    r = run_stage([PY, "-c", _LOADER, str(out), a.loader_feature, str(world), str(resume_k)], None)
    for line in r.get("stdout_tail", "").splitlines():
        if line.startswith("RESULT "):
            r.update(json.loads(line[7:]))
    return r


def stage_loader(a, corpus, out, res) -> dict[str, Any]:
    return {"world_1": _loader_run(a, out, 1, 0), "world_64": _loader_run(a, out, 64, 0)}


def stage_resume(a, corpus, out, res) -> dict[str, Any]:
    return {"world_1": _loader_run(a, out, 1, 20), "world_64": _loader_run(a, out, 64, 5)}


def stage_export(a, corpus, out, res) -> dict[str, Any]:
    r = {}
    for cmd in ("export-lhotse", "export-hf"):
        dst = a.data / f"{cmd}_{a.tag}"
        shutil.rmtree(dst, ignore_errors=True)
        r[cmd] = run_stage([PY, "-m", "audiopipe.cli", cmd, "--shards", str(out), "--out", str(dst),
                            "--no-progress"], dst)
    return r


def _done_count(out: Path) -> int:
    d = out / "done"
    try:
        return len([p for p in os.listdir(d) if p.endswith(".json") and not p.startswith(".")])
    except OSError:
        return 0


def stage_kill9(a, corpus, out, res) -> dict[str, Any]:
    ref = res.get("stages", {}).get("shard", {})
    n_shards = ref.get("shards")
    if not n_shards:
        raise SystemExit("kill9 needs the shard stage's result (its shard count and output)")
    dst = a.data / f"shards_{a.tag}_kill9"
    shutil.rmtree(dst, ignore_errors=True)
    args = ["--workers", str(a.workers), "--engine", "local"]
    half = n_shards // 2
    first = run_stage(shard_cmd(a, corpus, dst, None, args), dst, kill_when=lambda _: _done_count(dst) >= half)
    done_at_kill = _done_count(dst)
    kept = digest_tree(dst / "done") if (dst / "done").is_dir() else {}
    rerun_timings = a.data / f"timings_{a.tag}_kill9_rerun.json"
    rerun = run_stage(shard_cmd(a, corpus, dst, rerun_timings, args), dst)
    r: dict[str, Any] = {"killed_run": first, "done_at_kill": done_at_kill, "shards": n_shards, "rerun": rerun}
    if rerun["rc"] == 0:
        man = json.loads((dst / "manifest.json").read_text())
        tl = json.loads(rerun_timings.read_text())
        r["rerun_built_shards"] = len(tl["tasks"])
        r["totals"] = man["totals"]
        r["accounted"] = man["totals"]["written"] + man["totals"]["rejected"] == man["totals"]["discovered"] \
            == res["corpus"]["utterances"]
        r["compare_with_uninterrupted"] = compare_trees(out, dst)
        if r["compare_with_uninterrupted"]["identical"]:
            shutil.rmtree(dst)
    r["kept_done_records"] = len(kept)
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
        r = run_stage(shard_cmd(a, corpus, dst, a.data / f"timings_{a.tag}_ray.json",
                                ["--ray-address", cluster.address, "--engine", "ray"]), dst,
                      env=job_env(cluster, ROOT))
    finally:
        cluster.stop()
    r["raylets"] = 3
    r["cluster_start_s"] = round(start_s, 1)
    if r["rc"] == 0:
        man = json.loads((dst / "manifest.json").read_text())
        r["totals"] = man["totals"]
        r["compare_with_local_engine"] = compare_trees(out, dst)
        if r["compare_with_local_engine"]["identical"]:
            shutil.rmtree(dst)
    return r


def plot(results: list[Path], png: Path) -> None:
    """Left: shard throughput per decile of each run's shards (x real time per CPU-second). Right: the driver's
    memory through planning, before and after the plan fix (a bench_plan_memory.py results file among them), and
    the driver's peak of a shard run stopped at its deadline (to plan.json, and until stopped)."""
    fig, (a, b) = pyplot().subplots(1, 2, figsize=(11, 4))
    for path in results:
        r = json.loads(path.read_text())
        if "rows" in r:  # scale_plan_memory.json
            n = [row["utterances"] for row in r["rows"]]
            for k in ("before", "after"):
                b.plot(n, [row[k]["peak_mb"] for row in r["rows"]], marker="o", label=f"{k} (peak RSS)")
            continue
        sh = r["stages"].get("shard", {})
        if sh.get("killed") and sh.get("driver_peak_rss_mb_to_plan"):  # a run stopped at its deadline
            n = r["corpus"]["utterances"]
            b.scatter([n], [sh["driver_peak_rss_mb_to_plan"]], marker="s", color="k",
                      label=f"shard command, {n:,}: to plan.json")
            b.scatter([n], [sh["driver_peak_rss_mb"]], marker="^", color="r",
                      label=f"the same, {sh['shards_done']} shards later")
        d = sh.get("throughput", {}).get("deciles", [])
        if d:
            label = f"{r['corpus']['utterances']:,} utt, {r.get('features') or r.get('preset')}"
            a.plot([x["decile"] for x in d], [x["x_rt_per_cpu_s"] for x in d], marker="o", label=label)
    a.set(xlabel="decile of shards, in the order they finished", ylabel="x real time per CPU-second",
          title="shard throughput over the run", ylim=(0, None))
    a.legend(fontsize=8)
    b.set(xlabel="utterances", ylabel="MB", title="driver through discovery + plan + plan.json", ylim=(0, None))
    b.legend(fontsize=8)
    save(fig, png)


def stage_compare(a, corpus, out, res) -> dict[str, Any]:
    """The kill -9 + rerun output against the Ray output, file by file (both kept when they differed from the
    shard stage's output), and plan.json of each against the shard stage's by content."""
    runs = {k: a.data / f"shards_{a.tag}_{k}" for k in ("kill9", "ray")}
    r: dict[str, Any] = {}
    if all(p.is_dir() for p in runs.values()):
        r["kill9_vs_ray"] = compare_trees(runs["kill9"], runs["ray"])
    ref = json.loads((out / "plan.json").read_text())
    for k, p in runs.items():
        if (p / "plan.json").is_file():
            r[f"plan_json_{k}_equal_by_content"] = json.loads((p / "plan.json").read_text()) == ref
    return r


STAGES = {"shard": stage_shard, "noop": stage_noop, "plan_read": stage_plan_read, "verify": stage_verify,
          "inspect": stage_inspect,
          "loader": stage_loader, "resume": stage_resume, "export": stage_export, "kill9": stage_kill9,
          "ray": stage_ray, "compare": stage_compare}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "plot":  # bench_scale.py plot OUT.png RESULT.json...
        plot([Path(x) for x in argv[2:]], Path(argv[1]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                epilog="bench_scale.py plot OUT.png RESULT.json...: the figure of docs/scale.md (with bench_plan_memory's results among them)")
    p.add_argument("--data", type=Path, required=True, help="folder for the corpus and shards (outside git)")
    p.add_argument("--utterances", type=int, default=500_000)
    p.add_argument("--seed", type=int, default=0)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset")
    g.add_argument("--features", help="feature kinds instead of a preset")
    p.add_argument("--no-tar", action="store_true")
    p.add_argument("--shard-size", help="passed to audiopipe shard (small features: as many shards as a big "
                                       "feature would make)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--loader-feature", default="fbank")
    p.add_argument("--stages", default="shard,noop,verify,inspect,loader,resume")
    p.add_argument("--tag", help="names this run's output folder (default from size and features)")
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--shard-deadline", metavar="HH:MM",
                   help="UTC time (or +SECONDS from now) at which the shard stage is killed (SIGKILL of its process group) if still "
                        "running; what it finished is recorded (done shards, deciles of audio per wall-second, "
                        "the driver's peak and its RSS every 5 s) and the later stages are skipped")
    a = p.parse_args(argv)
    if a.shard_deadline and a.shard_deadline.startswith("+"):  # +SECONDS from now
        a.shard_deadline = time.time() + float(a.shard_deadline[1:])
    elif a.shard_deadline:
        hh, mm = (int(x) for x in a.shard_deadline.split(":"))
        now = time.gmtime()
        a.shard_deadline = time.mktime((now.tm_year, now.tm_mon, now.tm_mday, hh, mm, 0, 0, 0, 0)) - time.timezone
        if a.shard_deadline < time.time():
            raise SystemExit("--shard-deadline is in the past")
    if not a.preset and not a.features:
        a.preset = "eres2net"
    a.tag = a.tag or f"{a.utterances // 1000}k_{(a.features or a.preset).replace(',', '+')}"
    a.data.mkdir(parents=True, exist_ok=True)
    corpus, stats = corpus_for(a.data, a.utterances, a.seed)
    out = a.data / f"shards_{a.tag}"
    res: dict[str, Any] = json.loads(a.json.read_text()) if a.json.is_file() else {}
    res.update({
        "machine": f"{os.cpu_count()}-core shared CPU VM, no GPU; other engineers used the CPU at the same time "
                   f"({platform.platform()})",
        "corpus": stats, "features": a.features, "preset": a.preset, "no_tar": a.no_tar,
        "workers": a.workers, "shard_size": a.shard_size,
    })
    res.setdefault("stages", {})
    res.setdefault("commands", []).append("benchmarks/bench_scale.py " + " ".join(argv))  # each one that added stages
    for name in a.stages.split(","):
        print(f"== {name} ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        r = STAGES[name](a, corpus, out, res)
        res["stages"][name] = r
        if name == "shard" and r.get("killed"):
            res["note"] = (f"the shard stage was stopped at its deadline (--shard-deadline) after {r['shards_done']} "
                           f"of {r['shards_planned']} shards; the later stages need a finished shard set and did "
                           f"not run")
            a.json.write_text(json.dumps(res, indent=2) + "\n")
            break
        res["load_avg"] = [round(x, 2) for x in os.getloadavg()]
        a.json.write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps({k: v for k, v in r.items() if k not in ("stdout_tail", "throughput")}
                         if isinstance(r, dict) else r)[:1500], file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
