"""What the manifest readers share: the `Read` each returns, where a listed file lies against the corpus root,
and which table column holds a field."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from audiopipe.corpus.entries import Entry
from audiopipe.corpus.layouts.common import rel
from audiopipe.corpus.records import Reject
from audiopipe.errors import InvalidValue


@dataclass
class Read:
    """What one reader made of its manifests."""

    entries: list[Entry] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)  # decided before any header is read
    notes: list[str] = field(default_factory=list)
    unused: set[str] = field(default_factory=set)  # columns read from the manifest and used for nothing


def source_of(path: str, root: str, written: str) -> str:
    """Utterance.source of a listed file: relative to the root when inside it, else the path as written."""
    real_root = os.path.realpath(root)
    if path.startswith(root + os.sep):
        return rel(path, root)
    real = os.path.realpath(path)
    if real.startswith(real_root + os.sep):
        return rel(real, real_root)
    return written.replace(os.sep, "/")


def inside(path: str, root: str) -> bool:
    return path.startswith(root + os.sep) or os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def pick_column(columns: list[str], given: str | None, usual: tuple[str, ...], flag: str, where: str) -> str | None:
    """The column to read a field from: the one the user named (which must exist), else the first usual name
    present, else None."""
    if given:
        if given not in columns:
            raise InvalidValue(f"{where}: no column {given!r} ({flag}); its columns are {', '.join(columns)}")
        return given
    return next((c for c in usual if c in columns), None)
