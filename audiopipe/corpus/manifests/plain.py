"""audiopipe's own manifests (`plain`): JSONL, CSV or TSV with `path` (or `audio`), `id`, `text` and `speaker`
columns, each maybe gzipped. Discovery reads the files they list as it reads a walked folder's
(audiopipe.corpus.discover); every other column goes to Utterance.extra.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from typing import Any

from audiopipe.corpus.hints import LOCATION_EXTRA
from audiopipe.corpus.listings import json_objects, kind_of_value, open_text, regular_file, text_of
from audiopipe.corpus.transcripts import TranscriptError
from audiopipe.storage import guard

# Manifest columns with a meaning; every other column goes to Utterance.extra.
MANIFEST_PATH_KEYS = ("path", "audio")
MANIFEST_KNOWN_KEYS = ("path", "audio", "id", "text", "speaker")


@dataclass
class ManifestRow:
    """One listed audio file. `path` is absolute; missing columns are None. `problem` (reason, detail): a row
    that names its audio but cannot be used as it is (a text that is a list, a line that is not UTF-8)."""

    path: str
    written_path: str  # as written in the manifest, for messages
    line: int
    id: str | None = None
    text: str | None = None
    speaker: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    problem: tuple[str, str] | None = None


def _given(v: Any, name: str) -> str | None:
    # An empty cell means "not given" in CSV; treat JSON null/"" the same so both formats agree. A list or an
    # object is a guard.Refused (bad_value), never its Python repr.
    if v is None:
        return None
    s = text_of(v, name)  # checks the type; ids and speakers keep their own spacing, texts are collapsed
    if isinstance(v, str) and name != "text":
        s = v
    return s if s.strip() else None


def _row(rec: dict[str, Any], base: str, where: str, line: int) -> ManifestRow:
    written = next((rec[k] for k in MANIFEST_PATH_KEYS if rec.get(k) is not None and rec.get(k) != ""), None)
    if written is None:  # this row names no audio: it alone is refused
        return _bad_row(where, line, "bad_value", f"no 'path' (or 'audio') value; columns are "
                                                  f"{sorted(str(k) for k in rec if k is not None)}")
    if not isinstance(written, str) or not written.strip():
        return _bad_row(where, line, "bad_value", f"the audio path is {kind_of_value(written)}, not a path")
    written = written.strip()
    path = os.path.normpath(written if os.path.isabs(written) else os.path.join(base, written))
    extra = {k: v for k, v in rec.items() if k not in MANIFEST_KNOWN_KEYS and k not in LOCATION_EXTRA and k is not None}
    reserved = sorted(k for k in LOCATION_EXTRA if rec.get(k) not in (None, ""))
    if reserved:
        return ManifestRow(path=path, written_path=written, line=line, problem=(
            "bad_value", f"{where}:{line}: column {reserved[0]} is reserved (audiopipe writes it to say where audio "
                         f"lies inside a recording or archive): rename it"))
    try:
        return ManifestRow(path=path, written_path=written, line=line, id=_given(rec.get("id"), "id"),
                           text=_given(rec.get("text"), "text"),
                           speaker=_given(rec.get("speaker"), "speaker"), extra=extra)
    except guard.Refused as e:
        return ManifestRow(path=path, written_path=written, line=line, problem=(e.reason, f"{where}:{line}: {e}"))


def _bad_row(where: str, line: int, reason: str, detail: str) -> ManifestRow:
    """A row whose audio cannot be named: the manifest line itself is the rejected input."""
    return ManifestRow(path=where, written_path=f"{where}:{line}", line=line,
                       problem=(reason, detail if detail.startswith(where) else f"{where}:{line}: {detail}"))


def _allow_long_cells() -> None:
    """csv refuses a cell over 128 KiB (its default limit) and cannot go on after it; a JSONL line may be up to
    guard's line limit, so a CSV cell may be too: one long transcript is a row like any other."""
    if csv.field_size_limit() < guard.LIMITS["jsonl line"]:
        csv.field_size_limit(guard.LIMITS["jsonl line"])


def read_manifest(path: str | os.PathLike[str]) -> list[ManifestRow]:
    """Rows of a JSONL (.jsonl/.ndjson/.json), CSV (.csv) or TSV (.tsv) manifest, in file order; each may be
    gzipped (.jsonl.gz).

    Relative paths are resolved against the manifest's folder. A JSONL line that is not UTF-8, or a value of the
    wrong type, is a row with a `problem` (a reject naming the line); a line that is not JSON, a row without
    a path, and a CSV that is not UTF-8 stop with `file:line`.
    """
    path = regular_file(os.fspath(path))
    base = os.path.dirname(path)
    name = path[:-3] if path.lower().endswith(".gz") else path
    ext = name.rsplit(".", 1)[-1].lower()
    rows: list[ManifestRow] = []
    if ext in ("jsonl", "ndjson", "json"):
        for lineno, rec in json_objects(path):
            if isinstance(rec, guard.Refused):
                rows.append(_bad_row(path, lineno, rec.reason, rec.detail))
            else:
                rows.append(_row(rec, base, path, lineno))
        return rows
    if ext not in ("csv", "tsv"):
        raise TranscriptError(f"{path}: unknown manifest type '.{ext}' (use .jsonl, .csv or .tsv, "
                              f"or a lhotse, NeMo, Common Voice or Hugging Face manifest: docs/corpus.md)")
    reader = None
    _allow_long_cells()
    try:
        with open_text(path) as f:
            reader = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",")
            if not reader.fieldnames or not set(MANIFEST_PATH_KEYS) & set(reader.fieldnames):
                raise TranscriptError(f"{path}: the header row needs a 'path' or 'audio' column, "
                                      f"got {reader.fieldnames}")
            for rec in reader:
                rows.append(_row(rec, base, path, reader.line_num))
    except (UnicodeDecodeError, EOFError, OSError) as e:
        raise TranscriptError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:  # a NUL byte: the reader cannot go on past it
        raise TranscriptError(f"{path}:{reader.line_num if reader else 1}: not a CSV row ({e})") from None
    return rows
