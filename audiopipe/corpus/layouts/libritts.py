"""LibriTTS and LibriTTS-R, from the top folder (several splits) or one split folder.

    LibriTTS/SPEAKERS.txt                                   ;ID |SEX| SUBSET |MINUTES| NAME
    LibriTTS/train-clean-100/19/198/19_198_000000_000000.wav
    LibriTTS/train-clean-100/19/198/19_198_000000_000000.normalized.txt   (the text)
    LibriTTS/train-clean-100/19/198/19_198_000000_000000.original.txt     (extra["original_text"])
    LibriTTS/train-clean-100/19/198/19_198.trans.tsv        id <TAB> original <TAB> normalized (fallback)
    LibriTTS/train-clean-100/19/198/19_198.book.tsv         ... SNR last (extra["snr"], as lhotse reads it)

The speaker is the first field of the file name (`19`), never a folder: walked from the top folder, the first
folder is the split, and every split would have become one "speaker". SPEAKERS.txt adds `extra["gender"]`
(F/M) and `extra["subset"]`. The id is the path relative to the root without extension
(`train-clean-100/19/198/19_198_000000_000000`). A file whose name does not start with `<speaker>_<chapter>_`
takes the folder two levels up instead. Hidden files (`._x.wav` resource forks) are skipped.
"""

from __future__ import annotations

import os
import re
from typing import Any

from audiopipe.corpus.entries import ordered_map
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.storage import guard

NAME = "libritts"
EXPECTS = "LibriTTS split folders (train-clean-100, dev-clean, ...) holding <speaker>/<chapter>/ folders"
SPLIT = re.compile(r"^(train-clean-100|train-clean-360|train-other-500|dev-clean|dev-other|test-clean|test-other)$")
_FILE = re.compile(r"^(\d+)_(\d+)_")


def _has_speaker_folders(split: str) -> bool:
    try:
        return any(e.is_dir() and e.name.isdigit() for e in os.scandir(split))
    except OSError:
        return False


def _splits(root: str) -> list[str]:
    if SPLIT.match(os.path.basename(root.rstrip(os.sep))) and _has_speaker_folders(root):
        return [root]
    try:
        names = sorted(e.name for e in os.scandir(root) if e.is_dir() and SPLIT.match(e.name))
    except OSError:
        return []
    return [os.path.join(root, n) for n in names if _has_speaker_folders(os.path.join(root, n))]


def detect(root: str) -> bool:
    return bool(_splits(root))


def _speakers_table(root: str) -> dict[str, dict[str, str]]:
    """SPEAKERS.txt (in the root or above a split root) -> {speaker: {"gender", "subset"}}."""
    for folder in (root, os.path.dirname(root.rstrip(os.sep))):
        text = guard.read_text_or_none(os.path.join(folder, "SPEAKERS.txt"), "table", "SPEAKERS.txt")
        if text is None:
            continue
        out = {}
        for line in text.splitlines():
            if line.startswith(";") or "|" not in line:
                continue
            fields = [f.strip() for f in line.split("|")]
            if len(fields) >= 3 and fields[0]:
                out[fields[0]] = {"gender": fields[1], "subset": fields[2]}
        return out
    return {}


def _chapter_tables(folder: str, names: list[str]) -> tuple[dict[str, tuple[str, str]], dict[str, float]]:
    """The chapter's trans.tsv ({id: (original, normalized)}) and book.tsv SNRs ({id: snr})."""
    trans: dict[str, tuple[str, str]] = {}
    snr: dict[str, float] = {}
    for n in names:
        if n.startswith(".") or not n.endswith((".trans.tsv", ".book.tsv")):
            continue
        text = guard.read_text_or_none(os.path.join(folder, n), "table", "LibriTTS table") or ""
        for line in text.splitlines():
            fields = line.split("\t")
            if n.endswith(".trans.tsv") and len(fields) >= 3:
                trans[fields[0]] = (fields[1], fields[2])
            elif n.endswith(".book.tsv") and fields and line.split():
                try:
                    snr[fields[0]] = float(line.split()[-1])
                except ValueError:
                    pass
    return trans, snr


def _sidecar(path: str) -> str | None:
    return guard.read_text_or_none(path, "transcript", "sidecar transcript", reason="bad_transcript")


def _read(item: tuple[str, str, set[str]]) -> tuple[Any, Reject | None, str | None, str | None]:
    """(header, reject, normalized text, original text) of one wav from its sidecars."""
    path, source, names = item
    info, bad = header(path, source)
    if bad is not None:
        return None, bad, None, None
    stem = os.path.basename(path)[:-4]
    folder = os.path.dirname(path)
    try:
        norm = _sidecar(os.path.join(folder, stem + ".normalized.txt")) if f"{stem}.normalized.txt" in names \
            else None
        orig = _sidecar(os.path.join(folder, stem + ".original.txt")) if f"{stem}.original.txt" in names else None
    except guard.Refused as e:  # a sidecar that is a pipe, too large or not UTF-8: this file only
        return None, Reject(path, source, e.reason, e.detail), None, None
    return info, None, norm, orig


def discover(root: str, speaker_rule: int | None, options: Any = None):
    speakers = _speakers_table(root)
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for split in _splits(root):
        items: list[tuple[str, str, set[str]]] = []
        chapters: dict[str, tuple[dict[str, tuple[str, str]], dict[str, float]]] = {}
        for folder, dirs, files in os.walk(split):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            names = set(files)
            wavs = sorted(f for f in files if f.lower().endswith(".wav") and not f.startswith("."))
            if wavs:
                chapters[folder] = _chapter_tables(folder, sorted(files))
            items += [(os.path.join(folder, f), rel(os.path.join(folder, f), root), names) for f in wavs]
        for (path, source, _), (info, bad, norm, orig) in zip(items, ordered_map(_read, items)):
            if bad is not None:
                rejects.append(bad)
                continue
            stem = os.path.basename(path)[:-4]
            trans, snr = chapters[os.path.dirname(path)]
            orig_t, norm_t = trans.get(stem, (None, None))
            text = norm if norm and norm.strip() else (norm_t or "")
            original = orig if orig and orig.strip() else orig_t
            m = _FILE.match(stem)
            own = m.group(1) if m else os.path.basename(os.path.dirname(os.path.dirname(path)))
            extra: dict[str, Any] = {}
            if original:
                extra["original_text"] = " ".join(original.split())
            if stem in snr:
                extra["snr"] = snr[stem]
            extra.update(speakers.get(own, {}))
            extra["language"] = "en"
            utts.append(utterance(source[:-4], path, source, info, speaker_from_folders(source, speaker_rule, own),
                                  text, extra))
    return utts, rejects
