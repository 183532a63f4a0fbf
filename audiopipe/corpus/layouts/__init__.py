"""Corpus layouts that keep their transcripts, speakers or cuts in their own files (docs/corpus.md, Layouts).

Each layout is a module with `NAME`, `detect(root) -> bool` and `discover(root, speaker_rule)` returning
(utterances, rejects) like a walk would. `--layout auto` (the default) tries them in the order of `LAYOUTS` and
falls back to walking the folder (`files`) when none matches.
"""

from __future__ import annotations

import importlib
from types import ModuleType

LAYOUTS = ("kaldi", "aishell3", "emilia")  # detection order
CHOICES = ("auto", "files") + LAYOUTS


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"audiopipe.corpus.layouts.{name}")


def pick_layout(root: str, layout: str = "auto") -> str | None:
    """The layout module to read `root` with, or None to walk it as plain files."""
    if layout not in CHOICES:
        raise ValueError(f"layout must be one of {', '.join(CHOICES)}, got {layout!r}")
    if layout == "files":
        return None
    if layout != "auto":
        if not _module(layout).detect(root):
            raise ValueError(f"{root} does not look like a {layout} corpus: {_module(layout).EXPECTS}")
        return layout
    return next((name for name in LAYOUTS if _module(name).detect(root)), None)


def discover_layout(name: str, root: str, speaker_rule: int | None):
    """(utterances, rejects) of `root` read as layout `name`; an unsafe id is a `bad_id` reject and a repeated
    one a `duplicate_id` reject, as for `--manifest` ids (layout ids come from the corpus's own index files)."""
    from audiopipe.corpus.discover import Reject
    from audiopipe.corpus.transcripts import id_problem

    utts, rejects = _module(name).discover(root, speaker_rule)
    kept, seen = [], {}
    for u in sorted(utts, key=lambda u: (u.id, u.source)):
        problem = id_problem(u.id)
        if problem:
            rejects.append(Reject(u.path, u.source, "bad_id", f"{name} id {u.id!r} {problem}"))
            continue
        if u.id in seen:
            rejects.append(Reject(u.path, u.source, "duplicate_id", f"id {u.id!r} is already used by {seen[u.id]}"))
            continue
        seen[u.id] = u.source
        kept.append(u)
    return kept, rejects
