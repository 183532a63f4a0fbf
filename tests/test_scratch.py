"""Scratch folders a killed process leaves behind are removed by the next process that makes one, and only
those (audiopipe.storage.scratch)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from audiopipe.storage.scratch import OWNER, make_scratch, remove_scratch, sweep_abandoned

# Makes a scratch folder under argv[1], puts a file in it, says where, and waits to be killed.
OWNER_PROC = r"""
import sys, time
from audiopipe.storage.scratch import make_scratch
d = make_scratch("shard-000007", sys.argv[1])
(d / "staged.arrow").write_bytes(b"x" * 4096)
print(d, flush=True)
time.sleep(600)
"""


def _owner(parent: Path) -> tuple[subprocess.Popen, Path]:
    p = subprocess.Popen([sys.executable, "-c", OWNER_PROC, str(parent)], stdout=subprocess.PIPE, text=True)
    return p, Path(p.stdout.readline().strip())


def test_a_killed_owners_folder_is_swept_and_a_live_ones_is_kept(tmp_path):
    killed, dead_dir = _owner(tmp_path)
    alive, live_dir = _owner(tmp_path)
    try:
        assert dead_dir.name.startswith("audiopipe-shard-000007-") and (dead_dir / "staged.arrow").exists()
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        # Another program's folder of the same prefix, without a lock file, is never touched.
        foreign = tmp_path / "audiopipe-something-else"
        foreign.mkdir()
        (foreign / "data").write_text("theirs")
        mine = make_scratch("driver", tmp_path)  # the first in this process under tmp_path: sweeps first
        assert not dead_dir.exists()
        assert (live_dir / "staged.arrow").exists()
        assert (foreign / "data").read_text() == "theirs"
        assert mine.is_dir() and (mine / OWNER).exists()
        # This process's own folder is locked as well: a sweep from here leaves it.
        assert sweep_abandoned(tmp_path) == [] and mine.is_dir()
    finally:
        alive.kill()
        alive.wait()
    # Once its owner is gone the other folder goes too; ours stays until removed.
    assert sweep_abandoned(tmp_path) == [live_dir]
    assert mine.is_dir()
    remove_scratch(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["audiopipe-something-else"]


def test_a_new_folder_is_locked_before_it_has_a_name_a_sweep_looks_at(tmp_path):
    # Until it is locked a folder lives under a hidden name, which a sweep does not consider.
    d = make_scratch("verify", tmp_path)
    assert d.parent == tmp_path and d.name.startswith("audiopipe-verify-")
    assert [p.name for p in tmp_path.iterdir()] == [d.name]  # the hidden name is gone: renamed, not copied
    r = subprocess.run([sys.executable, "-c", "import sys; from audiopipe.storage.scratch import sweep_abandoned;"
                        "print(len(sweep_abandoned(sys.argv[1])))", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0" and d.is_dir()  # held by this process: another process leaves it
    remove_scratch(d)
    assert not d.exists()


# Makes a scratch folder holding many files, says where, waits for a line on stdin, then removes the folder.
REMOVER_PROC = r"""
import sys
from audiopipe.storage.scratch import make_scratch, remove_scratch
d = make_scratch("shard-000009", sys.argv[1])
for i in range(int(sys.argv[2])):
    (d / f"part-{i:05d}").write_bytes(b"")
print(d, flush=True)
sys.stdin.readline()
remove_scratch(d)
"""


def test_a_folder_being_removed_keeps_its_lock_file_while_anything_else_is_left(tmp_path):
    """The lock file goes last: a removal cut short (kill -9 at any moment of it) leaves files beside a lock file,
    which the next sweep finishes, never files without one, which no sweep would touch (that would be another
    program's folder). Watched from outside while a real process removes 3,000 files; then a removal stopped
    half-way and killed is swept."""
    n = 3_000
    for kill in (False, True):
        p = subprocess.Popen([sys.executable, "-c", REMOVER_PROC, str(tmp_path), str(n)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        try:
            d = Path(p.stdout.readline().strip())
            assert sum(1 for _ in os.scandir(d)) == n + 1
            p.stdin.write("go\n")
            p.stdin.flush()
            seen = []
            while True:
                try:
                    names = os.listdir(d)
                except FileNotFoundError:
                    break
                seen.append(len(names))
                assert not names or OWNER in names, f"{len(names)} files left without their lock file"
                if kill and len(names) < n // 2:
                    os.kill(p.pid, signal.SIGKILL)
                    break
            assert len(set(seen)) > 2  # the removal was watched while it ran, not only before or after
        finally:
            p.kill()
            p.wait()
        if kill:
            assert d.exists() and sweep_abandoned(tmp_path) == [d]
        assert not d.exists()
