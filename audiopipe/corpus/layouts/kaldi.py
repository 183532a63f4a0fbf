"""Kaldi data directories: wav.scp, text, utt2spk and segments (how 3D-Speaker and CN-Celeb ship).

    data/train/wav.scp    <recording> <path>              one audio file per recording
    data/train/segments   <utterance> <recording> <start s> <end s>   (optional; end -1 = to the end)
    data/train/text       <utterance> <transcript...>      (optional)
    data/train/utt2spk    <utterance> <speaker>            (optional)

Without `segments` every recording is one utterance with the recording's id. With it, utterances are cut out
of their recording: the header is read once per recording, and the shard builder reads each segment by seeking
in its recording (audiopipe.decode.segments: memory follows the segment, never the recording).

Refused with a reject, never run or guessed: a wav.scp entry that is a command (`sox a.flac -t wav - |`; we do
not execute commands found in data files: convert to files first), an archive offset (`feats.ark:1234`), a
segment whose recording is not in wav.scp, and a segment that is empty or runs past its recording's end. A
recording that is refused (missing, unreadable, a command) is one reject, and its segments go with it.
Relative paths are taken from the data directory; ESPnet writes them relative to its recipe folder
(`egs2/<corpus>/tts1`, two levels above `data/train`), so when they are not found from the data directory,
the nearest folder above it from which they are is used (a note says which). A malformed line stops discovery
with `file:line`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from audiopipe.corpus.entries import segment_problem
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.errors import InvalidValue
from audiopipe.storage import guard

NAME = "kaldi"
EXPECTS = "a wav.scp file in the folder (and optionally text, utt2spk, segments)"
_ARK = re.compile(r"\.(ark|scp):\d+$")
_BASE_LEVELS = 6  # folders above the data dir tried for relative wav.scp paths (ESPnet: dump/raw/org/train)
_BASE_SAMPLE = 20  # relative entries checked to choose that folder


def detect(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "wav.scp"))


class _Table(dict):
    """{key: (line number, fields after the key)} of one Kaldi file, and the lines it could not read:
    `refused` {key: Refused} where the key could still be told (a text line in latin-1: its utterance is
    refused), `lost` [(line, Refused)] where it could not."""

    def __init__(self) -> None:
        super().__init__()
        self.refused: dict[str, guard.Refused] = {}
        self.lost: list[tuple[int, guard.Refused]] = []


def _key_of(raw: bytes | None) -> str | None:
    """The key of a line that is not UTF-8 as a whole, when its first field is (Kaldi keys are ASCII ids)."""
    fields = (raw or b"").split(None, 1)
    try:
        return fields[0].decode("utf-8") if fields else None
    except UnicodeDecodeError:
        return None


def _table(path: str, min_fields: int, rest_joined: bool = True, reason: str = "bad_encoding",
           repeats: bool = False) -> _Table:
    """Lines `key value...` of a Kaldi file, read through audiopipe.storage.guard (a pipe does not block, a line
    has a size limit, text is strict UTF-8); blank lines skipped. A malformed line (no value, a key given
    twice unless `repeats`, when the last one counts) stops with `file:line`; a line that cannot be decoded is
    kept aside for the caller to refuse what it names (`reason`), and the rest is read."""
    out = _Table()
    if not os.path.lexists(path):
        return out
    try:
        for n, line in guard.text_lines(path, f"Kaldi {os.path.basename(path)}", reason=reason):
            if isinstance(line, guard.Refused):
                key = _key_of(line.raw)
                if key is not None and key not in out.refused:
                    out.refused[key] = line
                else:
                    out.lost.append((n, line))
                continue
            if not line.strip():
                continue
            key, _, rest = line.strip().partition(" ")
            fields = [rest.strip()] if rest_joined else rest.split()
            if len(fields) < min_fields or (min_fields and not fields[0]):
                raise InvalidValue(f"{path}:{n}: expected '<id> {'<value>' if min_fields == 1 else '...'}', "
                                   f"got {line[:200]!r}")
            if key in out and not repeats:
                raise InvalidValue(f"{path}:{n}: id {key!r} already given on line {out[key][0]}")
            out[key] = (n, fields)
    except guard.Refused as e:  # the file itself (a pipe, a folder): it concerns every line
        raise InvalidValue(e.detail) from None
    return out


def _relative_base(root: str, values: list[str]) -> str:
    """The folder relative wav.scp paths start from: the data dir, or the nearest folder above it (an ESPnet
    recipe folder) from which more of the first entries exist; the data dir when none does better."""
    sample = [v for v in values if not os.path.isabs(v) and not v.endswith("|") and not _ARK.search(v)]
    sample = sample[:_BASE_SAMPLE]
    if not sample:
        return root
    best, best_n, base = root, sum(os.path.isfile(os.path.join(root, v)) for v in sample), root
    if best_n == len(sample):
        return root
    for _ in range(_BASE_LEVELS):
        up = os.path.dirname(base)
        if up == base:
            break
        base = up
        n = sum(os.path.isfile(os.path.join(base, v)) for v in sample)
        if n > best_n:
            best, best_n = base, n
            if n == len(sample):
                break
    return best


def discover(root: str, speaker_rule: int | None, options: Any = None):
    scp_path = os.path.join(root, "wav.scp")
    wav_scp = _table(scp_path, 1)
    base = _relative_base(root, [fields[0] for _, fields in wav_scp.values()])
    notes = [] if base == root else [f"wav.scp paths are relative to {base} (an ESPnet recipe folder), not to "
                                     f"the data folder {root}: read from there"]
    texts = _table(os.path.join(root, "text"), 0, reason="bad_transcript", repeats=True)
    spk = _table(os.path.join(root, "utt2spk"), 1)
    seg_path = os.path.join(root, "segments")
    segments = _table(seg_path, 3, rest_joined=False) if os.path.lexists(seg_path) else None

    rejects: list[Reject] = []
    # Lines whose key could not be read: each is one input refused (it named a recording or an utterance).
    for table, name in ((wav_scp, "wav.scp"), (texts, "text"), (spk, "utt2spk"), (segments, "segments")):
        for n, why in (table.lost if table is not None else ()):
            rejects.append(Reject(os.path.join(root, name), f"{name}:{n}", why.reason, why.detail))
    refused: set[str] = set()  # recordings with a reject of their own: their segments go with it
    for rec, why in sorted(wav_scp.refused.items()):
        refused.add(rec)
        rejects.append(Reject(scp_path, f"wav.scp#{rec}", why.reason, why.detail))
    recordings: dict[str, tuple[str, str, Any]] = {}  # id -> (path, source, header info)
    for rec, (n, (value,)) in sorted(wav_scp.items()):
        where = f"wav.scp:{n}"
        if rec in refused:
            continue
        if value.endswith("|"):
            refused.add(rec)
            rejects.append(Reject(value, f"wav.scp#{rec}", "kaldi_pipe",
                                  f"{where}: recording {rec!r} is read through a command ({value!r}); commands "
                                  f"in data files are not run: write the audio to files and list their paths"))
            continue
        if _ARK.search(value):
            refused.add(rec)
            rejects.append(Reject(value, f"wav.scp#{rec}", "kaldi_ark",
                                  f"{where}: recording {rec!r} is an offset into an archive ({value!r}); "
                                  f"extract it to an audio file first"))
            continue
        path = os.path.normpath(value if os.path.isabs(value) else os.path.join(base, value))
        source = rel(path, root)
        info, bad = header(path, source, where)
        if bad is not None:
            rejects.append(bad)
            refused.add(rec)
            continue
        recordings[rec] = (path, source, info)

    def unreadable_line(uid: str) -> guard.Refused | None:
        """The text or utt2spk line of this utterance that could not be read, if any."""
        return texts.refused.get(uid) or spk.refused.get(uid)

    utts: list[Utterance] = []
    if segments is None:
        for rec, (path, source, info) in recordings.items():
            why = unreadable_line(rec)
            if why is not None:
                rejects.append(Reject(path, source, why.reason, why.detail))
                continue
            speaker = _value(spk, rec) or speaker_from_folders(source, speaker_rule, "")
            utts.append(utterance(rec, path, source, info, speaker if speaker_rule is not None else "",
                                  _value(texts, rec), {"recording": rec}))
        return utts, rejects, notes

    for uid, why in sorted(segments.refused.items()):
        rejects.append(Reject(seg_path, f"segments#{uid}", why.reason, why.detail))
    for uid, (n, fields) in sorted(segments.items()):
        where = f"segments:{n}"
        rec = fields[0]
        if rec not in recordings:
            if rec not in refused:  # a refused recording already has its reject; its segments go with it
                rejects.append(Reject(rec, f"segments#{uid}", "kaldi_missing_recording",
                                      f"{where}: utterance {uid!r} cuts recording {rec!r}, which wav.scp does "
                                      f"not list"))
            continue
        path, source, info = recordings[rec]
        sr, total = int(info.samplerate), int(info.frames)
        try:
            start, end = float(fields[1]), float(fields[2])
        except ValueError:
            rejects.append(Reject(path, f"segments#{uid}", "bad_segment",
                                  f"{where}: start and end must be seconds, got {' '.join(fields[1:3])[:80]!r}"))
            continue
        if math.isfinite(end) and end < 0:  # Kaldi's -1: to the end of the recording
            end = total / sr
        problem = segment_problem(start, end, total, sr)
        if problem is not None:
            rejects.append(Reject(path, f"segments#{uid}", "bad_segment", f"{where}: {problem}, recording {rec!r}"))
            continue
        why = unreadable_line(uid)
        if why is not None:
            rejects.append(Reject(path, f"segments#{uid}", why.reason, why.detail))
            continue
        first, last = round(start * sr), min(round(end * sr), total)
        speaker = _value(spk, uid) or speaker_from_folders(source, speaker_rule, "")
        utts.append(utterance(uid, path, source, info, speaker if speaker_rule is not None else "",
                              _value(texts, uid), {"recording": rec, "start_frame": first, "end_frame": last},
                              frames=last - first))
    return utts, rejects, notes


def _value(table: _Table, key: str) -> str:
    got = table.get(key)
    return got[1][0] if got is not None and got[1] else ""
