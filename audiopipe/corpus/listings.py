"""The files that list a corpus's audio (manifests, and layouts' own JSON index files), read as a reader must:
a regular file only (a FIFO or a folder is refused, never waited on), gunzipped when its name ends in .gz, UTF-8
with a BOM dropped, JSON one object per line; and the checks a listed value passes before it becomes a
transcript, a speaker or metadata (never its Python repr).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import zlib
from typing import Any, Iterator

from audiopipe.corpus.transcripts import TranscriptError
from audiopipe.errors import InvalidValue, NotFound
from audiopipe.storage import guard


def regular_file(path: str, what: str = "manifest") -> str:
    """`path` made absolute, if it is a regular file (not a FIFO, device or folder), else FileNotFoundError /
    ValueError with one line (the check is audiopipe.storage.guard's)."""
    path = os.path.abspath(path)
    try:
        guard.regular(path, what)
    except guard.Refused as e:
        if e.reason == "missing":
            raise NotFound(f"{what} not found: {guard.shown(path)}") from None
        raise InvalidValue(f"{what} is not a regular file: {guard.shown(path)}") from None
    return path


class _Gunzip(gzip.GzipFile):
    """A GzipFile over an open file that closes that file too (GzipFile leaves a file it was given open)."""

    def __init__(self, raw: Any):
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def open_binary(path: str):
    """A manifest's bytes, gunzipped when its name ends in .gz (opened by guard.open_regular: a file that became
    a pipe since regular_file looked at it does not block)."""
    raw = guard.open_regular(path, "manifest")
    return _Gunzip(raw) if path.endswith(".gz") else raw


def open_text(path: str):
    """A text manifest for reading (UTF-8, a BOM dropped), gunzipped when its name ends in .gz."""
    return io.TextIOWrapper(open_binary(path), encoding="utf-8-sig", newline="")


def json_objects(path: str) -> Iterator[tuple[int, dict[str, Any] | guard.Refused]]:
    """(line, object) of a JSON-lines file (gzipped or not). A line that is not UTF-8 (or too long), not JSON,
    or JSON but not an object comes as a guard.Refused in place of its object (`bad_json` naming `file:line`
    for the last two), for the caller to reject that line alone: one bad row never stops the others. A file
    that is not gzip, or is cut short inside its compression, stops with one line."""
    shown = guard.shown(path)
    try:
        with open_binary(path) as f:
            for n, line in guard.lines(f, shown, "jsonl line"):
                if isinstance(line, guard.Refused):
                    yield n, line
                    continue
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    yield n, guard.Refused("bad_json", f"{shown}:{n}: not JSON ({e.msg} at column {e.colno})")
                    continue
                except RecursionError:
                    yield n, guard.Refused("bad_json", f"{shown}:{n}: JSON nested too deeply")
                    continue
                if not isinstance(rec, dict):
                    yield n, guard.Refused("bad_json", f"{shown}:{n}: a JSON {type(rec).__name__}, not a JSON "
                                                       f"object")
                    continue
                yield n, rec
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TranscriptError(f"{shown}: not a gzip file, or cut short ({e})") from None


def text_of(value: Any, name: str = "text") -> str:
    """A transcript, speaker or id cell as a single-spaced string ("" for null); a number is its decimal text.
    A list, an object, true/false or bytes is a guard.Refused("bad_value") naming the field: never stored as
    its Python repr."""
    if value is None:
        return ""
    if isinstance(value, str):
        lone = next((c for c in value if "\ud800" <= c <= "\udfff"), None) if not value.isascii() else None
        if lone is not None:  # JSON may escape one ("\ud800"); no text holds it, and Arrow cannot store it
            raise guard.Refused("bad_value", f"{name} holds the lone surrogate U+{ord(lone):04X}, which is not text")
        return " ".join(value.split())
    if isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and math.isfinite(value):
        return str(value)
    raise guard.Refused("bad_value", f"{name} is {kind_of_value(value)}, not a string")


def kind_of_value(value: Any) -> str:
    """What a JSON / table value is, in words, for messages (never its contents)."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} fields"
    if isinstance(value, float):
        return f"the number {value}"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"{len(value)} bytes"
    return f"a {type(value).__name__}"


def plain_value(value: Any) -> bool:
    """Whether a metadata value can travel in the plan (JSON) and into a text column."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return len(value) <= 64 and all(plain_value(v) for v in value)
    if isinstance(value, dict):
        return len(value) <= 64 and all(isinstance(k, str) and plain_value(v) for k, v in value.items())
    return False
