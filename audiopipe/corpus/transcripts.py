"""Transcript sources: LJSpeech metadata.csv, sidecar text files, and manifests (JSONL / CSV / TSV).

Precedence (highest first): manifest column > sidecar file > metadata.csv. See docs/corpus.md.
"""

from __future__ import annotations

import csv
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audiopipe.corpus.hints import LOCATION_EXTRA
from audiopipe.storage import guard

METADATA_NAME = "metadata.csv"
# Sidecar names tried beside `x.wav`, in order. LibriTTS ships x.normalized.txt and x.original.txt.
SIDECAR_SUFFIXES = (".normalized.txt", ".txt", ".lab", ".original.txt")
# Manifest columns with a meaning; every other column goes to Utterance.extra.
MANIFEST_PATH_KEYS = ("path", "audio")
MANIFEST_KNOWN_KEYS = ("path", "audio", "id", "text", "speaker")


class TranscriptError(ValueError):
    """A transcript source that cannot be parsed; the message names the file and line."""


def read_text_file(path: str) -> str | None:
    """A sidecar transcript: UTF-8 (BOM tolerated), whitespace collapsed to single spaces; None when the file is
    gone. A file that is not a regular one, larger than a transcript can be, or not UTF-8 is a guard.Refused
    (`unreadable`, `too_large`, `bad_transcript`) naming the file and line."""
    text = guard.read_text_or_none(path, "transcript", "sidecar transcript", reason="bad_transcript")
    return " ".join(text.split()) if text is not None else None


def find_sidecar(audio_path: str, names_in_dir: set[str] | None = None) -> str | None:
    """Path of the sidecar transcript of `audio_path`, or None. `names_in_dir` saves a stat per candidate."""
    folder, name = os.path.split(audio_path)
    stem = name.rsplit(".", 1)[0]
    for suffix in SIDECAR_SUFFIXES:
        cand = stem + suffix
        if cand == name:
            continue
        if (cand in names_in_dir) if names_in_dir is not None else os.path.isfile(os.path.join(folder, cand)):
            return os.path.join(folder, cand)
    return None


def _strip_audio_ext(key: str, audio_exts: frozenset[str]) -> str:
    head, dot, ext = key.rpartition(".")
    if dot and ext.lower() in audio_exts and "/" not in ext:
        return head
    return key


def parse_metadata_csv(path: str, audio_exts: frozenset[str]) -> dict[str, str]:
    """A folder's metadata.csv -> {key: text}; key is the audio path relative to the folder, no extension.

    Two dialects: LJSpeech `id|text[|normalized]` (normalized preferred when present; split on '|' rather than
    with the csv module because LJSpeech text holds unbalanced quotes), and the Hugging Face audiofolder CSV
    whose header names a `file_name` column and a `text`/`transcription`/`sentence` column.
    """
    try:
        content = guard.read_text(path, "table", METADATA_NAME)
    except guard.Refused as e:  # it concerns every file it lists: stop with its one line
        raise TranscriptError(e.detail) from None
    lines = content.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    if "|" not in first and "file_name" in _csv_row(path, first):
        return _parse_audiofolder_csv(path, content, audio_exts)
    out: dict[str, str] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < 2:
            raise TranscriptError(f"{path}:{lineno}: expected LJSpeech 'id|text[|normalized]' (or a CSV header "
                                  f"with a file_name column), got {line[:80]!r}")
        text = parts[2] if len(parts) >= 3 and parts[2].strip() else parts[1]
        out.setdefault(_key(parts[0], audio_exts), " ".join(text.split()))
    return out


def _csv_row(path: str, line: str) -> list[str]:
    try:
        return next(csv.reader([line]), [])
    except csv.Error as e:
        raise TranscriptError(f"{path}:1: not a CSV header ({e})") from None


def _key(name: str, audio_exts: frozenset[str]) -> str:
    return _strip_audio_ext(name.strip().replace("\\", "/").removeprefix("./"), audio_exts)


def _parse_audiofolder_csv(path: str, content: str, audio_exts: frozenset[str]) -> dict[str, str]:
    reader = csv.DictReader(content.splitlines())
    out: dict[str, str] = {}
    try:
        fields = reader.fieldnames or []
        text_col = next((c for c in ("text", "transcription", "sentence", "normalized_text") if c in fields), None)
        for rec in reader:
            name = rec.get("file_name")
            if not name:
                raise TranscriptError(f"{path}:{reader.line_num}: empty file_name")
            text = (rec.get(text_col) or "") if text_col else ""
            out.setdefault(_key(name, audio_exts), " ".join(text.split()))
    except csv.Error as e:  # a NUL byte, a field over csv's size limit
        raise TranscriptError(f"{path}:{reader.line_num}: not a CSV row ({e})") from None
    return out


class MetadataIndex:
    """Looks up an audio file's text in the nearest metadata.csv above it (parsed once per folder).

    For a csv in folder D the key is the audio path relative to D without extension; a leading `wavs/` may be
    left out of the key, which is the LJSpeech layout (D/metadata.csv names `LJ001-0001`, audio in D/wavs/).
    """

    def __init__(self, audio_exts: frozenset[str]) -> None:
        self._exts = audio_exts
        self._cache: dict[str, dict[str, str] | None] = {}

    def table(self, folder: str) -> dict[str, str] | None:
        if folder not in self._cache:
            p = os.path.join(folder, METADATA_NAME)
            # exists, not isfile: a metadata.csv that is a pipe or a folder is said, not skipped in silence.
            self._cache[folder] = parse_metadata_csv(p, self._exts) if os.path.exists(p) else None
        return self._cache[folder]

    def has_csv(self, folder: str) -> bool:
        return self.table(folder) is not None

    def lookup(self, audio_path: str, top: str) -> str | None:
        """Text for `audio_path` from metadata.csv files in its folder and its ancestors up to `top`."""
        stem_path = Path(audio_path).with_suffix("")
        top_path = Path(top)
        folders = [stem_path.parent]
        if top_path in stem_path.parents:
            folders += [p for p in stem_path.parent.parents if p == top_path or top_path in p.parents]
        elif stem_path.parent.name == "wavs":  # a file outside the corpus root: its own LJSpeech folder only
            folders.append(stem_path.parent.parent)
        for folder in folders:
            table = self.table(str(folder))
            if table is not None:
                key = stem_path.relative_to(folder).as_posix()
                for k in (key, key.removeprefix("wavs/")):
                    if k in table:
                        return table[k]
        return None


def id_problem(uid: str) -> str | None:
    """Why a manifest `id` cannot name an utterance, or None. Ids become tar member names and file names in
    exports, so they must be relative '/'-separated paths that stay inside their folder."""
    if not isinstance(uid, str):
        return "is not a string"
    if not uid.strip():
        return "is empty"
    if uid.startswith("/"):
        return "is absolute (ids are relative, '/'-separated)"
    if "\\" in uid:
        return "contains a backslash (separate folders with '/')"
    ctrl = next((c for c in uid if unicodedata.category(c) in ("Cc", "Cs")), None)
    if ctrl is not None:
        what = "control character" if unicodedata.category(ctrl) == "Cc" else "lone surrogate"
        return f"contains the {what} U+{ord(ctrl):04X}"
    parts = uid.split("/")
    if "" in parts:
        return "has an empty path segment ('//' or a trailing '/')"
    if any(p in (".", "..") for p in parts):
        return "has a '.' or '..' path segment"
    return None


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
    from audiopipe.corpus.manifests import text_of

    if v is None:
        return None
    s = text_of(v, name)  # checks the type; ids and speakers keep their own spacing, texts are collapsed
    if isinstance(v, str) and name != "text":
        s = v
    return s if s.strip() else None


def _row(rec: dict[str, Any], base: str, where: str, line: int) -> ManifestRow:
    written = next((rec[k] for k in MANIFEST_PATH_KEYS if rec.get(k) is not None and rec.get(k) != ""), None)
    if written is None:
        raise TranscriptError(f"{where}:{line}: no 'path' (or 'audio') value; columns are "
                              f"{sorted(k for k in rec if k is not None)}")
    if not isinstance(written, str) or not written.strip():
        from audiopipe.corpus.manifests import kind_of_value

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


def read_manifest(path: str | os.PathLike[str]) -> list[ManifestRow]:
    """Rows of a JSONL (.jsonl/.ndjson/.json), CSV (.csv) or TSV (.tsv) manifest, in file order; each may be
    gzipped (.jsonl.gz).

    Relative paths are resolved against the manifest's folder. A JSONL line that is not UTF-8, or a value of the
    wrong type, is a row with a `problem` (a reject naming the line); a line that is not JSON, a row without
    a path, and a CSV that is not UTF-8 stop with `file:line`.
    """
    from audiopipe.corpus.manifests import json_objects, open_text, regular_file

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
    line = 0
    try:
        with open_text(path) as f:
            reader = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",")
            if not reader.fieldnames or not set(MANIFEST_PATH_KEYS) & set(reader.fieldnames):
                raise TranscriptError(f"{path}: the header row needs a 'path' or 'audio' column, "
                                      f"got {reader.fieldnames}")
            for rec in reader:
                line = reader.line_num
                rows.append(_row(rec, base, path, line))
    except (UnicodeDecodeError, EOFError, OSError) as e:
        raise TranscriptError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:  # a NUL byte, a field over csv's size limit
        raise TranscriptError(f"{path}:{line + 1}: not a CSV row ({e})") from None
    return rows
