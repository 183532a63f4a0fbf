"""Hugging Face datasets: parquet files, Arrow files and `save_to_disk` folders with an `Audio` column.

    --manifest data/train-00000-of-00004.parquet       (repeat --manifest for more files)
    --manifest ./my_dataset                           (save_to_disk: state.json + data-*.arrow; a DatasetDict
                                                       folder: every split, ids prefixed with the split)
    --manifest ./data                                 (a folder of .parquet / .arrow files, read in name order)

The audio column is the one typed `Audio` in the dataset's features (read with `datasets.Features` from the
schema; `--audio-column` names another, a binary or `{bytes, path}` column). A row with embedded bytes is an
utterance whose path is the table file: discovery reads the header from the bytes, and the shard workers decode
the bytes in memory (audiopipe.decode.cells), never writing them to files. A row with a path only is the file
it names (relative paths from the dataset's folder). Text and speaker come from `--text-column` /
`--speaker-column`, else the first of the usual names present (text, sentence, transcription, ...; speaker,
speaker_id, client_id). The id is the `--id-column` (or `id`) value, else the audio's file name without
extension when every row has a distinct one, else `<table file>/<row>`.

Discovery reads the audio column once to learn each clip's length (a Parquet file row group by row group, an
Arrow file memory-mapped); nothing else is loaded, and columns that are not used are named in a note.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from audiopipe.corpus.entries import Entry, ordered_map, resolve_path
from audiopipe.corpus.hints import USED_EXTRA
from audiopipe.corpus.listings import plain_value, regular_file, text_of
from audiopipe.corpus.manifests.common import Read, pick_column, source_of
from audiopipe.corpus.wavheader import parse_wav_header
from audiopipe.decode.audio import RejectError
from audiopipe.decode.cells import cell_info, open_arrow
from audiopipe.errors import InvalidValue
from audiopipe.storage import guard

TEXT_COLUMNS = ("text", "sentence", "transcription", "transcript", "normalized_text", "raw_text")
SPEAKER_COLUMNS = ("speaker", "speaker_id", "client_id", "spk_id")
_BATCH_ROWS = 1024
_MAX_TABLE_FILES = 100_000


def table_files(folder: str) -> list[str]:
    """The .parquet and .arrow files under `folder` (three levels deep at most), sorted; hidden names skipped."""
    found: list[str] = []
    top = folder.rstrip(os.sep).count(os.sep)
    for d, dirs, files in os.walk(folder):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        if d.count(os.sep) - top >= 3:
            dirs[:] = []
        found += [os.path.join(d, f) for f in files if f.endswith((".parquet", ".arrow")) and not f.startswith(".")]
        if len(found) > _MAX_TABLE_FILES:
            raise InvalidValue(f"{folder}: more than {_MAX_TABLE_FILES} table files; name the ones to read")
    return sorted(found)


@dataclass
class _Table:
    path: str  # absolute
    prefix: str  # id prefix: "<split>/" for a DatasetDict split, else ""
    base: str  # folder that relative audio paths start from
    features: Any = None  # datasets.Features from a save_to_disk folder (else read from the file's schema)


def _tables(manifest: str) -> list[_Table]:
    manifest = os.path.abspath(manifest)
    if not os.path.isdir(manifest):
        return [_Table(regular_file(manifest), "", os.path.dirname(manifest))]
    names = set(os.listdir(manifest))
    if "state.json" in names or "dataset_dict.json" in names:
        import datasets

        loaded = datasets.load_from_disk(manifest)  # memory-maps the Arrow files, copies nothing
        splits = loaded.items() if isinstance(loaded, datasets.DatasetDict) else [("", loaded)]
        return [_Table(regular_file(f["filename"], "dataset file"), f"{split}/" if split else "", manifest,
                       ds.features) for split, ds in splits for f in ds.cache_files]
    return [_Table(regular_file(p, "dataset file"), "", manifest) for p in table_files(manifest)]


def _schema(t: _Table) -> Any:
    if t.path.endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_schema(t.path)
    return open_arrow(t.path).schema


def _audio_columns(schema: Any, features: Any) -> list[str]:
    """Columns typed `Audio` in the dataset's features (from a save_to_disk folder, or the schema's metadata)."""
    if features is None and schema.metadata and b"huggingface" in schema.metadata:
        from datasets import Features

        try:
            features = Features.from_arrow_schema(schema)
        except (ValueError, TypeError, KeyError, json.JSONDecodeError):
            features = None
    if features is None:
        return []
    from datasets import Audio

    return [name for name, f in features.items() if isinstance(f, Audio)]


@dataclass
class _Columns:
    audio: str
    audio_field: str | None  # "bytes" inside a {bytes, path} struct; None for a binary or string column
    text: str | None
    speaker: str | None
    id: str | None
    kept: list[str] = field(default_factory=list)
    unused: set[str] = field(default_factory=set)


def _columns(t: _Table, schema: Any, options: Any) -> _Columns:
    import pyarrow as pa

    names = list(schema.names)
    where = t.path
    audio = options.audio_column
    if audio:
        if audio not in names:
            raise InvalidValue(f"{where}: no column {audio!r} (audio_column=); its columns are {', '.join(names)}")
    else:
        typed = _audio_columns(schema, t.features)
        if len(typed) != 1:
            what = f"{len(typed)} columns typed Audio ({', '.join(typed)})" if typed else "no column typed Audio"
            raise InvalidValue(f"{where}: {what}; name the audio column with audio_column= (columns: "
                               f"{', '.join(names)})")
        audio = typed[0]
    typ = schema.field(audio).type
    if pa.types.is_struct(typ) and typ.get_field_index("bytes") >= 0:
        audio_field = "bytes"
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_string(typ) \
            or pa.types.is_large_string(typ):
        audio_field = None
    else:
        raise InvalidValue(f"{where}: column {audio!r} is {typ}, not audio bytes, a path, or a {{bytes, path}} struct")
    text = pick_column(names, options.text_column, TEXT_COLUMNS, "text_column=", where)
    speaker = pick_column(names, options.speaker_column, SPEAKER_COLUMNS, "speaker_column=", where)
    uid = pick_column(names, options.id_column, ("id",), "id_column=", where)
    keep = set(options.keep_columns) | set(USED_EXTRA)
    kept = [c for c in names if c in keep and c not in (audio, text, speaker, uid)]
    unused = set(names) - {audio, text, speaker, uid} - set(kept)
    return _Columns(audio, audio_field, text, speaker, uid, kept, unused)


@dataclass
class _FileRead:
    entries: list[Entry]
    names: list[str | None]  # the audio's own file name per entry (for ids), None when it has none
    cols: _Columns


def _header(buf: Any) -> Any:
    head = parse_wav_header(bytes(buf[:4096]), len(buf))
    return head if head is not None else cell_info(buf)


def _batches(t: _Table, columns: list[str]):
    """(row group or None, first row, record batch) over the table, only `columns` read."""
    if t.path.endswith(".parquet"):
        import pyarrow.parquet as pq

        with pq.ParquetFile(t.path) as pf:
            for g in range(pf.num_row_groups):
                yield g, 0, pf.read_row_group(g, columns=columns)
        return
    table = open_arrow(t.path).select(columns)
    for start in range(0, table.num_rows, _BATCH_ROWS):
        yield None, start, table.slice(start, _BATCH_ROWS)


def _read_file(t: _Table, root: str, options: Any) -> _FileRead:
    import pyarrow as pa

    cols = _columns(t, _schema(t), options)
    wanted = [c for c in (cols.audio, cols.text, cols.speaker, cols.id, *cols.kept) if c]
    wanted = list(dict.fromkeys(wanted))
    fmt = "parquet" if t.path.endswith(".parquet") else "arrow"
    file_source = source_of(t.path, root, t.path)
    entries: list[Entry] = []
    names: list[str | None] = []
    for group, first, batch in _batches(t, wanted):
        audio = batch.column(cols.audio).combine_chunks()
        present = audio.is_valid().to_pylist()
        if cols.audio_field is not None:  # Hugging Face's {bytes, path} struct
            blobs = audio.field(cols.audio_field)
            paths = audio.field("path").to_pylist() if audio.type.get_field_index("path") >= 0 \
                else [None] * len(audio)
        elif pa.types.is_string(audio.type) or pa.types.is_large_string(audio.type):
            blobs, paths = None, audio.to_pylist()
        else:
            blobs, paths = audio, [None] * len(audio)
        paths = [p if ok else None for p, ok in zip(paths, present)]
        texts = batch.column(cols.text).to_pylist() if cols.text else [None] * batch.num_rows
        speakers = batch.column(cols.speaker).to_pylist() if cols.speaker else [None] * batch.num_rows
        ids = batch.column(cols.id).to_pylist() if cols.id else [None] * batch.num_rows
        kept = {c: batch.column(c).to_pylist() for c in cols.kept}
        for i in range(batch.num_rows):
            row = first + i
            where = f"{os.path.basename(t.path)}#{row if group is None else f'{group}:{row}'}"
            extra = {c: v[i] for c, v in kept.items() if v[i] is not None and plain_value(v[i])}
            e = Entry(t.path, f"{file_source}#{row if group is None else f'{group}:{row}'}", where, None, extra=extra)
            try:  # a text column of lists, a speaker of structs: this row is refused, never its Python repr
                uid = text_of(ids[i], "id") or None
                e.id = t.prefix + uid if uid is not None and t.prefix else uid
                e.text, e.speaker = text_of(texts[i], "text"), text_of(speakers[i], "speaker")
            except guard.Refused as err:
                e.problem = (err.reason, err.detail)
            written = paths[i]
            blob = blobs[i] if blobs is not None and present[i] else None
            if e.problem is not None:
                pass  # refused above: its audio is not looked at
            elif blob is not None and blob.is_valid:
                buf = blob.as_buffer()
                try:
                    e.info = _header(memoryview(buf) if buf is not None else b"")
                except RejectError as err:
                    e.problem = (err.reason, err.detail)
                e.extra.update(cell_format=fmt, cell_column=cols.audio, cell_field=cols.audio_field, cell_row=row)
                if group is not None:
                    e.extra["cell_group"] = group
            elif written:
                e.path = resolve_path(str(written), t.base)
                e.source = source_of(e.path, root, str(written))
            else:
                e.problem = ("missing", "the audio cell has neither bytes nor a path")
            entries.append(e)
            base = os.path.basename(str(written)) if written else ""
            names.append(t.prefix + base.rsplit(".", 1)[0] if base else None)
    return _FileRead(entries, names, cols)


def read(paths: list[str], root: str, options: Any) -> Read:
    out = Read()
    tables = [t for p in paths for t in _tables(p)]
    if not tables:
        raise InvalidValue(f"no .parquet or .arrow file in {', '.join(paths)}")
    files = list(ordered_map(lambda t: _read_file(t, root, options), tables, threads=min(4, len(tables)),
                             block=1))
    names = [n for f in files for n in f.names]
    by_name = all(names) and len(set(names)) == len(names)
    for t, f in zip(tables, files):
        stem = os.path.splitext(os.path.basename(t.path))[0]
        for e, name in zip(f.entries, f.names):
            if e.id is None:
                e.id = name if by_name else f"{t.prefix}{stem}/{e.source.rsplit('#', 1)[-1].replace(':', '-')}"
            out.entries.append(e)
        out.unused |= f.cols.unused
    cols = files[0].cols
    said = [f"audio from column {cols.audio!r}"]
    said.append(f"text from {cols.text!r}" if cols.text else "no text column (name one with text_column=)")
    said.append(f"speaker from {cols.speaker!r}" if cols.speaker else "no speaker column (speaker_column=)")
    out.notes.append(f"Hugging Face dataset: {', '.join(said)}")
    return out
