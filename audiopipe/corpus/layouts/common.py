"""Helpers shared by the layout readers: one Utterance or Reject per audio reference, header read only."""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

from audiopipe.corpus.records import Reject, Utterance
from audiopipe.corpus.wavheader import read_wav_header
from audiopipe.decode.audio import RejectError, read_info


def rel(path: str, root: str) -> str:
    """`path` relative to root with '/' separators, or as given when it lies outside the root."""
    r = os.path.relpath(path, root)
    if r.startswith(".."):
        return path.replace(os.sep, "/")
    return PurePosixPath(*r.split(os.sep)).as_posix()


def header(path: str, source: str, where: str = "") -> tuple[Any, Reject | None]:
    """soundfile info of the file, or the Reject that says why it cannot be used (its detail starting with
    `where`, the index line that named the file, when given)."""
    at = f"{where}: " if where else ""
    # A plain PCM WAV directly (as walked corpora are read, audiopipe/corpus/wavheader.py), the rest by libsndfile.
    info = read_wav_header(path) if path.lower().endswith((".wav", ".wave")) else None
    try:
        info = info if info is not None else read_info(path)
    except RejectError as e:
        return None, Reject(path, source, e.reason, at + e.detail)
    if info.frames <= 0:
        return None, Reject(path, source, "empty", at + "the header declares no audio frames")
    return info, None


def utterance(uid: str, path: str, source: str, info: Any, speaker: str, text: str,
              extra: dict[str, Any] | None = None, frames: int | None = None) -> Utterance:
    """An Utterance from a header; `frames` overrides the length (a segment of a longer recording)."""
    n = int(info.frames) if frames is None else int(frames)
    sr = int(info.samplerate)
    return Utterance(id=uid, path=path, source=source, speaker=speaker, text=" ".join(text.split()),
                     sample_rate=sr, num_samples=n, channels=int(info.channels),
                     duration=n / sr if sr > 0 else 0.0, extra=dict(extra or {}))


def speaker_from_folders(source: str, rule: int | None, default: str) -> str:
    """`default` (the layout's own speaker) for --speaker auto; dir:N and none as for walked corpora."""
    if rule is None:
        return ""
    if rule < 0:
        return default
    folders = PurePosixPath(source).parts[:-1]
    return folders[rule] if rule < len(folders) else ""
