"""Kaldi data directories: wav.scp, text, utt2spk and segments (how 3D-Speaker and CN-Celeb ship).

    data/train/wav.scp    <recording> <path>              one audio file per recording
    data/train/segments   <utterance> <recording> <start s> <end s>   (optional; end -1 = to the end)
    data/train/text       <utterance> <transcript...>      (optional)
    data/train/utt2spk    <utterance> <speaker>            (optional)

Without `segments` every recording is one utterance with the recording's id. With it, utterances are cut out
of their recording: the header is read once per recording, and the shard builder decodes each recording once
for all its segments (audiopipe.decode.segments).

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

import os
import re
from typing import Any

from audiopipe.corpus.discover import Reject, Utterance
from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance

NAME = "kaldi"
EXPECTS = "a wav.scp file in the folder (and optionally text, utt2spk, segments)"
_ARK = re.compile(r"\.(ark|scp):\d+$")
_SEGMENT_SLACK_S = 0.01  # Kaldi segment ends are rounded to 10 ms; a little past the end is the same end
_BASE_LEVELS = 6  # folders above the data dir tried for relative wav.scp paths (ESPnet: dump/raw/org/train)
_BASE_SAMPLE = 20  # relative entries checked to choose that folder


def detect(root: str) -> bool:
    return os.path.isfile(os.path.join(root, "wav.scp"))


def _table(path: str, min_fields: int, rest_joined: bool = True) -> dict[str, tuple[int, list[str]]]:
    """Lines `key value...` -> {key: (line number, fields after the key)}; blank lines skipped."""
    out: dict[str, tuple[int, list[str]]] = {}
    if not os.path.isfile(path):
        return out
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            key, _, rest = line.strip().partition(" ")
            fields = [rest.strip()] if rest_joined else rest.split()
            if len(fields) < min_fields or (min_fields and not fields[0]):
                raise ValueError(f"{path}:{n}: expected '<id> {'<value>' if min_fields == 1 else '...'}', "
                                 f"got {line!r}")
            if key in out:
                raise ValueError(f"{path}:{n}: id {key!r} already given on line {out[key][0]}")
            out[key] = (n, fields)
    return out


def _text(root: str) -> dict[str, str]:
    path = os.path.join(root, "text")
    table: dict[str, str] = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, rest = line.strip().partition(" ")
                if key:
                    table[key] = rest.strip()
    return table


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
    texts = _text(root)
    spk = {k: v[1][0] for k, v in _table(os.path.join(root, "utt2spk"), 1).items()}
    seg_path = os.path.join(root, "segments")
    segments = _table(seg_path, 3, rest_joined=False) if os.path.isfile(seg_path) else None

    rejects: list[Reject] = []
    refused: set[str] = set()  # recordings with a reject of their own: their segments go with it
    recordings: dict[str, tuple[str, str, Any]] = {}  # id -> (path, source, header info)
    for rec, (n, (value,)) in sorted(wav_scp.items()):
        where = f"wav.scp:{n}"
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

    utts: list[Utterance] = []
    if segments is None:
        for rec, (path, source, info) in recordings.items():
            speaker = spk.get(rec) or speaker_from_folders(source, speaker_rule, "")
            utts.append(utterance(rec, path, source, info, speaker if speaker_rule is not None else "",
                                  texts.get(rec, ""), {"recording": rec}))
        return utts, rejects, notes

    for uid, (n, fields) in sorted(segments.items()):
        where = f"segments:{n}"
        rec = fields[0]
        try:
            start, end = float(fields[1]), float(fields[2])
        except ValueError:
            raise ValueError(f"{seg_path}:{n}: start and end must be seconds, got {fields[1:3]}") from None
        if rec not in recordings:
            if rec not in refused:  # a refused recording already has its reject; its segments go with it
                rejects.append(Reject(rec, f"segments#{uid}", "kaldi_missing_recording",
                                      f"{where}: utterance {uid!r} cuts recording {rec!r}, which wav.scp does "
                                      f"not list"))
            continue
        path, source, info = recordings[rec]
        sr, total = int(info.samplerate), int(info.frames)
        if end < 0:
            end = total / sr
        first, last = round(start * sr), min(round(end * sr), total)
        if start < 0 or end <= start or end > total / sr + _SEGMENT_SLACK_S or last <= first:
            rejects.append(Reject(path, f"segments#{uid}", "bad_segment",
                                  f"{where}: segment {start:.3f}-{end:.3f} s of {rec!r} is empty or outside "
                                  f"the recording (0-{total / sr:.3f} s)"))
            continue
        speaker = spk.get(uid) or speaker_from_folders(source, speaker_rule, "")
        utts.append(utterance(uid, path, source, info, speaker if speaker_rule is not None else "",
                              texts.get(uid, ""), {"recording": rec, "start_frame": first, "end_frame": last},
                              frames=last - first))
    return utts, rejects, notes
