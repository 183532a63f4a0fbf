"""An export folder written whole or not at all.

Exports that are folders of many files (lhotse Shar, a Hugging Face `save_to_disk` folder, a NeMo manifest with
its audio) are written into a hidden temporary folder beside the target (`.<name>.tmp-<pid>`, the name
`audiopipe.storage.atomic` gives temporaries). When every file is complete, each is fsync'd, and the folder is
renamed onto the target, then the parent folder is fsync'd: a reader sees the previous export or the new one,
never a part. A failed or interrupted export removes its temporary and leaves any earlier export as it was.

Every export folder holds a marker (MARKER_NAME) naming its kind and every file the export wrote (beside the
folder, as `.<name>.audiopipe-export.json`, for a format whose reader takes every file in it for data: lhotse
Shar). With
overwrite, an earlier export is first renamed aside (`.<name>.old-<pid>`) and removed once the new one is in
place; that happens only when the folder holds the marker of an export of the same kind and no file the marker
does not list, so a user's own dataset (a NeMo manifest beside its audio and README) or a file added to an export
afterwards is never deleted: the refusal names it.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import json

from audiopipe.export.errors import ExportError
from audiopipe.storage.atomic import fsync_dir, fsync_file, temporary_for, write_text_atomic


MARKER_NAME = ".audiopipe-export.json"


def marker_path(out: Path, beside: bool) -> Path:
    """Where the marker of export folder `out` lives (see the module docstring)."""
    return out.with_name(f".{out.name}{MARKER_NAME}") if beside else out / MARKER_NAME


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if not p.is_dir() and p.name != MARKER_NAME)


def _check_replaceable(out: Path, what: str, beside: bool) -> None:
    """Refuse, in one line, to replace a folder that is not wholly an earlier export of this kind."""
    try:
        marker = json.loads(marker_path(out, beside).read_text())
        kind, written = marker["kind"], set(marker["files"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ExportError(f"{out} is not empty and was not written by an audiopipe {what} export (no "
                          f"{MARKER_NAME}): not replaced (remove it or choose another out=)") from None
    if kind != what:
        raise ExportError(f"{out} holds an audiopipe {kind} export, not a {what} one: not replaced (remove it or "
                          f"choose another out=)")
    foreign = [f for f in _files(out) if f not in written]
    if foreign:
        listed = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ExportError(f"{out} holds files the earlier {what} export did not write ({listed}): not replaced "
                          f"(move them out, or choose another out=)")


def _sync_tree(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in files:
            fsync_file(Path(folder) / name)
        fsync_dir(Path(folder))


@contextmanager
def staged_folder(out: str | os.PathLike[str], *, overwrite: bool, looks_like: Callable[[Path], bool],
                  what: str, marker_beside: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder; on a clean exit it becomes `out` (see the module docstring).

    looks_like(folder): whether an existing, non-empty `out` is an earlier export of this kind (`what`).
    marker_beside: the marker goes beside the folder, not in it (a reader that takes every file for data)."""
    out = Path(os.path.abspath(out))  # "." or "x/" name their folder, so the temporary lands beside it
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    replace = out.is_dir() and any(out.iterdir())
    if replace and not overwrite:
        raise ExportError(f"{out} is not empty; pass overwrite=True to replace an earlier {what} export there")
    if replace and not looks_like(out):
        raise ExportError(f"{out} is not empty and does not look like a {what} export: not replaced (remove it "
                          f"or choose another out=)")
    if replace:
        _check_replaceable(out, what, marker_beside)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_for(out)
    shutil.rmtree(tmp, ignore_errors=True)  # left by a killed export of this same process id
    tmp.mkdir()
    try:
        yield tmp
        marker = json.dumps({"kind": what, "files": _files(tmp)}, indent=0) + "\n"
        if not marker_beside:
            (tmp / MARKER_NAME).write_text(marker)
        _sync_tree(tmp)
        old = None
        if replace:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        elif out.is_dir():
            out.rmdir()  # an empty folder the user made for it
        os.replace(tmp, out)
        if marker_beside:  # after the folder: a crash between the two leaves a folder no overwrite replaces
            write_text_atomic(marker_path(out, True), marker)
        fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
