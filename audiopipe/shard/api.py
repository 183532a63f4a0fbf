"""`shard(...)`: run a shard job from Python, as `audiopipe shard` does from the command line.

    from audiopipe.shard.api import shard
    summary = shard("./wavs", "./shards", preset="f5tts", workers=2)
    print(summary.written, summary.hours)

The keyword arguments are the command's options (docs/shard.md), with their defaults; the command line is a
thin layer over this function, so both check the same things and refuse the same inputs, with the same one-line
`JobError`. Returns the job's `Summary`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from audiopipe.shard.checksum import ALGORITHMS, DEFAULT as DEFAULT_CHECKSUM
from audiopipe.shard.job import ENGINES, BertSettings, CodecSettings, Job, JobError

if TYPE_CHECKING:
    from audiopipe.corpus.options import CorpusOptions
    from audiopipe.shard.run import Summary

LAYOUTS = ("auto", "files", "kaldi", "aishell3", "libritts", "vctk", "emilia")

__all__ = ["shard", "build_job", "JobError"]


def _number(name: str, value: float, *, low: float | None = None, high: float | None = None,
            low_open: bool = False) -> float:
    """`value` if it is a finite number inside the bounds, else a one-line JobError naming the option."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise JobError(f"{name}={value!r}: must be a number") from None
    if not math.isfinite(x):
        raise JobError(f"{name}={value!r}: must be a finite number")
    if low is not None and (x <= low if low_open else x < low):
        raise JobError(f"{name}={value!r}: must be {'more than' if low_open else 'at least'} {low:g}")
    if high is not None and x > high:
        raise JobError(f"{name}={value!r}: must be at most {high:g}")
    return x


def _integer(name: str, value: int | None, low: int, high: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobError(f"{name}={value!r}: must be a whole number")
    if value < low or (high is not None and value > high):
        raise JobError(f"{name}={value}: must be "
                       f"{f'between {low} and {high}' if high is not None else f'at least {low}'}")
    return value


def _manifests(manifest: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None) -> list[str]:
    """The manifest paths, absolute (one or several; a folder too: a Shar or save_to_disk folder)."""
    if manifest is None or manifest == [] or manifest == ():
        return []
    items = [manifest] if isinstance(manifest, (str, os.PathLike)) else list(manifest)
    paths = [str(Path(m).resolve()) for m in items]
    for m in paths:
        if not Path(m).exists():
            raise JobError(f"manifest not found: {m}")
    return paths


def _corpus_root(corpus: str | Path | None, manifests: list[str]) -> Path:
    """--corpus, or (with --manifest alone) the first manifest's folder, which its relative paths start from."""
    if corpus is None and not manifests:
        raise JobError("give corpus=FOLDER (a folder of audio), or manifest=PATH (a manifest that lists it)")
    first = Path(manifests[0]) if manifests else None
    root = Path(corpus) if corpus is not None else (first if first.is_dir() else first.parent)
    if not root.is_dir():
        raise JobError(f"corpus folder not found: {root}")
    return root


def _shard_seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 64:
        raise JobError(f"shard_seed={value!r}: must be an integer in 0..2**64-1, or None")
    return value


def _keep_columns(keep: str | Sequence[str] | None) -> list[str]:
    if not keep:
        return []
    return [c.strip() for c in (keep.split(",") if isinstance(keep, str) else keep) if c.strip()]


_KEEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_keep_columns(keep: list[str], features: list[tuple[str, dict]]) -> None:
    """--keep-columns names that cannot clash with a column the shards already have (their features, the length
    index's `<feature>_frames`, trimming and phones)."""
    if not keep:
        return
    from audiopipe.shard.build import make_feature

    taken = {"id", "speaker", "text", "source", "duration", "trim_start", "trim_end", "phones", "durations",
             "codes", "shard", "row"}
    taken |= {s.name for kind, params in features for s in make_feature(kind, params).specs}
    for name in keep:
        if not _KEEP_NAME.fullmatch(name) or name.endswith("_frames"):
            raise JobError(f"keep_columns={name!r}: not a column name (letters, digits and _, not ending "
                           f"in _frames)")
        if name in taken:
            raise JobError(f"keep_columns={name!r}: already a column of these shards")
    if len(set(keep)) != len(keep):
        raise JobError("keep_columns= names a column twice")


def build_job(corpus: str | Path | None = None, out: str | Path = "./shards", *, preset: str = "f5tts",
              features: str | list[str] | None = None,
              manifest: str | Path | Sequence[str | Path] | None = None, language: str = "en",
              shard_size: int | None = None, shard_seed: int | None = 0, min_duration: float = 0.3,
              max_duration: float = 30.0, max_channels: int = 2, silence_dbfs: float = -60.0, tar: bool = True,
              checksum: str = DEFAULT_CHECKSUM, codec_checkpoint: str | Path | None = None,
              codec_random_init: bool = False, codec_batch_size: int = 8,
              bert_checkpoint: str | Path | None = None, keep_columns: str | Sequence[str] | None = None,
              staging: str | None = None, break_lock: bool = False) -> Job:
    """Check the options and make the Job they describe (no corpus is read; nothing beyond the presets is
    imported, unless keep_columns are named: they are checked against the features' columns)."""
    return _build(corpus, out, preset=preset, features=features, manifest=manifest, language=language,
                  shard_size=shard_size, shard_seed=shard_seed, min_duration=min_duration,
                  max_duration=max_duration, max_channels=max_channels, silence_dbfs=silence_dbfs, tar=tar,
                  checksum=checksum, codec_checkpoint=codec_checkpoint, codec_random_init=codec_random_init,
                  codec_batch_size=codec_batch_size, bert_checkpoint=bert_checkpoint, keep_columns=keep_columns,
                  staging=staging, break_lock=break_lock)[0]


def _build(corpus: str | Path | None, out: str | Path, *, preset: str, features: str | list[str] | None,
           manifest: Any, language: str, shard_size: int | None, shard_seed: int | None, min_duration: float,
           max_duration: float, max_channels: int, silence_dbfs: float, tar: bool, checksum: str,
           codec_checkpoint: str | Path | None, codec_random_init: bool, codec_batch_size: int,
           bert_checkpoint: str | Path | None, keep_columns: str | Sequence[str] | None, staging: str | None,
           break_lock: bool) -> tuple[Job, Any, list[str]]:
    """build_job, plus the resolved preset and the manifest paths (for the corpus options)."""
    from audiopipe.decode.audio import DecodeLimits
    from audiopipe.presets import resolve
    from audiopipe.storage.s3 import is_s3, parse_s3

    manifests = _manifests(manifest)
    corpus = _corpus_root(corpus, manifests)
    # Numbers: finite and ordered, or one line now (NaN compares false with everything: a --min-duration nan
    # would reject every clip and write nothing).
    lo = _number("min_duration", min_duration, low=0)
    hi = _number("max_duration", max_duration, low=0, low_open=True)
    if lo >= hi:
        raise JobError(f"min_duration={min_duration:g} must be less than max_duration={max_duration:g} (seconds)")
    silence = _number("silence_dbfs", silence_dbfs, high=0)
    _integer("max_channels", max_channels, 1)
    _integer("codec_batch_size", codec_batch_size, 1)
    if shard_size is not None:
        _integer("shard_size", shard_size, 1)
    seed = _shard_seed(shard_seed)
    if checksum not in ALGORITHMS:
        raise JobError(f"unknown checksum {checksum!r}; choose from {', '.join(ALGORITHMS)}")
    if language not in ("en", "zh", "mixed", "auto"):
        raise JobError(f"unknown language {language!r}; choose from en, zh, mixed, auto")
    try:
        chosen = resolve([n.strip() for n in preset.split(",") if n.strip()])
    except ValueError as e:
        raise JobError(str(e)) from e
    feats = list(chosen.features)
    if features:
        from audiopipe.features.names import NAMES, feature_kinds

        kinds, bad = feature_kinds([k.strip() for k in (features.split(",") if isinstance(features, str)
                                                        else features) if k.strip()])
        if bad:
            raise JobError(f"unknown feature {', '.join(bad)}; choose from {', '.join(NAMES)}")
        feats = [(k, {}) for k in kinds]
    if language != "en" and chosen.codec:
        raise JobError("a language other than en (zh, mixed, auto) gives GPT-SoVITS phone ids; the ns2 preset reads ARPAbet ids "
                       "(MFA TextGrids), so it takes language='en' only")
    bert = None
    if bert_checkpoint:
        if not chosen.phones or language == "en":
            raise JobError("bert_checkpoint= gives GPT-SoVITS's per-phone BERT features: it needs a preset with "
                           "phones (gpt_sovits) and a language other than en (zh, mixed or auto)")
        if not Path(bert_checkpoint).is_dir():
            raise JobError(f"BERT checkpoint folder not found: {bert_checkpoint}")
        bert = BertSettings(checkpoint=str(Path(bert_checkpoint).resolve()))
    codec = None
    if chosen.codec:
        if not codec_checkpoint and not codec_random_init:
            raise JobError("preset ns2 needs codec weights: codec_checkpoint=DIR (a local EnCodec 24 kHz "
                           "folder), or codec_random_init=True for a demo")
        if codec_checkpoint and not Path(codec_checkpoint).is_dir():
            raise JobError(f"codec checkpoint folder not found: {codec_checkpoint}")
        codec = CodecSettings(checkpoint=str(Path(codec_checkpoint).resolve()) if codec_checkpoint else None,
                              random_init=bool(codec_random_init and not codec_checkpoint),
                              batch_size=codec_batch_size)
    keep = _keep_columns(keep_columns)
    _check_keep_columns(keep, feats)
    limits = DecodeLimits(min_duration=lo, max_duration=hi, max_channels=max_channels, silence_dbfs=silence)
    out_s = str(out)
    out_s = str(parse_s3(out_s)) if is_s3(out_s) else str(Path(out_s).resolve())
    if (staging or break_lock) and not is_s3(out_s):
        raise JobError("staging= and break_lock=True are for an s3:// out= (a local folder is written in place "
                       "and its lock is released by the kernel when its holder dies)")
    job = Job(corpus=str(corpus.resolve()), out=out_s,
              presets=["custom"] if features else chosen.description.split("+"),
              features=feats, limits=asdict(limits), trim=chosen.trim, phones=chosen.phones, codec=codec,
              align_to=chosen.align_to if chosen.codec else None, shard_bytes=shard_size or 0,
              write_tar=tar, language=language if chosen.phones else "en",  # only phones read it
              checksum=checksum, keep_columns=keep, shard_seed=seed, bert=bert)
    return job, chosen, manifests


def _corpus_options(job: Job, chosen: Any, preset: str, *, text_column: str | None, speaker_column: str | None,
                    audio_column: str | None, id_column: str | None, vctk_mic: str, require_text: bool,
                    custom_features: bool) -> "CorpusOptions":
    """What discovery is told beyond the root and the manifest (audiopipe.corpus.options)."""
    from audiopipe.corpus.options import VCTK_MICS, CorpusOptions

    if vctk_mic not in VCTK_MICS:
        raise JobError(f"unknown VCTK microphone {vctk_mic!r}; choose from {', '.join(VCTK_MICS)}")
    return CorpusOptions(text_column=text_column, speaker_column=speaker_column, audio_column=audio_column,
                         id_column=id_column, vctk_mic=vctk_mic, keep_columns=tuple(job.keep_columns),
                         require_text=require_text,
                         text_for=f"preset={preset!r}" if chosen.transcripts and not custom_features else None)


def shard(corpus: str | Path | None = None, out: str | Path = "./shards", *, preset: str = "f5tts",
          features: str | list[str] | None = None, manifest: str | Path | Sequence[str | Path] | None = None,
          speaker: str = "auto", layout: str = "auto", language: str = "en", workers: int | None = None,
          engine: str = "auto", nice: int | None = None, ray_address: str | None = None,
          shard_size: int | None = None, shard_seed: int | None = 0, min_duration: float = 0.3,
          max_duration: float = 30.0, max_channels: int = 2, silence_dbfs: float = -60.0, tar: bool = True,
          checksum: str = DEFAULT_CHECKSUM, codec_checkpoint: str | Path | None = None,
          codec_random_init: bool = False, codec_batch_size: int = 8, bert_checkpoint: str | Path | None = None,
          keep_columns: str | Sequence[str] | None = None, text_column: str | None = None,
          speaker_column: str | None = None, audio_column: str | None = None, id_column: str | None = None,
          vctk_mic: str = "mic1", require_text: bool = False, staging: str | None = None,
          break_lock: bool = False, progress: bool = False) -> Summary:
    """Extract `corpus` (or what `manifest` lists: one path or several; corpus then defaults to the first
    manifest's folder) into shards under `out` (a folder or s3://bucket/prefix) and return the job's Summary.

    What is computed: preset, comma-separated: "f5tts" (vocos mel), "eres2net"/"campplus" (Kaldi fbank + pcm),
    "gpt_sovits" (phones, pcm), "ns2" (codec codes, F0, energy, phones; needs codec_checkpoint or
    codec_random_init); or features, a list of feature names ("mel", "fbank", "f0", "energy", "pcm", ...).
    language "en", "zh" or "auto" (phones); keep_columns: manifest columns written as shard columns.
    Where texts and speakers come from: speaker "auto" (folder layout), layout "auto" or a corpus layout
    ("kaldi", "libritts", "vctk", ...), text_column/speaker_column/audio_column/id_column for manifests,
    require_text=True refuses utterances without a transcript.
    What is kept: min_duration/max_duration (seconds), max_channels, silence_dbfs (quieter files are rejected).
    How it runs: workers None, one per CPU of this machine; 0, in this process only (no other process, no
    Ray); more than the CPUs here: capped, and the summary's notes say so. engine: "auto" (local worker
    processes unless a cluster, a codec stage or a large job needs Ray), "local" or "ray"; ray_address for a
    cluster; progress=True shows a bar. shard_size (utterances a shard) and shard_seed set the plan.
    Raises JobError (one line, an AudiopipeError) for anything the caller can fix. docs/shard.md has the rest."""
    _integer("workers", workers, 0)
    _integer("nice", nice, -20, 19)
    if engine not in ENGINES:
        raise JobError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if layout not in LAYOUTS:
        raise JobError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    job, chosen, manifests = _build(
        corpus, out, preset=preset, features=features, manifest=manifest, language=language,
        shard_size=shard_size, shard_seed=shard_seed, min_duration=min_duration, max_duration=max_duration,
        max_channels=max_channels, silence_dbfs=silence_dbfs, tar=tar, checksum=checksum,
        codec_checkpoint=codec_checkpoint, codec_random_init=codec_random_init, codec_batch_size=codec_batch_size,
        bert_checkpoint=bert_checkpoint, keep_columns=keep_columns, staging=staging, break_lock=break_lock)
    options = _corpus_options(job, chosen, preset, text_column=text_column, speaker_column=speaker_column,
                             audio_column=audio_column, id_column=id_column, vctk_mic=vctk_mic,
                             require_text=require_text, custom_features=bool(features))
    from audiopipe.shard.run import run_job

    return run_job(job, workers=workers, ray_address=ray_address, manifest=manifests or None, speaker=speaker,
                   show_progress=progress, layout=layout, nice=nice, staging=staging, break_lock=break_lock,
                   engine=engine, corpus_options=options)
