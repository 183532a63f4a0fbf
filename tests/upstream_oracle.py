"""Run the upstream projects' own code as the oracle of a compatibility test.

Upstream model code (F5-TTS, speakerlab, GPT-SoVITS, vocos, EnCodec) lives in a side virtualenv whose pins clash
with ours (`make upstream` builds it from tests/upstream/venv.sh). A test hands a script of tests/upstream/ to that
interpreter: the script builds upstream's model, writes or reads checkpoints with upstream's own functions, and
leaves tensors in files (safetensors) that the test, in our venv, compares with our model's.

`make test` sets AUDIOPIPE_UPSTREAM_PYTHON, so there a missing side venv is a failure. Elsewhere the tests skip,
saying how to run them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "upstream"
DEFAULT = HERE.parent / ".upstream-venv" / "bin" / "python"


def upstream_python() -> Path:
    """The side venv's interpreter; skips the test (or fails under `make test`) when it is missing."""
    given = os.environ.get("AUDIOPIPE_UPSTREAM_PYTHON")
    path = Path(given) if given else DEFAULT
    if path.is_file():
        return path
    if given:
        pytest.fail(f"AUDIOPIPE_UPSTREAM_PYTHON={given} does not exist: run `make upstream`")
    pytest.skip("the upstream projects' code is not installed: `make upstream` builds it (then rerun)")


def upstream_source(var: str, why: str, marker: str, paths: list[str], tmp_path_factory,
                    keep: tuple[str, ...] = ("",)) -> Path:
    """An upstream project's source for an opt-in oracle, named by the environment variable `var` (unset: the
    test skips, saying `why`): a work tree holding `marker` as it is, or a git dir whose HEAD's files under
    `paths` ending in one of `keep` are exported to a temporary folder (`.revision` names the commit)."""
    given = os.environ.get(var)
    if not given:
        pytest.skip(why)
    src = Path(given)
    if (src / marker).exists():
        return src
    git = ["git", "--git-dir", str(src)]
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", *paths], capture_output=True, text=True,
                           check=True).stdout.split()
    out = tmp_path_factory.mktemp(var.lower())
    tar = subprocess.run([*git, "archive", "HEAD", "--", *[n for n in names if n.endswith(keep)]],
                         capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar.stdout, check=True)
    (out / ".revision").write_text(subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout)
    return out


def run_upstream(script: str, *args: str | os.PathLike[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run tests/upstream/<script> in the side venv; a failure shows its output."""
    py = upstream_python()
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([str(py), str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if r.returncode != 0:
        pytest.fail(f"upstream oracle {script} failed (exit {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def run_upstream_jobs(*jobs: tuple[str | os.PathLike[str], ...], timeout: float = 600) -> subprocess.CompletedProcess:
    """Several `run_upstream(script, *args)` jobs, each a (script, *args) tuple, in order in one side-venv process
    (tests/upstream/jobs.py): the upstream imports are paid once."""
    args: list[str | os.PathLike[str]] = []
    for job in jobs:
        assert "+" not in map(str, job), job  # jobs.py's separator
        args += [*(["+"] if args else []), *job]
    return run_upstream("jobs.py", *args, timeout=timeout)
