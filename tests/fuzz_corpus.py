"""The corpus-layer fuzzing harness: hypothesis strategies that write hostile corpora to disk, and the invariant
that every example must hold. Run by tests/test_fuzz_corpus.py (a fixed seed and example count, about a
minute) and at length by benchmarks/bench_fuzz.py.

Kinds of example (KINDS): audio of every container libsndfile writes, whole, cut, with flipped header bytes or a
header field overwritten, with junk appended; a walked folder whose sidecar transcripts are random bytes,
latin-1, pipes, /dev/zero, folders or 2 MiB; audiopipe's JSONL and CSV manifests, NeMo manifests, lhotse
recordings + supervisions (with lines that are not JSON or items lhotse refuses), lhotse Shar folders, Hugging
Face parquet tables (audio cells of WAV bytes, junk, empty or null), Common Voice TSVs, Kaldi data dirs and
Emilia JSONL indexes whose values are of any JSON type (lists, objects, NaN, lone surrogates) and whose lines
may be latin-1 or cut; Emilia tars with sparse,
linked, duplicate, nested, odd and cut members and JSON members that are lists, invalid or latin-1.

The invariant, on every example (`check`):
- discovery and the decoding of every utterance (RecordingCache.load, what the shard builder calls) end within
  TIME_LIMIT_S, and the process's peak memory rises by less than MEMORY_LIMIT;
- nothing raises but a RejectError for one input, or a one-line error naming the index file where a whole
  index is unusable (a JSONL cut inside its gzip stream, a CSV with a NUL byte: docs/corpus.md); one bad row of
  a lhotse, Shar, NeMo or Hugging Face manifest is one reject, never a stop; no reject names an object address;
- discovered = written + rejected: every input the example holds is an utterance or a reject, and every reject
  has a reason from the documented list and a one-line detail;
- each written input holds exactly its data: the text and speaker it was given (or no utterance at all), and the
  samples libsndfile decodes from its intact bytes (a segment: those frames of the recording).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal as signals
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audiopipe.corpus.discover import discover
from audiopipe.corpus.transcripts import TranscriptError
from audiopipe.decode.audio import DecodeLimits, RejectError
from audiopipe.decode.segments import RecordingCache

from hostile_inputs import (CONTAINERS, DECLARED_LENGTH, LOSSY, RATE, audio_bytes, decoded, peak_rss_growth,
                            signal, streamed_flac, write_tar)

TIME_LIMIT_S = 20.0  # per example: discovery and every decode
MEMORY_LIMIT = 256 << 20  # peak resident memory may rise this much per example
LIMITS = DecodeLimits(min_duration=0.0, max_duration=600.0, silence_dbfs=-400.0)
SR = 16000
# Every reject reason docs/corpus.md lists (discovery and decoding).
REASONS = frozenset((
    "missing", "empty", "unreadable", "too_large", "bad_encoding", "bad_json", "bad_value", "duplicate_id",
    "outside_root", "bad_id", "bad_transcript", "bad_member", "duplicate_member", "nested_archive",
    "bad_sample_rate", "too_many_channels", "too_short", "too_long", "truncated", "nan_inf", "silent",
    "kaldi_pipe", "kaldi_ark", "kaldi_missing_recording", "no_text", "lhotse_source", "lhotse_transform",
    "lhotse_channel", "lhotse_cut", "lhotse_no_audio", "lhotse_missing_recording", "bad_segment"))
STOPS = (TranscriptError, ValueError, FileNotFoundError)  # exactly these types, one line, naming the index


class Hang(Exception):
    pass


@dataclass
class Want:
    """What an input must be written as, if it is written (None: not checked), and whether it must be."""

    text: str | None = None
    speaker: str | None = None
    samples: np.ndarray | None = None
    must: bool = True  # False: a reject is as good (a mutated file whose fate depends on libsndfile)
    atol: float = 0.0
    shorter_ok: float = 1.0  # the written length may be this fraction of `samples` (MP3's documented slack)


@dataclass
class Expect:
    inputs: int | None  # discovered must equal this; None when the example may lose inputs to a cut index
    wants: dict[str, Want] = field(default_factory=dict)  # by utterance id
    refused: set[str] = field(default_factory=set)  # ids that must not be written
    stop_ok: str | None = None  # a file a one-line stop error may name; None: discovery must not stop
    manifest: list[Path] | None = None
    layout: str = "auto"
    options: Any = None  # audiopipe.corpus.options.CorpusOptions (e.g. the audio column of a table)


class Example:
    """One drawn example: `build(root)` writes the corpus under root and says what to expect; its repr is what was
    drawn, so that a failure shows the input (hypothesis prints it)."""

    def __init__(self, build: Callable[[Path], Expect], **drawn: Any):
        self.build, self.drawn = build, drawn

    def __call__(self, root: Path) -> Expect:
        return self.build(root)

    def __repr__(self) -> str:
        return f"Example({', '.join(f'{k}={v!r}' for k, v in self.drawn.items())})"


def collapse(s: str) -> str:
    return " ".join(s.split())


# ------------------------------------------------------------------------------------------ the check

def check(build: Example, counter: dict[str, int] | None = None, kind: str = "") -> None:
    """Build one example in a fresh folder and assert the invariant (see the module doc)."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        expect = build(root / "corpus")
        if counter is not None:
            counter[kind] = counter.get(kind, 0) + 1
        _, grew = peak_rss_growth(lambda: _timed(lambda: _check(root / "corpus", expect)))
        assert grew < MEMORY_LIMIT, f"peak memory rose {grew / 2**20:.0f} MiB"
    finally:
        _unblock(root)
        shutil.rmtree(root, ignore_errors=True)


def _timed(fn: Callable[[], Any]) -> Any:
    """fn() under a wall-clock alarm: a blocked open or an endless read raises Hang instead of hanging."""
    def alarm(signum, frame):
        raise Hang(f"an example ran past {TIME_LIMIT_S} s")

    old = signals.signal(signals.SIGALRM, alarm)
    signals.setitimer(signals.ITIMER_REAL, TIME_LIMIT_S)
    try:
        return fn()
    finally:
        signals.setitimer(signals.ITIMER_REAL, 0)
        signals.signal(signals.SIGALRM, old)


def _check(root: Path, expect: Expect) -> None:
    try:
        d = discover(root, manifest=expect.manifest, layout=expect.layout, header_threads=1, options=expect.options)
    except STOPS as e:
        msg = str(e)
        assert type(e) in STOPS, f"{type(e).__name__}: {msg}"
        assert expect.stop_ok is not None, f"discovery stopped: {type(e).__name__}: {msg}"
        assert "\n" not in msg and expect.stop_ok in msg, f"a stop that does not name {expect.stop_ok}: {msg}"
        return
    for r in d.rejects:
        assert r.reason in REASONS, f"undocumented reason {r.reason!r}: {r}"
        assert r.detail and "\n" not in r.detail and "Traceback" not in r.detail, r
        assert " at 0x" not in r.detail, f"an object address in a reject (differs between runs): {r}"
        json.dumps(r.to_dict(), ensure_ascii=False).encode("utf-8")  # a reject record can be written
    if expect.inputs is not None:
        assert d.discovered == expect.inputs, (f"discovered {d.discovered} (written {len(d.utterances)} + rejected "
                                               f"{len(d.rejects)}) of {expect.inputs} inputs: {d.rejects}")
    got = {u.id: u for u in d.utterances}
    for uid in expect.refused:
        assert uid not in got, f"{uid} was written: {got[uid]}"
    cache = RecordingCache(d.utterances)
    for u in d.utterances:
        json.dumps(u.to_dict(), ensure_ascii=False).encode("utf-8")  # ids, texts, sources are real text
        want = expect.wants.get(u.id)
        assert want is not None or not expect.wants, f"an utterance nobody asked for: {u}"
        try:
            wav, _ = cache.load(u, LIMITS)
        except RejectError as e:
            assert e.reason in REASONS and "\n" not in e.detail, e
            assert want is None or not want.must, f"{u.id} must be written, was refused: {e}"
            continue
        assert len(wav) == u.num_samples or _mp3(u), f"{u.id}: {len(wav)} frames decoded, discovery said " \
                                                     f"{u.num_samples}"
        if want is None:
            continue
        if want.text is not None:
            assert u.text == want.text, f"{u.id}: text {u.text!r}, given {want.text!r}"
        if want.speaker is not None:
            assert u.speaker == want.speaker, f"{u.id}: speaker {u.speaker!r}, given {want.speaker!r}"
        if want.samples is not None:
            ref = want.samples
            if want.shorter_ok < 1.0 and len(wav) < len(ref):
                assert len(wav) >= want.shorter_ok * len(ref), f"{u.id}: {len(wav)} of {len(ref)} frames"
                ref = ref[:len(wav)]
            assert wav.shape == ref.shape, f"{u.id}: {wav.shape} frames written, the input holds {ref.shape}"
            ok = np.array_equal(wav, ref) if want.atol == 0 else np.allclose(wav, ref, rtol=0, atol=want.atol)
            assert ok, f"{u.id}: samples differ by up to {np.max(np.abs(wav - ref))}"
    for uid, want in expect.wants.items():
        if want.must and uid not in got:
            said = [r for r in d.rejects if uid in r.source or uid in r.detail]
            raise AssertionError(f"{uid} must be written; rejects: {said or d.rejects}")


def _mp3(u: Any) -> bool:
    return u.source.lower().endswith(".mp3")


def _unblock(root: Path) -> None:
    """Open every pipe the example made for writing once, so that a reader still blocked on one (after a Hang)
    lets go."""
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            try:
                if os.path.exists(p) and not os.path.isfile(p) and not os.path.isdir(p):
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass


# ------------------------------------------------------------------------------------------ values

def _readable_containers() -> list[tuple[str, str, str, bool]]:
    """(format, subtype, extension, stereo too) of the containers this libsndfile writes and reads back."""
    out = []
    for fmt, subtype, ext in CONTAINERS:
        sr = RATE.get(subtype, RATE.get(fmt, SR))
        x = signal(0.05, sr)
        try:
            decoded(audio_bytes(x, sr, fmt, subtype))
        except (RuntimeError, ValueError, TypeError):
            continue
        try:
            decoded(audio_bytes(np.stack([x, x], axis=1), sr, fmt, subtype))
            stereo = True
        except (RuntimeError, ValueError, TypeError):
            stereo = False
        out.append((fmt, subtype, ext, stereo))
    return out


READABLE = _readable_containers()

# JSON values of every type a manifest field may hold, strings of every kind among them.
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)
SCALAR = st.one_of(TEXT, st.none(), st.integers(-10**6, 10**6), st.booleans(),
                   st.floats(allow_nan=True, allow_infinity=True), st.just("  "), st.just("\ud800x"))
VALUE = st.one_of(SCALAR, st.lists(TEXT, max_size=3), st.dictionaries(TEXT, TEXT, max_size=2))


def expected_text(value: Any) -> str | None:
    """What a text field must be written as, or None when the row must be refused (a list, an object, a
    boolean, a non-finite number, a lone surrogate). None/""/blank: no text ("")."""
    if value is None:
        return ""
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        return None
    if isinstance(value, float):
        return str(value) if math.isfinite(value) else None
    if isinstance(value, int):
        return str(value)
    if any("\ud800" <= c <= "\udfff" for c in value):
        return None
    return collapse(value)


def expected_speaker(value: Any, raw: bool = True) -> str | None:
    """What a speaker field must be written as: as given (audiopipe's manifests, Emilia) or single-spaced
    (`raw=False`: NeMo, lhotse, Common Voice, as their readers always did); None when it must be refused."""
    t = expected_text(value)
    if t is None or not isinstance(value, str) or not raw:
        return t
    return value if value.strip() else ""


def _wav(path: Path, seconds: float = 0.3, seed: int = 0) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = audio_bytes(signal(seconds, SR, seed), SR, "WAV", "PCM_16")
    path.write_bytes(data)
    return decoded(data)


# ------------------------------------------------------------------------------------------ audio

@st.composite
def audio_example(draw) -> Example:
    fmt, subtype, ext, stereo = draw(st.sampled_from(READABLE))
    mutation = draw(st.sampled_from(["whole", "whole", "cut", "flip", "field", "append", "stream"]))
    seconds = draw(st.sampled_from([0.05, 0.3, 1.0]))
    channels = draw(st.sampled_from([1, 1, 2]))
    seed = draw(st.integers(0, 3))
    cut = draw(st.floats(0.0, 1.0))
    flips = draw(st.lists(st.tuples(st.integers(0, 127), st.integers(0, 255)), min_size=1, max_size=4))
    word = draw(st.tuples(st.integers(0, 31), st.sampled_from([0, 0xFFFFFFFF, 0x7FFFFFFF, 1, 0x10000])))
    junk = draw(st.binary(min_size=1, max_size=64))

    def build(root: Path) -> Expect:
        sr = RATE.get(subtype, RATE.get(fmt, SR))
        x = signal(seconds, sr, seed)
        if channels == 2 and stereo:
            x = np.stack([x, signal(seconds, sr, seed + 7)], axis=1)
        if mutation == "stream":
            data = streamed_flac(x, sr, subtype) if fmt == "FLAC" else audio_bytes(x, sr, fmt, subtype)
        else:
            data = audio_bytes(x, sr, fmt, subtype)
        whole = decoded(audio_bytes(x, sr, fmt, subtype))
        lossy = subtype in LOSSY
        want = Want(samples=whole, atol=1e-6 if fmt == "MP3" else 0.0)
        if mutation == "cut":
            data = data[:int(len(data) * cut)]
            # A header that states its length must have all of it; one that does not (IRCAM, PAF, PVF: the data
            # runs to the end of the file) holds what is left, a prefix.
            shorter = 1.0 if fmt in DECLARED_LENGTH or fmt == "FLAC" else 0.0
            want = Want(samples=whole, must=False, atol=want.atol, shorter_ok=shorter)
            if lossy and fmt not in ("MP3",):
                want = Want(must=False)  # a cut Vorbis/Opus stream: decodable or not, no reference
        elif mutation in ("flip", "field", "append"):
            b = bytearray(data)
            if mutation == "flip":
                for pos, val in flips:
                    if pos < len(b):
                        b[pos] = val
            elif mutation == "field":
                pos = word[0] * 4
                if pos + 4 <= len(b):
                    b[pos:pos + 4] = word[1].to_bytes(4, "little")
            else:
                b += junk
            data = bytes(b)
            want = Want(samples=_self_decode(data), must=False, atol=1e-6 if fmt == "MP3" else 0.0)
            if mutation == "append" and want.samples is None:
                want = Want(must=False)
        path = root / "spk" / f"a.{ext}"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        return Expect(inputs=1, wants={"spk/a": want})
    return Example(build, fmt=fmt, subtype=subtype, mutation=mutation, seconds=seconds, channels=channels, seed=seed,
                   cut=cut, flips=flips, word=word, junk=junk)


def _self_decode(data: bytes) -> np.ndarray | None:
    """libsndfile's own decode of the whole (mutated) file: what the written clip must equal if it is written."""
    from audiopipe.decode.cells import AudioBytes

    try:
        info = sf.info(AudioBytes(data))
        if info.frames * info.channels > 10**7:  # a header claiming more than any example holds
            return None
        y, _ = sf.read(AudioBytes(data), dtype="float32", always_2d=True)
    except (RuntimeError, ValueError, TypeError, MemoryError, OverflowError):
        return None
    if y.shape[0] > 10**7:
        return None
    return y.mean(axis=1, dtype=np.float32) if y.shape[1] > 1 else y[:, 0]


# ------------------------------------------------------------------------------------------ sidecars

SIDECARS = ["none", "text", "bytes", "latin1", "bom", "empty", "fifo", "zero", "dir", "big"]


@st.composite
def sidecar_example(draw) -> Example:
    files = draw(st.lists(st.tuples(st.sampled_from(SIDECARS), TEXT, st.binary(max_size=32),
                                    st.sampled_from([".txt", ".lab", ".normalized.txt"])), min_size=1, max_size=4))

    def build(root: Path) -> Expect:
        e = Expect(inputs=len(files))
        for i, (kind, text, raw, suffix) in enumerate(files):
            uid = f"spk/a{i}"
            samples = _wav(root / f"{uid}.wav", seed=i)
            side = root / f"{uid}{suffix}"
            want: str | None = ""
            if kind == "text":
                side.write_text(text, encoding="utf-8")
                want = collapse(text)
            elif kind == "bytes":
                side.write_bytes(raw)
                try:
                    want = collapse(raw.decode("utf-8-sig"))
                except UnicodeDecodeError:
                    want = None
            elif kind == "latin1":
                side.write_bytes(f"caf\u00e9 {text}".encode("utf-8").replace(b"\xc3\xa9", b"\xe9", 1))
                want = None
            elif kind == "bom":
                side.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
                want = collapse(text)
            elif kind == "empty":
                side.write_bytes(b"")
            elif kind == "fifo":
                os.mkfifo(side)
                want = None
            elif kind == "zero":
                os.symlink("/dev/zero", side)
                want = None
            elif kind == "dir":  # a folder named like a sidecar is not one: no transcript
                side.mkdir()
            elif kind == "big":
                with open(side, "wb") as f:
                    f.truncate(2 << 20)
                want = None
            if want is None:
                e.refused.add(uid)
            else:
                e.wants[uid] = Want(text=want, speaker="spk", samples=samples)
        return e
    return Example(build, files=files)


# ------------------------------------------------------------------------------------------ manifests

ROW_PATHS = ["file", "file", "file", "missing", "list", "number"]


@st.composite
def manifest_example(draw) -> Example:
    kind = draw(st.sampled_from(["jsonl", "csv"]))
    rows = draw(st.lists(st.tuples(st.sampled_from(ROW_PATHS), VALUE, VALUE,
                                   st.sampled_from(["none", "given", "bad"])), min_size=1, max_size=4))
    mutation = draw(st.sampled_from(["none", "none", "latin1", "cut"]))
    victim = draw(st.integers(0, 3))
    cut = draw(st.floats(0.0, 1.0))

    def build(root: Path) -> Expect:
        e = Expect(inputs=len(rows))
        lines: list[bytes] = []
        for i, (path_kind, text, speaker, id_kind) in enumerate(rows):
            samples = _wav(root / "spk" / f"r{i}.wav", seed=i)
            path: Any = {"file": f"spk/r{i}.wav", "missing": f"spk/gone{i}.wav", "list": [f"spk/r{i}.wav"],
                         "number": 7}[path_kind]
            uid = {"none": None, "given": f"u{i}", "bad": f"../u{i}"}[id_kind]
            if kind == "csv":  # CSV cells are text: what a JSON value becomes when written as a cell
                text, speaker = _cell(text), _cell(speaker)
                path = path if isinstance(path, str) else str(path)
            row = {"path": path, "text": text, "speaker": speaker}
            if uid is not None:
                row["id"] = uid
            out_id = uid if uid is not None else f"spk/r{i}"
            t, s = expected_text(text), expected_speaker(speaker)
            if kind == "csv":
                t = collapse(text) if text is not None else ""
                s = speaker if speaker and speaker.strip() else ""
            if mutation == "latin1" and i == victim % len(rows) and kind == "jsonl":
                row["text"] = "caf\u00e9"
                lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass")
                             .replace(b"caf\xc3\xa9", b"caf\xe9"))
                e.refused.add(out_id)
                continue
            if kind == "jsonl":
                lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            else:
                lines.append(row)  # type: ignore[arg-type]
            if path_kind != "file" or id_kind == "bad" or t is None or s is None:
                e.refused.add(out_id)
                continue
            e.wants[out_id] = Want(text=t, speaker=s if s else "spk", samples=samples)
        m = root / f"list.{kind}"
        if kind == "jsonl":
            data = b"\n".join(lines) + b"\n"
        else:
            import csv
            import io

            buf = io.StringIO()
            w = csv.DictWriter(buf, fieldnames=["path", "text", "speaker", "id"], lineterminator="\n",
                               quoting=csv.QUOTE_ALL)  # (a bare CR in a cell would be a line break)
            w.writeheader()
            w.writerows(lines)  # type: ignore[arg-type]
            data = buf.getvalue().encode("utf-8", "surrogatepass")
            if b"\x00" in data or "\ud800" in buf.getvalue():
                e.stop_ok = m.name  # a NUL byte or a surrogate: csv / UTF-8 refuse the whole table
                e.inputs = None
        if mutation == "cut":  # a manifest cut mid-row: what the cut row says is not known, only that nothing breaks
            data = data[:int(len(data) * cut)]
            e.inputs, e.stop_ok, e.refused, e.wants = None, m.name, set(), {}
        m.write_bytes(data)
        e.manifest = [m]
        return e
    return Example(build, kind=kind, rows=rows, mutation=mutation, victim=victim, cut=cut)


def _cell(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value)


@st.composite
def nemo_example(draw) -> Example:
    grid = st.integers(0, 120).map(lambda n: n / 100)
    times = st.one_of(grid, grid, st.sampled_from([float("nan"), float("inf"), -0.5, 5.0]), st.just("x"),
                      st.none(), st.lists(grid, max_size=1))
    rows = draw(st.lists(st.tuples(times, times, VALUE, VALUE), min_size=1, max_size=4))

    def build(root: Path) -> Expect:
        x = _wav(root / "long.wav", seconds=1.2)
        e = Expect(inputs=len(rows))
        lines = []
        for i, (offset, duration, text, speaker) in enumerate(rows):
            row = {"audio_filepath": "long.wav", "offset": offset, "duration": duration, "text": text,
                   "speaker": speaker, "id": f"n{i}"}
            lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            t, s = expected_text(text), expected_speaker(speaker, raw=False)
            span = _span(offset, duration, len(x))
            if t is None or s is None or span is None:
                e.refused.add(f"n{i}")
                continue
            e.wants[f"n{i}"] = Want(text=t, speaker=s, samples=x[span[0]:span[1]])
        m = root / "train_manifest.json"
        m.write_bytes(b"\n".join(lines) + b"\n")
        e.manifest = [m]
        return e
    return Example(build, rows=rows)


def _span(offset: Any, duration: Any, total: int) -> tuple[int, int] | None:
    """[first, last) frames a NeMo row names (None: it must be refused), independently of the reader: offset and
    duration in seconds, 10 ms past the end allowed (rounded manifests)."""
    def seconds(v: Any) -> float | None:
        if v is None:
            return 0.0
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError
        return float(v)

    try:
        start = seconds(offset)
        dur = None if duration is None else seconds(duration)
    except ValueError:
        return None
    end = total / SR if dur is None else start + dur
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start or end > total / SR + 0.01:
        return None
    first, last = round(start * SR), min(round(end * SR), total)
    if first == 0 and total - last <= 0.01 * SR:  # the whole file, its end rounded in the manifest
        return 0, total
    return (first, last) if last > first else None


@st.composite
def lhotse_example(draw) -> Example:
    grid = st.integers(0, 100).map(lambda n: n / 100)
    sups = draw(st.lists(st.tuples(grid, grid, VALUE, VALUE), min_size=1, max_size=3))
    bad_lines = draw(st.lists(st.sampled_from(BAD_LINES), max_size=2))

    def build(root: Path) -> Expect:
        x = _wav(root / "rec.wav", seconds=1.0)
        rec = {"id": "rec", "sources": [{"type": "file", "channels": [0], "source": str(root / "rec.wav")}],
               "sampling_rate": SR, "num_samples": len(x), "duration": len(x) / SR, "channel_ids": [0]}
        e = Expect(inputs=len(sups))
        lines = []
        for i, (start, duration, text, speaker) in enumerate(sups):
            sup = {"id": f"s{i}", "recording_id": "rec", "start": start, "duration": duration, "channel": 0,
                   "text": text, "speaker": speaker}
            lines.append(json.dumps(sup, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            t, s = expected_text(text), expected_speaker(speaker, raw=False)
            span = _span(start, duration, len(x))
            if t is None or s is None or span is None:
                e.refused.add(f"s{i}")
                continue
            e.wants[f"s{i}"] = Want(text=t, speaker=s, samples=x[span[0]:span[1]])
        recs, sp = root / "x_recordings_all.jsonl", root / "x_supervisions_all.jsonl"
        recs.write_text(json.dumps(rec) + "\n")
        sp.write_bytes(b"\n".join(lines + bad_lines) + b"\n")  # each bad line is one reject, never a stop
        e.inputs += len(bad_lines)
        e.manifest = [recs, sp]
        return e
    return Example(build, sups=sups, bad_lines=bad_lines)


# Lines of a JSON-lines manifest that name nothing readable: not JSON, not an object, an item lhotse refuses.
BAD_LINES = [b"{not json", b'["a", "list"]', b"17", b'{"id": "x", "recording_id": "rec", "start": "soon"}',
             b'{"id": "y", "sources": "nowhere", "sampling_rate": 16000}', b"\xe9t\xe9"]


@st.composite
def shar_example(draw) -> Example:
    """A lhotse Shar folder (cuts.000000.jsonl.gz + recording.000000.tar) whose cuts' texts are any JSON value,
    with lines that are not cuts among them: each cut is written with its text or refused, each bad line is one
    reject."""
    texts = draw(st.lists(VALUE, min_size=1, max_size=3))
    bad_lines = draw(st.lists(st.sampled_from(BAD_LINES[:3] + BAD_LINES[5:]), max_size=2))

    def build(root: Path) -> Expect:
        import gzip

        from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

        wavs = [root / "audio" / f"c{i}.wav" for i in range(len(texts))]
        for i, w in enumerate(wavs):
            _wav(w, seed=i)
        recs = RecordingSet.from_recordings(Recording.from_file(w, recording_id=f"c{i}") for i, w in enumerate(wavs))
        sups = SupervisionSet.from_segments(SupervisionSegment(f"c{i}", f"c{i}", 0.0, recs[f"c{i}"].duration,
                                                               text="x", speaker="spk") for i in range(len(wavs)))
        shar = root / "shar"
        shar.mkdir()
        CutSet.from_manifests(recordings=recs, supervisions=sups).to_shar(shar, fields={"recording": "wav"},
                                                                          shard_size=100)
        cuts = shar / "cuts.000000.jsonl.gz"
        e = Expect(inputs=len(texts) + len(bad_lines))
        lines = []
        for line, text in zip(gzip.decompress(cuts.read_bytes()).splitlines(), texts):
            cut = json.loads(line)
            cut["supervisions"][0]["text"] = text
            lines.append(json.dumps(cut, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            t = expected_text(text)
            if t is None:
                e.refused.add(cut["id"])
            else:
                e.wants[cut["id"]] = Want(text=t, speaker="spk")
        cuts.write_bytes(gzip.compress(b"\n".join(lines + bad_lines) + b"\n"))
        e.manifest = [shar]
        return e
    return Example(build, texts=texts, bad_lines=bad_lines)


@st.composite
def hf_example(draw) -> Example:
    """A parquet table whose audio cells are WAV bytes, junk, empty or null, and whose texts are any text: each
    row is written with exactly its audio and text or refused, and no reject names an object address."""
    cells = draw(st.lists(st.tuples(st.sampled_from(["wav", "wav", "junk", "riff", "empty", "null"]),
                                    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=24)),
                          min_size=1, max_size=4))

    def build(root: Path) -> Expect:
        import pyarrow as pa
        import pyarrow.parquet as pq

        root.mkdir(parents=True)
        e = Expect(inputs=len(cells))
        blobs: list[bytes | None] = []
        for i, (kind, text) in enumerate(cells):
            data = audio_bytes(signal(0.3, SR, i), SR, "WAV", "PCM_16")
            blobs.append({"wav": data, "junk": bytes(range(256)) * 3, "riff": data[:60], "empty": b"",
                          "null": None}[kind])
            if kind == "wav":
                e.wants[f"h{i}"] = Want(text=collapse(text), samples=decoded(data))
            elif kind == "riff":  # a header cut short: refused when found or when decoded, as libsndfile decides
                e.wants[f"h{i}"] = Want(must=False)
            else:
                e.refused.add(f"h{i}")
        pq.write_table(pa.table({"audio": pa.array(blobs, pa.binary()), "text": [t for _, t in cells],
                                 "id": [f"h{i}" for i in range(len(cells))]}), root / "d.parquet")
        from audiopipe.corpus.options import CorpusOptions

        e.manifest, e.options = [root / "d.parquet"], CorpusOptions(audio_column="audio")
        return e
    return Example(build, cells=cells)


@st.composite
def commonvoice_example(draw) -> Example:
    cell = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0\t\n\r"), max_size=20)
    rows = draw(st.lists(st.tuples(cell, cell, st.booleans()), min_size=1, max_size=4))
    latin1 = draw(st.booleans())

    def build(root: Path) -> Expect:
        root.mkdir(parents=True)
        e = Expect(inputs=len(rows))
        lines = ["client_id\tpath\tsentence\tlocale"]
        for i, (sentence, client, present) in enumerate(rows):
            name = f"common_voice_en_{i}.wav"
            samples = _wav(root / "clips" / name, seed=i) if present else None
            lines.append(f"{client}\t{name}\t{sentence}\ten")
            if present:
                e.wants[f"common_voice_en_{i}"] = Want(text=collapse(sentence), speaker=collapse(client),
                                                       samples=samples)
            else:
                e.refused.add(f"common_voice_en_{i}")
        data = ("\n".join(lines) + "\n").encode("utf-8")
        if latin1:
            data = data.replace(b"\ten\n", b"\t\xe9n\n", 1)
            e.stop_ok, e.inputs = "validated.tsv", None
        (root / "validated.tsv").write_bytes(data)
        e.manifest = [root / "validated.tsv"]
        return e
    return Example(build, rows=rows, latin1=latin1)


# ------------------------------------------------------------------------------------------ Kaldi

TOKENS = ["0", "0.25", "0.5", "1", "1.5", "2", "3", "-1", "nan", "inf", "-inf", "1e308", "x", "-0.5", "2.999"]


@st.composite
def kaldi_example(draw) -> Example:
    segs = draw(st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from(TOKENS),
                                   st.sampled_from(["text", "latin1", "none"]), TEXT,
                                   st.sampled_from(["spk", "latin1", "none"])), min_size=1, max_size=5))
    bom = draw(st.booleans())

    def build(root: Path) -> Expect:
        x = _wav(root / "rec.wav", seconds=3.0)
        root.mkdir(parents=True, exist_ok=True)
        (root / "wav.scp").write_bytes((b"\xef\xbb\xbf" if bom else b"") + b"rec rec.wav\n")
        seg_lines, text_lines, spk_lines = [], [], []
        e = Expect(inputs=len(segs))
        for i, (a, b, text_kind, text, spk_kind) in enumerate(segs):
            uid = f"rec-{i:02d}"
            seg_lines.append(f"{uid} rec {a} {b}")
            t: str | None = ""
            if text_kind == "text":
                one_line = collapse(text)
                text_lines.append(f"{uid} {one_line}".encode("utf-8"))
                t = one_line
            elif text_kind == "latin1":
                text_lines.append(f"{uid} caf\u00e9".encode("latin-1"))
                t = None
            s: str | None = ""
            if spk_kind == "spk":
                spk_lines.append(f"{uid} s{i}".encode())
                s = f"s{i}"
            elif spk_kind == "latin1":
                spk_lines.append(f"{uid} caf\u00e9".encode("latin-1"))
                s = None
            span = _kaldi_span(a, b, len(x))
            if span is None or t is None or s is None:
                e.refused.add(uid)
                continue
            e.wants[uid] = Want(text=t, speaker=s, samples=x[span[0]:span[1]])
        (root / "segments").write_text("\n".join(seg_lines) + "\n")
        (root / "text").write_bytes(b"\n".join(text_lines) + b"\n")
        (root / "utt2spk").write_bytes(b"\n".join(spk_lines) + b"\n")
        return e
    return Example(build, segs=segs, bom=bom)


def _kaldi_span(a: str, b: str, total: int) -> tuple[int, int] | None:
    try:
        start, end = float(a), float(b)
    except ValueError:
        return None
    if math.isfinite(end) and end < 0:
        end = total / SR
    if not (math.isfinite(start) and math.isfinite(end)) or start < 0 or end <= start or end > total / SR + 0.01:
        return None
    first, last = round(start * SR), min(round(end * SR), total)
    return (first, last) if last > first else None


# ------------------------------------------------------------------------------------------ Emilia

@st.composite
def emilia_jsonl_example(draw) -> Example:
    rows = draw(st.lists(st.tuples(VALUE, VALUE, st.sampled_from(["file", "file", "missing", "list", "latin1"])),
                         min_size=1, max_size=4))

    def build(root: Path) -> Expect:
        e = Expect(inputs=len(rows))
        lines = [json.dumps({"id": "first", "wav": "ZH_B0/first.wav", "text": "ok"}).encode()]
        e.wants["first"] = Want(text="ok", samples=_wav(root / "ZH" / "ZH_B0" / "first.wav", seed=9))
        e.inputs += 1
        for i, (text, speaker, wav_kind) in enumerate(rows):
            samples = _wav(root / "ZH" / "ZH_B0" / f"e{i}.wav", seed=i)
            wav: Any = {"file": f"ZH_B0/e{i}.wav", "missing": f"ZH_B0/gone{i}.wav", "list": [f"e{i}.wav"],
                        "latin1": f"ZH_B0/e{i}.wav"}[wav_kind]
            row = {"id": f"e{i}", "wav": wav, "text": text, "speaker": speaker, "language": "zh"}
            if wav_kind == "latin1":
                row["text"] = "caf\u00e9"
                lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass")
                             .replace(b"caf\xc3\xa9", b"caf\xe9"))
                e.refused.add(f"e{i}")
                continue
            lines.append(json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass"))
            t, s = expected_text(text), expected_speaker(speaker)
            if wav_kind != "file" or t is None or s is None:
                e.refused.add(f"e{i}")
                continue
            e.wants[f"e{i}"] = Want(text=t, speaker=s, samples=samples)
        (root / "ZH" / "ZH_B0.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        return e
    return Example(build, rows=rows)


MEMBER_JSON = ["dict", "dict", "dict", "list", "invalid", "latin1", "none", "string"]
EXTRAS = ["duplicate", "sparse", "hardlink", "symlink", "nested", "odd", "second_audio", "folder", "orphan_json"]


@st.composite
def emilia_tar_example(draw) -> Example:
    pairs = draw(st.lists(st.tuples(st.sampled_from(MEMBER_JSON), VALUE, VALUE), min_size=1, max_size=4))
    extras = draw(st.lists(st.sampled_from(EXTRAS), max_size=3))
    cut = draw(st.one_of(st.none(), st.floats(0.05, 1.0)))

    def build(root: Path) -> Expect:
        import tarfile

        root.mkdir(parents=True)
        members: list[Any] = [("k00.json", json.dumps({"id": "k00", "text": "first"}).encode()),
                              ("k00.wav", audio_bytes(signal(0.3, SR, 99), SR, "WAV", "PCM_16"))]
        e = Expect(inputs=1 + len(pairs))
        e.wants["k00"] = Want(text="first", samples=decoded(members[1][1]))
        for i, (jkind, text, speaker) in enumerate(pairs, 1):
            key = f"k{i:02d}"
            audio = audio_bytes(signal(0.3, SR, i), SR, "WAV", "PCM_16")
            row = {"id": key, "text": text, "speaker": speaker}
            blob = {"dict": lambda: json.dumps(row, ensure_ascii=False).encode("utf-8", "surrogatepass"),
                    "list": lambda: b'["a", "b"]', "invalid": lambda: b'{"id": ',
                    "latin1": lambda: '{"id": "x", "text": "caf\u00e9"}'.encode("latin-1"),
                    "string": lambda: b'"just a string"', "none": lambda: None}[jkind]()
            if blob is not None:
                members.append((f"{key}.json", blob))
            members.append((f"{key}.wav", audio))
            t, s = (expected_text(text), expected_speaker(speaker)) if jkind == "dict" else ("", "")
            if jkind in ("list", "invalid", "latin1", "string") or t is None or s is None:
                e.refused.add(key)
            else:
                e.wants[key] = Want(text=t, speaker=s, samples=decoded(audio))
        for j, extra in enumerate(extras):
            key = f"x{j:02d}"
            audio = audio_bytes(signal(4.0, SR, 50 + j), SR, "WAV", "PCM_16")
            if extra == "duplicate":  # the first pair's names again: the second copies are refused
                members += [("k00.json", json.dumps({"id": "k00", "text": "again"}).encode()),
                            ("k00.wav", audio)]
                e.inputs += 2
            elif extra == "sparse":
                x = signal(4.0, SR, 60 + j)
                x[SR // 2:SR * 7 // 2] = 0
                data = audio_bytes(x, SR, "WAV", "PCM_16")
                members += [(f"{key}.json", json.dumps({"id": key, "text": "s"}).encode()),
                            ("sparse", f"{key}.wav", data, (16384, 110592))]
                e.inputs += 1
                e.refused.add(key)
            elif extra in ("hardlink", "symlink"):
                members += [(f"{key}.json", json.dumps({"id": key, "text": "l"}).encode()),
                            (extra, f"{key}.wav", "k00.wav")]
                e.inputs += 1
                e.refused.add(key)
            elif extra == "nested":
                members.append((f"{key}.tar", b"\0" * 1024))
                e.inputs += 1
            elif extra == "odd":
                members.append((f"{key}.txt", b"notes"))
                e.inputs += 1
            elif extra == "second_audio":
                members.append(("k00.flac", audio_bytes(signal(0.3, SR, 77), SR, "FLAC", "PCM_16")))
                e.inputs += 1
            elif extra == "folder":
                members.append(("raw", _folder_header(f"{key}/")))
            elif extra == "orphan_json":
                members.append((f"{key}.json", json.dumps({"id": key, "text": "no audio"}).encode()))
                e.inputs += 1
                e.refused.add(key)
        tar = root / "ZH-B000000.tar"
        write_tar(tar, members)
        if cut is not None:
            data = tar.read_bytes()
            keep = max(1024, int(len(data) * cut))
            tar.write_bytes(data[:keep])
            intact = _intact_keys(data, keep)
            e.inputs, e.refused = None, e.refused | (set(e.wants) - intact)
            e.wants = {k: w for k, w in e.wants.items() if k in intact}
        return e
    return Example(build, pairs=pairs, extras=extras, cut=cut)


def _folder_header(name: str) -> bytes:
    import tarfile

    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mtime = 1_700_000_000
    return info.tobuf(tarfile.GNU_FORMAT)


def _intact_keys(data: bytes, keep: int) -> set[str]:
    """Keys whose every member lies before byte `keep` of the tar (read from the whole tar's listing)."""
    import io
    import tarfile

    ends: dict[str, int] = {}
    seen: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf:
            key, _, ext = os.path.basename(m.name).partition(".")
            audio = ext in ("wav", "flac")
            if m.name in seen or audio and (key, "audio") in seen:
                continue  # a second copy or a second audio file: an input of its own, not part of the pair
            seen |= {m.name, (key, "audio")} if audio else {m.name}
            ends[key] = max(ends.get(key, 0), m.offset_data + m.size)
    return {k for k, end in ends.items() if end <= keep}


KINDS: dict[str, Any] = {
    "audio": audio_example(),
    "sidecars": sidecar_example(),
    "manifest": manifest_example(),
    "nemo": nemo_example(),
    "lhotse": lhotse_example(),
    "shar": shar_example(),
    "hf": hf_example(),
    "commonvoice": commonvoice_example(),
    "kaldi": kaldi_example(),
    "emilia_jsonl": emilia_jsonl_example(),
    "emilia_tar": emilia_tar_example(),
}


def fuzz(kind: str, examples: int, counter: dict[str, int] | None = None, **options: Any) -> Callable[[], None]:
    """A hypothesis test of `examples` examples of one kind, each `check`ed (hypothesis shrinks a failure to a small
    example): what tests/test_fuzz_corpus.py and benchmarks/bench_fuzz.py run."""
    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              suppress_health_check=list(HealthCheck), **options)
    @given(example=KINDS[kind])
    def run(example: Example) -> None:
        check(example, counter, kind)
    return run
