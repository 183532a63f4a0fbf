"""One writer per output folder: an exclusive `fcntl.flock` on a lock file inside it, naming its holder.

A second job on the same folder fails at once (non-blocking) with a message naming the running one (pid, host,
start time), instead of interleaving its writes with the first. The kernel drops a flock when its holder dies,
kill -9 included, so a lock file left behind never blocks a rerun: only a live holder does. flock is reliable on
local disks; on network file systems it depends on the server (NFSv4 and Lustre honour it, some others do not).

A flock belongs to the open file description, which a child forked without exec (a DataLoader worker, a
multiprocessing child) shares: such a child would keep the folder locked after its parent was killed, and its
copy of the lock object could unlink the parent's file. Every process forked from a holder therefore closes its
copy of the descriptor at once (audiopipe/after_fork.py), which leaves the parent's lock as it was.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from audiopipe.after_fork import reset_after_fork
from audiopipe.errors import AudiopipeError, StorageError

LOCK_NAME = ".audiopipe.lock"


class LockHeld(AudiopipeError, RuntimeError):
    """The folder is locked by a running job; the message names it."""


def _describe(info: dict[str, Any]) -> str:
    if not info:
        return "another process (it has not written its name yet)"
    return (f"{info.get('command', 'another job')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, "
            f"since {info.get('since', '?')})")


def _read_holder(fd: int) -> dict[str, Any]:
    # The holder writes its name right after taking the lock: give it a moment before reporting "unknown".
    for _ in range(20):
        try:
            info = json.loads(os.pread(fd, 4096, 0) or b"null")
        except ValueError:
            info = None
        if isinstance(info, dict):
            return info
        time.sleep(0.01)
    return {}


class FolderLock:
    """Take with `FolderLock(folder, "audiopipe shard")` (raises LockHeld at once), release with `release()` or
    as a context manager. The lock file is removed on release; a killed holder leaves it behind, harmlessly."""

    def __init__(self, folder: str | os.PathLike[str], command: str) -> None:
        self.path = Path(folder) / LOCK_NAME
        self._fd: int | None = None
        reset_after_fork(self, FolderLock._drop_in_forked_child)  # from the open on: a fork at any point drops it
        while True:
            # O_CLOEXEC (Python's default): not inherited by a child that execs; a fork alone: _drop_in_forked_child.
            fd = self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                self._close()
                raise LockHeld(f"{Path(folder)} is in use by {_describe(holder)}; wait for it to finish or use "
                               f"another folder") from None
            except OSError as e:  # ENOLCK, EOPNOTSUPP: a file system without flock
                self._close()
                raise StorageError(e.errno, f"cannot lock {self.path} ({e.strerror}); the file system may not "
                                       f"support flock") from None
            except BaseException:
                self._close()
                raise
            # A releasing holder unlinks the file: if ours was unlinked between open and flock, our lock guards
            # nothing; start over on the file now at the path.
            try:
                if os.stat(self.path).st_ino == os.fstat(fd).st_ino:
                    break
            except FileNotFoundError:
                pass
            self._fd = None
            os.close(fd)
        self.info = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
                     "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(self.info, sort_keys=True) + "\n").encode(), 0)
        except BaseException:  # e.g. a full disk: do not keep a lock nobody will release
            self.release()
            raise

    def _drop_in_forked_child(self) -> None:
        # Closing the child's descriptor does not unlock: the parent's still refers to the same description.
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None  # the child's release() is then a no-op: it must not unlink the parent's file

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still locked, so nobody can be locking this inode meanwhile
        except OSError:
            pass  # e.g. the folder became read-only: the kernel still drops the lock on close
        self._close()

    def _close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "FolderLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
