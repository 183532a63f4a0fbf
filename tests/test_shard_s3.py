"""`audiopipe shard --out s3://...`, `verify s3://` and `inspect s3://` against a real S3 server on 127.0.0.1.

A job that is watched or killed runs through the real CLI in a subprocess; reruns, `verify` and `inspect` run the
same CLI in this process (`main`), which spares a Python and its imports each. The server is moto's
ThreadedMotoServer in this process (tests/s3server.py), reached over TCP with the AWS_* environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from audiopipe.storage.lock import LockHeld
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, filesystem, parse_s3

pytest_plugins = ["s3server"]

FEATURES = "mel"
ARGS = ["--features", FEATURES, "--shard-size", "200kB", "--workers", "1", "--no-progress"]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audiopipe.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _objects(root: str) -> dict[str, str]:
    from s3server import object_digests  # here, not at import: pytest_plugins loads s3server first (assert rewriting)

    return object_digests(root)


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _put(root: str, rel: str, data: bytes) -> None:
    with filesystem().open_output_stream(parse_s3(root).child(rel).path) as f:
        f.write(data)


def _get(root: str, rel: str) -> bytes:
    with filesystem().open_input_stream(parse_s3(root).child(rel).path) as f:
        return f.read()


@pytest.fixture(scope="module")
def reference(espeak_corpus, tmp_path_factory):
    """The job the CLI builds from ARGS, run in-process to a local folder: what every s3 run must reproduce byte
    for byte."""
    from shard_helpers import shard

    out = tmp_path_factory.mktemp("s3ref") / "local"
    shard(espeak_corpus.root, out, [("vocos_mel", {})], shard_bytes=200 * 1024)
    digest = _digest(out)
    assert sum(k.startswith("arrow/") for k in digest) >= 6  # enough shards for a kill to land mid-job
    return out, digest


def test_shard_to_s3_is_byte_identical_verified_and_repaired(s3, espeak_corpus, reference, tmp_path, capsys):
    from audiopipe.cli import main
    from audiopipe.shard.inspect import summarize
    from audiopipe.shard.verify import verify

    _, root = s3
    local, want = reference
    out = f"{root}/sets/v1"
    staging = tmp_path / "staging"
    r = _cli("shard", "--corpus", str(espeak_corpus.root), "--out", out, "--staging", str(staging), *ARGS)
    assert r.returncode == 0, r.stderr
    assert _objects(out) == want  # every file of the local run, same key, same bytes; no lock left behind
    assert not any(staging.iterdir())  # staged files are removed once uploaded
    assert verify(out).lines() == verify(local).lines() and verify(out).ok

    png = tmp_path / "d.png"
    capsys.readouterr()
    assert main(["inspect", out, "--json", "--plot", str(png)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got.pop("plot") == str(png) and png.stat().st_size > 0
    assert got == json.loads(json.dumps(summarize(local)))

    # An object corrupted on the server: verify names it, a rerun rebuilds that shard alone.
    manifest = json.loads(_get(out, "manifest.json"))
    victim = manifest["shards"][2]
    data = bytearray(_get(out, victim["arrow"]["path"]))
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    _put(out, victim["arrow"]["path"], bytes(data))
    assert main(["verify", out, "--no-tar"]) == 1
    stdout = capsys.readouterr().out
    assert f"{victim['name']}: {victim['arrow']['path']} checksum mismatch" in stdout, stdout
    assert stdout.count("checksum mismatch") == 1

    # Put right again: a rerun on a finished prefix checks every object's checksum and has nothing to do
    # (test_kill_9_... shows a rerun rebuilding a corrupted shard).
    _put(out, victim["arrow"]["path"], (local / victim["arrow"]["path"]).read_bytes())
    assert main(["shard", "--corpus", str(espeak_corpus.root), "--out", out, *ARGS]) == 0
    stdout = capsys.readouterr().out
    assert "up to date" in stdout, stdout

    # How a rerun checks: by the checksum uploaded with each object (one HEAD), reading back only an object that
    # lacks it (the one rewritten above by another writer), and a rewrite with other bytes is still caught.
    from audiopipe.shard.output import S3Output
    from audiopipe.storage.upload import head

    other = manifest["shards"][0]["tar"]
    assert head(parse_s3(out).child(other["path"])) == (other["bytes"], {"audiopipe-xxh3-128": other["xxh3_128"]})
    names = [s["name"] for s in manifest["shards"]]
    o, hashed = S3Output(out), []
    read_whole = o.checksum
    # counts the reads, each still done for real
    o.checksum = lambda rel, algorithm: hashed.append(rel) or read_whole(rel, algorithm)
    try:
        assert o.finished(names) == set(names)
        assert hashed == [victim["arrow"]["path"]]
        _put(out, victim["arrow"]["path"], bytes(data))
        assert o.finished(names) == set(names) - {victim["name"]}
    finally:
        o.close()


def _owner_of(folder: Path) -> str:
    """Who made a scratch folder, for a failure message: its owner's pid and that process's command line."""
    files = sorted(p.name for p in folder.rglob("*"))
    try:
        pid = int((folder / ".owner").read_text())
    except (OSError, ValueError):
        return f"owner unknown; holds {files}"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        cmd = "gone"
    return f"pid {pid} ({cmd}); holds {files}"


def _scratch_owned(parent: Path) -> list[str]:
    """The scratch folders under `parent` whose owner process still holds their lock."""
    import fcntl

    from audiopipe.storage.scratch import OWNER, PREFIX

    held = []
    for p in parent.glob(f"{PREFIX}*"):
        try:
            fd = os.open(p / OWNER, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            held.append(p.name)
        finally:
            os.close(fd)  # closing drops the lock we may have taken
    return held


def test_kill_9_mid_job_then_rerun_resumes_with_no_partial_objects(s3, espeak_corpus, reference, tmp_path):
    _, root = s3
    staging = tmp_path / "staging"
    _, want = reference
    out = f"{root}/k"
    n_shards = sum(k.startswith("done/") for k in want)
    fs = filesystem()
    done_prefix = parse_s3(out).child("done").path

    def done() -> int:
        from pyarrow import fs as pafs

        return sum(1 for i in fs.get_file_info(pafs.FileSelector(done_prefix, allow_not_found=True)))

    proc = subprocess.Popen([sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(espeak_corpus.root),
                             "--out", out, "--staging", str(staging), *ARGS], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # kill -9 of the group: all of it
    deadline = time.monotonic() + 240
    while done() < 2:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    # A Ray worker is not in the driver's process group: it notices its raylet is gone a moment later and may
    # still finish the upload it was doing. Take the snapshot once the prefix has stopped changing.
    at_kill, settled = _objects(out), time.monotonic() + 3
    while True:
        time.sleep(0.5)
        now = _objects(out)
        if now == at_kill and time.monotonic() > settled:
            break
        at_kill = now
    assert 2 <= sum(k.startswith("done/") for k in at_kill) < n_shards, "the kill must land mid-job"
    # A worker that outlives the kill holds its scratch folder's lock until it exits, and a rerun's sweep leaves
    # a live owner's folder alone: wait for every owner to be gone, so the rerun below starts after the dead run.
    deadline = time.monotonic() + 120
    while (alive := _scratch_owned(staging)):
        assert time.monotonic() < deadline, f"the killed run's processes still hold {alive}"
        time.sleep(0.2)
    assert "manifest.json" not in at_kill
    # Nothing partial: every object that exists is exactly the uninterrupted run's (the lock aside).
    partial = {k for k, h in at_kill.items() if k != ".audiopipe.lock" and want.get(k) != h}
    assert not partial, partial
    assert ".audiopipe.lock" in at_kill  # left by the killed job; it names a dead pid on this host
    # The killed driver never removed its scratch folder (nor a worker the shard it was staging).
    left = sorted(p.name for p in staging.iterdir())
    assert any(n.startswith("audiopipe-driver-") for n in left), left

    # One finished shard's tar also gets corrupted on the server (same size): the rerun must redo it too.
    finished = sorted(k[len("done/"):-len(".json")] for k in at_kill if k.startswith("done/"))
    victim = json.loads(_get(out, f"done/{finished[0]}.json"))["tar"]["path"]
    data = bytearray(_get(out, victim))
    data[-1000] ^= 0x01
    _put(out, victim, bytes(data))

    r = _cli("shard", "--corpus", str(espeak_corpus.root), "--out", out, "--staging", str(staging), *ARGS)
    assert r.returncode == 0, r.stderr
    assert f"({n_shards - len(finished) + 1} built now)" in r.stdout, r.stdout
    print(f"killed driver pid {proc.pid}")
    # The rerun removed what the dead run left in the staging folder, and its own folders once done.
    left = {p.name: _owner_of(p) for p in staging.iterdir()}
    assert left == {}, left
    assert _objects(out) == want
    from audiopipe.storage.upload import incomplete_uploads

    assert incomplete_uploads(parse_s3(out)) == []  # what the killed run left half-sent was aborted


def test_an_upload_cut_off_mid_way_publishes_nothing(s3, tmp_path):
    from audiopipe.storage.upload import abort_incomplete, head, incomplete_uploads, upload_file

    server, root = s3
    big = tmp_path / "big.bin"
    big.write_bytes(np.random.default_rng(0).integers(0, 256, 16 << 20, dtype=np.uint8).tobytes())
    url = parse_s3(root).child("x", "big.bin")
    quick = S3Settings(attempts=2, connect_timeout=1.0, request_timeout=3.0)
    result: list[BaseException | int] = []

    def upload() -> None:
        try:
            result.append(upload_file(big, url, part_size=5 << 20, settings=quick))
        except BaseException as e:
            result.append(e)

    t = threading.Thread(target=upload)
    t.start()
    deadline = time.monotonic() + 60
    while not incomplete_uploads(parse_s3(root)):  # stop the server once the upload has begun
        assert time.monotonic() < deadline and t.is_alive(), result
        time.sleep(0.005)
    server.stop()
    try:
        t.join(60)
        assert not t.is_alive()
    finally:
        server.start()
    assert len(result) == 1 and isinstance(result[0], ObjectStoreError), result
    assert str(url) in str(result[0])
    assert filesystem().get_file_info(url.path).type.name == "NotFound"  # no object, not even a prefix of it
    # The abort could not reach the stopped server: the parts stay invisible until a rerun aborts them.
    assert abort_incomplete(parse_s3(root)) >= 1 and incomplete_uploads(parse_s3(root)) == []
    # The same file uploads whole once the server is back; a file within one part is a single PUT.
    sha = hashlib.sha256(big.read_bytes()).hexdigest()
    assert upload_file(big, url, part_size=5 << 20, checksum=("sha256", sha)) == big.stat().st_size
    assert hashlib.sha256(_get(root, "x/big.bin")).hexdigest() == sha
    # A multipart upload keeps the checksum given with it, under the key audiopipe has always used for sha256
    # (x-amz-meta-audiopipe-sha256), so objects of runs made before xxh3 are still checked by one HEAD.
    assert head(url) == (big.stat().st_size, {"audiopipe-sha256": sha})
    assert head(parse_s3(root).child("x", "none.bin")) is None


def test_why_uploads_avoid_pyarrow_streams_an_exception_publishes_a_prefix(s3):
    # The reason audiopipe.storage.upload exists: pyarrow's S3 stream completes the upload when an exception
    # closes it, so the first 1000 bytes of a file that never finished appear under the final name.
    _, root = s3
    url = parse_s3(root).child("partial.bin")
    with pytest.raises(RuntimeError):
        with filesystem().open_output_stream(url.path) as f:
            f.write(b"a" * 1000)
            raise RuntimeError("the writer failed half-way")
    assert filesystem().get_file_info(url.path).size == 1000


# ---------------------------------------------------------------- the prefix lock

def test_a_live_lock_refuses_a_second_job_in_one_line(s3, espeak_corpus, capsys):
    from audiopipe.storage.object_lock import PrefixLock

    _, root = s3
    from audiopipe.cli import main

    with PrefixLock(parse_s3(root).child("busy"), "audiopipe shard", settle=0.1):
        assert main(["shard", "--corpus", str(espeak_corpus.root), "--out", f"{root}/busy", *ARGS]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("audiopipe: error: ") and "is in use by audiopipe shard" in lines[0]
    assert f"pid {os.getpid()} on {socket.gethostname()}" in lines[0] and "--break-lock" in lines[0]
    assert _objects(f"{root}/busy") == {}  # released on exit, and the refused job wrote nothing


def _write_lock(root: str, **info) -> None:
    _put(root, ".audiopipe.lock", (json.dumps({"command": "audiopipe shard", "since": "then", "token": "x",
                                               **info}) + "\n").encode())


def test_dead_stale_or_broken_locks_are_taken_over(s3):
    from audiopipe.storage.object_lock import PrefixLock

    _, root = s3
    prefix = parse_s3(root)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _write_lock(root, pid=int(gone.stdout), host=socket.gethostname())  # killed on this host: taken at once
    PrefixLock(prefix, "t", settle=0.1).release()

    _write_lock(root, pid=1, host="other-node")  # another machine's, fresh: refused, unless broken
    with pytest.raises(LockHeld, match=r"pid 1 on other-node.*last heartbeat \d+ s ago"):
        PrefixLock(prefix, "t", settle=0.1)
    PrefixLock(prefix, "t", settle=0.1, break_lock=True).release()

    _write_lock(root, pid=1, host="other-node")
    time.sleep(2.2)  # the server's clock has 1 s resolution
    PrefixLock(prefix, "t", settle=0.1, stale_after=1.0).release()  # its heartbeat is older than stale_after
    assert _objects(root) == {}


def test_a_heartbeat_keeps_the_lock_fresh_and_notices_a_takeover(s3):
    from audiopipe.storage.object_lock import PrefixLock

    _, root = s3
    from audiopipe.storage.upload import client

    lock = PrefixLock(parse_s3(root), "t", settle=0.1, heartbeat=0.3)
    url = parse_s3(root).child(".audiopipe.lock")

    def modified():
        return client().head_object(Bucket=url.bucket, Key=url.key)["LastModified"]

    try:
        first, deadline = modified(), time.monotonic() + 60
        while modified() == first:  # the server's clock has 1 s resolution: a beat a second later shows
            assert time.monotonic() < deadline, "the heartbeat never rewrote the lock"
            time.sleep(0.1)
        holder, _ = lock.read()
        assert holder["token"] == lock.info["token"]  # rewritten by its own heartbeat, still ours
        lock.check()
        _write_lock(root, pid=1, host="other-node")
        deadline = time.monotonic() + 60
        while lock.lost is None:  # the next beat reads the other job's token (or fails its If-Match write)
            assert time.monotonic() < deadline, "the heartbeat never noticed the takeover"
            time.sleep(0.05)
        with pytest.raises(LockHeld, match="taken over by audiopipe shard \\(pid 1 on other-node"):
            lock.check()
    finally:
        lock.release()
    assert json.loads(_get(root, ".audiopipe.lock"))["host"] == "other-node"  # not ours: left alone


def test_a_beat_never_overwrites_a_takeover_between_its_read_and_its_write(s3):
    """The heartbeat reads the lock, then rewrites it. Another job's takeover landing between the two used to be
    overwritten (both jobs then believed they held the prefix); the rewrite is conditional on the ETag it read."""
    from audiopipe.storage.object_lock import PrefixLock

    _, root = s3
    lock = PrefixLock(parse_s3(root), "t", settle=0.1, heartbeat=3600)  # no beat of its own during the test
    try:
        holder, _, etag = lock._read()
        assert holder["token"] == lock.info["token"] and etag
        assert lock._rewrite(etag)  # nothing in between: the beat rewrites its own lock
        _, _, etag = lock._read()
        _write_lock(root, pid=1, host="other-node")  # the takeover, after the beat's read
        assert not lock._rewrite(etag)
        assert json.loads(_get(root, ".audiopipe.lock"))["host"] == "other-node"
    finally:
        lock.release()
    assert json.loads(_get(root, ".audiopipe.lock"))["host"] == "other-node"  # not ours: left alone


def test_s3_only_flags_on_a_local_out_get_one_line(synthetic_corpus, tmp_path, capsys):
    from audiopipe.cli import main

    for flag in (["--break-lock"], ["--staging", str(tmp_path / "st")]):
        assert main(["shard", "--corpus", str(synthetic_corpus.root), "--out", str(tmp_path / "o"), *flag]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "are for an s3:// --out" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_verify_and_inspect_of_a_prefix_without_a_shard_set_say_so_in_one_line(s3, capsys, tmp_path, monkeypatch):
    from audiopipe.cli import main

    _, root = s3
    monkeypatch.chdir(tmp_path)
    for argv, needle in ((["verify", f"{root}/none"], f"{root}/none/manifest.json not found"),
                         (["inspect", f"{root}/none"], f"{root}/none/manifest.json not found"),
                         (["verify", "s3://no-such-bucket-x/none"], "bucket no-such-bucket-x does not exist")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("audiopipe: error: ") and needle in err[0], err
    assert list(tmp_path.iterdir()) == []  # no histogram, no local folder named after the URL
