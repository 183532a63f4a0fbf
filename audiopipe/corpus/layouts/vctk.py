"""VCTK: 0.92 (`wav48_silence_trimmed/`, FLAC, two microphones) and 0.80 (`wav48/`, WAV), text in `txt/`.

    VCTK-Corpus-0.92/speaker-info.txt                              ID AGE GENDER ACCENTS REGION COMMENTS
    VCTK-Corpus-0.92/txt/p225/p225_001.txt
    VCTK-Corpus-0.92/wav48_silence_trimmed/p225/p225_001_mic1.flac
    VCTK-Corpus-0.92/wav48_silence_trimmed/p225/p225_001_mic2.flac
    VCTK-Corpus/wav48/p225/p225_001.wav                              (0.80: one file per sentence)

0.92 recorded every sentence with two microphones: one is taken (`--vctk-mic`, mic1 by default; a note counts
the other's files), so no sentence appears twice. The text is `txt/<speaker>/<sentence>.txt` (p315 has none
in 0.92: such files get "" and are counted in the note on transcripts). The speaker is the folder (`p225`);
speaker-info.txt adds `extra["gender"]`, `["age"]`, `["accent"]`, `["region"]` (lhotse's names). The id is
the path under the audio folder without extension (`p225/p225_001_mic1`; 0.80: `p225/p225_001`).
"""

from __future__ import annotations

import os
import re
from typing import Any

from audiopipe.corpus.entries import ordered_map
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.storage import guard

NAME = "vctk"
EXPECTS = "txt/ beside wav48_silence_trimmed/ (VCTK 0.92) or wav48/ (VCTK 0.80)"
_AUDIO_DIRS = ("wav48_silence_trimmed", "wav48")
_MIC = re.compile(r"^(.+)_(mic\d)$")


def _audio_dir(root: str) -> str | None:
    return next((os.path.join(root, d) for d in _AUDIO_DIRS if os.path.isdir(os.path.join(root, d))), None)


def detect(root: str) -> bool:
    return os.path.isdir(os.path.join(root, "txt")) and _audio_dir(root) is not None


def _speaker_info(root: str) -> dict[str, dict[str, Any]]:
    text = guard.read_text_or_none(os.path.join(root, "speaker-info.txt"), "table", "speaker-info.txt")
    out: dict[str, dict[str, Any]] = {}
    for line in (text or "").splitlines()[1:]:
        f = line.split()
        if len(f) < 4:
            continue
        spk = f[0] if f[0][:1].isalpha() else f"p{f[0]}"  # 0.80 lists 225, 0.92 p225
        info: dict[str, Any] = {"gender": f[2], "accent": f[3]}
        if f[1].isdigit():
            info["age"] = int(f[1])
        if len(f) > 4:
            info["region"] = " ".join(f[4:])
        out[spk] = info
    return out


def _read(item: tuple[str, str, str]) -> tuple[Any, Reject | None, str | None]:
    path, source, txt = item
    info, bad = header(path, source)
    if bad is not None:
        return None, bad, None
    try:
        return info, None, guard.read_text_or_none(txt, "transcript", "transcript", reason="bad_transcript")
    except guard.Refused as e:  # a transcript that is a pipe, too large or not UTF-8: this file only
        return None, Reject(path, source, e.reason, e.detail), None


def discover(root: str, speaker_rule: int | None, options: Any = None):
    mic = getattr(options, "vctk_mic", "mic1")
    audio = _audio_dir(root)
    txt_root = os.path.join(root, "txt")
    speakers = _speaker_info(root)
    items: list[tuple[str, str, str]] = []
    other_mic = 0
    for folder, dirs, files in os.walk(audio):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        spk = os.path.relpath(folder, audio).split(os.sep)[0]
        for name in sorted(files):
            stem, dot, ext = name.rpartition(".")
            if name.startswith(".") or ext.lower() not in ("flac", "wav"):
                continue
            m = _MIC.match(stem)
            if m and m.group(2) != mic:
                other_mic += 1
                continue
            sentence = m.group(1) if m else stem
            path = os.path.join(folder, name)
            items.append((path, rel(path, root), os.path.join(txt_root, spk, sentence + ".txt")))
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for (path, source, _), (info, bad, text) in zip(items, ordered_map(_read, items)):
        if bad is not None:
            rejects.append(bad)
            continue
        uid = rel(path, audio).rsplit(".", 1)[0]
        own = uid.split("/")[0]
        extra = {**speakers.get(own, {}), "language": "en"}
        utts.append(utterance(uid, path, source, info, speaker_from_folders(source, speaker_rule, own),
                              text or "", extra))
    notes = []
    if other_mic:
        notes.append(f"VCTK: {mic} recordings taken, {other_mic} files of the other microphone left out "
                     f"(vctk_mic= chooses)")
    return utts, rejects, notes
