"""Emilia: one JSONL per batch folder, each line an utterance with its MP3 path, text, speaker and language.

    Emilia/ZH/ZH_B00000.jsonl         {"id", "wav", "text", "duration", "speaker", "language", "dnsmos"}
    Emilia/ZH/ZH_B00000/ZH_B00000_S00000/mp3/ZH_B00000_S00000_W000000.mp3

`wav` is relative to the JSONL's folder. The root may be the Emilia folder (language folders below it) or one
language folder. id, speaker and text come from the line; `language` (zh, en, ...) lands in extra and decides
the phone front end per line under `--language auto`; other fields (dnsmos, duration as listed) are kept in
extra. A line whose MP3 is missing is a `missing` reject; a line that is not JSON stops discovery (file:line).

The newer WebDataset distribution (.tar files of mp3 + json pairs) is not read in place: unpack it first
(`tar xf`), then point at the folder of JSONL files this makes, or list the files with a manifest.
"""

from __future__ import annotations

import glob
import json
import os

from audiopipe.corpus.discover import Reject, Utterance
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance

NAME = "emilia"
EXPECTS = "JSONL files (id, wav, text, ...) beside their audio folders, in the folder or one level below"
_REQUIRED = ("id", "wav", "text")


def _jsonl_files(root: str) -> list[str]:
    return sorted(glob.glob(os.path.join(root, "*.jsonl")) + glob.glob(os.path.join(root, "*", "*.jsonl")))


def _looks_like_emilia(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(row, dict) and all(k in row for k in _REQUIRED)


def detect(root: str) -> bool:
    files = _jsonl_files(root)
    return bool(files) and _looks_like_emilia(files[0])


def discover(root: str, speaker_rule: int | None) -> tuple[list[Utterance], list[Reject]]:
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for jsonl in _jsonl_files(root):
        base = os.path.dirname(jsonl)
        with open(jsonl, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{jsonl}:{n}: not JSON: {e.msg}") from None
                if not isinstance(row, dict) or any(k not in row for k in _REQUIRED):
                    raise ValueError(f"{jsonl}:{n}: an Emilia line needs {', '.join(_REQUIRED)}")
                path = os.path.join(base, str(row["wav"]))
                source = rel(path, root)
                info, bad = header(path, source)
                if bad is not None:
                    bad.detail = f"{os.path.basename(jsonl)}:{n}: {bad.detail}"
                    rejects.append(bad)
                    continue
                extra = {k: v for k, v in row.items() if k not in ("id", "wav", "text", "speaker")}
                speaker = speaker_from_folders(source, speaker_rule, str(row.get("speaker") or ""))
                utts.append(utterance(str(row["id"]), path, source, info, speaker, str(row["text"]), extra))
    return utts, rejects
