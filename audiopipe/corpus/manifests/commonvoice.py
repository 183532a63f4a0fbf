"""Common Voice: a split's TSV (`validated.tsv`, `train.tsv`, ...) beside the `clips/` folder of MP3s.

    cv-corpus-17.0/en/validated.tsv    client_id  path  sentence_id  sentence  ...  age  gender  accents  locale
    cv-corpus-17.0/en/clips/common_voice_en_123.mp3

`path` is relative to `clips/` beside the TSV; `sentence` is the text, `client_id` the speaker (an anonymous
hash), the id is the clip's name without extension (`common_voice_en_123`, unique in a release), `locale`
becomes `extra["language"]`. Common Voice sentences hold unbalanced quotes, so the TSV is split on tabs with
no quoting (as Common Voice writes it). `--text-column`/`--speaker-column` choose other columns.
"""

from __future__ import annotations

import csv
import os
from typing import Any

from audiopipe.corpus.entries import Entry, resolve_path
from audiopipe.corpus.hints import USED_EXTRA
from audiopipe.corpus.listings import open_text, regular_file, text_of
from audiopipe.corpus.manifests.common import Read, pick_column, source_of
from audiopipe.corpus.transcripts import TranscriptError


def read(paths: list[str], root: str, options: Any) -> Read:
    out = Read()
    keep = set(options.keep_columns)
    for tsv in paths:
        tsv = regular_file(tsv)
        clips = os.path.join(os.path.dirname(tsv), "clips")
        name = os.path.basename(tsv)
        try:
            with open_text(tsv) as f:
                reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
                columns = list(reader.fieldnames or [])
                text_col = pick_column(columns, options.text_column, ("sentence",), "text_column=", tsv)
                spk_col = pick_column(columns, options.speaker_column, ("client_id",), "speaker_column=", tsv)
                id_col = pick_column(columns, options.id_column, (), "id_column=", tsv)
                used = {"path", text_col, spk_col, id_col, "locale", *USED_EXTRA}
                out.unused |= set(columns) - used - keep
                for row in reader:
                    where = f"{name}:{reader.line_num}"
                    written = (row.get("path") or "").strip()
                    if not written:
                        raise TranscriptError(f"{tsv}:{reader.line_num}: empty 'path'")
                    if "." not in os.path.basename(written):  # the first releases listed clips without .mp3
                        written += ".mp3"
                    path = resolve_path(written, clips)
                    extra = {k: row[k] for k in columns if (k in keep or k in USED_EXTRA) and row.get(k)}
                    if row.get("locale"):
                        extra.setdefault("language", row["locale"])
                    uid = text_of(row.get(id_col)) if id_col else os.path.splitext(os.path.basename(written))[0]
                    out.entries.append(Entry(path, source_of(path, root, written), where, uid or None,
                                             text_of(row.get(text_col)) if text_col else "",
                                             text_of(row.get(spk_col)) if spk_col else "", extra=extra))
        except (UnicodeDecodeError, csv.Error) as e:
            raise TranscriptError(f"{tsv}: not a UTF-8 tab-separated file ({e})") from None
    return out
