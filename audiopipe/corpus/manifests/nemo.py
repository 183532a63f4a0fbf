"""NeMo manifests: JSON lines with `audio_filepath`, `duration`, optional `offset`, `text`, `speaker`.

    {"audio_filepath": "wavs/long1.wav", "offset": 12.48, "duration": 3.2, "text": "...", "speaker": "s1"}

`audio_filepath` is relative to the manifest's folder (as NeMo resolves it) or absolute. `offset` and
`duration` are honoured as NeMo's loaders honour them: the utterance is that stretch of the file, cut from the
recording, which is decoded once for all its rows (audiopipe.corpus.entries). A row from 0 to the file's end
(10 ms of rounding allowed) is the whole file. `lang` (NeMo's language tag) becomes `extra["language"]`. Ids:
the `--id-column` (or an `id` field), else the path without extension, with `_<start ms>-<end ms>` appended
for a stretch. `.json`, `.jsonl` and their `.gz` are read.
"""

from __future__ import annotations

import os
from typing import Any

from audiopipe.corpus.entries import Entry, resolve_path
from audiopipe.corpus.manifests import (USED_EXTRA, Read, inside, json_objects, plain_value, regular_file,
                                        source_of, text_of)
from audiopipe.corpus.transcripts import TranscriptError


def _seconds(value: Any, name: str, where: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TranscriptError(f"{where}: {name} must be seconds, got {value!r}") from None


def read(paths: list[str], root: str, options: Any) -> Read:
    out = Read()
    audio_key = options.audio_column or "audio_filepath"
    text_key = options.text_column or "text"
    speaker_keys = (options.speaker_column,) if options.speaker_column else ("speaker", "speaker_id")
    keep = set(options.keep_columns)
    seen_keys: set[str] = set()
    used = {audio_key, text_key, "offset", "duration", "lang", *speaker_keys, *USED_EXTRA}
    if options.id_column:
        used.add(options.id_column)
    for manifest in paths:
        manifest = regular_file(manifest)
        base = os.path.dirname(manifest)
        name = os.path.basename(manifest)
        for n, rec in json_objects(manifest):
            where = f"{name}:{n}"
            seen_keys.update(rec)
            written = rec.get(audio_key)
            if not isinstance(written, str) or not written.strip():
                raise TranscriptError(f"{manifest}:{n}: no {audio_key!r} value; fields are {sorted(rec)}")
            path = resolve_path(written.strip(), base)
            offset = _seconds(rec.get("offset"), "offset", where)
            duration = _seconds(rec.get("duration"), "duration", where)
            end = (offset or 0.0) + duration if duration is not None else None  # NeMo reads `duration` s
            extra = {k: v for k, v in rec.items() if (k in keep or k in USED_EXTRA) and plain_value(v)}
            if rec.get("lang") is not None and "language" not in extra:
                extra["language"] = str(rec["lang"])
            uid = rec.get(options.id_column or "id")
            speaker = next((text_of(rec[k]) for k in speaker_keys if rec.get(k) is not None), "")
            e = Entry(path, source_of(path, root, written), where, text_of(uid) or None,
                      text_of(rec.get(text_key)), speaker, offset, end, extra)
            if e.id is None and not inside(path, root):
                e.problem = ("outside_root", f"{written} is not under the corpus root {root}; give it an id "
                                             f"(--id-column) or pass a --corpus folder above it")
            out.entries.append(e)
    out.unused = seen_keys - used - keep
    return out
