"""The Debian packages the suite reads, from the one list in sysdeps.txt (`make sysdeps` installs it).

A test or fixture that reads one calls `require(package)` first. Where the package is missing, a developer running
one module by hand gets a skip that names the package and `make sysdeps`; under `make test` (which sets
AUDIOPIPE_SYSDEPS after running `make sysdeps`) a missing package is a failure, as a missing upstream venv is
(tests/upstream_oracle.py): there the packages must be installed.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

import pytest

LIST = Path(__file__).resolve().parents[1] / "sysdeps.txt"


@functools.cache
def listed() -> tuple[str, ...]:
    """The packages of sysdeps.txt, in order."""
    return tuple(w for line in LIST.read_text().splitlines() for w in line.split("#", 1)[0].split())


@functools.cache
def installed(package: str) -> bool:
    """dpkg's word: the package is unpacked and configured (False where there is no dpkg)."""
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True)
    except FileNotFoundError:
        return False
    return r.returncode == 0 and r.stdout.endswith(" installed")


def require(*packages: str, present: bool | None = None) -> None:
    """Skip (fail under `make test`) unless every package is installed. `present` overrides dpkg's answer for a
    check by the thing itself (an executable on PATH, a file), which also holds where dpkg does not exist."""
    unlisted = [p for p in packages if p not in listed()]
    assert not unlisted, f"{unlisted} not in sysdeps.txt: add them there so `make sysdeps` installs them"
    if present is None:
        missing = [p for p in packages if not installed(p)]
    else:
        missing = [] if present else list(packages)
    if not missing:
        return
    why = f"Debian package {' '.join(missing)} not installed (`make sysdeps` installs it)"
    if os.environ.get("AUDIOPIPE_SYSDEPS"):
        pytest.fail(f"{why}: AUDIOPIPE_SYSDEPS says `make sysdeps` ran, so it must be there", pytrace=False)
    pytest.skip(why)
