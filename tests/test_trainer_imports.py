"""trainers/ imports hold in any order: no file there edits sys.path or needs `import core` first.

An import sorter (isort, with every module in one section, alphabetical) rewrites a copy of trainers/ so that
audiopipe's imports come before core's; each train_*.py of that copy still answers `--help`, started from an
unrelated working directory with only the library (not trainers/) on PYTHONPATH, as an installed checkout runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

isort = pytest.importorskip("isort")

ROOT = Path(__file__).resolve().parent.parent
TRAINERS = sorted(p.name for p in (ROOT / "trainers").glob("train_*.py"))


def _first_line(src: str, pattern: str) -> int:
    return next(i for i, line in enumerate(src.splitlines()) if re.match(pattern, line))


def test_no_trainer_edits_sys_path():
    for f in (ROOT / "trainers").glob("*.py"):
        assert not re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", f.read_text()), f.name


def test_sorted_trainers_answer_help_from_any_directory(tmp_path):
    copy = tmp_path / "trainers"
    shutil.copytree(ROOT / "trainers", copy, ignore=shutil.ignore_patterns("__pycache__"))
    # one section, plain alphabetical: `audiopipe` sorts before `core`, the order the old set-up broke on
    cfg = isort.Config(force_sort_within_sections=True, no_sections=True, line_length=120)
    for f in copy.glob("*.py"):
        f.write_text(isort.code(f.read_text(), config=cfg))
    both = [f for f in copy.glob("*.py") if re.search(r"^(from|import) audiopipe", f.read_text(), re.M)
            and re.search(r"^(from|import) core\b", f.read_text(), re.M)]
    assert len(both) >= 4  # the sorter did reorder: in each, audiopipe is now imported before core
    for f in both:
        src = f.read_text()
        assert _first_line(src, r"(from|import) audiopipe") < _first_line(src, r"(from|import) core\b"), f.name

    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = {name: subprocess.Popen([sys.executable, str(copy / name), "--help"], cwd=elsewhere, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name in TRAINERS}
    for name, p in procs.items():
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, f"{name}: {err[-2000:]}"
        assert "--shards" in out and "usage:" in out, name


@pytest.mark.parametrize("name", ["train_ns2.py"])
def test_trainer_help_from_another_directory(tmp_path, name):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "trainers" / name), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "--shards" in r.stdout
