"""Emilia: one JSONL per batch folder, each line an utterance with its MP3 path, text, speaker and language.

    Emilia/ZH/ZH_B00000.jsonl         {"id", "wav", "text", "duration", "speaker", "language", "dnsmos"}
    Emilia/ZH/ZH_B00000/ZH_B00000_S00000/mp3/ZH_B00000_S00000_W000000.mp3

`wav` is relative to the JSONL's folder. The root may be the Emilia folder (language folders below it) or one
language folder. id, speaker and text come from the line; `language` (zh, en, ...) lands in extra and decides
the phone front end per line under `--language auto`; other fields (dnsmos, duration as listed) are kept in
extra. A line whose MP3 is missing is a `missing` reject; a line that is not JSON stops discovery (file:line).

The newer WebDataset distribution is read in place too: `ZH/ZH-B000000.tar` holding `<key>.mp3` + `<key>.json`
pairs (the JSON has the same fields; `wav` may be absent). Nothing is unpacked: an uncompressed tar keeps each
member's bytes contiguous, so the utterance's path is the tar, `extra` has `tar_member`, `member_offset`,
`member_size`, and the shard builder decodes that byte range (audiopipe.decode.members). Its source is
`<tar>#<member>`. A JSON without its audio is a `missing` reject; a compressed tar (`.tar.gz`) is not
listed (it cannot be read in place: decompress it first).
"""

from __future__ import annotations

import json
import os
import tarfile
from typing import Any

from audiopipe.corpus.discover import Reject, Utterance
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.transcripts import json_lines

NAME = "emilia"
EXPECTS = "JSONL files (id, wav, text, ...) beside their audio folders, in the folder or one level below"
_REQUIRED = ("id", "wav", "text")


def _index_files(root: str) -> tuple[list[str], list[str]]:
    """(JSONL files, tar files) in root and one folder below, sorted, hidden names left out (glob's `*`).

    One listing per folder for both kinds: detection runs on every corpus, and a walked corpus of a million
    files in a thousand speaker folders would otherwise be listed twice through glob's per-name matching."""
    jsonl: list[str] = []
    tars: list[str] = []

    def take(folder: str, names: list[str]) -> None:
        for n in names:
            if n.endswith(".jsonl") and not n.startswith("."):
                jsonl.append(os.path.join(folder, n))
            elif n.endswith(".tar") and not n.startswith("."):
                tars.append(os.path.join(folder, n))

    try:
        entries = [e for e in os.scandir(root) if not e.name.startswith(".")]
    except OSError:
        return [], []
    take(root, [e.name for e in entries])
    for e in entries:
        try:
            if e.is_dir():
                take(e.path, os.listdir(e.path))
        except OSError:  # an unreadable folder is reported by the walk, not by layout detection
            continue
    return sorted(jsonl), sorted(tars)


def _jsonl_files(root: str) -> list[str]:
    return _index_files(root)[0]


def _tar_files(root: str) -> list[str]:
    return _index_files(root)[1]


_AUDIO_EXTS = (".mp3", ".wav", ".flac", ".ogg", ".opus")


def _key(name: str) -> tuple[str, str]:
    """WebDataset's grouping: the key is the member path up to the first dot of its base name."""
    folder, base = os.path.split(name)
    stem, dot, ext = base.partition(".")
    return os.path.join(folder, stem), "." + ext.lower() if dot else ""


def _tar_groups(path: str) -> dict[str, dict[str, tarfile.TarInfo]]:
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    with tarfile.open(path, "r:") as tf:  # "r:": uncompressed only, the members must be byte ranges
        for m in tf:
            if m.isfile():
                key, ext = _key(m.name)
                groups.setdefault(key, {})[ext] = m
    return groups


def _looks_like_emilia_tar(path: str) -> bool:
    try:
        with tarfile.open(path, "r:") as tf:
            for m in tf:
                if m.isfile() and m.name.endswith(".json"):
                    row = json.loads(tf.extractfile(m).read().decode("utf-8"))
                    return isinstance(row, dict) and "text" in row
    except (OSError, tarfile.TarError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return False


def _looks_like_emilia(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        row = json.loads(first)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(row, dict) and all(k in row for k in _REQUIRED)


def detect(root: str) -> bool:
    files, tars = _index_files(root)
    if files:
        return _looks_like_emilia(files[0])
    return bool(tars) and _looks_like_emilia_tar(tars[0])


def discover(root: str, speaker_rule: int | None, options: Any = None) -> tuple[list[Utterance], list[Reject]]:
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for jsonl in _jsonl_files(root):
        base = os.path.dirname(jsonl)
        with open(jsonl, encoding="utf-8") as f:
            for n, row in json_lines(jsonl, f):
                if any(k not in row for k in _REQUIRED):
                    raise ValueError(f"{jsonl}:{n}: an Emilia line needs {', '.join(_REQUIRED)}")
                path = os.path.join(base, str(row["wav"]))
                source = rel(path, root)
                info, bad = header(path, source, f"{os.path.basename(jsonl)}:{n}")
                if bad is not None:
                    rejects.append(bad)
                    continue
                extra = {k: v for k, v in row.items() if k not in ("id", "wav", "text", "speaker")}
                speaker = speaker_from_folders(source, speaker_rule, str(row.get("speaker") or ""))
                utts.append(utterance(str(row["id"]), path, source, info, speaker, str(row["text"]), extra))
    for tar in _tar_files(root):
        _read_tar(tar, root, speaker_rule, utts, rejects)
    return utts, rejects


def _read_tar(tar: str, root: str, speaker_rule: int | None, utts: list[Utterance], rejects: list[Reject]) -> None:
    from audiopipe.decode.audio import RejectError
    from audiopipe.decode.members import member_info

    tar_source = rel(tar, root)
    try:
        groups = _tar_groups(tar)
    except (OSError, tarfile.TarError) as e:
        rejects.append(Reject(tar, tar_source, "unreadable", f"not an uncompressed tar ({e}); a compressed "
                                                            f"tar cannot be read in place: decompress it first"))
        return
    with tarfile.open(tar, "r:") as tf:
        for key, members in sorted(groups.items()):
            audio = next((members[e] for e in _AUDIO_EXTS if e in members), None)
            meta = members.get(".json")
            row = json.loads(tf.extractfile(meta).read().decode("utf-8")) if meta is not None else {}
            if audio is None:
                if meta is not None:
                    rejects.append(Reject(tar, f"{tar_source}#{meta.name}", "missing",
                                          f"{meta.name} has no audio member beside it in {tar_source}"))
                continue
            source = f"{tar_source}#{audio.name}"
            try:
                info = member_info(tar, audio.offset_data, audio.size)
            except RejectError as e:
                rejects.append(Reject(tar, source, e.reason, e.detail))
                continue
            extra = {k: v for k, v in row.items() if k not in ("id", "wav", "text", "speaker")}
            extra.update(tar_member=audio.name, member_offset=audio.offset_data, member_size=audio.size)
            speaker = str(row.get("speaker") or "") if speaker_rule is not None else ""
            utts.append(utterance(str(row.get("id") or os.path.basename(key)), tar, source, info, speaker,
                                  str(row.get("text") or ""), extra))
