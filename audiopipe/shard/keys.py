"""Sample keys: how an utterance id becomes the name of its samples in a WebDataset tar.

The mapping is an escape, not a replacement, so two ids never share a key and the id can be read back from the
key. WebDataset splits a member name `<key>.<ext>` at the first dot of its basename, so `.` must not appear in a
key; `%` is escaped so that the escape itself stays unambiguous; backslashes, control characters and the
characters Windows refuses in file names are escaped so that a tar extracted anywhere gives the same names.
Every escaped character is below U+0100 and becomes `%XX` (two upper-case hex digits of its code point).

Keys that differ only in letter case or Unicode normalisation would land on one file on a case-insensitive disk
(macOS, Windows); `fold` gives the form under which keys must also be distinct (checked at plan time).
"""

from __future__ import annotations

import re
import unicodedata

# '.' splits key from extension in WebDataset, '%' is the escape itself, the rest are unsafe in file names.
_ESCAPED = frozenset('%.\\:*?"<>|') | frozenset(chr(c) for c in range(0x20)) | frozenset(
    chr(c) for c in range(0x7F, 0xA0))
_UNESCAPE = re.compile(r"%([0-9A-F]{2})")


def sample_key(utt_id: str) -> str:
    """The WebDataset key of utterance `utt_id`: injective, dot-free, and `key_to_id` gives the id back."""
    if _ESCAPED.isdisjoint(utt_id):  # most ids: nothing to escape (one set operation, not a loop per character)
        return utt_id
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in utt_id)


def key_to_id(key: str) -> str:
    if "%" not in key:
        return key
    return _UNESCAPE.sub(lambda m: chr(int(m.group(1), 16)), key)


def fold(key: str) -> str:
    """What a case-insensitive, normalising file system sees: two keys with the same fold would collide there."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", key).casefold())


def member_name_problem(name: str) -> str | None:
    """Why `name` must not be a tar member name (it would be absolute or leave the archive's folder), or None."""
    if not name:
        return "is empty"
    if name.startswith("/"):
        return "is absolute"
    if "\\" in name or "\x00" in name:
        return "contains a backslash or NUL"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "has an empty, '.' or '..' path segment"
    return None
