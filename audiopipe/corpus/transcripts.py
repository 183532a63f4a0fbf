"""Transcript sources: LJSpeech metadata.csv, sidecar text files, and manifests (JSONL / CSV / TSV).

Precedence (highest first): manifest column > sidecar file > metadata.csv. See docs/corpus.md.
"""

from __future__ import annotations

import csv
import json
import os
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from audiopipe.errors import AudiopipeError

METADATA_NAME = "metadata.csv"
# Sidecar names tried beside `x.wav`, in order. LibriTTS ships x.normalized.txt and x.original.txt.
SIDECAR_SUFFIXES = (".normalized.txt", ".txt", ".lab", ".original.txt")
# Manifest columns with a meaning; every other column goes to Utterance.extra.
MANIFEST_PATH_KEYS = ("path", "audio")
MANIFEST_KNOWN_KEYS = ("path", "audio", "id", "text", "speaker")


class TranscriptError(AudiopipeError, ValueError):
    """A transcript source that cannot be parsed; the message names the file and line."""


def json_lines(path: str, f: Iterable[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-blank line of a JSONL file; a line that is not a JSON object is a
    TranscriptError naming `path:line` (one bad line concerns the whole index, so it is not skipped)."""
    for lineno, line in enumerate(f, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TranscriptError(f"{path}:{lineno}: not a JSON object per line ({e.msg})") from None
        if not isinstance(rec, dict):
            raise TranscriptError(f"{path}:{lineno}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, rec


def read_text_file(path: str) -> str:
    """A sidecar transcript: UTF-8 (BOM tolerated), whitespace collapsed to single spaces."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            return " ".join(f.read().split())
    except UnicodeDecodeError as e:
        raise TranscriptError(f"{path}: not UTF-8 text ({e})") from None


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
        with open(path, encoding="utf-8-sig", newline="") as f:
            content = f.read()
    except UnicodeDecodeError as e:
        raise TranscriptError(f"{path}: not UTF-8 text ({e})") from None
    lines = content.splitlines()
    first = next((ln for ln in lines if ln.strip()), "")
    if "|" not in first and "file_name" in next(csv.reader([first]), []):
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


def _key(name: str, audio_exts: frozenset[str]) -> str:
    return _strip_audio_ext(name.strip().replace("\\", "/").removeprefix("./"), audio_exts)


def _parse_audiofolder_csv(path: str, content: str, audio_exts: frozenset[str]) -> dict[str, str]:
    reader = csv.DictReader(content.splitlines())
    fields = reader.fieldnames or []
    text_col = next((c for c in ("text", "transcription", "sentence", "normalized_text") if c in fields), None)
    out: dict[str, str] = {}
    for rec in reader:
        name = rec.get("file_name")
        if not name:
            raise TranscriptError(f"{path}:{reader.line_num}: empty file_name")
        text = (rec.get(text_col) or "") if text_col else ""
        out.setdefault(_key(name, audio_exts), " ".join(text.split()))
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
            self._cache[folder] = parse_metadata_csv(p, self._exts) if os.path.isfile(p) else None
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
    if not uid.strip():
        return "is empty"
    if uid.startswith("/"):
        return "is absolute (ids are relative, '/'-separated)"
    if "\\" in uid:
        return "contains a backslash (separate folders with '/')"
    ctrl = next((c for c in uid if unicodedata.category(c) == "Cc"), None)
    if ctrl is not None:
        return f"contains the control character U+{ord(ctrl):04X}"
    parts = uid.split("/")
    if "" in parts:
        return "has an empty path segment ('//' or a trailing '/')"
    if any(p in (".", "..") for p in parts):
        return "has a '.' or '..' path segment"
    return None


@dataclass
class ManifestRow:
    """One listed audio file. `path` is absolute; missing columns are None."""

    path: str
    written_path: str  # as written in the manifest, for messages
    line: int
    id: str | None = None
    text: str | None = None
    speaker: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _given(v: Any) -> str | None:
    # An empty cell means "not given" in CSV; treat JSON null/"" the same so both formats agree.
    if v is None:
        return None
    s = str(v)
    return s if s.strip() else None


def _row(rec: dict[str, Any], base: str, where: str, line: int) -> ManifestRow:
    written = next((rec[k] for k in MANIFEST_PATH_KEYS if _given(rec.get(k)) is not None), None)
    if written is None:
        raise TranscriptError(f"{where}:{line}: no 'path' (or 'audio') value; columns are {sorted(rec)}")
    written = str(written).strip()
    path = os.path.normpath(written if os.path.isabs(written) else os.path.join(base, written))
    text = _given(rec.get("text"))
    return ManifestRow(
        path=path, written_path=written, line=line,
        id=_given(rec.get("id")),
        text=" ".join(text.split()) if text is not None else None,
        speaker=_given(rec.get("speaker")),
        extra={k: v for k, v in rec.items() if k not in MANIFEST_KNOWN_KEYS and k is not None},
    )


def read_manifest(path: str | os.PathLike[str]) -> list[ManifestRow]:
    """Rows of a JSONL (.jsonl/.ndjson/.json), CSV (.csv) or TSV (.tsv) manifest, in file order; each may be
    gzipped (.jsonl.gz).

    Relative paths are resolved against the manifest's folder.
    """
    from audiopipe.corpus.manifests import open_text, regular_file

    path = regular_file(os.fspath(path))
    base = os.path.dirname(path)
    name = path[:-3] if path.lower().endswith(".gz") else path
    ext = name.rsplit(".", 1)[-1].lower()
    rows: list[ManifestRow] = []
    try:
        with open_text(path) as f:
            if ext in ("csv", "tsv"):
                reader = csv.DictReader(f, delimiter="\t" if ext == "tsv" else ",")
                if not reader.fieldnames or not set(MANIFEST_PATH_KEYS) & set(reader.fieldnames):
                    raise TranscriptError(f"{path}: the header row needs a 'path' or 'audio' column, "
                                          f"got {reader.fieldnames}")
                for rec in reader:
                    rows.append(_row(rec, base, path, reader.line_num))
            elif ext in ("jsonl", "ndjson", "json"):
                for lineno, rec in json_lines(path, f):
                    rows.append(_row(rec, base, path, lineno))
            else:
                raise TranscriptError(f"{path}: unknown manifest type '.{ext}' (use .jsonl, .csv or .tsv, "
                                      f"or a lhotse, NeMo, Common Voice or Hugging Face manifest: docs/corpus.md)")
    except (UnicodeDecodeError, EOFError, OSError) as e:
        raise TranscriptError(f"{path}: not UTF-8 text ({e})") from None
    return rows
