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

Hostile input is refused per utterance, never for the whole corpus: a line or JSON member that is not UTF-8
(`bad_encoding`), a JSON member that is not a JSON object (`bad_json`), a text, speaker or id that is not a
string (`bad_value`), and the tar members audiopipe.corpus.tarmembers refuses (sparse, links, duplicates,
nested archives, a tar cut short: the members before the cut are kept). A JSONL line that is not JSON, or
lacks id/wav/text, stops discovery with `file:line` as a malformed index does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from audiopipe.corpus.hints import LOCATION_EXTRA
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.listings import json_objects, kind_of_value, plain_value, text_of
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.corpus.tarmembers import TAR_ERRORS, Member, list_members, open_tar, read_member
from audiopipe.decode.audio import RejectError
from audiopipe.decode.members import member_info
from audiopipe.errors import InvalidValue
from audiopipe.storage import guard

NAME = "emilia"
EXPECTS = "JSONL files (id, wav, text, ...) beside their audio folders, in the folder or one level below"
_REQUIRED = ("id", "wav", "text")
_DETECT_MEMBERS = 64  # members looked at to decide whether a tar is an Emilia tar


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


def _looks_like_emilia_tar(path: str) -> bool:
    """Whether the first JSON member (among the first few) has a `text`. Never raises, never blocks: detection
    runs on every corpus, and a pipe or a broken file named `x.tar` is not an Emilia tar."""
    try:
        f, tf = open_tar(path)
    except guard.Refused:
        return False
    try:
        with f, tf:
            for _, m in zip(range(_DETECT_MEMBERS), tf):
                if m.isreg() and not m.issparse() and m.name.endswith(".json"):
                    data = read_member(path, Member(m.name, m.offset_data, m.size), "json member", m.name)
                    row = json.loads(guard.decode(data, m.name))
                    return isinstance(row, dict) and "text" in row
    except (*TAR_ERRORS, RecursionError):  # tarfile raises many kinds on a damaged header
        return False
    return False


def _looks_like_emilia(path: str) -> bool:
    try:
        with guard.open_regular(path, "JSONL") as f:
            first = next((line for _, line in guard.lines(f, path, "jsonl line")
                          if isinstance(line, guard.Refused) or line.strip()), "")
        if isinstance(first, guard.Refused):
            return False
        row = json.loads(first)
    except (guard.Refused, OSError, ValueError, RecursionError):
        return False
    return isinstance(row, dict) and all(k in row for k in _REQUIRED)


def detect(root: str) -> bool:
    files, tars = _index_files(root)
    if files:
        return _looks_like_emilia(files[0])
    return bool(tars) and _looks_like_emilia_tar(tars[0])


def _fields(row: dict[str, Any], speaker_rule: int | None, source: str) -> tuple[str, str, str, dict[str, Any]]:
    """(id, text, speaker, extra) of a line or JSON member; guard.Refused (`bad_value`) for a value of the wrong
    type."""
    uid, speaker = (_as_given(row.get(k), k) for k in ("id", "speaker"))
    text = text_of(row.get("text"), "text")
    extra = {k: v for k, v in row.items()
             if k not in ("id", "wav", "text", "speaker") and k not in LOCATION_EXTRA and plain_value(v)}
    reserved = sorted(k for k in LOCATION_EXTRA if row.get(k) not in (None, ""))
    if reserved:
        raise guard.Refused("bad_value", f"field {reserved[0]} is reserved (audiopipe writes it to say where audio "
                                         f"lies inside an archive)")
    if "language" in extra and not isinstance(extra["language"], str):
        extra["language"] = text_of(extra["language"], "language")
    return uid, text, speaker_from_folders(source, speaker_rule, speaker), extra


def _as_given(value: Any, name: str) -> str:
    """An id or speaker as the line gives it (blank: none); guard.Refused for a value that is not text."""
    said = text_of(value, name)  # refuses lists, objects, booleans and lone surrogates
    return (value if isinstance(value, str) else said) if said else ""


def discover(root: str, speaker_rule: int | None, options: Any = None) -> tuple[list[Utterance], list[Reject]]:
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for jsonl in _jsonl_files(root):
        base = os.path.dirname(jsonl)
        name = os.path.basename(jsonl)
        jsonl_source = rel(jsonl, root)
        for n, row in json_objects(jsonl):
            where = f"{name}:{n}"
            if isinstance(row, guard.Refused):  # a line that is not UTF-8: it names nothing readable
                rejects.append(Reject(jsonl, f"{jsonl_source}:{n}", row.reason, row.detail))
                continue
            if any(k not in row for k in _REQUIRED):
                raise InvalidValue(f"{jsonl}:{n}: an Emilia line needs {', '.join(_REQUIRED)}")
            wav = row["wav"]
            if not isinstance(wav, str) or not wav.strip() or guard.name_problem(wav):
                what = kind_of_value(wav) if not isinstance(wav, str) else "not a file name"
                rejects.append(Reject(jsonl, f"{jsonl_source}:{n}", "bad_value", f"{where}: wav is {what}"))
                continue
            path = os.path.join(base, wav)
            source = rel(path, root)
            try:
                uid, text, speaker, extra = _fields(row, speaker_rule, source)
            except guard.Refused as e:
                rejects.append(Reject(path, source, e.reason, f"{where}: {e.detail}"))
                continue
            info, bad = header(path, source, where)
            if bad is not None:
                rejects.append(bad)
                continue
            utts.append(utterance(uid, path, source, info, speaker, text, extra))
    for tar in _tar_files(root):
        _read_tar(tar, root, speaker_rule, utts, rejects)
    return utts, rejects


def _read_tar(tar: str, root: str, speaker_rule: int | None, utts: list[Utterance], rejects: list[Reject]) -> None:
    """Each audio member with its JSON: one utterance or one reject; every member refused on its own is one
    reject too, which also stands for the JSON beside a refused audio member (discovered = written + rejected
    holds for tars)."""
    tar_source = rel(tar, root)
    try:
        listing = list_members(tar)
    except guard.Refused as e:
        rejects.append(Reject(tar, tar_source, e.reason, e.detail))
        return
    refused_keys = set()  # keys whose audio member was refused: that reject stands for its JSON too
    for name, reason, detail in listing.refused:
        rejects.append(Reject(tar, f"{tar_source}#{name}", reason, detail))
        key, ext = _key(name)
        if ext in _AUDIO_EXTS:
            refused_keys.add(key)
    groups: dict[str, dict[str, Member]] = {}
    for m in listing.members:
        key, ext = _key(m.name)
        group = groups.setdefault(key, {})
        if ext in _AUDIO_EXTS and any(e in group for e in _AUDIO_EXTS):  # a second audio file for one key
            first = next(group[e].name for e in _AUDIO_EXTS if e in group)
            rejects.append(Reject(tar, f"{tar_source}#{m.name}", "duplicate_member",
                                  f"{m.name} is a second audio member for {key} (after {first}, which is kept)"))
            continue
        if ext not in _AUDIO_EXTS and ext != ".json":
            rejects.append(Reject(tar, f"{tar_source}#{m.name}", "bad_member",
                                  f"{m.name} is neither audio ({', '.join(_AUDIO_EXTS)}) nor its .json"))
            continue
        group[ext] = m
    try:
        f = guard.open_regular(tar, "tar")  # one open for all the JSON members
    except guard.Refused as e:  # gone since it was listed
        rejects.append(Reject(tar, tar_source, e.reason, e.detail))
        return
    with f:
        for key, members in sorted(groups.items()):
            _read_pair(tar, tar_source, f, key, members, refused_keys, speaker_rule, utts, rejects)


def _read_pair(tar: str, tar_source: str, f: Any, key: str, members: dict[str, Member], refused_keys: set[str],
               speaker_rule: int | None, utts: list[Utterance], rejects: list[Reject]) -> None:
    """One key of a tar: an utterance, or a reject naming its audio (or its lone JSON)."""
    audio = next((members[e] for e in _AUDIO_EXTS if e in members), None)
    meta = members.get(".json")
    if audio is None:
        if meta is not None and key not in refused_keys:
            rejects.append(Reject(tar, f"{tar_source}#{meta.name}", "missing",
                                  f"{meta.name} has no audio member beside it in {tar_source}"))
        return
    source = f"{tar_source}#{audio.name}"
    try:
        row = _member_json(tar, meta, tar_source, f) if meta is not None else {}
        # The tar's own speaker in every mode but none (a tar source has no speaker folders).
        uid, text, speaker, extra = _fields(row, -1 if speaker_rule is not None else None, source)
    except guard.Refused as e:
        rejects.append(Reject(tar, source, e.reason, e.detail))
        return
    try:
        info = member_info(tar, audio.offset, audio.size)
    except RejectError as e:
        rejects.append(Reject(tar, source, e.reason, e.detail))
        return
    extra.update(tar_member=audio.name, member_offset=audio.offset, member_size=audio.size)
    utts.append(utterance(uid or os.path.basename(key), tar, source, info, speaker, text, extra))


def _member_json(tar: str, meta: Member, tar_source: str, f: Any = None) -> dict[str, Any]:
    """The JSON object of a member; guard.Refused for a member too large, not UTF-8 or not a JSON object."""
    where = f"{tar_source}#{meta.name}"
    data = read_member(tar, meta, "json member", where, f)
    try:
        row = json.loads(guard.decode(data, where))
    except json.JSONDecodeError as e:
        raise guard.Refused("bad_json", f"{where}: not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except RecursionError:
        raise guard.Refused("bad_json", f"{where}: JSON nested too deeply") from None
    if not isinstance(row, dict):
        raise guard.Refused("bad_json", f"{where}: {kind_of_value(row)}, not a JSON object")
    return row
