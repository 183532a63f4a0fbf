"""An export folder written whole or not at all.

Exports that are folders of many files (lhotse Shar, a Hugging Face `save_to_disk` folder, a NeMo manifest with
its audio) are written into a hidden temporary folder beside the target (`.<name>.tmp-<pid>`, the name
`audiopipe.storage.atomic` gives temporaries). When every file is complete, each is fsync'd, and the folder is
renamed onto the target, then the parent folder is fsync'd: a reader sees the previous export or the new one,
never a part. A failed or interrupted export removes its temporary and leaves any earlier export as it was.

With overwrite, an earlier export is first renamed aside (`.<name>.old-<pid>`) and removed once the new one is
in place; a folder that does not look like an export of the same kind is never replaced.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from audiopipe.export.errors import ExportError
from audiopipe.storage.atomic import fsync_dir, fsync_file, temporary_for


def _sync_tree(root: Path) -> None:
    for folder, dirs, files in os.walk(root):
        for name in files:
            fsync_file(Path(folder) / name)
        fsync_dir(Path(folder))


@contextmanager
def staged_folder(out: str | os.PathLike[str], *, overwrite: bool, looks_like: Callable[[Path], bool],
                  what: str) -> Iterator[Path]:
    """Yield an empty temporary folder; on a clean exit it becomes `out` (see the module docstring).

    looks_like(folder): whether an existing, non-empty `out` is an earlier export of this kind (`what`)."""
    out = Path(os.path.abspath(out))  # "." or "x/" name their folder, so the temporary lands beside it
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder")
    replace = out.is_dir() and any(out.iterdir())
    if replace and not overwrite:
        raise ExportError(f"{out} is not empty; pass overwrite=True to replace an earlier {what} export there")
    if replace and not looks_like(out):
        raise ExportError(f"{out} is not empty and does not look like a {what} export: not replaced (remove it "
                          f"or choose another out=)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_for(out)
    shutil.rmtree(tmp, ignore_errors=True)  # left by a killed export of this same process id
    tmp.mkdir()
    try:
        yield tmp
        _sync_tree(tmp)
        old = None
        if replace:
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        elif out.is_dir():
            out.rmdir()  # an empty folder the user made for it
        os.replace(tmp, out)
        fsync_dir(out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
