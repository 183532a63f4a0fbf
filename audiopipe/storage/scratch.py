"""Private scratch folders on local disk (a shard staged for upload, the driver's files for an s3:// job, the
objects `audiopipe verify` downloads) that a killed process cannot leak for good.

A process removes its scratch folder when it is done, but a kill -9, an OOM kill or a lost Ray worker never
gets there, and a staged shard is up to a whole shard in size: on a node that runs many jobs, /tmp fills up.
So each folder holds a `.owner` file that its process keeps open and locked (flock) for as long as it uses
the folder. The kernel drops that lock when the process dies, however it dies. The first time a process
makes a scratch folder under a parent folder, it removes every `audiopipe-*` folder there whose lock it can
take. Only folders with such a lock file are ever removed, and never one whose owner is alive; a folder
without one (another program's, or an older audiopipe's) is left alone.

A folder is made under a hidden name and renamed to its `audiopipe-*` name only once its lock is held, so a
sweep in another process can never catch a new folder before its owner locks it. A process killed before the
rename leaves a hidden `.audiopipe-new-*` folder, which is unmistakably ours: the sweep takes it too.

A folder is removed with its `.owner` last, so a process killed half-way through the removal leaves a folder
that still has its lock file, and the next sweep finishes the job (removed first, the lock file would leave a
half-removed folder that no sweep would ever touch).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
from pathlib import Path

PREFIX = "audiopipe-"
OWNER = ".owner"

_held: dict[Path, int] = {}  # folder -> the descriptor whose lock says its owner is alive
_swept: set[str] = set()  # parent folders this process has swept
_lock = threading.Lock()  # the shard upload threads make and remove folders concurrently


def make_scratch(kind: str, parent: str | os.PathLike[str] | None = None) -> Path:
    """A new empty folder `<parent>/audiopipe-<kind>-<random>` (parent: the system temp folder by default),
    owned by this process until `remove_scratch`; the first call per parent first removes abandoned ones."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    with _lock:
        first = str(parent) not in _swept
        _swept.add(str(parent))
    if first:
        sweep_abandoned(parent)
    new = Path(tempfile.mkdtemp(prefix=f".{PREFIX}new-", dir=parent))
    try:
        fd = os.open(new / OWNER, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"{os.getpid()}\n".encode())  # for a person looking; the lock is what counts
        final = new.with_name(f"{PREFIX}{kind}-{new.name.rsplit('-', 1)[-1]}")
        os.rename(new, final)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    with _lock:
        _held[final] = fd
    return final


def remove_scratch(folder: str | os.PathLike[str]) -> None:
    """Remove a folder made by `make_scratch`, then release its lock (no sweep can take it while it goes)."""
    folder = Path(folder)
    _remove_owner_last(folder)
    with _lock:
        fd = _held.pop(folder, None)
    if fd is not None:
        os.close(fd)


def sweep_abandoned(parent: str | os.PathLike[str]) -> list[Path]:
    """Remove the `audiopipe-*` folders under `parent` whose owner process is gone; returns them."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(PREFIX):
            continue
        try:
            if not e.is_dir(follow_symlinks=False):
                continue
            fd = os.open(Path(e.path) / OWNER, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:  # no lock file: not a folder this module made (or being removed right now)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its owner is alive
            os.close(fd)
            continue
        try:
            _remove_owner_last(Path(e.path))
            removed.append(Path(e.path))
        finally:
            os.close(fd)
    return removed


def _remove_owner_last(folder: Path) -> None:
    """Remove `folder`, its lock file last (see the module docstring)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for e in entries:
        if e.name == OWNER:
            continue
        if e.is_dir(follow_symlinks=False):
            shutil.rmtree(e.path, ignore_errors=True)
        else:
            try:
                os.unlink(e.path)
            except OSError:
                pass
    shutil.rmtree(folder, ignore_errors=True)
