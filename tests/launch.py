"""Run a command in a process session of its own, and end the whole session if it hangs.

torchrun and its ranks, or a driver and its workers, are then never left running by a failed test: the timeout
kills the group, not just the launcher.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest


def run_group(cmd: list[str], *, timeout: float, env: dict[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess:
    p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        pytest.fail(f"{Path(cmd[0]).name} did not finish in {timeout} s:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(cmd, p.returncode, stdout, stderr)
