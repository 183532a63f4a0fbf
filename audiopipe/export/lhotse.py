"""Export shards as a lhotse CutSet in lhotse Shar: audio, supervisions and the precomputed arrays, per shard.

    audiopipe export-lhotse --shards ./shards --out ./shar

One cut per utterance (cut id = utterance id), spanning its whole audio. Written with lhotse's own SharWriter,
one Shar shard per audiopipe shard:
  cuts.NNNNNN.jsonl.gz       the cuts: a supervision each (text, speaker, language, gender, kept columns in custom)
  recording.NNNNNN.tar       the shards' pcm as FLAC (lossless int16), with --audio pcm (the default when held)
  <feature>.NNNNNN.tar       each array as .npy (lossless): a custom field read with `cut.load_<feature>()`,
                             time first ([T, C]) as lhotse stores arrays; the Kaldi fbank a TemporalArray (with
                             its frame shift), every other array a plain Array (see _temporal: lhotse would cut
                             the last frame of centred features)
Read with `CutSet.from_shar(in_dir=...)`. With --audio source the cuts point at the corpus files instead
(nothing copied; see audiopipe/export/audio.py), with --audio none they have no recording.

The arrays are custom fields, not `cut.features`: lhotse requires a Features manifest to have exactly
round(duration / frame_shift) frames (its own extractors frame without snipping edges), and audiopipe's Kaldi
fbank has 2 fewer, its centred mels sometimes 1 more; lhotse refuses such a manifest (docs/export.md).
"""

from __future__ import annotations

import argparse
import io
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from audiopipe.export.audio import AUDIO_MODES, SourceAudio, from_pcm, resolve_mode
from audiopipe.export.errors import ExportError, need
from audiopipe.export.shardset import ArrayInfo, ShardSource, add_export_arguments, feature_list, progress_bar
from audiopipe.export.staging import staged_folder

# Names lhotse gives a meaning of its own on a cut or in a Shar folder: a feature may not take them.
_RESERVED = {"recording", "features", "cuts", "supervisions", "id", "start", "duration", "channel", "custom",
             "num_samples", "num_frames", "sampling_rate"}
_SUPERVISION_FIELDS = ("language", "gender")  # kept columns that lhotse's SupervisionSegment has a field for


def looks_like_shar(folder: Path) -> bool:
    return any(folder.glob("cuts.*.jsonl.gz"))


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _wav_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, pcm, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _temporal(info: ArrayInfo) -> bool:
    """Whether lhotse may treat the array as temporal: its duration-based reads (cut.load_<name>(), SharWriter)
    keep round(duration / frame_shift) frames, so only a framing that never has more frames than that loses
    nothing. Kaldi's snip_edges framing has 1 + (N - window) // hop; centred framings (mels, F0, energy) have
    1 + N // hop, one more than lhotse keeps for about half the utterances: those are plain Arrays."""
    return info.kind == "kaldi_fbank" and info.frame_shift is not None


def _array_field(info: ArrayInfo, value: np.ndarray, duration: float) -> Any:
    """lhotse's in-memory manifest of one array, time first: SharWriter stores its .npy in <feature>.N.tar."""
    from lhotse.array import Array, TemporalArray, seconds_to_frames

    data = value.T if value.ndim == 2 else value
    array = Array(storage_type="memory_npy", storage_path="", storage_key=_npy(data), shape=list(data.shape))
    if not _temporal(info):
        return array
    if seconds_to_frames(duration, info.frame_shift) < data.shape[0]:  # the docstring's guarantee, checked
        raise ExportError(f"{info.name}: {data.shape[0]} frames in {duration:.4f} s; lhotse would drop some")
    return TemporalArray(array=array, temporal_dim=0, frame_shift=info.frame_shift, start=0.0)


def _cut(row: dict[str, Any], arrays: dict[str, ArrayInfo], extra: list[str], audio: Any, duration: float):
    from lhotse import AudioSource, MonoCut, Recording, SupervisionSegment

    uid = row["id"]
    recording = None
    if audio is not None:
        source = (AudioSource(type="memory", channels=[0], source=_wav_bytes(audio.pcm, audio.sample_rate))
                  if audio.pcm is not None else AudioSource(type="file", channels=[0], source=audio.path))
        recording = Recording(id=uid, sources=[source], sampling_rate=audio.sample_rate,
                              num_samples=audio.num_samples, duration=audio.duration)
    fields = {k: row[k] for k in _SUPERVISION_FIELDS if k in extra and row.get(k) not in (None, "")}
    custom = {k: row[k] for k in extra if k not in fields and row.get(k) is not None}
    sup = SupervisionSegment(id=uid, recording_id=uid, start=0.0, duration=duration, channel=0, text=row["text"],
                             speaker=row["speaker"], custom=custom or None, **fields)
    return MonoCut(id=uid, start=0.0, duration=duration, channel=0, recording=recording, supervisions=[sup],
                   custom={name: _array_field(info, row[name], duration) for name, info in arrays.items()} or None)


def export_lhotse(shards_dir: str | Path, out_dir: str | Path, *, features: list[str] | None = None,
                  audio: str = "auto", overwrite: bool = False, progress: bool = False) -> dict[str, Any]:
    """Write a lhotse Shar folder at out_dir (see the module docstring); returns a summary."""
    need("lhotse", "export-lhotse")
    src = ShardSource(shards_dir, features)
    mode = resolve_mode(audio, src.pcm is not None)
    bad = sorted(set(src.arrays) & _RESERVED)
    if bad:
        raise ExportError(f"feature {', '.join(bad)} has a name lhotse reserves on a cut; it cannot be a Shar field")
    if not src.arrays and mode == "none":
        raise ExportError(f"{src.root}: with --audio none and no features there is nothing to export")
    sources = SourceAudio(src.corpus, src.trimmed, src.root) if mode == "source" else None
    src.open(pcm=mode == "pcm")
    pcm_rate = int(src.pcm.sample_rate) if mode == "pcm" else None

    from lhotse.audio.backend import audio_backend
    from lhotse.shar import SharWriter

    fields = {name: "numpy" for name in src.arrays}
    if mode == "pcm":
        fields = {"recording": "flac", **fields}
    rows = seconds = 0
    shar_shards = 0
    # The FLAC is written by soundfile: lhotse's default backend takes torchaudio whenever it is installed, and a
    # torchaudio built for another torch (pulled in by an extra's dependency) fails to load its library mid-export.
    with staged_folder(out_dir, overwrite=overwrite, looks_like=looks_like_shar, what="lhotse Shar",
                       marker_beside=True) as tmp, \
            progress_bar(len(src), "export-lhotse", progress) as bar, warnings.catch_warnings(), \
            audio_backend("LibsndfileBackend"):
        warnings.simplefilter("ignore")  # lhotse warns about every custom field it has not seen before
        for _, start, stop in src.shard_ranges():
            if stop == start:
                continue
            # One Shar shard per audiopipe shard: the same grouping, and one shard's rows in memory at most.
            with SharWriter(str(tmp), fields=fields, shard_size=None, shard_suffix=f".{shar_shards:06d}",
                            warn_unused_fields=False) as writer:
                for chunk in src.chunks(start, stop):
                    for row in chunk:
                        located = (from_pcm(row, pcm_rate) if mode == "pcm" else
                                   sources.locate(row) if sources is not None else None)
                        duration = located.duration if located is not None else float(row["duration"])
                        writer.write(_cut(row, src.arrays, src.extra_columns, located, duration))
                        rows += 1
                        seconds += duration
                    bar.update(len(chunk))
            shar_shards += 1
    return {"shards": str(src.root), "out": str(out_dir), "rows": rows, "hours": round(seconds / 3600, 6),
            "shar_shards": shar_shards, "audio": mode, "pcm_rate": pcm_rate,
            "arrays": {n: (a.channels, a.frame_shift, a.kind) for n, a in src.arrays.items()},
            "extra_columns": src.extra_columns}


def summary_lines(s: dict[str, Any]) -> list[str]:
    audio = {"pcm": f"recording (the shards' pcm as FLAC, {s['pcm_rate']} Hz)",
             "source": "recordings pointing at the corpus files", "none": "no audio"}[s["audio"]]
    arrays = [f"{n} [T, {c}]" if c else f"{n} [T]" for n, (c, _, _) in s["arrays"].items()]
    lines = [f"exported {s['rows']} cuts ({s['hours']:.3f} h) to {s['out']} as lhotse Shar, {s['shar_shards']} "
             f"shards: {audio}; arrays {', '.join(arrays) or 'none'}"]
    if s["extra_columns"]:
        lines.append(f"note: kept columns {', '.join(s['extra_columns'])} are in each supervision "
                     f"(language and gender as its fields, the others in its custom)")
    if any(kind == "kaldi_fbank" for _, _, kind in s["arrays"].values()):
        lines.append("note: the Kaldi fbank has 1 + (N - 400) // 160 frames (snip_edges), 2 fewer than lhotse's own "
                     "Fbank gives for the same audio: it is a custom field (cut.load_<name>()), not cut.features; "
                     "see docs/export.md")
    lines.append(f"read with: CutSet.from_shar(in_dir=\"{s['out']}\")")
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write the shards as a lhotse CutSet in lhotse Shar (cuts + audio + arrays, one Shar shard "
                     "per audiopipe shard), for lhotse's samplers and datasets, icefall and NeMo; see docs/export.md")
    add_export_arguments(
        p, out_help="Shar folder to write (a new or empty folder, or an earlier Shar export with --overwrite)",
        features_help="comma-separated array features to attach (default: every one the shards hold, pcm aside)",
        audio_choices=AUDIO_MODES,
        audio_help="pcm: the shards' pcm feature, as FLAC in recording.N.tar; source: point at the corpus files "
                   "(whole, mono, untrimmed only); none: no recordings; auto (default): pcm when the shards hold "
                   "it, else source",
        overwrite_help="replace an earlier Shar export in --out")


def run(args: argparse.Namespace) -> int:
    """The `audiopipe export-lhotse` command. Problems raise ExportError (a ValueError) for the CLI's error line."""
    summary = export_lhotse(args.shards, args.out, features=feature_list(args.features), audio=args.audio,
                            overwrite=args.overwrite, progress=not args.no_progress)
    for line in summary_lines(summary):
        print(line)
    return 0
