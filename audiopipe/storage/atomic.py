"""One way to write a file so that a crash, kill -9 or full disk never leaves a half file under its final name.

Every artifact audiopipe produces (shards, tars, done records, manifest, index, rejects, checkpoints, exports,
codebooks) goes through `atomic_path`: the bytes go to a hidden temporary beside the target, the temporary is
fsync'd, renamed over the target, and the directory is fsync'd so the rename itself survives a power loss.
Readers therefore see either the previous complete file or the new complete one, never a prefix.

Temporaries are named `.<name>.tmp-<pid>`; `is_temporary` recognises them so a rerun can sweep what a killed
run left behind.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

_TMP_MARK = ".tmp-"


def temporary_for(path: Path) -> Path:
    """The hidden temporary `atomic_path` writes before the rename (same folder, so the rename is atomic)."""
    return path.with_name(f".{path.name}{_TMP_MARK}{os.getpid()}")


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and _TMP_MARK in path.name


def fsync_dir(folder: Path) -> None:
    """Make a rename or create in `folder` durable (POSIX needs the directory itself synced)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:  # fsync on a read-only descriptor flushes the file's dirty pages on Linux
        os.fsync(f.fileno())


@contextmanager
def _temporary(path: str | os.PathLike[str]) -> Iterator[tuple[Path, Path]]:
    """(the target, its temporary beside it): the temporary is removed if the block fails, whatever it did."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_for(path)
    try:
        yield path, tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | os.PathLike[str], durable: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it becomes `path` durably, on an error it is removed.

    The caller may hand the temporary to any library that wants a file name (pyarrow, torch.save, tarfile).
    durable=False skips the fsyncs: still never a partial file under the name, but a power loss may lose the
    file (or leave it empty), for files whose loss only means redoing work (a shard's done record).
    """
    with _temporary(path) as (path, tmp):
        yield tmp
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


_SYNC_POOL: ThreadPoolExecutor | None = None


def _sync_pool() -> ThreadPoolExecutor:
    global _SYNC_POOL
    if _SYNC_POOL is None:  # fsync releases the GIL: the writer goes on computing while the disk catches up
        _SYNC_POOL = ThreadPoolExecutor(2, thread_name_prefix="fsync")
    return _SYNC_POOL


class AtomicBatch:
    """Files that count only together (a shard's Arrow file and tar): each is atomic like `atomic_path`, but
    its fsync and rename run in a background thread while the caller writes the next one, and `commit()`
    waits for all of them.

    sync=False skips the fsyncs: for files that only live until they are uploaded (s3:// staging), whose
    durability is the object store's. Folders are not fsync'd here: the caller that makes the set final
    (the shard job, before its manifest) fsyncs each folder once (`fsync_dir`), instead of once per file.
    Until then a power loss can lose a rename, never leave a partial file under its final name.
    """

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self._pending: list[tuple[Future, Path]] = []

    @contextmanager
    def path(self, path: str | os.PathLike[str]) -> Iterator[Path]:
        with _temporary(path) as (path, tmp):
            yield tmp
        self._pending.append((_sync_pool().submit(self._finish, tmp, path), tmp))

    def _finish(self, tmp: Path, path: Path) -> None:
        if self.sync:
            fsync_file(tmp)
        os.replace(tmp, path)

    def commit(self) -> None:
        """Wait until every file is in place (durably unless sync=False); re-raise the first failure."""
        pending, self._pending = self._pending, []
        error: BaseException | None = None
        for fut, tmp in pending:
            try:
                fut.result()
            except BaseException as e:  # keep waiting for the others, so no thread writes after we return
                tmp.unlink(missing_ok=True)
                error = error or e
        if error is not None:
            raise error

    def abort(self) -> None:
        """After a failure: wait for the background work (nothing may write once the caller has moved on); the
        files already committed are complete and stay, like a file `atomic_path` finished before the error."""
        try:
            self.commit()
        except BaseException:
            pass


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 1) -> Path:
    """Keys sorted and UTF-8 kept as is, so the same object always gives the same bytes (reruns compare equal)."""
    return write_text_atomic(path, json.dumps(obj, sort_keys=True, indent=indent, ensure_ascii=False) + "\n")
