"""The atomic-write helper every artifact goes through: all or nothing under the final name."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from audiopipe.storage.atomic import atomic_path, is_temporary, temporary_for, write_json_atomic


def test_success_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "a.json"
    write_json_atomic(target, {"b": 1, "a": "é"})
    assert json.loads(target.read_text()) == {"a": "é", "b": 1}
    write_json_atomic(target, {"x": 2})
    assert json.loads(target.read_text()) == {"x": 2}
    assert [p.name for p in target.parent.iterdir()] == ["a.json"]


def test_error_inside_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert target.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [target]


def test_temporary_is_hidden_beside_the_target(tmp_path):
    t = temporary_for(tmp_path / "x.arrow")
    assert t.parent == tmp_path and is_temporary(t) and not is_temporary(tmp_path / "x.arrow")


def test_disk_full_mid_write_keeps_the_old_file(tmp_path):
    # RLIMIT_FSIZE makes the kernel refuse writes past 64 KiB (EFBIG), as a full disk would: the old file stays.
    target = tmp_path / "big.bin"
    target.write_bytes(b"old")
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        from audiopipe.storage.atomic import write_bytes_atomic
        try:
            write_bytes_atomic({str(target)!r}, b"x" * 1_000_000)
        except OSError as e:
            print("refused", e.errno); sys.exit(3)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["big.bin"]
