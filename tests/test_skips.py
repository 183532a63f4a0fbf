"""The skip machinery (tests/skips.py, tests/sysdeps.py) on a small suite of its own, run by pytest as `make test`
runs the real one: the reasons come from the run's reports, through pytest-xdist's workers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skips import ALLOWED
from sysdeps import listed, require

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from skips import pytest_collectreport, pytest_runtest_logreport, pytest_sessionfinish, pytest_terminal_summary
"""
SUITE = """
import pytest
from sysdeps import require

def test_runs():
    pass

def test_cuda():
    pytest.skip("no CUDA device here: runs on a GPU")

def test_needs_a_package():
    require("espeak-ng", present=False)
"""


def run(tmp_path: Path, suite: str = SUITE, workers: int = 0, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_small.py").write_text(suite)
    (tmp_path / "test_optional.py").write_text('import pytest\npytest.importorskip("no_such_module")\n')
    e = {k: v for k, v in os.environ.items() if k != "AUDIOPIPE_SYSDEPS"} | env
    xdist = ["-n", str(workers)] if workers else ["-p", "no:xdist"]
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *xdist, "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), str(tmp_path)], capture_output=True, text=True, env=e, cwd=tmp_path,
                          timeout=120)


def test_by_hand_a_missing_package_skips_saying_what_to_install_and_the_run_counts_skips_by_reason(tmp_path):
    r = run(tmp_path, workers=1)  # the skips happen in a worker process
    assert r.returncode == 0, r.stdout[-3000:]
    assert "3 skipped, by reason" in r.stdout  # a whole module skipped at collection counts too
    assert "1  fails make test: could not import 'no_such_module'" in r.stdout
    assert "1  allowed: no CUDA device here" in r.stdout
    assert "1  fails make test: Debian package espeak-ng not installed (`make sysdeps` installs it)" in r.stdout


def test_under_make_test_a_missing_package_fails(monkeypatch):
    monkeypatch.setenv("AUDIOPIPE_SYSDEPS", "installed")
    with pytest.raises(pytest.fail.Exception, match="espeak-ng not installed .* so it must be there"):
        require("espeak-ng", present=False)
    with pytest.raises(AssertionError, match="not in sysdeps.txt"):
        require("cowsay", present=True)  # a test may only need what `make sysdeps` installs


def test_under_make_test_a_skip_not_allowed_fails_the_run(tmp_path):
    other = SUITE.replace("present=False", "present=True") + "\ndef test_other():\n    pytest.skip('no network')\n"
    r = run(tmp_path, other, AUDIOPIPE_SYSDEPS="installed")
    assert r.returncode == 1, r.stdout[-3000:]  # every test passed or skipped, but one skip was not a decision
    assert "2 passed, 3 skipped" in r.stdout
    assert "2 tests skipped for a reason tests/skips.py does not allow" in r.stdout
    assert "test_small.py::test_other: no network" in r.stdout


def test_allowed_reasons_are_the_ones_the_suite_gives():
    # Each allowed reason is worded so in a test of the suite: rewording one there must update ALLOWED.
    sources = "\n".join(p.read_text() for p in HERE.glob("test_*.py") if p.name != "test_skips.py")
    assert all(key in sources for key in ALLOWED), [k for k in ALLOWED if k not in sources]


def test_the_makefile_installs_the_list_the_tests_read():
    make = subprocess.run(["make", "-s", "-n", "-p", "sysdeps"], capture_output=True, text=True, cwd=ROOT).stdout
    debs = next(line for line in make.splitlines() if line.startswith("DEBS :="))
    assert debs.split(":=", 1)[1].split() == list(listed())


def test_the_voices_gpu_bundle_reads_come_from_the_packages_its_test_requires():
    # `make gpu-bundle` reads gpu_bundle.VOICES; tests/test_gpu_proof.py requires BUNDLE_DEBS before building one.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_bundle import SOUNDS, VOICES
    from test_gpu_proof import BUNDLE_DEBS

    require(*BUNDLE_DEBS)
    owners = subprocess.run(["dpkg-query", "-S", *(str(SOUNDS / v) for v in VOICES)], capture_output=True, text=True,
                            check=True).stdout
    assert {line.split(":")[0] for line in owners.splitlines()} <= set(BUNDLE_DEBS), owners
    assert len(owners.splitlines()) == len(VOICES)
