"""`audiopipe shard --ray-address` on a real 2-node Ray cluster on this machine, losing its second node mid-job.

Each node is its own `ray start` (own raylet, object store and workers), on free ports and in a private temp
folder, so the test runs beside other Ray sessions. The second node is lost by SIGKILL of its raylet and the
workers it started, when a quarter of the shards are done; the job must finish on the head node alone and
write the bytes of an uninterrupted run.
"""

from __future__ import annotations

from typing import Callable

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from audiopipe.shard.manifest import read_manifest
from shard_helpers import shard, tree_digest

RAY = str(Path(sys.executable).with_name("ray"))
FEATURES = [("vocos_mel", {}), ("f0", {})]
SHARD_BYTES = 60 * 1024


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _cluster_env() -> dict[str, str]:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    # Notice a dead node in ~1 s instead of Ray's default ~15 s (the behaviour tested is the same).
    env.update(RAY_health_check_period_ms="250", RAY_health_check_failure_threshold="4",
               RAY_health_check_initial_delay_ms="0", RAY_health_check_timeout_ms="1000")
    return env


def _node_ports() -> list[str]:
    """Free ports for one node's servers, so that this cluster never collides with another Ray on the box."""
    nm, om, agent, agent_grpc, rt_agent, metrics = _free_ports(6)
    return ["--node-ip-address", "127.0.0.1", "--node-manager-port", str(nm), "--object-manager-port", str(om),
            "--dashboard-agent-listen-port", str(agent),
            "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(rt_agent),
            "--metrics-export-port", str(metrics)]


def _raylets(tmp: str) -> set[int]:
    """pids of the raylets whose sockets live under our private temp folder."""
    pids = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"/raylet") and any(tmp.encode() in a for a in cmd):
            pids.add(int(d.name))
    return pids


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


@pytest.fixture
def two_node_cluster():
    tmp = tempfile.mkdtemp(prefix="aprc-", dir="/tmp")  # short: Ray's unix socket paths must stay < 108 bytes
    env = _cluster_env()
    (gcs,) = _free_ports(1)
    address = f"127.0.0.1:{gcs}"
    try:
        subprocess.run([RAY, "start", "--head", "--port", str(gcs), "--num-cpus", "1", "--temp-dir", tmp,
                        "--include-dashboard", "false", "--disable-usage-stats", *_node_ports()],
                       env=env, check=True, capture_output=True, timeout=120)
        head = _raylets(tmp)
        subprocess.run([RAY, "start", "--address", address, "--num-cpus", "1", "--disable-usage-stats",
                        *_node_ports()], env=env, check=True, capture_output=True, timeout=120)
        second = _raylets(tmp) - head
        assert len(head) == 1 and len(second) == 1, (head, second)
        yield address, second.pop(), env
    finally:
        # `ray stop` would also stop other Ray sessions on this machine: stop ours by pid only.
        for pid in _raylets(tmp):
            for child in _children(pid):
                _kill(child)
            _kill(pid)
        for d in Path("/proc").iterdir():  # GCS, dashboard agents, log monitors of our session
            if d.name.isdigit():
                try:
                    cmd = (d / "cmdline").read_bytes()
                except OSError:
                    continue
                if tmp.encode() in cmd:
                    _kill(int(d.name))
        shutil.rmtree(tmp, ignore_errors=True)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def lose_node_mid_job(proc, raylet: int, done: Callable[[], int], n_shards: int, timeout: float) -> None:
    """SIGKILL a node's raylet and its workers once a quarter of the shards are done and that node is running a
    shard task (so the loss takes work in flight with it)."""
    deadline = time.monotonic() + timeout
    busy: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        busy = [c for c in _children(raylet) if b"shard_task" in Path(f"/proc/{c}/cmdline").read_bytes()] \
            if Path(f"/proc/{raylet}").exists() else []
        if done() >= n_shards // 4 and busy:
            break
        time.sleep(0.02)
    assert proc.poll() is None and busy, "the node must be lost while it holds a shard"
    workers = _children(raylet)
    _kill(raylet)
    for w in workers:
        _kill(w)


def test_losing_a_worker_node_mid_job_keeps_the_job_and_its_bytes(espeak_corpus, two_node_cluster, tmp_path):
    address, second_raylet, env = two_node_cluster
    clean = tmp_path / "clean"
    shard(espeak_corpus.root, clean, FEATURES, shard_bytes=SHARD_BYTES, workers=1)
    n_shards = len(read_manifest(clean)["shards"])
    assert n_shards >= 8

    out = tmp_path / "lost"
    cmd = [sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(espeak_corpus.root), "--out", str(out),
           "--features", "vocos_mel,f0", "--shard-size", f"{SHARD_BYTES // 1024}kB", "--no-progress",
           "--ray-address", address]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, PYTHONPATH=os.pathsep.join(sys.path)))
    # Wait for a quarter of the shards, and for the second node to be working on one, then lose that node.
    lose_node_mid_job(proc, second_raylet, lambda: len(list((out / "done").glob("*.json")))
                      if (out / "done").is_dir() else 0, n_shards, timeout=120)
    done_at_kill = len(list((out / "done").glob("*.json")))
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert done_at_kill < n_shards, "the node must be lost mid-job"
    assert tree_digest(out) == tree_digest(clean)
