"""Export shards as a NeMo JSON-lines manifest and the audio it names.

    audiopipe export-nemo --shards ./shards --out ./nemo

  manifest.json     one JSON object per utterance, in shard order:
                    {"audio_filepath", "duration", "offset", "text", "speaker", "lang"?, kept columns...}
  audio/<key>.wav   with --audio pcm (the default when the shards hold it): the shards' pcm, 16-bit WAV

The audio is written out because NeMo reads audio files and nothing else: the shards' pcm is exactly what the
features were computed from, and it is the only audio that exists for rows cut from long recordings, read from
tars or from Parquet bytes. <key> is the utterance's sample key (its id with `.` and other characters unsafe in
file names escaped, as in the WebDataset tars; a folder or file name over 200 bytes is cut short and ends with a
hash of the whole key). audio_filepath is relative to the manifest's folder, which NeMo
resolves against that folder, so the export can be moved as a whole. With --audio source nothing is copied: each
line points at the corpus file (absolute path), possible only where that file is the row's whole audio.

duration is the audio's length, written as the smallest float for which NeMo's reader (it reads
int(duration * sample_rate) samples) gets every sample; offset is 0.
"""

from __future__ import annotations

import argparse
import json
import math
import warnings
from pathlib import Path
from typing import Any

import soundfile as sf

from audiopipe.errors import AudiopipeWarning
from audiopipe.export.audio import SourceAudio, from_pcm, resolve_mode
from audiopipe.export.errors import ExportError
from audiopipe.export.shardset import ShardSource, add_export_arguments, progress_bar
from audiopipe.export.staging import staged_folder
from audiopipe.shard.keys import sample_key

MANIFEST = "manifest.json"
AUDIO_DIR = "audio"
_RESERVED = ("audio_filepath", "duration", "offset", "text", "speaker", "lang")


# A file name is at most 255 bytes on every common file system; ".wav" and room to spare.
_MAX_NAME_BYTES = 200


def audio_name(key: str) -> str:
    """The audio file's path under audio/ for a sample key: the key itself, each folder and file name that would
    be too long for a file system cut short and made unique with a hash of the whole key (the manifest line says
    which file is whose)."""
    import hashlib

    parts = key.split("/")
    if all(len(p.encode("utf-8")) <= _MAX_NAME_BYTES for p in parts):
        return key
    tag = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
    cut = [p.encode("utf-8")[:_MAX_NAME_BYTES - 17].decode("utf-8", "ignore") + f"-{tag}"
           if len(p.encode("utf-8")) > _MAX_NAME_BYTES else p for p in parts]
    return "/".join(cut)


def looks_like_nemo(folder: Path) -> bool:
    return (folder / MANIFEST).is_file()


def nemo_duration(num_samples: int, sample_rate: int) -> float:
    """Seconds such that int(seconds * sample_rate) == num_samples (N / sr alone is one sample short for ~4 %
    of lengths: the product rounds just below N)."""
    d = num_samples / sample_rate
    while int(d * sample_rate) < num_samples:
        d = math.nextafter(d, math.inf)
    return d


def export_nemo(shards_dir: str | Path, out_dir: str | Path, *, audio: str = "auto", overwrite: bool = False,
                progress: bool = False) -> dict[str, Any]:
    """Write manifest.json (+ audio/ with pcm) at out_dir (see the module docstring); returns a summary."""
    src = ShardSource(shards_dir, [])
    mode = resolve_mode(audio, src.pcm is not None, allow_none=False)
    clash = [c for c in src.extra_columns if c in _RESERVED and c != "language"]
    if clash:
        raise ExportError(f"kept column {', '.join(clash)} would overwrite a NeMo manifest key")
    sources = SourceAudio(src.corpus, src.trimmed, src.root) if mode == "source" else None
    pcm_rate = int(src.pcm.sample_rate) if mode == "pcm" else None
    src.open(pcm=mode == "pcm")
    rows = empty = 0
    seconds = 0.0
    with staged_folder(out_dir, overwrite=overwrite, looks_like=looks_like_nemo, what="NeMo") as tmp, \
            progress_bar(len(src), "export-nemo", progress) as bar, \
            open(tmp / MANIFEST, "w", encoding="utf-8", newline="\n") as f:
        for _, start, stop in src.shard_ranges():
            for chunk in src.chunks(start, stop):
                for row in chunk:
                    if mode == "pcm":
                        located = from_pcm(row, pcm_rate)
                        rel = f"{AUDIO_DIR}/{audio_name(sample_key(row['id']))}.wav"
                        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                        sf.write(str(tmp / rel), located.pcm, located.sample_rate, format="WAV",
                                 subtype="PCM_16")
                        path = rel
                    else:
                        located = sources.locate(row)
                        path = located.path
                    item = {"audio_filepath": path,
                            "duration": nemo_duration(located.num_samples, located.sample_rate),
                            "offset": 0.0, "text": row["text"], "speaker": row["speaker"]}
                    for c in src.extra_columns:
                        if row.get(c) is not None:
                            item["lang" if c == "language" else c] = row[c]
                    f.write(json.dumps(item, ensure_ascii=False) + "\n")
                    rows += 1
                    empty += not (row["text"] or "").strip()
                    seconds += located.duration
                bar.update(len(chunk))
    if empty:
        warnings.warn(AudiopipeWarning(f"{empty} of {rows} lines have an empty \"text\" (utterances without a "
                                       f"transcript); reshard with require_text=True to leave them out"), stacklevel=2)
    return {"shards": str(src.root), "out": str(out_dir), "rows": rows, "hours": round(seconds / 3600, 6),
            "audio": mode, "pcm_rate": pcm_rate, "extra_columns": src.extra_columns, "untranscribed": empty}


def summary_lines(s: dict[str, Any]) -> list[str]:
    audio = (f"audio/ holds the shards' pcm as 16-bit WAV ({s['pcm_rate']} Hz)" if s["audio"] == "pcm"
             else "audio_filepath points at the corpus files (absolute paths)")
    lines = [f"exported {s['rows']} utterances ({s['hours']:.3f} h) to {s['out']}/{MANIFEST}; {audio}"]
    if s["extra_columns"]:
        lines.append(f"note: kept columns {', '.join(s['extra_columns'])} are keys of each line"
                     + (" (language as lang)" if "language" in s["extra_columns"] else ""))
    lines.append(f"train with: manifest_filepath={s['out']}/{MANIFEST}")
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a NeMo JSON-lines manifest (audio_filepath, duration, offset, text, speaker) and the "
                     "audio it names; see docs/export.md")
    add_export_arguments(
        p, out_help="folder to write manifest.json and audio/ into (a new or empty folder, or an earlier export "
                    "with --overwrite)",
        audio_choices=("auto", "pcm", "source"),
        audio_help="pcm: write the shards' pcm as WAV files under audio/; source: point at the corpus files (whole, "
                   "mono, untrimmed only; nothing copied); auto (default): pcm when the shards hold it, else source",
        overwrite_help="replace an earlier export in --out")


def run(args: argparse.Namespace) -> int:
    """The `audiopipe export-nemo` command. Problems raise ExportError (a ValueError) for the CLI's error line."""
    summary = export_nemo(args.shards, args.out, audio=args.audio, overwrite=args.overwrite,
                          progress=not args.no_progress)
    for line in summary_lines(summary):
        print(line)
    return 0
