"""AISHELL-3: `content.txt` with characters and their pinyin, audio in `wav/<speaker>/`, per split.

    aishell3/train/content.txt        SSB00050001.wav<TAB>广 guang3 州 zhou1 女 nv3 ...
    aishell3/train/wav/SSB0005/SSB00050001.wav
    aishell3/test/...                 (same shape)

The root may be the corpus folder (holding train/ and test/) or one split. A content.txt line alternates
characters and their tone-numbered pinyin: the transcript is the characters, and the annotators' pinyin is kept
in `extra["pinyin"]` (space-separated, one syllable per character). The speaker is the folder under wav/.
Every audio file under wav/ becomes an utterance (text "" when content.txt has no line for it); a line whose
file is missing is a `missing` reject.
"""

from __future__ import annotations

import os
from typing import Any

from audiopipe.corpus.layouts.common import header, rel, speaker_from_folders, utterance
from audiopipe.corpus.records import Reject, Utterance
from audiopipe.errors import InvalidValue
from audiopipe.storage import guard

NAME = "aishell3"
EXPECTS = "content.txt beside a wav/ folder, in the folder itself or in train/ and test/"
SPLITS = ("train", "test")


def _splits(root: str) -> list[str]:
    if os.path.isfile(os.path.join(root, "content.txt")) and os.path.isdir(os.path.join(root, "wav")):
        return [root]
    return [os.path.join(root, s) for s in SPLITS
            if os.path.isfile(os.path.join(root, s, "content.txt")) and os.path.isdir(os.path.join(root, s, "wav"))]


def detect(root: str) -> bool:
    return bool(_splits(root))


Lost = list[tuple[int, guard.Refused]]


def read_content(path: str) -> tuple[dict[str, tuple[str, str]], dict[str, guard.Refused], Lost]:
    """content.txt -> ({file name: (characters, pinyin)}, {file name: why its line cannot be read}, [(line, why)]
    for lines that name no readable file); a line that does not alternate char/pinyin stops."""
    out: dict[str, tuple[str, str]] = {}
    refused: dict[str, guard.Refused] = {}
    lost: Lost = []
    try:
        for n, line in guard.text_lines(path, "content.txt", reason="bad_transcript"):
            if isinstance(line, guard.Refused):  # not UTF-8: refuse the file it names, if its name can be read
                first = (line.raw or b"").split(None, 1)[:1]
                try:
                    refused.setdefault(first[0].decode("utf-8"), line)
                except (IndexError, UnicodeDecodeError):
                    lost.append((n, line))
                continue
            parts = line.split()
            if not parts:
                continue
            name, rest = parts[0], parts[1:]
            if len(rest) % 2:
                raise InvalidValue(f"{path}:{n}: expected '<file> <char> <pinyin> <char> <pinyin> ...', got an odd "
                                   f"number of fields after {name}")
            out[name] = ("".join(rest[0::2]), " ".join(rest[1::2]))
    except guard.Refused as e:  # content.txt itself is a pipe or a folder
        raise InvalidValue(e.detail) from None
    return out, refused, lost


def discover(root: str, speaker_rule: int | None, options: Any = None) -> tuple[list[Utterance], list[Reject]]:
    utts: list[Utterance] = []
    rejects: list[Reject] = []
    for split in _splits(root):
        content_path = os.path.join(split, "content.txt")
        content, unreadable, lost = read_content(content_path)
        for n, why in lost:
            rejects.append(Reject(content_path, f"{rel(content_path, root)}:{n}", why.reason, why.detail))
        wav_root = os.path.join(split, "wav")
        seen: set[str] = set()
        for folder, dirs, files in os.walk(wav_root):
            dirs.sort()
            for name in sorted(files):
                if name.startswith(".") or not name.lower().endswith(".wav"):
                    continue
                path = os.path.join(folder, name)
                source = rel(path, root)
                seen.add(name)
                info, bad = header(path, source)
                if bad is not None:
                    rejects.append(bad)
                    continue
                if name in unreadable:
                    rejects.append(Reject(path, source, unreadable[name].reason, unreadable[name].detail))
                    continue
                text, pinyin = content.get(name, ("", ""))
                own = os.path.basename(folder) if folder != wav_root else ""
                extra = {"pinyin": pinyin, "language": "zh"} if pinyin else {"language": "zh"}
                utts.append(utterance(source.rsplit(".", 1)[0], path, source, info,
                                      speaker_from_folders(source, speaker_rule, own), text, extra))
        for name in sorted((set(content) | set(unreadable)) - seen):
            path = os.path.join(wav_root, name[:7], name)
            rejects.append(Reject(path, rel(path, root), "missing",
                                  f"content.txt lists {name} but there is no such file under {rel(wav_root, root)}/"))
    return utts, rejects
