"""Real Ray nodes on this machine, for the tests and benchmarks that lose one (tests/test_shard_cluster.py,
test_shard_security.py; benchmarks/bench_chaos.py, bench_scale.py). Cluster: a head node and a
worker node, each its own `ray start` with one CPU, on free ports, in a private temp folder, with a token. Stress:
processes spinning on the CPU beside it. Processes are found through /proc, so a node is lost by SIGKILL of its
own pids and other Ray sessions on the machine are left alone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, their children, ...)."""
    kids: dict[int, list[int]] = {}
    for p in _pids():
        try:  # the parent pid is the 2nd field after the command name, which may hold spaces and parentheses
            kids.setdefault(int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(p)
        except (OSError, IndexError, ValueError):
            pass
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


class Cluster:
    """A head node and one worker node, each its own `ray start` with one CPU, on free ports, in a private temp
    folder (so other Ray sessions on the machine are left alone), with token authentication."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """`env`: more environment for the nodes, which their workers inherit (as a real cluster's set-up gives)."""
        self.tmp = tempfile.mkdtemp(prefix="aprc-", dir="/tmp")  # short: Ray's socket paths stay < 108 bytes
        self.token = secrets.token_hex(16)
        self.env = dict(os.environ, **(env or {}), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token",
                        RAY_AUTH_TOKEN=self.token)
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


def job_env(cluster: Cluster, tree: Path = ROOT) -> dict[str, str]:
    """The job's environment: the cluster's token, and no settings from the cluster's nodes beyond it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=cluster.token, PYTHONPATH=str(tree))
