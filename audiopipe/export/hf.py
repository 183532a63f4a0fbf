"""Export shards as a Hugging Face `datasets` folder that `load_from_disk` memory-maps as it is: nothing copied.

    audiopipe export-hf --shards ./shards --out ./hf_dataset

The folder is what `Dataset.save_to_disk` writes, written by datasets' own ArrowWriter, one file per audiopipe
shard:
  data-NNNNN-of-MMMMM.arrow   Arrow IPC *stream* files with datasets' schema metadata (what its reader maps)
  dataset_info.json           the features
  state.json                  the file list
`datasets.load_from_disk(out)` opens them all, `Dataset.from_file(one.arrow)` one of them; both memory-map the
files (the dataset's `cache_files` are these files). Columns:
  id, speaker, text, source      string
  duration                       float32, seconds (as in the shards)
  audio                          Audio: the shards' pcm as 16-bit WAV bytes (--audio pcm), or the corpus file's
                                 path (--audio source), or absent (--audio none)
  <feature>                      Array2D(shape=(None, C)) time first, [T, C] (transpose for audiopipe's [C, T]);
                                 1-D features (f0, phones, ...) a Sequence of their dtype
  kept columns                   as in the shards (string, or integer trim offsets)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import soundfile as sf

from audiopipe.export.audio import AUDIO_MODES, SourceAudio, from_pcm, resolve_mode
from audiopipe.export.errors import ExportError, need
from audiopipe.export.shardset import (BASE_COLUMNS, ArrayInfo, ShardSource, add_export_arguments, feature_list,
                                        progress_bar)
from audiopipe.export.staging import staged_folder

STATE_JSON, INFO_JSON = "state.json", "dataset_info.json"  # datasets' config.DATASET_STATE_JSON_FILENAME / _INFO_


def looks_like_hf(folder: Path) -> bool:
    return (folder / STATE_JSON).is_file() and (folder / INFO_JSON).is_file()


def _features(src: ShardSource, mode: str, pcm_rate: int | None):
    from datasets import Array2D, Audio, Features, Sequence, Value

    feats: dict[str, Any] = {"id": Value("string"), "speaker": Value("string"), "text": Value("string"),
                             "source": Value("string"), "duration": Value("float32")}
    if mode != "none":
        feats["audio"] = Audio(sampling_rate=pcm_rate)  # source: each file at its own rate
    for name, info in src.arrays.items():
        feats[name] = (Array2D(shape=(None, info.channels), dtype=info.dtype) if info.channels
                       else Sequence(Value(info.dtype)))
    if src.extra_columns:
        extra = Features.from_arrow_schema(pa.schema([(n, src.extra_types[n]) for n in src.extra_columns]))
        feats.update(extra)
    return Features(feats)


def _array_column(values: list[np.ndarray], info: ArrayInfo) -> pa.Array:
    """Rows [C, T] -> list<list<dtype>> rows [T, C] (Array2D's storage), or [T] -> list<dtype>. One copy."""
    dtype = np.dtype(info.dtype)
    if not info.channels:
        offsets = np.zeros(len(values) + 1, np.int32)
        np.cumsum([v.shape[-1] for v in values], out=offsets[1:])
        flat = np.concatenate([np.asarray(v, dtype).reshape(-1) for v in values]) if values else np.zeros(0, dtype)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    frames = np.array([v.shape[-1] for v in values], np.int64)
    flat = np.concatenate([np.ascontiguousarray(np.asarray(v, dtype).T).reshape(-1) for v in values])
    inner = pa.ListArray.from_arrays(pa.array(np.arange(frames.sum() + 1, dtype=np.int32) * info.channels),
                                     pa.array(flat))
    outer = np.zeros(len(values) + 1, np.int32)
    np.cumsum(frames, out=outer[1:])
    return pa.ListArray.from_arrays(pa.array(outer), inner)


def _wav(pcm: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def export_hf(shards_dir: str | Path, out_dir: str | Path, *, features: list[str] | None = None,
              audio: str = "auto", overwrite: bool = False, progress: bool = False) -> dict[str, Any]:
    """Write a `save_to_disk` folder at out_dir (see the module docstring); returns a summary."""
    need("datasets", "export-hf")
    from datasets import DatasetInfo
    from datasets.arrow_writer import ArrowWriter

    src = ShardSource(shards_dir, features)
    mode = resolve_mode(audio, src.pcm is not None)
    taken = [n for n in src.arrays if n in ("audio", *BASE_COLUMNS) or n in src.extra_columns]
    if taken:
        raise ExportError(f"feature {', '.join(taken)} would share a column name with another column")
    sources = SourceAudio(src.corpus, src.trimmed, src.root) if mode == "source" else None
    pcm_rate = int(src.pcm.sample_rate) if mode == "pcm" else None
    src.open(pcm=mode == "pcm")
    feats = _features(src, mode, pcm_rate)
    schema = feats.arrow_schema
    ranges = [r for r in src.shard_ranges() if r[2] > r[1]]
    names = [f"data-{k:05d}-of-{len(ranges):05d}.arrow" for k in range(len(ranges))]
    # Deterministic: the same shards and options give the same fingerprint (datasets keys its caches on it).
    fingerprint = hashlib.sha256(json.dumps([src.manifest["index"]["sha256"], list(src.arrays), mode]).encode()
                                 ).hexdigest()[:16]
    rows = 0
    with staged_folder(out_dir, overwrite=overwrite, looks_like=looks_like_hf, what="Hugging Face") as tmp, \
            progress_bar(len(src), "export-hf", progress) as bar:
        for name, (_, start, stop) in zip(names, ranges):
            writer = ArrowWriter(features=feats, path=str(tmp / name), fingerprint=fingerprint)
            try:
                for chunk in src.chunks(start, stop):
                    cols: dict[str, Any] = {c: [r[c] for r in chunk] for c in ("id", "speaker", "text", "source")}
                    cols["duration"] = pa.array([r["duration"] for r in chunk], pa.float32())
                    if mode != "none":
                        located = [from_pcm(r, pcm_rate) if mode == "pcm" else sources.locate(r) for r in chunk]
                        cols["audio"] = pa.StructArray.from_arrays(
                            [pa.array([_wav(a.pcm, a.sample_rate) if a.pcm is not None else None for a in located],
                                      pa.binary()),
                             pa.array([f"{r['id']}.wav" if a.pcm is not None else a.path
                                       for r, a in zip(chunk, located)], pa.string())],
                            names=["bytes", "path"])
                    for a, info in src.arrays.items():
                        cols[a] = _array_column([r[a] for r in chunk], info)
                    for c in src.extra_columns:
                        cols[c] = pa.array([r.get(c) for r in chunk], src.extra_types[c])
                    table = pa.table({c: cols[c] for c in schema.names})
                    writer.write_table(table)
                    rows += len(chunk)
                    bar.update(len(chunk))
                writer.finalize()
            finally:
                writer.close()
        state = {"_data_files": [{"filename": n} for n in names], "_fingerprint": fingerprint,
                 "_format_columns": None, "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False,
                 "_split": None}
        (tmp / STATE_JSON).write_text(json.dumps(state, indent=2, sort_keys=True), encoding="utf-8")
        info = asdict(DatasetInfo(features=feats, description=f"audiopipe shards {src.root.name} "
                                                                f"(index {src.manifest['index']['sha256'][:16]})"))
        (tmp / INFO_JSON).write_text(json.dumps({k: info[k] for k in sorted(info)}, indent=2), encoding="utf-8")
    return {"shards": str(src.root), "out": str(out_dir), "rows": rows, "files": len(names), "audio": mode,
            "pcm_rate": pcm_rate, "columns": list(schema.names),
            "arrays": {n: a.channels for n, a in src.arrays.items()}}


def summary_lines(s: dict[str, Any]) -> list[str]:
    audio = {"pcm": f"audio (the shards' pcm as WAV bytes, {s['pcm_rate']} Hz)",
             "source": "audio (paths of the corpus files)", "none": "no audio"}[s["audio"]]
    arrays = [f"{n} Array2D [T, {c}]" if c else f"{n} [T]" for n, c in s["arrays"].items()]
    return [f"exported {s['rows']} rows to {s['out']} as {s['files']} Arrow files: {audio}; "
            f"{', '.join(arrays) or 'no arrays'}; columns {', '.join(s['columns'])}",
            f"read with: datasets.load_from_disk(\"{s['out']}\") (memory-mapped, nothing copied)"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write the shards as a Hugging Face datasets folder (save_to_disk layout, one Arrow file per "
                     "audiopipe shard) that load_from_disk or Dataset.from_file memory-map without copying; "
                     "features typed Array2D [T, C], pcm as an Audio column; see docs/export.md")
    add_export_arguments(
        p, out_help="dataset folder to write (a new or empty folder, or an earlier export with --overwrite)",
        features_help="comma-separated array features to export (default: every one the shards hold, pcm aside)",
        audio_choices=AUDIO_MODES,
        audio_help="pcm: the shards' pcm as WAV bytes in an Audio column; source: the corpus files' paths (whole, "
                   "mono, untrimmed only); none: no audio column; auto (default): pcm when the shards hold it, else "
                   "source",
        overwrite_help="replace an earlier export in --out")


def run(args: argparse.Namespace) -> int:
    """The `audiopipe export-hf` command. Problems raise ExportError (a ValueError) for the CLI's error line."""
    summary = export_hf(args.shards, args.out, features=feature_list(args.features), audio=args.audio,
                        overwrite=args.overwrite, progress=not args.no_progress)
    for line in summary_lines(summary):
        print(line)
    return 0
