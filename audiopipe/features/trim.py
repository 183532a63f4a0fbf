"""Leading/trailing silence trimming, as NS2-style preprocessing does before codes, F0 and alignment.

Same rule as ``librosa.effects.trim`` (so results can be compared with it): frame RMS on a centred,
zero-padded signal; a frame is speech when its level is within `top_db` of the loudest frame; keep from the
first speech frame's start to one hop past the last. Returned as sample indices so a shard row can store them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from audiopipe.errors import InvalidValue

DEFAULT_TOP_DB = 35.0
DEFAULT_FRAME_LENGTH = 1024  # 42.7 ms at 24 kHz
DEFAULT_HOP_LENGTH = 256
AMIN = 1e-5  # RMS floor (-100 dBFS): quieter than this is digital silence, as in librosa.amplitude_to_db


@dataclass(frozen=True)
class TrimResult:
    """Keep ``wav[start:end]``. `all_silent` means nothing rose above the floor, so the clip was kept whole."""

    start: int
    end: int
    all_silent: bool = False

    @property
    def length(self) -> int:
        return self.end - self.start


def frame_rms(wav: np.ndarray, frame_length: int, hop_length: int) -> np.ndarray:
    """RMS per frame of the centred signal (zero padding of frame_length // 2 each side), like librosa.feature.rms."""
    pad = frame_length // 2
    padded = np.pad(np.asarray(wav, dtype=np.float64), pad)
    frames = np.lib.stride_tricks.sliding_window_view(padded, frame_length)[::hop_length]
    return np.sqrt(np.mean(frames * frames, axis=-1))


def trim_silence(
    wav: np.ndarray,
    top_db: float = DEFAULT_TOP_DB,
    frame_length: int = DEFAULT_FRAME_LENGTH,
    hop_length: int = DEFAULT_HOP_LENGTH,
) -> TrimResult:
    """(start, end) in samples of the non-silent part of a mono waveform; never empty."""
    wav = np.asarray(wav)
    if wav.ndim != 1:
        raise InvalidValue(f"trim_silence expects mono 1-D audio, got shape {wav.shape}")
    if wav.size == 0:
        raise InvalidValue("trim_silence got an empty waveform")
    if frame_length <= 0 or hop_length <= 0:
        raise InvalidValue(f"frame_length and hop_length must be positive, got {frame_length}, {hop_length}")
    if not top_db > 0:
        raise InvalidValue(f"top_db must be positive, got {top_db}")
    if not np.isfinite(wav).all():
        raise InvalidValue("trim_silence got a waveform with NaN or inf")

    rms = frame_rms(wav, frame_length, hop_length)
    peak = float(rms.max())
    if peak <= AMIN:
        return TrimResult(0, int(wav.size), all_silent=True)
    # Same arithmetic as librosa.amplitude_to_db(rms, ref=np.max) > -top_db, so ties resolve identically.
    level_db = 20.0 * np.log10(np.maximum(AMIN, rms)) - 20.0 * np.log10(peak)
    speech = np.flatnonzero(level_db > -top_db)
    # The loudest frame always passes (0 dB > -top_db), so `speech` is never empty here.
    start = int(speech[0]) * hop_length
    end = min(int(wav.size), (int(speech[-1]) + 1) * hop_length)
    if start >= end:  # only the last frame, centred on the final sample, is loud: keep one hop, not nothing
        start = max(0, end - hop_length)
    return TrimResult(start, end)
