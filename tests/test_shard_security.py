"""A shard job's Ray is closed to everyone else, and no credential leaks into what a job writes or says.

Run as a new user would: no RAY_* setting in the environment and no ~/.ray token. During the job (its driver
paused with SIGSTOP once its Ray workers are up, so the check never races the job's end), every TCP socket that
any of its processes listens on is read from /proc: all must be on loopback; and a Ray client without the job's
token is refused by its GCS, while one with it (read from the GCS's own environment) is let in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ray_cluster import descendants

pytest_plugins = ["s3server"]

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _addr(hex_addr: str) -> str:
    """An address of /proc/net/tcp{,6} (hex, each 32-bit word little-endian) as text."""
    import ipaddress

    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    if ip.version == 6 and ip.ipv4_mapped:
        return f"::ffff:{ip.ipv4_mapped}"
    return str(ip)


def listening(pids: list[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every TCP socket in LISTEN state that one of `pids` holds."""
    by_inode: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A":  # TCP_LISTEN
                host, port = f[1].rsplit(":", 1)
                by_inode[f[9]] = (_addr(host), int(port, 16))
    out = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in by_inode:
                out.append((pid, *by_inode[link[8:-1]]))
    return out


def _cmd(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _environ(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def _new_user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    return dict(env, HOME=str(home), PYTHONPATH=str(ROOT))


_PROBE = """
import sys
from ray._raylet import GcsClient
from ray.exceptions import AuthenticationError
try:
    GcsClient(address=sys.argv[1])
    print("ACCEPTED")
except AuthenticationError:
    print("REFUSED")
"""


def _probe(address: str, env: dict[str, str]) -> str:
    r = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True, env=env, timeout=120)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"rc {r.returncode}: {r.stderr[-500:]}"


def test_a_shard_job_on_ray_listens_on_loopback_only_and_refuses_a_client_without_its_token(asterisk_corpus,
                                                                                              tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = _new_user_env(home)
    proc = subprocess.Popen([sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(asterisk_corpus.root),
                             "--out", str(tmp_path / "out"), "--features", "mel", "--engine", "ray",
                             "--workers", "1", "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 240
    stopped = False
    try:
        # Wait until Ray's servers and a worker process of the job listen, then hold the job there.
        while True:
            assert proc.poll() is None, f"the job ended before its Ray workers were seen: {proc.communicate()}"
            assert time.monotonic() < deadline, "no Ray worker of the job started"
            procs = [proc.pid, *descendants(proc.pid)]
            socks = listening(procs)
            names = {pid: _cmd(pid) for pid, _, _ in socks}
            if any(n.startswith(b"ray::") for n in names.values()) and \
                    any(b"gcs_server" in n for n in names.values()):
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGSTOP)
        stopped = True
        socks = listening([proc.pid, *descendants(proc.pid)])
        assert len(socks) >= 3, socks  # at least the GCS, the raylet and one worker
        exposed = [(pid, _cmd(pid)[:60], a, p) for pid, a, p in socks if a not in LOOPBACK]
        assert exposed == [], f"Ray ports beyond loopback: {exposed}"

        gcs = next(pid for pid, _, _ in socks if b"gcs_server" in _cmd(pid))
        token = _environ(gcs).get("RAY_AUTH_TOKEN")
        assert token and len(token) >= 32 and _environ(gcs).get("RAY_AUTH_MODE") == "token"
        ports = [p for pid, _, p in socks if pid == gcs]
        client = dict(env, RAY_AUTH_MODE="disabled")
        answers = {p: _probe(f"127.0.0.1:{p}", client) for p in ports}
        assert set(answers.values()) == {"REFUSED"}, answers  # no token: refused on every port of the GCS
        with_token = {p: _probe(f"127.0.0.1:{p}", dict(env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token))
                      for p in ports}
        assert "ACCEPTED" in with_token.values(), with_token  # the same client with the token: let in
    finally:
        if stopped:
            os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert not (home / ".ray").exists()  # the token was never written to the user's home


def _everything_written(paths: list[Path]) -> dict[str, bytes]:
    found = {}
    for root in paths:
        for p in ([root] if root.is_file() else root.rglob("*")):
            if p.is_file() and not p.is_symlink():
                try:
                    found[str(p)] = p.read_bytes()
                except OSError:
                    pass
    return found


def test_no_credential_reaches_a_manifest_a_plan_a_log_or_an_error(s3, asterisk_corpus, tmp_path):
    from pyarrow import fs as pafs

    from audiopipe.storage.s3 import filesystem, parse_s3

    _, bucket = s3
    secrets = {"AWS_ACCESS_KEY_ID": f"AKIA{uuid.uuid4().hex[:16].upper()}",
               "AWS_SECRET_ACCESS_KEY": f"secret-{uuid.uuid4().hex}",
               "AWS_SESSION_TOKEN": f"session-{uuid.uuid4().hex}",
               "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex}
    ray_tmp = Path(tempfile.mkdtemp(prefix="aps-", dir="/tmp"))  # Ray's logs (short: socket paths < 108 bytes)
    home = tmp_path / "home"
    home.mkdir()
    env = {**_new_user_env(home), **secrets, "RAY_TMPDIR": str(ray_tmp)}  # the S3 server's endpoint kept
    out = f"{bucket}/sec"
    timings = tmp_path / "timings.json"
    staging = tmp_path / "staging"
    base = [sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(asterisk_corpus.root), "--features",
            "mel", "--engine", "ray", "--workers", "1", "--no-progress", "--staging", str(staging)]
    try:
        ok = subprocess.run([*base, "--out", out, "--timings", str(timings)], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=400)
        assert ok.returncode == 0, ok.stderr
        # An error that names the output: a bucket that does not exist.
        bad = subprocess.run([*base, "--out", "s3://no-such-bucket-audiopipe/x"], capture_output=True, text=True,
                             env=env, cwd=ROOT, timeout=400)
        assert bad.returncode == 2 and bad.stderr.startswith("audiopipe: error: "), bad.stderr
        # Everything the jobs wrote or said: every object under the prefix (plan, manifest, done records, rejects,
        # index, shards), Ray's logs of both runs, --timings, staging leftovers, stdout and stderr.
        url, fs = parse_s3(out), filesystem()
        written = {}
        for info in fs.get_file_info(pafs.FileSelector(url.path, recursive=True)):
            if info.type == pafs.FileType.File:
                with fs.open_input_stream(info.path) as f:
                    written[f"s3://{info.path}"] = f.read()
        assert {"plan.json", "manifest.json"} <= {k.rsplit("/", 1)[1] for k in written}
        logs = _everything_written([ray_tmp])
        assert sum(1 for k in logs if "/logs/" in k) >= 5, sorted(logs)[:10]  # Ray really logged there
        written.update(logs)
        written.update(_everything_written([timings, staging, home]))
        written.update({"stdout": ok.stdout.encode(), "stderr": ok.stderr.encode() + bad.stderr.encode()})
        leaks = {(name, where) for name, value in secrets.items() for where, blob in written.items()
                 if value.encode() in blob}
        assert leaks == set(), leaks
        assert json.loads(timings.read_text())["tasks"]  # the timings were written, and hold none of it
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
