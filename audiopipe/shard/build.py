"""Build one shard: decode each utterance once, compute every feature, write Arrow + tar, record completion.

This is a plain function; the Ray runner only decides where it runs. Every input either becomes a row or a
reject with a reason: nothing is dropped silently, and one bad file never fails the shard.
"""

from __future__ import annotations

import json
import os
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from audiopipe.decode.audio import DecodeLimits, RejectError, resample_to
from audiopipe.decode.segments import RecordingCache
from audiopipe.errors import Failed, InvalidValue, WrongType
from audiopipe.features.base import FeatureSpec
from audiopipe.features.mel import stft_magnitude
from audiopipe.features.pcm import check_waveform
from audiopipe.features.registry import build_feature
from audiopipe.features.trim import trim_silence
from audiopipe.shard.job import Job
from audiopipe.shard.plan import WorkUnit
from audiopipe.shard.writer import ArrayColumn, ScalarColumn, write_arrow, write_tar
from audiopipe.storage.atomic import AtomicBatch, atomic_path

# A codec encoder takes waveforms at its rate and returns int16 [16, T] codes for each (batched inside).
EncodeFn = Callable[[list[np.ndarray]], list[np.ndarray]]

CODEC_RATE = 24000


@dataclass
class Extractors:
    """Feature objects for a job, built once per worker process."""

    features: list[Any]
    specs: list[FeatureSpec]
    codec_spec: FeatureSpec | None = None
    phone_ids: Callable[[str, str | None], np.ndarray] | None = None  # (text, the line's language tag)
    extra_specs: list[FeatureSpec] = field(default_factory=list)
    # --bert-checkpoint: (text, tag) -> (phone ids, GPT-SoVITS segments), and the BERT model (loaded once per
    # worker process) that turns the segments into per-phone features
    phone_segments: Callable[[str, str | None], tuple[np.ndarray, list]] | None = None
    bert: Any = None

    @property
    def all_specs(self) -> list[FeatureSpec]:
        return self.specs + ([self.codec_spec] if self.codec_spec else [])


_CACHE: dict[str, Extractors] = {}


class _Renamed:
    """A feature stored under another column name (two presets may both want a "mel" of different kinds)."""

    def __init__(self, feature: Any, name: str):
        if len(feature.specs) != 1:
            raise InvalidValue(f"only single-column features can be renamed, {feature.specs[0].kind} has "
                               f"{len(feature.specs)}")
        self._f, self._from = feature, feature.specs[0].name
        self.specs = (replace(feature.specs[0], name=name),)

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        return {self.specs[0].name: self._f(wav)[self._from]}

    @property
    def stft_key(self) -> Any:
        return getattr(self._f, "stft_key", None)

    def from_magnitude(self, mag: np.ndarray) -> dict[str, np.ndarray]:
        return {self.specs[0].name: self._f.from_magnitude(mag)[self._from]}

    def num_frames(self, n: int) -> int:
        return self._f.num_frames(n)


def compute_features(features: list[Any], by_rate: dict[int, np.ndarray]) -> dict[str, np.ndarray]:
    """Every feature of one utterance. Features at the same rate share the resampled waveform in `by_rate`,
    and those with the same STFT framing (`stft_key`: a mel and an energy, say) share one |STFT|."""
    arrays: dict[str, np.ndarray] = {}
    mags: dict[Any, np.ndarray] = {}
    for f in features:
        x = by_rate[f.specs[0].sample_rate]
        key = getattr(f, "stft_key", None)
        if key is None:
            arrays.update(f(x))
            continue
        if key not in mags:
            mags[key] = stft_magnitude(check_waveform(x, f.specs[0].kind), key)
        arrays.update(f.from_magnitude(mags[key]))
    return arrays


def make_feature(kind: str, params: dict[str, Any]) -> Any:
    params = dict(params)
    name = params.pop("name", None)
    f = build_feature(kind, **params)
    return _Renamed(f, name) if name and name != f.specs[0].name else f


def extractors_for(job: Job, codec_spec: FeatureSpec | None = None) -> Extractors:
    key = job.identity()
    if key not in _CACHE:
        feats = [make_feature(kind, params) for kind, params in job.features]
        specs = [s for f in feats for s in f.specs]
        names = [s.name for s in specs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise InvalidValue(f"two features want the same column name {dup}; give one a different name")
        phone_ids = phone_segments = bert = None
        if job.phones and job.language != "en" and job.bert:
            from audiopipe.text.bert import BertPhoneFeatures

            phone_segments = _gpt_sovits_phone_ids(job.language, segments=True)
            bert = BertPhoneFeatures(job.bert.checkpoint, device=job.bert.device, batch_size=job.bert.batch_size)
        elif job.phones and job.language != "en":
            phone_ids = _gpt_sovits_phone_ids(job.language)
        elif job.phones:
            from audiopipe.text.en_phones import G2PError, g2p, phones_to_ids

            def phone_ids(text: str, line_language: str | None = None) -> np.ndarray:
                try:
                    return np.asarray(phones_to_ids(g2p(text)), dtype=np.int16)
                except G2PError as e:
                    raise RejectError("g2p_failed", str(e)) from e

        _CACHE[key] = Extractors(feats, specs, codec_spec, phone_ids, phone_segments=phone_segments, bert=bert)
    return _CACHE[key]


def _gpt_sovits_phone_ids(language: str, segments: bool = False) -> Callable[[str, str | None], Any]:
    """Phone ids in GPT-SoVITS's symbol table for zh/auto jobs (English lines too, so one table per job); with
    segments=True, (ids, the line's segments) for the BERT features."""
    from audiopipe.text.en_phones import G2PError
    from audiopipe.text.frontend import gpt_sovits_segments
    from audiopipe.text.symbols import symbols_to_ids

    def phone_ids(text: str, line_language: str | None = None) -> Any:
        try:
            segs = gpt_sovits_segments(text, language, line_language)
            ids = symbols_to_ids([ph for _, phones, _ in segs for ph in phones])
        except (G2PError, ValueError) as e:  # ZhG2PError is a ValueError
            raise RejectError("g2p_failed", str(e)) from e
        if not ids:
            raise RejectError("g2p_failed", f"no phones in {text[:40]!r} (nothing Chinese or English to read)")
        ids = np.asarray(ids, dtype=np.int16)
        return (ids, segs) if segments else ids

    return phone_ids


def done_path(out: Path, name: str) -> Path:
    return out / "done" / f"{name}.json"


def write_done_record(path: Path, record: dict[str, Any]) -> None:
    """The done record, atomically (the bytes of storage.atomic.write_json_atomic) but not fsync'd.

    Its shard's files were fsync'd before it exists, so a done record that survives a power loss names durable
    files; one that does not (missing, or empty: `_local_finished` reads that as unfinished) only makes a rerun
    build its shard again. The manifest never depends on it (the driver has the records from the tasks), and
    its fsync, a journal commit that also flushes the next shard's writes, was the largest wait left in a worker
    (0.26 s of 5.7 s, 56 shards, docs/extraction.md)."""
    with atomic_path(path, durable=False) as tmp:
        tmp.write_text(json.dumps(record, sort_keys=True, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _add_bert(rows: list[dict[str, Any]], bert: Any, rejects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-phone BERT features (audiopipe.text.bert) for every row: the Chinese segments of all rows go
    through the model in batches; a row whose text the tokenizer does not split one token per character is
    rejected (found by running the rows one by one when a batch fails). Phones from a TextGrid get zeros."""
    from audiopipe.text.bert import BertFeatureError, assemble

    segs = [row["scalars"].pop("_segments", None) for row in rows]
    texts = [[s[2] for s in sg if s[0] == "zh" and s[2]] if sg else [] for sg in segs]
    try:
        flat = bert.char_features([t for ts in texts for t in ts])
        feats, k = [], 0
        for ts in texts:
            feats.append(flat[k:k + len(ts)])
            k += len(ts)
    except BertFeatureError:
        feats = []
        for ts in texts:
            try:
                feats.append(bert.char_features(ts))
            except BertFeatureError as e:
                feats.append(e)
    kept = []
    for row, sg, f in zip(rows, segs, feats):
        try:
            if isinstance(f, Exception):
                raise f
            n = row["arrays"]["phones"].shape[0]
            row["arrays"]["bert"] = assemble(sg, f) if sg else np.zeros((1024, n), dtype=np.float16)
        except BertFeatureError as e:
            rejects.append({"id": row["id"], "source": row["source"], "reason": "bert_failed", "detail": str(e)})
            continue
        kept.append(row)
    return kept


def _fit_length(a: np.ndarray, frames: int) -> np.ndarray:
    """Crop or edge-pad the time axis: F0 counts N//hop+1 frames, EnCodec ceil(N/hop); NS2 needs them equal."""
    t = a.shape[-1]
    if t == frames:
        return a
    if t > frames:
        return a[..., :frames]
    pad = [(0, 0)] * (a.ndim - 1) + [(0, frames - t)]
    return np.pad(a, pad, mode="edge")


def _reject(u: Any, reason: str, detail: str) -> dict[str, Any]:
    return {"id": u.id, "path": u.path, "source": u.source, "reason": reason, "detail": detail}


def array_columns(specs: list[FeatureSpec], phones: bool) -> list[ArrayColumn]:
    cols = [ArrayColumn(s.name, s.dtype, s.channels) for s in specs]
    if phones:
        # durations: frames per phone from an MFA TextGrid (then phones are MFA's), empty when there is none.
        cols += [ArrayColumn("phones", "int16", 0), ArrayColumn("durations", "int32", 0)]
    return cols


def textgrid_for(u: Any) -> Path | None:
    """An MFA TextGrid for this utterance: a manifest `textgrid` column, or <stem>.TextGrid beside the audio."""
    given = u.extra.get("textgrid") if u.extra else None
    if given:
        p = Path(given)
        return p if p.is_absolute() else Path(u.path).parent / p
    p = Path(u.path).with_suffix(".TextGrid")
    return p if p.exists() else None


def aligned_phones(tg: Path, frames: int, frame_rate: float, start_s: float, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    from audiopipe.corpus.textgrid import TextGridError, read_phone_durations
    from audiopipe.text.en_phones import phones_to_ids

    try:
        labels, durs = read_phone_durations(tg, total_frames=frames, frame_rate=frame_rate, start=start_s, end=end_s)
        ids = phones_to_ids(labels)
    except (TextGridError, ValueError) as e:
        raise RejectError("bad_textgrid", f"{tg.name}: {e}") from e
    return np.asarray(ids, dtype=np.int16), np.asarray(durs, dtype=np.int32)


def scalar_columns(job: Job) -> list[ScalarColumn]:
    cols = []
    if job.trim:
        cols += [ScalarColumn("trim_start", pa.int64()), ScalarColumn("trim_end", pa.int64())]
    cols += [ScalarColumn(name, pa.string()) for name in job.keep_columns]
    return cols


def kept_value(value: Any) -> str | None:
    """A metadata value as its --keep-columns text: strings as they are, numbers and lists as JSON, null as null."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def shard_metadata(job: Job, specs: list[FeatureSpec]) -> dict[str, Any]:
    return {"features": {s.name: {**s.to_dict(), "hash": s.config_hash} for s in specs},
            "job": job.identity()}


def build_shard(unit: WorkUnit, job: Job, encode: EncodeFn | None = None,
                codec_spec: FeatureSpec | None = None,
                progress: Callable[[float], None] | None = None, sync: bool = True) -> dict[str, Any]:
    """Write shard `unit.name` under job.out and return its completion record (also saved in done/).

    The files are fsync'd before they get their names (sync=False: not at all, for staged files that are
    uploaded and deleted); the folders are not: the job fsyncs arrow/, wds/ and done/ once before its
    manifest (audiopipe.shard.output.LocalOutput.sync)."""
    return start_shard(unit, job, encode, codec_spec, progress, sync).finish()


@dataclass
class PendingShard:
    """A shard whose files are written and are being fsync'd and renamed in the background; `finish()` waits
    for that, then writes the done record (the shard counts as finished only then) and returns it.

    A worker computes its next shard between the two (audiopipe.shard.groups), instead of waiting for the disk."""

    files: AtomicBatch
    record: dict[str, Any]
    done: Path

    def finish(self) -> dict[str, Any]:
        self.files.commit()  # both files in place (and durable) before the done record names them
        write_done_record(self.done, self.record)
        return self.record

    def abort(self) -> None:
        self.files.abort()


def start_shard(unit: WorkUnit, job: Job, encode: EncodeFn | None = None, codec_spec: FeatureSpec | None = None,
                progress: Callable[[float], None] | None = None, sync: bool = True) -> PendingShard:
    """Decode, compute and write shard `unit.name`; its files' fsyncs and renames still run when this returns
    (see PendingShard)."""
    out = Path(job.out)
    ex = extractors_for(job, codec_spec)
    limits = DecodeLimits(**job.limits)
    rates = sorted({s.sample_rate for s in ex.specs} | ({CODEC_RATE} if job.codec else set()))
    rows: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    codec_inputs: list[np.ndarray] = []
    recordings = RecordingCache(unit.utterances)  # segments (Kaldi, NeMo, lhotse): read by seeking in their recording
    for u in unit.utterances:
        try:
            wav, sr = recordings.load(u, limits)  # a file, a Kaldi segment, or a member of an Emilia tar
            scalars: dict[str, Any] = {name: kept_value((u.extra or {}).get(name)) for name in job.keep_columns}
            if job.trim:
                # Trim settings are given at the codec rate (24 kHz); scale the frames to this file's rate.
                scale = sr / CODEC_RATE
                t = trim_silence(wav, top_db=job.trim.get("top_db", 35.0),
                                 frame_length=max(16, round(job.trim.get("frame_length", 1024) * scale)),
                                 hop_length=max(4, round(job.trim.get("hop_length", 256) * scale)))
                start, end = t.start, t.end
                wav = wav[start:end]
                scalars.update(trim_start=int(start), trim_end=int(end))
                if len(wav) / sr < limits.min_duration:
                    raise RejectError("too_short", f"{len(wav) / sr:.2f} s after trimming silence "
                                                   f"< {limits.min_duration} s")
            by_rate = resample_to(wav, sr, rates)
            arrays = compute_features(ex.features, by_rate)
            for s in ex.specs:
                a = arrays[s.name]
                if a.dtype != np.dtype(s.dtype):
                    raise WrongType(f"feature {s.name} returned {a.dtype}, spec says {s.dtype}")
                if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
                    raise RejectError("feature_nan", f"feature {s.name} has non-finite values")
            if ex.phone_ids is not None or ex.phone_segments is not None:
                tg = textgrid_for(u)
                if tg is not None:
                    scalars["_textgrid"] = (str(tg), scalars.get("trim_start", 0) / sr,
                                            scalars.get("trim_end", len(wav)) / sr if job.trim else None)
                elif not u.text.strip():
                    raise RejectError("no_text", "preset needs phones but the utterance has no transcript")
                elif ex.phone_segments is not None:
                    arrays["phones"], scalars["_segments"] = ex.phone_segments(u.text, (u.extra or {}).get("language"))
                    arrays["durations"] = np.zeros(0, dtype=np.int32)
                else:
                    arrays["phones"] = ex.phone_ids(u.text, (u.extra or {}).get("language"))
                    arrays["durations"] = np.zeros(0, dtype=np.int32)
            if job.codec:
                codec_inputs.append(by_rate[CODEC_RATE])
            rows.append({"id": u.id, "speaker": u.speaker, "text": u.text, "source": u.source,
                         "duration": len(wav) / sr, "arrays": arrays, "scalars": scalars})
        except RejectError as e:
            rejects.append(_reject(u, e.reason, e.detail))
        except Exception as e:  # a bug or an odd file must not sink the other utterances of the shard
            rejects.append(_reject(u, "feature_error", f"{type(e).__name__}: {e}"))
            if os.environ.get("AUDIOPIPE_DEBUG"):
                traceback.print_exc()
        if progress:
            progress(u.duration)

    specs = list(ex.specs)
    if job.codec:
        if encode is None or codec_spec is None:
            raise Failed("this job needs codec codes but no encoder was given")
        codes = encode(codec_inputs) if codec_inputs else []
        for row, c in zip(rows, codes):
            row["arrays"]["codes"] = c
        specs.append(codec_spec)
        if job.align_to:
            for row in rows:
                n = row["arrays"][job.align_to].shape[-1]
                for s in ex.specs:
                    if s.hop_length * CODEC_RATE == codec_spec.hop_length * s.sample_rate:
                        row["arrays"][s.name] = _fit_length(row["arrays"][s.name], n)

    if job.phones:
        # Durations count frames of the model's frame rate: the codec's when there is one, else the first feature's.
        rate_spec = codec_spec if job.codec else specs[0]
        kept = []
        for row in rows:
            tg = row["scalars"].pop("_textgrid", None)
            if tg is not None:
                path, start_s, end_s = tg
                frames = row["arrays"][rate_spec.name].shape[-1]
                try:
                    row["arrays"]["phones"], row["arrays"]["durations"] = aligned_phones(
                        Path(path), frames, rate_spec.frame_rate, start_s, end_s)
                except RejectError as e:
                    rejects.append({"id": row["id"], "path": path, "source": row["source"], "reason": e.reason,
                                    "detail": e.detail})
                    continue
            kept.append(row)
        rows = kept

    if ex.bert is not None:
        rows = _add_bert(rows, ex.bert, rejects)
        specs.append(ex.bert.spec)

    acols = array_columns(specs, job.phones)
    scols = scalar_columns(job)
    meta = shard_metadata(job, specs)
    arrow_path = out / "arrow" / f"{unit.name}.arrow"
    tar_path = out / "wds" / f"{unit.name}.tar"
    # Checksums are taken as the bytes are written (no second read of either file); the Arrow file's fsync
    # runs in the background while the tar is built, and the tar's while the caller goes on (PendingShard).
    files = AtomicBatch(sync)
    try:
        arrow_digest = write_arrow(arrow_path, rows, acols, scols, meta, files=files, checksum=job.checksum)
        pcm_rate = next((s.sample_rate for s in specs if s.name == "pcm"), None)
        if job.write_tar:
            tar_digest = write_tar(tar_path, rows, acols, scols, pcm_rate, files=files, checksum=job.checksum)
    except BaseException:
        files.abort()
        raise
    record = {
        "name": unit.name,
        "index": unit.index,
        "rows": len(rows),
        "duration": float(sum(r["duration"] for r in rows)),
        "planned": len(unit.utterances),
        "arrow": arrow_digest.entry(f"arrow/{unit.name}.arrow"),
        "rejects": rejects,
    }
    if job.write_tar:
        record["tar"] = tar_digest.entry(f"wds/{unit.name}.tar")
    return PendingShard(files, record, done_path(out, unit.name))
