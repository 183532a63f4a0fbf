"""Transcripts beside the audio: sidecar text files and LJSpeech / audiofolder metadata.csv, and the error that
names a transcript source (or a manifest) that cannot be parsed.

Precedence (highest first): manifest column (audiopipe.corpus.manifests.plain) > sidecar file > metadata.csv.
See docs/corpus.md.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from audiopipe.storage import guard

from audiopipe.errors import AudiopipeError

METADATA_NAME = "metadata.csv"
# Sidecar names tried beside `x.wav`, in order. LibriTTS ships x.normalized.txt and x.original.txt.
SIDECAR_SUFFIXES = (".normalized.txt", ".txt", ".lab", ".original.txt")


class TranscriptError(AudiopipeError, ValueError):
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
