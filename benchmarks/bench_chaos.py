"""Chaos: lose a Ray worker node at random points of `audiopipe shard --ray-address`, under CPU stress, N times.

    python benchmarks/bench_chaos.py --runs 10 --stress 1 --json benchmarks/results/chaos.json

A real 2-node Ray cluster on this machine (two `ray start`, one CPU each, private ports and temp folder, token
authentication on), and a corpus of espeak-ng speech cut into small shards. Each run starts the job, and SIGKILLs
the worker node at a point drawn at random:

- before_first_shard: once the job holds its output folder, before any shard is done;
- mid_group: once k shards are done (k drawn from 1..n-4) and the worker node is running a shard task (or,
  if it is not seen running one by then, once k+2 are done);
- during_index: once every shard is done, before the manifest (the index is built then).

How the node is lost is drawn too: `raylet` (SIGKILL of its raylet alone: its workers are orphaned and must stop
writing) or `node` (the raylet and every process it started, as when the machine dies). Meanwhile `--stress N`
processes spin on the CPU at normal priority.

Every run must end in one of two outcomes, checked in full:
- identical: exit 0, and every file of the output equals an uninterrupted run's (sha256 of each);
- rerun_identical: exit non-zero with exactly one line `audiopipe: error: ...` that says to rerun, no traceback,
  and the same command rerun (on the head node alone) exits 0 with every file identical.
Anything else is a failure, recorded with its stderr. After each run the worker node is started again.

The results JSON lists every run (kill point drawn and observed, loss mode, exit code, outcome, seconds), the
seed, the machine and its load; the exit code is non-zero when any run failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))
SHARD_KB = 60
POINTS = ("before_first_shard", "mid_group", "during_index")
MODES = ("raylet", "node")


# ------------------------------------------------------------------ processes

def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def _ppid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    kids: dict[int, list[int]] = {}
    for p in _pids():
        pp = _ppid(p)
        if pp is not None:
            kids.setdefault(pp, []).append(p)
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# ------------------------------------------------------------------ the cluster

class Cluster:
    """A head node and one worker node, each its own `ray start` with one CPU, on free ports, in a private temp
    folder (so other Ray sessions on the machine are left alone), with token authentication."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix="aprc-", dir="/tmp")  # short: Ray's socket paths stay < 108 bytes
        self.token = secrets.token_hex(16)
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        # Notice a dead node in ~1 s instead of Ray's default ~15 s (the behaviour tested is the same).
        self.env.update(RAY_health_check_period_ms="250", RAY_health_check_failure_threshold="4",
                        RAY_health_check_initial_delay_ms="0", RAY_health_check_timeout_ms="1000")
        (gcs,) = free_ports(1)
        self.address = f"127.0.0.1:{gcs}"
        self.head: set[int] = set()
        self.worker_raylet: int | None = None
        self.worker_procs: set[int] = set()

    def _ours(self) -> set[int]:
        return {p for p in _pids() if self.tmp.encode() in _cmdline(p)}

    @staticmethod
    def _node_ports() -> list[str]:
        nm, om, agent, agent_grpc, rt_agent, metrics = free_ports(6)
        return ["--node-ip-address", "127.0.0.1", "--node-manager-port", str(nm), "--object-manager-port",
                str(om), "--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port",
                str(agent_grpc), "--runtime-env-agent-port", str(rt_agent), "--metrics-export-port", str(metrics)]

    def _ray_start(self, *args: str) -> None:
        r = subprocess.run([RAY, "start", *args, "--disable-usage-stats", *self._node_ports()], env=self.env,
                           capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")

    def start(self, attempts: int = 2) -> "Cluster":
        """Start both nodes; on a busy machine Ray's own start-up can time out, so it is tried again once."""
        for attempt in range(attempts):
            port = self.address.rsplit(":", 1)[1]
            (dashboard,) = free_ports(1)  # the head's dashboard server runs even without the UI: not on 8265
            try:
                self._ray_start("--head", "--port", port, "--num-cpus", "1", "--temp-dir", self.tmp,
                                "--include-dashboard", "false", "--dashboard-port", str(dashboard))
                self.head = self._ours()
                self.add_worker()
                return self
            except BaseException:
                self.stop()
                if attempt + 1 == attempts:
                    raise
                self.tmp = tempfile.mkdtemp(prefix="aprc-", dir="/tmp")
                (gcs,) = free_ports(1)
                self.address = f"127.0.0.1:{gcs}"
        return self

    def add_worker(self, attempts: int = 3) -> None:
        """Start the worker node (again); Ray's node start-up can time out on a busy machine: retried."""
        for attempt in range(attempts):
            before = self._ours()
            try:
                self._ray_start("--address", self.address, "--num-cpus", "1")
                break
            except RuntimeError:
                for p in self._ours() - before:  # what the failed start left
                    kill(p)
                if attempt + 1 == attempts:
                    raise
        self.worker_procs = self._ours() - before
        raylets = [p for p in self.worker_procs if _cmdline(p).split(b"\0")[0].endswith(b"/raylet")]
        assert len(raylets) == 1, raylets
        self.worker_raylet = raylets[0]

    def busy_on_worker(self) -> bool:
        """The worker node is running a shard task now."""
        if self.worker_raylet is None or not Path(f"/proc/{self.worker_raylet}").exists():
            return False
        return any(b"shard_task" in _cmdline(c) for c in descendants(self.worker_raylet))

    def lose_worker(self, mode: str) -> None:
        """SIGKILL the worker node's raylet (mode "raylet"), or it and everything it started ("node")."""
        assert self.worker_raylet is not None
        below = descendants(self.worker_raylet)
        kill(self.worker_raylet)
        if mode == "node":
            for p in below + sorted(self.worker_procs):
                kill(p)

    def clear_worker(self) -> None:
        """Whatever is left of a lost worker node (agents, orphaned workers) goes."""
        if self.worker_raylet is not None:
            for p in descendants(self.worker_raylet) + sorted(self.worker_procs):
                kill(p)
            kill(self.worker_raylet)
        for p in self._ours() - self.head:
            kill(p)
        self.worker_raylet, self.worker_procs = None, set()

    def stop(self) -> None:
        # `ray stop` would stop every Ray session of this machine: stop ours by pid only.
        for p in self._ours():
            for c in descendants(p):
                kill(c)
            kill(p)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Stress:
    """`n` processes spinning on the CPU at normal priority, for as long as the context lasts."""

    def __init__(self, n: int) -> None:
        self.n, self.procs = n, []

    def __enter__(self) -> "Stress":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


# ------------------------------------------------------------------ one run

def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _done(out: Path) -> int:
    d = out / "done"
    return len([p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]) if d.is_dir() else 0


def shard_cmd(corpus: Path, out: Path, address: str) -> list[str]:
    return [sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out),
            "--features", "mel,f0", "--shard-size", f"{SHARD_KB}kB", "--no-progress", "--ray-address",
            address]


def job_env(cluster: Cluster, tree: Path = ROOT) -> dict[str, str]:
    """The job's environment: the cluster's token, and no settings from the cluster's nodes beyond it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token, PYTHONPATH=str(tree))


def one_line_rerun_error(stderr: str) -> str | None:
    """The one `audiopipe: error: ...` line that says to rerun, or None when stderr is anything else."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    if len(lines) == 1 and lines[0].startswith("audiopipe: error: ") and "rerun" in lines[0] \
            and "Traceback" not in stderr:
        return lines[0]
    return None


def chaos_run(cluster: Cluster, corpus: Path, out: Path, clean: dict[str, str], n_shards: int, point: str,
              mode: str, rng: random.Random, timeout: float = 300.0) -> dict:
    """One job that loses the worker node at `point`; returns what happened, with `outcome` checked."""
    t0 = time.monotonic()
    cmd, env = shard_cmd(corpus, out, cluster.address), job_env(cluster)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    target = rng.randint(1, max(1, n_shards - 4))
    deadline = time.monotonic() + timeout
    killed = False
    while time.monotonic() < deadline and proc.poll() is None:
        done = _done(out)
        if point == "before_first_shard":
            ready = (out / ".audiopipe.lock").exists() and done == 0
        elif point == "mid_group":  # the node holding a shard; past 2 more shards, mid-job whatever it holds
            ready = (done >= target and cluster.busy_on_worker()) or (target + 2 <= done < n_shards)
        else:
            ready = done >= n_shards and not (out / "manifest.json").exists()
        if ready:
            seen = {"done": done, "manifest": (out / "manifest.json").exists(), "busy": cluster.busy_on_worker()}
            cluster.lose_worker(mode)
            killed = True
            break
        time.sleep(0.005)
    if not killed:
        seen = {"done": _done(out), "manifest": (out / "manifest.json").exists(), "busy": False}
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        return _result(point, mode, seen, killed, -9, "FAIL: the job hung", stderr, t0)
    if proc.returncode == 0:
        ok = tree_digest(out) == clean
        return _result(point, mode, seen, killed, 0, "identical" if ok else "FAIL: exit 0, other bytes", stderr, t0)
    line = one_line_rerun_error(stderr)
    if line is None:
        return _result(point, mode, seen, killed, proc.returncode, "FAIL: not one line saying to rerun", stderr, t0)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if r.returncode != 0:
        return _result(point, mode, seen, killed, proc.returncode, "FAIL: the rerun failed", r.stderr, t0, line)
    ok = tree_digest(out) == clean
    return _result(point, mode, seen, killed, proc.returncode,
                   "rerun_identical" if ok else "FAIL: rerun exit 0, other bytes", stderr, t0, line)


def _result(point, mode, seen, killed, rc, outcome, stderr, t0, line=None) -> dict:
    return {"point": point, "mode": mode, "killed": killed, "at_kill": seen, "rc": rc, "outcome": outcome,
            "error_line": line, "stderr_tail": stderr[-1500:] if outcome.startswith("FAIL") else "",
            "seconds": round(time.monotonic() - t0, 2)}


def reference(corpus: Path, out: Path) -> dict[str, str]:
    """The uninterrupted run's bytes, built in this process's engine-free path (`--workers 0`): the bytes never
    depend on the engine."""
    r = subprocess.run([sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out),
                        "--features", "mel,f0", "--shard-size", f"{SHARD_KB}kB", "--no-progress",
                        "--workers", "0"], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"the reference run failed:\n{r.stderr}")
    return tree_digest(out)


def make_corpus(root: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from corpora import make_espeak_corpus

    make_espeak_corpus(root, speakers=4, per_speaker=6)
    return root


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--stress", type=int, default=1, help="CPU-spinning processes beside the job (default 1)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", default="benchmarks/results/chaos.json")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers used the CPU at the same time")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2 ** 32)
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="audiopipe-chaos-"))
    cluster = None
    runs: list[dict] = []
    n_shards, load = 0, []
    try:
        corpus = make_corpus(work / "corpus")
        clean = reference(corpus, work / "clean")
        n_shards = len(json.loads((work / "clean" / "manifest.json").read_text())["shards"])
        cluster = Cluster().start()
        load = [os.getloadavg()]
        with Stress(a.stress):
            for i in range(a.runs):
                point, mode = rng.choice(POINTS), rng.choice(MODES)
                out = work / f"out-{i}"
                r = chaos_run(cluster, corpus, out, clean, n_shards, point, mode, rng)
                runs.append(r)
                print(f"run {i}: {point} ({mode}): {r['outcome']} in {r['seconds']} s, at kill {r['at_kill']}"
                      + (f"; {r['error_line']}" if r["error_line"] else ""), flush=True)
                shutil.rmtree(out, ignore_errors=True)
                load.append(os.getloadavg())
                save(a, seed, n_shards, load, runs)
                cluster.clear_worker()
                if i + 1 < a.runs:
                    cluster.add_worker()
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    ok = save(a, seed, n_shards, load, runs)
    lost = sum(r["killed"] for r in runs)
    print(f"{ok} of {len(runs)} runs identical or one line + identical rerun, the node lost in {lost} of them "
          f"(seed {seed}); {a.json}")
    return 0 if ok == len(runs) == a.runs else 1


def save(a: argparse.Namespace, seed: int, n_shards: int, load: list, runs: list[dict]) -> int:
    """Write the results so far (after every run: a benchmark stopped midway keeps what it measured)."""
    ok = sum(not r["outcome"].startswith("FAIL") for r in runs)
    out = {"machine": f"{a.machine} ({os.cpu_count()} CPUs, {platform.platform()})", "command": " ".join(sys.argv),
           "seed": seed, "stress_processes": a.stress, "shards": n_shards,
           "load_average_1m": [round(x[0], 2) for x in load], "runs": runs,
           "outcomes": {k: sum(r["outcome"] == k for r in runs) for k in ("identical", "rerun_identical")},
           "failed": len(runs) - ok, "ok": f"{ok} of {len(runs)}", "runs_asked": a.runs,
           "node_lost_in": sum(r["killed"] for r in runs),
           "node_lost_while_it_held_a_shard": sum(r["killed"] and r["at_kill"]["busy"] for r in runs)}
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return ok


if __name__ == "__main__":
    sys.exit(main())
