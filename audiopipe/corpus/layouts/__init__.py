"""Corpus layouts that keep their transcripts, speakers or cuts in their own files (docs/corpus.md, Layouts).

Each layout is a module with `NAME`, `detect(root) -> bool` and `discover(root, speaker_rule)` returning
(utterances, rejects) like a walk would. `--layout auto` (the default) tries them in the order of `LAYOUTS` and
falls back to walking the folder (`files`) when none matches.

May import: `audiopipe.corpus` (the records they make, the header reads and the listed-file readers they share
with manifests), `audiopipe.decode` (headers of audio files and tar members), `audiopipe.storage` (the guarded
opening of index files).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from audiopipe.corpus.options import CorpusOptions
from audiopipe.corpus.records import unique_ids
from audiopipe.errors import InvalidValue

LAYOUTS = ("kaldi", "aishell3", "libritts", "vctk", "emilia")  # detection order
CHOICES = ("auto", "files") + LAYOUTS


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"audiopipe.corpus.layouts.{name}")


def pick_layout(root: str, layout: str = "auto") -> str | None:
    """The layout module to read `root` with, or None to walk it as plain files."""
    if layout not in CHOICES:
        raise InvalidValue(f"layout must be one of {', '.join(CHOICES)}, got {layout!r}")
    if layout == "files":
        return None
    if layout != "auto":
        if not _module(layout).detect(root):
            raise InvalidValue(f"{root} does not look like a {layout} corpus: {_module(layout).EXPECTS}")
        return layout
    return next((name for name in LAYOUTS if _module(name).detect(root)), None)


def discover_layout(name: str, root: str, speaker_rule: int | None, options: Any = None):
    """(utterances, rejects, notes) of `root` read as layout `name`; an unsafe id is a `bad_id` reject and a
    repeated one a `duplicate_id` reject, as for `--manifest` ids (layout ids come from the corpus's own index
    files). A layout's `discover(root, speaker_rule, options)` returns (utterances, rejects) or, with notes for
    the user, (utterances, rejects, notes)."""
    got = _module(name).discover(root, speaker_rule, options if options is not None else CorpusOptions())
    utts, rejects, notes = got if len(got) == 3 else (*got, [])
    return unique_ids(utts, rejects, name), rejects, list(notes)
