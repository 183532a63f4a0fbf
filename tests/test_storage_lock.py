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


def test_a_lock_file_is_not_handed_to_child_processes(tmp_path):
    # A child (a Ray worker, say) that outlives its parent must not keep the folder locked.
    with FolderLock(tmp_path, "parent"):
        child = subprocess.Popen(["sleep", "30"])
    try:
        FolderLock(tmp_path, "next").release()
    finally:
        child.kill()
        child.wait()
