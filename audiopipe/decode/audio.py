"""Decode one audio file into float32 mono, refuse bad input with a reason, and resample.

Two levels of checking: `check_header` looks only at header fields (cheap: discovery and planning use it on
every file), `load_audio` decodes and adds the checks that need samples (truncation, NaN/inf, silence).
Every refusal is a `RejectError(reason, detail)`; the reason codes are listed in docs/corpus.md.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Iterable, NamedTuple

import numpy as np
import soundfile as sf
import soxr

from audiopipe.decode import declared
from audiopipe.storage import guard
from audiopipe.errors import AudiopipeError, InvalidValue

RESAMPLE_QUALITY = "HQ"

# An MP3 header length may be an estimate (no Xing/LAME frame count); allow a little slack before calling it
# truncated: two MPEG frames or 1 %, whichever is larger.
_MP3_SLACK_FRAMES = 2 * 1152
_MP3_SLACK_FRACTION = 0.01


@dataclass(frozen=True)
class DecodeLimits:
    """What counts as usable audio. All bounds are inclusive."""

    min_duration: float = 0.3  # seconds
    max_duration: float = 30.0  # seconds
    max_channels: int = 2
    min_sample_rate: int = 4000
    max_sample_rate: int = 192000
    silence_dbfs: float = -60.0  # a file whose peak is below this is silent

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class RejectError(AudiopipeError):
    """An input that must not be written. `reason` is a short stable code, `detail` a sentence with numbers."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"

    def __reduce__(self):  # keep reason/detail across pickling (Ray workers, multiprocessing)
        return (RejectError, (self.reason, self.detail))


def _header_fields(info: Any) -> tuple[int, int, int]:
    """(sample_rate, channels, frames) from a soundfile info object or anything shaped like a corpus Utterance."""
    if hasattr(info, "samplerate"):
        return int(info.samplerate), int(info.channels), int(info.frames)
    return int(info.sample_rate), int(info.channels), int(info.num_samples)


def check_header(info: Any, limits: DecodeLimits | None = None) -> None:
    """Raise RejectError if header fields alone disqualify the file.

    `info` is a `soundfile.info()` result or a corpus `Utterance` (anything with sample_rate/channels/num_samples).
    """
    limits = limits or DecodeLimits()
    sr, channels, frames = _header_fields(info)
    check_format(sr, channels, limits)
    if frames <= 0:
        raise RejectError("empty", "the header declares no audio frames")
    duration = frames / sr
    if duration < limits.min_duration:
        raise RejectError("too_short", f"{duration:.3f} s is shorter than the minimum {limits.min_duration} s")
    if duration > limits.max_duration:
        raise RejectError("too_long", f"{duration:.3f} s is longer than the maximum {limits.max_duration} s")


def check_format(sr: int, channels: int, limits: DecodeLimits) -> None:
    """The header checks that do not need its length: sample rate and channels."""
    if sr <= 0 or not limits.min_sample_rate <= sr <= limits.max_sample_rate:
        raise RejectError("bad_sample_rate", f"sample rate {sr} Hz is outside "
                                             f"[{limits.min_sample_rate}, {limits.max_sample_rate}] Hz")
    if channels < 1:
        raise RejectError("unreadable", f"the header declares {channels} channels")
    if channels > limits.max_channels:
        raise RejectError("too_many_channels", f"{channels} channels; at most {limits.max_channels} are accepted")


def _checked_size(path: str) -> int:
    """The size of a regular, non-empty file (audiopipe.storage.guard's check: libsndfile's open of a named pipe
    blocks until a writer appears, which would hang the whole job)."""
    try:
        size = guard.regular(path).st_size  # one stat: discovery calls this for every file it hands to libsndfile
    except guard.Refused as e:
        raise RejectError(e.reason, e.detail) from None
    if size == 0:
        raise RejectError("empty", "the file is 0 bytes")
    return size


class Header(NamedTuple):
    """What discovery needs of a file's header."""

    samplerate: int
    frames: int
    channels: int
    format: str
    subtype: str


_BLOCK = 1 << 16  # frames decoded at a time


def as_stream(f: sf.SoundFile) -> sf.SoundFile:
    """`f` read forward only, as soundfile reads a pipe. soundfile seeks to its own position after every read
    (to keep its count), and libFLAC cannot seek in a FLAC whose STREAMINFO gives no length: reading such a
    file in blocks would stop after the first one. Marking it unseekable (soundfile's state for pipes) keeps
    soundfile from seeking; the frames to read are then always given."""
    f._info.seekable = 0
    return f


def measure_frames(f: sf.SoundFile, limit: int | None = None) -> int:
    """The frames an open file really holds, counted by decoding it block by block into one reused buffer (the
    memory of one block, whatever the length); stops past `limit` frames when given. For a stream whose header
    gives no length (a FLAC with total_samples 0): `f` is read forward (as_stream) and cannot be rewound."""
    as_stream(f)
    buf = np.empty((_BLOCK, f.channels), np.float32)
    n = 0
    try:
        while limit is None or n <= limit:
            got = len(f.read(_BLOCK, dtype="float32", always_2d=True, out=buf))
            if got == 0:
                break
            n += got
    except (RuntimeError, OSError, ValueError) as e:
        raise RejectError("truncated", f"the decoder stopped after {n} frames of a stream without a length in "
                                       f"its header: {e}") from None
    return n


def read_info(path: str | os.PathLike[str]) -> Header:
    """The file's header (libsndfile opens it, nothing is decoded), every failure a RejectError (missing, empty,
    unreadable). Opening a SoundFile costs ~2/3 of soundfile.info(), which also builds format descriptions and
    libsndfile's log text; discovery reads a header per file of the corpus, with the GIL held for that Python.
    A stream whose header gives no length (a FLAC with total_samples 0) is measured by decoding it."""
    path = os.fspath(path)
    size = _checked_size(path)  # first: a named pipe must be refused before libsndfile blocks opening it
    try:
        with sf.SoundFile(path) as f:
            frames = measure_frames(f) if declared.unknown(f.frames) else f.frames
            return Header(f.samplerate, frames, f.channels, f.format, f.subtype)
    except (RuntimeError, OSError, ValueError, TypeError) as e:  # LibsndfileError is a RuntimeError
        raise RejectError("unreadable", f"libsndfile cannot read the header ({size} bytes): {e}") from None


def _open(path: str) -> tuple[sf.SoundFile, int]:
    """The file opened for decoding, and its size, with read_info's refusals: one open serves header and
    samples."""
    size = _checked_size(path)
    try:
        return sf.SoundFile(path), size
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        raise RejectError("unreadable", f"libsndfile cannot read the header ({size} bytes): {e}") from None


def _decode(f: sf.SoundFile, limit: int | None = None) -> tuple[np.ndarray, str | None]:
    """Decode block by block so that frames decoded before a mid-stream error are counted; at most `limit`
    frames (more than a file may hold is not kept in memory: the caller refuses it as too long).

    Mono comes out 1-D straight from libsndfile (no [N, 1] copy); more channels as [N, C]."""
    blocks: list[np.ndarray] = []
    error = None
    two_d = f.channels > 1
    n = 0
    short_at: int | None = None
    while limit is None or n < limit:
        want = _BLOCK if limit is None else min(_BLOCK, limit - n)
        try:
            block = f.read(want, dtype="float32", always_2d=two_d)
        except (RuntimeError, OSError, ValueError) as e:
            error = str(e)
            break
        if len(block) == 0:
            break
        if short_at is not None:
            # A read came back short and the next one still had frames: libsndfile's decoder (ALAC, for one)
            # gave up on a damaged packet and went on after it, so what follows is not the stream's audio
            # (soundfile.read in one call stops at that point too). Stop there; the caller compares the
            # frames kept with the header's.
            error = f"a damaged packet at frame {short_at}; the decoder skipped over it"
            break
        if len(block) < want:
            short_at = n + len(block)
        blocks.append(block)
        n += len(block)
    if not blocks:
        data = np.zeros((0, f.channels) if two_d else 0, np.float32)
    else:
        data = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    return data, error


def load_audio(path: str | os.PathLike[str], limits: DecodeLimits | None = None) -> tuple[np.ndarray, int]:
    """Decode `path` to (float32 mono waveform, sample rate), or raise RejectError with the reason.

    Channels are mixed to mono by averaging. Integer PCM comes out in [-1, 1); float files pass unscaled.
    """
    limits = limits or DecodeLimits()
    path = os.fspath(path)
    f, size = _open(path)
    with f, open(path, "rb") as raw:  # raw: the header bytes, for the length it declares
        return decode_open(f, raw, size, limits)


def declared_length(raw: Any, size: int, f: sf.SoundFile) -> declared.Length:
    """The length the header declares (audiopipe.decode.declared), or RejectError("unreadable") for a header
    that contradicts itself, which no decode can read one way."""
    length = declared.declared_length(raw, size, f)
    if length.fault is not None:
        raise RejectError("unreadable", length.fault)
    return length


def decode_open(f: sf.SoundFile, raw: Any, size: int, limits: DecodeLimits,
                what: str = "decoded audio") -> tuple[np.ndarray, int]:
    """Decode a file libsndfile has opened (`raw`: its bytes, `size` long, for the length its header declares)
    with every check: header limits, a header that declares more data than the file holds (refused before
    decoding), then decode_checked's. A stream without a length in its header is decoded up to the longest
    duration allowed, and its length checked on what was decoded."""
    if declared.unknown(f.frames):
        check_format(int(f.samplerate), int(f.channels), limits)
        return decode_checked(as_stream(f), 0, limits, what)
    check_header(f, limits)
    length = declared_length(raw, size, f)
    if length.short is not None and not length.counted:  # cut short, by how many frames the header cannot say
        raise RejectError("truncated", f"{length.short}; libsndfile reads {int(f.frames)} frames")
    return decode_checked(f, length.frames, limits, what, length.short)


def decode_checked(f: sf.SoundFile, declared_frames: int, limits: DecodeLimits,
                   what: str = "decoded audio", why: str | None = None) -> tuple[np.ndarray, int]:
    """Decode an open file (a path, a tar member, a recording) to (float32 mono, rate) with every check after
    the header's: unreadable, truncated (with MP3's slack), empty, NaN/inf, then duration and silence. At most
    one frame more than the longest duration allowed is decoded."""
    samplerate = int(f.samplerate)
    limit = math.floor(limits.max_duration * samplerate) + 1 if math.isfinite(limits.max_duration) else None
    try:
        data, error = _decode(f, limit)
    except (RuntimeError, OSError, ValueError) as e:
        raise RejectError("unreadable", f"libsndfile cannot open the file for decoding: {e}") from None
    decoded = len(data)
    slack = max(_MP3_SLACK_FRAMES, int(declared_frames * _MP3_SLACK_FRACTION)) if f.format == "MP3" else 0
    if limit is not None and decoded >= limit:
        declared_frames = 0  # stopped on purpose: too long, said by check_limits below
    if decoded + slack < declared_frames or (error is not None and decoded < declared_frames):
        said = f" (decoder stopped: {error})" if error else f"; {why}" if why else ""
        raise RejectError("truncated", f"decoded {decoded} of the {declared_frames} frames the header declares "
                                       f"({decoded / samplerate:.3f} of {declared_frames / samplerate:.3f} s)"
                                       f"{said}")
    if error is not None and declared_frames == 0:  # a stream without a length that breaks off
        raise RejectError("truncated", f"the decoder stopped after {decoded} frames of a stream without a "
                                       f"length in its header: {error}")
    if decoded == 0:
        raise RejectError("empty", "no audio frames could be decoded")

    finite = np.isfinite(data)
    if not finite.all():
        bad = int(data.size - np.count_nonzero(finite))
        raise RejectError("nan_inf", f"{bad} of {data.size} samples are NaN or infinite")

    wav = data if data.ndim == 1 else data.mean(axis=1, dtype=np.float32)
    # Re-check the duration on what was actually decoded (MP3 headers may estimate it).
    return check_limits(np.ascontiguousarray(wav, dtype=np.float32), samplerate, limits, what), samplerate


def check_limits(wav: np.ndarray, sr: int, limits: DecodeLimits, what: str = "decoded audio") -> np.ndarray:
    """Duration and silence limits on decoded mono audio: a whole file, or a cut of a recording."""
    duration = len(wav) / sr
    if duration < limits.min_duration:
        raise RejectError("too_short", f"{what} of {duration:.3f} s is shorter than the minimum "
                                       f"{limits.min_duration} s")
    if duration > limits.max_duration:
        raise RejectError("too_long", f"{what} of {duration:.3f} s is longer than the maximum "
                                      f"{limits.max_duration} s")
    peak = float(np.max(np.abs(wav))) if len(wav) else 0.0
    peak_dbfs = 20.0 * math.log10(peak) if peak > 0 else -math.inf
    if peak_dbfs < limits.silence_dbfs:
        shown = "-inf" if peak == 0 else f"{peak_dbfs:.1f}"
        raise RejectError("silent", f"peak {shown} dBFS is below the {limits.silence_dbfs} dBFS silence threshold")
    return wav


def resample(wav: np.ndarray, sr_in: int, sr_out: int) -> np.ndarray:
    """Resample a mono float32 waveform with soxr (quality HQ). Equal rates return the input unchanged."""
    if sr_in <= 0 or sr_out <= 0:
        raise InvalidValue(f"sample rates must be positive, got {sr_in} -> {sr_out}")
    wav = np.ascontiguousarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise InvalidValue(f"resample expects a mono 1-D waveform, got shape {wav.shape}")
    if sr_in == sr_out:
        return wav
    return soxr.resample(wav, sr_in, sr_out, quality=RESAMPLE_QUALITY)


def resample_to(wav: np.ndarray, sr: int, rates: Iterable[int]) -> dict[int, np.ndarray]:
    """{rate: waveform at rate} for each distinct rate, resampling once per rate (always from the original)."""
    return {int(r): resample(wav, sr, int(r)) for r in sorted(set(int(r) for r in rates))}


def resampler_info() -> dict[str, str]:
    """What the manifest records about the resampler, so that a changed resampler is visible."""
    return {"library": "soxr", "version": soxr.__version__, "libsoxr": soxr.__libsoxr_version__,
            "quality": RESAMPLE_QUALITY}
