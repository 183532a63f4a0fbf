"""NeMo manifests: JSON lines with `audio_filepath`, `duration`, optional `offset`, `text`, `speaker`.

    {"audio_filepath": "wavs/long1.wav", "offset": 12.48, "duration": 3.2, "text": "...", "speaker": "s1"}

`audio_filepath` is relative to the manifest's folder (as NeMo resolves it) or absolute. `offset` and
`duration` are honoured as NeMo's loaders honour them: the utterance is that stretch of the file, cut from the
recording by seeking in it (audiopipe.decode.segments). A row from 0 to the file's end
(10 ms of rounding allowed) is the whole file. `lang` (NeMo's language tag) becomes `extra["language"]`. Ids:
the `--id-column` (or an `id` field), else the path without extension, with `_<start ms>-<end ms>` appended
for a stretch. `.json`, `.jsonl` and their `.gz` are read.
"""

from __future__ import annotations

import os
from typing import Any

from audiopipe.corpus.entries import Entry, resolve_path
from audiopipe.corpus.hints import LOCATION_EXTRA, USED_EXTRA
from audiopipe.corpus.listings import json_objects, kind_of_value, plain_value, regular_file, text_of
from audiopipe.corpus.manifests.common import Read, inside, source_of
from audiopipe.storage import guard


def _seconds(value: Any, name: str) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise guard.Refused("bad_value", f"{name} is {kind_of_value(value)}, not seconds")
    try:
        return float(value)  # nan and inf are refused by the cut (`bad_segment`), with the row's line
    except ValueError:
        raise guard.Refused("bad_value", f"{name} must be seconds, got {value!r:.40}") from None


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
            if isinstance(rec, guard.Refused):  # a line that is not UTF-8: the line itself is refused
                out.entries.append(Entry(manifest, where, where, None, problem=(rec.reason, rec.detail)))
                continue
            seen_keys.update(rec)
            written = rec.get(audio_key)
            if written is None or written == "":  # this row names no audio: it alone is refused
                out.entries.append(Entry(manifest, where, where, None, problem=(
                    "bad_value", f"{where}: no {audio_key!r} value; fields are {sorted(rec)}")))
                continue
            if not isinstance(written, str) or not written.strip() or guard.name_problem(written):
                what = kind_of_value(written) if not isinstance(written, str) else "not a file name"
                out.entries.append(Entry(manifest, where, where, None,
                                         problem=("bad_value", f"{audio_key} is {what}")))
                continue
            path = resolve_path(written.strip(), base)
            e = Entry(path, source_of(path, root, written), where, None)
            try:
                offset = _seconds(rec.get("offset"), "offset")
                duration = _seconds(rec.get("duration"), "duration")
                e.start = offset
                e.end = (offset or 0.0) + duration if duration is not None else None  # NeMo reads `duration` s
                e.extra = {k: v for k, v in rec.items()
                           if (k in keep or k in USED_EXTRA) and k not in LOCATION_EXTRA and plain_value(v)}
                if rec.get("lang") is not None and "language" not in e.extra:
                    e.extra["language"] = text_of(rec["lang"], "lang")
                given = rec.get(options.id_column or "id")
                e.id = text_of(given, "id") or None
                if isinstance(given, str) and e.id is not None and e.id != given:  # never changed silently
                    raise guard.Refused("bad_id", f"{where}: id {given!r:.80} has line breaks, tabs, or spaces "
                                                  f"at its ends or doubled; an id is kept as given: fix it")
                e.text = text_of(rec.get(text_key), text_key)
                e.speaker = next((text_of(rec[k], k) for k in speaker_keys if rec.get(k) is not None), "")
            except guard.Refused as err:
                e.problem = (err.reason, err.detail)
            if e.problem is None and e.id is None and not inside(path, root):
                e.problem = ("outside_root", f"{written} is not under the corpus root {root}; give it an id "
                                             f"(an id column) or a corpus folder above it")
            out.entries.append(e)
    out.unused = seen_keys - used - keep
    return out
