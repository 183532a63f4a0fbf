"""Decode one audio file into float32 mono, refuse bad input with a reason, and resample.

Two levels of checking: `check_header` looks only at header fields (cheap: discovery and planning use it on
every file), `load_audio` decodes and adds the checks that need samples (truncation, NaN/inf, silence).
Every refusal is a `RejectError(reason, detail)`; the reason codes are listed in docs/corpus.md.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from dataclasses import asdict, dataclass
from typing import Any, Iterable, NamedTuple

import numpy as np
import soundfile as sf
import soxr

from audiopipe.errors import AudiopipeError

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
    if sr <= 0 or not limits.min_sample_rate <= sr <= limits.max_sample_rate:
        raise RejectError("bad_sample_rate", f"sample rate {sr} Hz is outside "
                                             f"[{limits.min_sample_rate}, {limits.max_sample_rate}] Hz")
    if channels < 1:
        raise RejectError("unreadable", f"the header declares {channels} channels")
    if channels > limits.max_channels:
        raise RejectError("too_many_channels", f"{channels} channels; at most {limits.max_channels} are accepted")
    if frames <= 0:
        raise RejectError("empty", "the header declares no audio frames")
    duration = frames / sr
    if duration < limits.min_duration:
        raise RejectError("too_short", f"{duration:.3f} s is shorter than the minimum {limits.min_duration} s")
    if duration > limits.max_duration:
        raise RejectError("too_long", f"{duration:.3f} s is longer than the maximum {limits.max_duration} s")


def _checked_size(path: str) -> int:
    try:
        st = os.stat(path)  # one stat: discovery calls this for every file it hands to libsndfile
    except FileNotFoundError:
        raise RejectError("missing", f"no such file: {path}") from None
    except OSError as e:
        raise RejectError("unreadable", f"cannot stat the file: {e}") from None
    if not stat.S_ISREG(st.st_mode):
        # libsndfile's open of a named pipe blocks until a writer appears: it would hang the whole job.
        raise RejectError("unreadable", "not a regular file (a named pipe, socket or device)")
    size = st.st_size
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


def read_info(path: str | os.PathLike[str]) -> Header:
    """The file's header (libsndfile opens it, nothing is decoded), every failure a RejectError (missing, empty,
    unreadable). Opening a SoundFile costs ~2/3 of soundfile.info(), which also builds format descriptions and
    libsndfile's log text; discovery reads a header per file of the corpus, with the GIL held for that Python."""
    path = os.fspath(path)
    size = _checked_size(path)  # first: a named pipe must be refused before libsndfile blocks opening it
    try:
        with sf.SoundFile(path) as f:
            return Header(f.samplerate, f.frames, f.channels, f.format, f.subtype)
    except (RuntimeError, OSError, ValueError, TypeError) as e:  # LibsndfileError is a RuntimeError
        raise RejectError("unreadable", f"libsndfile cannot read the header ({size} bytes): {e}") from None


def _open(path: str) -> sf.SoundFile:
    """The file opened for decoding, with read_info's refusals: one open serves header and samples."""
    size = _checked_size(path)
    try:
        return sf.SoundFile(path)
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        raise RejectError("unreadable", f"libsndfile cannot read the header ({size} bytes): {e}") from None


def _riff_declared_frames(path: str) -> int | None:
    """Frames the WAV `data` chunk declares, or None when unknown.

    libsndfile silently shortens a WAV whose data chunk runs past the end of the file, so soundfile.info()
    cannot reveal the truncation; the declared chunk size can.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(12)
            if len(head) < 12 or head[8:12] != b"WAVE" or head[:4] not in (b"RIFF", b"RIFX"):
                return None
            endian = "<" if head[:4] == b"RIFF" else ">"
            block_align = 0
            while True:
                chunk = f.read(8)
                if len(chunk) < 8:
                    return None
                cid, size = chunk[:4], struct.unpack(endian + "I", chunk[4:])[0]
                if cid == b"fmt ":
                    fmt = f.read(size + (size & 1))
                    if len(fmt) >= 14:
                        block_align = struct.unpack(endian + "H", fmt[12:14])[0]
                    continue
                if cid == b"data":
                    # 0 and huge sizes are placeholders written by streaming tools: length unknown.
                    if block_align <= 0 or size == 0 or size >= 0x7FFFF000:
                        return None
                    return size // block_align
                f.seek(size + (size & 1), os.SEEK_CUR)
    except OSError:
        return None


def _declared_frames(path: str, info: Any) -> int:
    if info.format in ("WAV", "WAVEX"):
        declared = _riff_declared_frames(path)
        if declared is not None:
            return max(declared, int(info.frames))
    return int(info.frames)


def _decode(f: sf.SoundFile) -> tuple[np.ndarray, str | None]:
    """Decode block by block so that frames decoded before a mid-stream error are counted.

    Mono comes out 1-D straight from libsndfile (no [N, 1] copy); more channels as [N, C]."""
    blocks: list[np.ndarray] = []
    error = None
    two_d = f.channels > 1
    while True:
        try:
            block = f.read(1 << 16, dtype="float32", always_2d=two_d)
        except (RuntimeError, OSError, ValueError) as e:
            error = str(e)
            break
        if len(block) == 0:
            break
        blocks.append(block)
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
    with _open(path) as info:  # the open file is its own header: samplerate, channels, frames, format
        check_header(info, limits)
        return decode_checked(info, _declared_frames(path, info), limits)


def decode_checked(f: sf.SoundFile, declared: int, limits: DecodeLimits,
                   what: str = "decoded audio") -> tuple[np.ndarray, int]:
    """Decode an open file (a path, a tar member, a recording) to (float32 mono, rate) with every check after
    the header's: unreadable, truncated (with MP3's slack), empty, NaN/inf, then duration and silence."""
    try:
        data, error = _decode(f)
    except (RuntimeError, OSError, ValueError) as e:
        raise RejectError("unreadable", f"libsndfile cannot open the file for decoding: {e}") from None
    samplerate = int(f.samplerate)
    decoded = len(data)
    slack = max(_MP3_SLACK_FRAMES, int(declared * _MP3_SLACK_FRACTION)) if f.format == "MP3" else 0
    if decoded + slack < declared or (error is not None and decoded < declared):
        why = f" (decoder stopped: {error})" if error else ""
        raise RejectError("truncated", f"decoded {decoded} of the {declared} frames the header declares "
                                       f"({decoded / samplerate:.3f} of {declared / samplerate:.3f} s)"
                                       f"{why}")
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
        raise ValueError(f"sample rates must be positive, got {sr_in} -> {sr_out}")
    wav = np.ascontiguousarray(wav, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"resample expects a mono 1-D waveform, got shape {wav.shape}")
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
