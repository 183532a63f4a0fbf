"""Manifests written by other tools, read as `--manifest` (docs/corpus.md, Manifests).

`kind_of(path)` tells which reader a manifest path needs:

| kind | what | reader |
|---|---|---|
| `plain` | audiopipe's own JSONL/CSV/TSV (`path`, `id`, `text`, `speaker`) | plain.py (read by discovery itself) |
| `lhotse` | lhotse recordings / supervisions / cuts, `.jsonl` or `.jsonl.gz` | lhotse.py (lhotse's parser) |
| `lhotse_shar` | a lhotse Shar folder (`cuts.000000.jsonl.gz` + `recording.000000.tar`) | lhotse.py |
| `nemo` | NeMo JSON-lines (`audio_filepath`, `duration`, `offset`, `text`) | nemo.py |
| `commonvoice` | Common Voice TSV (`path` under `clips/`, `sentence`, `client_id`) | commonvoice.py |
| `hf` | Hugging Face parquet / Arrow files or a `save_to_disk` folder with an `Audio` column | hf.py |

Every reader but `plain` returns `Entry` rows (audiopipe.corpus.entries), which `resolve` turns into
utterances and rejects with one header read per audio. Each reader also says which of its columns it did not
use, so that discovery can name them once instead of dropping them silently.

May import: `audiopipe.corpus` (the records, entries and listed-file readers shared with discovery and the
layouts), `audiopipe.decode` (headers of audio cells and files), `audiopipe.storage` (the guarded opening of
manifests).
"""

from __future__ import annotations

import os
import re
from typing import Any

from audiopipe.corpus.listings import json_objects, open_binary, regular_file
from audiopipe.corpus.manifests import commonvoice, hf, lhotse, nemo
from audiopipe.corpus.manifests.common import Read
from audiopipe.errors import Failed, InvalidValue
from audiopipe.storage import guard

KINDS = ("plain", "lhotse", "lhotse_shar", "nemo", "commonvoice", "hf")
# Types of lhotse manifest items, from their JSON fields (lhotse itself decides when it parses them).
_CUT_TYPES = ("MonoCut", "MultiCut", "MixedCut", "PaddingCut", "DataCut")
_LHOTSE_NAME = re.compile(r"(^|[_.-])(recordings|supervisions|cuts)([_.-]|$)")  # lhotse's file names


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
        if hf.table_files(path):
            return "hf"
        raise InvalidValue(f"{path} is a folder but not a manifest: expected a Hugging Face save_to_disk folder "
                           f"(state.json), a lhotse Shar folder (cuts.000000.jsonl.gz) or a folder of .parquet/"
                           f".arrow files; a folder of audio is given as corpus=")
    path = regular_file(path)
    name = os.path.basename(path).lower()
    if name.endswith((".parquet", ".arrow")):
        return "hf"
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith((".jsonl", ".json", ".ndjson")):
        first = _first_object(path)
        if first is not None and "audio_filepath" in first:
            return "nemo"
        # By its items, or by lhotse's file names when the first readable line names no audio file (none
        # readable, or a damaged item): lhotse's reader then rejects each line it cannot parse.
        named = _LHOTSE_NAME.search(name) and (first is None or not {"path", "audio"} & first.keys())
        if first is not None and _lhotse_item(first) or named:
            return "lhotse"
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
        raise Failed(f"reading {what} needs the {module} package: pip install -e \".[manifests]\" "
                     f"(or pip install {module})")


def read(kind: str, paths: list[str], root: str, speaker_rule: int | None, options: Any) -> Read:
    """Entries of the manifests of one kind (not `plain`)."""
    if kind in ("lhotse", "lhotse_shar"):
        _need("lhotse", "lhotse manifests")
    elif kind == "hf":
        _need("datasets", "a Hugging Face dataset")
    readers = {"nemo": nemo, "commonvoice": commonvoice, "lhotse": lhotse, "lhotse_shar": lhotse, "hf": hf}
    if kind not in readers:
        raise InvalidValue(f"no reader for manifest kind {kind!r}")
    mod = readers[kind]
    # A manifest's speaker is taken in every --speaker mode, as for audiopipe's own manifests.
    return mod.read(paths, root, options) if kind != "lhotse_shar" else mod.read_shar(paths, root, options)


