"""storage/lock.py: one holder per folder, a second is refused at once with the holder's name, kill -9 frees it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audiopipe.storage.lock import LOCK_NAME, FolderLock, LockHeld

HOLD = """
import sys, time
from audiopipe.storage.lock import FolderLock
lock = FolderLock(sys.argv[1], "test holder")
print("held", flush=True)
time.sleep(600)
"""


def _holder(folder: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_holder_is_refused_at_once_naming_the_first(tmp_path):
    p = _holder(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(LockHeld) as e:
            FolderLock(tmp_path, "second")
        assert time.monotonic() - t0 < 1.0  # non-blocking: no waiting for the holder
        msg = str(e.value)
        assert f"in use by test holder (pid {p.pid} on {socket.gethostname()}, since 20" in msg
        assert "\n" not in msg
    finally:
        p.kill()
        p.wait()


def test_a_holder_killed_with_sigkill_leaves_a_file_that_does_not_block(tmp_path):
    p = _holder(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == p.pid  # stale file, dead holder
    with FolderLock(tmp_path, "rerun") as lock:
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid() == lock.info["pid"]
        with pytest.raises(LockHeld, match=f"rerun \\(pid {os.getpid()} "):
            FolderLock(tmp_path, "same process, other descriptor")
    assert not (tmp_path / LOCK_NAME).exists()  # a clean release leaves nothing behind
    FolderLock(tmp_path, "again").release()


HOLD_AND_FORK = """
import os, sys
from audiopipe.storage.lock import FolderLock
lock = FolderLock(sys.argv[1], "forking holder")
pid = os.fork()  # as a DataLoader worker or a multiprocessing child is started: fork, no exec
if pid == 0:
    # The child says its pid itself: fork handlers run before any of its Python code, so once this line is read
    # the child has done whatever it does with the lock at fork (the parent printing could race it).
    print(os.getpid(), flush=True)
    sys.stdin.read()  # the child outlives its parent until the test closes its stdin
    os._exit(0)
sys.stdin.read()
"""


def test_a_forked_child_does_not_keep_the_folder_locked_after_its_parent_is_killed(tmp_path):
    """A child forked without exec (DataLoader workers, multiprocessing) shares the lock's open file description,
    and a flock lasts until every descriptor of it is closed: a holder killed with SIGKILL would keep the folder
    locked for as long as such a child lived, and the rerun be refused naming a dead process."""
    p = subprocess.Popen([sys.executable, "-c", HOLD_AND_FORK, str(tmp_path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    try:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        os.kill(child, 0)  # the forked child still runs
        FolderLock(tmp_path, "rerun").release()
    finally:
        p.stdin.close()
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_forked_child_cannot_release_its_parents_lock(tmp_path):
    """The child holds a copy of the FolderLock object: its release() (a `with` block unwound in a forked
    child) must neither unlink the parent's lock file nor unlock it, or a second job could start beside the
    parent."""
    with FolderLock(tmp_path, "parent") as lock:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                lock.release()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(LockHeld, match="in use by parent"):
            FolderLock(tmp_path, "second job")
    assert not (tmp_path / LOCK_NAME).exists()
