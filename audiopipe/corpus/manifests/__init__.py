"""Manifests written by other tools, read as `--manifest` (docs/corpus.md, Manifests).

`kind_of(path)` tells which reader a manifest path needs:

| kind | what | reader |
|---|---|---|
| `plain` | audiopipe's own JSONL/CSV/TSV (`path`, `id`, `text`, `speaker`) | audiopipe.corpus.transcripts |
| `lhotse` | lhotse recordings / supervisions / cuts, `.jsonl` or `.jsonl.gz` | lhotse.py (lhotse's parser) |
| `lhotse_shar` | a lhotse Shar folder (`cuts.000000.jsonl.gz` + `recording.000000.tar`) | lhotse.py |
| `nemo` | NeMo JSON-lines (`audio_filepath`, `duration`, `offset`, `text`) | nemo.py |
| `commonvoice` | Common Voice TSV (`path` under `clips/`, `sentence`, `client_id`) | commonvoice.py |
| `hf` | Hugging Face parquet / Arrow files or a `save_to_disk` folder with an `Audio` column | hf.py |

Every reader but `plain` returns `Entry` rows (audiopipe.corpus.entries), which `read_entries` turns into
utterances and rejects with one header read per audio. Each reader also says which of its columns it did not
use, so that discovery can name them once instead of dropping them silently.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from audiopipe.corpus.entries import Entry
from audiopipe.storage import guard

KINDS = ("plain", "lhotse", "lhotse_shar", "nemo", "commonvoice", "hf")
# Extra keys every reader may fill and the shard builder reads (language: per-line phones; textgrid: durations).
from audiopipe.corpus.hints import USED_EXTRA  # noqa: E402
# Types of lhotse manifest items, from their JSON fields (lhotse itself decides when it parses them).
_CUT_TYPES = ("MonoCut", "MultiCut", "MixedCut", "PaddingCut", "DataCut")
_LHOTSE_NAME = re.compile(r"(^|[_.-])(recordings|supervisions|cuts)([_.-]|$)")  # lhotse's file names


@dataclass
class Read:
    """What one reader made of its manifests."""

    entries: list[Entry] = field(default_factory=list)
    rejects: list[Any] = field(default_factory=list)  # Reject rows decided before any header is read
    notes: list[str] = field(default_factory=list)
    unused: set[str] = field(default_factory=set)  # columns read from the manifest and used for nothing


def regular_file(path: str, what: str = "manifest") -> str:
    """`path` made absolute, if it is a regular file (not a FIFO, device or folder), else FileNotFoundError /
    ValueError with one line (the check is audiopipe.storage.guard's)."""
    path = os.path.abspath(path)
    try:
        guard.regular(path, what)
    except guard.Refused as e:
        if e.reason == "missing":
            raise FileNotFoundError(f"{what} not found: {guard.shown(path)}") from None
        raise ValueError(f"{what} is not a regular file: {guard.shown(path)}") from None
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
    """(line, object) of a JSON-lines file (gzipped or not). A line that is not UTF-8 (or too long) comes as a
    guard.Refused in place of its object, for the caller to reject what it names; a line that is not a JSON
    object stops with `file:line`, as a malformed index does."""
    from audiopipe.corpus.transcripts import TranscriptError

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
                    raise TranscriptError(f"{shown}:{n}: not a JSON object per line ({e.msg})") from None
                except RecursionError:
                    raise TranscriptError(f"{shown}:{n}: JSON nested too deeply") from None
                if not isinstance(rec, dict):
                    raise TranscriptError(f"{shown}:{n}: expected a JSON object, got {type(rec).__name__}")
                yield n, rec
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TranscriptError(f"{shown}: not a gzip file, or cut short ({e})") from None


def _first_object(path: str) -> dict[str, Any] | None:
    """The first readable object of a JSON-lines file, which tells its kind (None: no line can be read)."""
    for _, rec in json_objects(path):
        if isinstance(rec, dict):
            return rec
    return None


def _lhotse_item(rec: dict[str, Any]) -> bool:
    if rec.get("type") in _CUT_TYPES:
        return True
    if "sources" in rec and "sampling_rate" in rec and "id" in rec:
        return True  # a Recording
    return {"recording_id", "start", "duration", "id"} <= rec.keys()  # a SupervisionSegment


def is_shar_folder(path: str) -> bool:
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return any(n.startswith("cuts.") and (n.endswith(".jsonl.gz") or n.endswith(".jsonl")) for n in names)


def kind_of(path: str) -> str:
    """Which reader `path` needs (a file or a folder), decided from its name and first row."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        names = set(os.listdir(path))
        if "state.json" in names or "dataset_dict.json" in names:
            return "hf"
        if is_shar_folder(path):
            return "lhotse_shar"
        from audiopipe.corpus.manifests.hf import table_files

        if table_files(path):
            return "hf"
        raise ValueError(f"{path} is a folder but not a manifest: expected a Hugging Face save_to_disk folder "
                         f"(state.json), a lhotse Shar folder (cuts.000000.jsonl.gz) or a folder of .parquet/"
                         f".arrow files; a folder of audio is given with --corpus")
    path = regular_file(path)
    name = os.path.basename(path).lower()
    if name.endswith((".parquet", ".arrow")):
        return "hf"
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith((".jsonl", ".json", ".ndjson")):
        first = _first_object(path)
        if first is not None and "audio_filepath" in first:
            return "nemo"
        if first is not None and _lhotse_item(first) or first is None and _LHOTSE_NAME.search(name):
            return "lhotse"  # (no line readable: lhotse's own reader says why, rather than another reader)
        return "plain"
    if stem.endswith(".tsv"):
        with open_binary(path) as f:
            first = next(guard.lines(f, guard.shown(path)), (1, ""))[1]
        if isinstance(first, guard.Refused):
            raise first
        head = first.split("\t")
        if "path" in head and "sentence" in head:
            return "commonvoice"
    return "plain"


def _need(module: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"reading {what} needs the {module} package: pip install -e \".[manifests]\" "
                           f"(or pip install {module})")


def read(kind: str, paths: list[str], root: str, speaker_rule: int | None, options: Any) -> Read:
    """Entries of the manifests of one kind (not `plain`)."""
    if kind in ("lhotse", "lhotse_shar"):
        _need("lhotse", "lhotse manifests")
    elif kind == "hf":
        _need("datasets", "a Hugging Face dataset")
    if kind == "nemo":
        from audiopipe.corpus.manifests import nemo as mod
    elif kind == "commonvoice":
        from audiopipe.corpus.manifests import commonvoice as mod
    elif kind in ("lhotse", "lhotse_shar"):
        from audiopipe.corpus.manifests import lhotse as mod
    elif kind == "hf":
        from audiopipe.corpus.manifests import hf as mod
    else:
        raise ValueError(f"no reader for manifest kind {kind!r}")
    # A manifest's speaker is taken in every --speaker mode, as for audiopipe's own manifests.
    return mod.read(paths, root, options) if kind != "lhotse_shar" else mod.read_shar(paths, root, options)


def source_of(path: str, root: str, written: str) -> str:
    """Utterance.source of a listed file: relative to the root when inside it, else the path as written."""
    from audiopipe.corpus.layouts.common import rel

    real_root = os.path.realpath(root)
    if path.startswith(root + os.sep):
        return rel(path, root)
    real = os.path.realpath(path)
    if real.startswith(real_root + os.sep):
        return rel(real, real_root)
    return written.replace(os.sep, "/")


def inside(path: str, root: str) -> bool:
    return path.startswith(root + os.sep) or os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


def pick_column(columns: list[str], given: str | None, usual: tuple[str, ...], flag: str, where: str) -> str | None:
    """The column to read a field from: the one the user named (which must exist), else the first usual name
    present, else None."""
    if given:
        if given not in columns:
            raise ValueError(f"{where}: no column {given!r} ({flag}); its columns are {', '.join(columns)}")
        return given
    return next((c for c in usual if c in columns), None)


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
