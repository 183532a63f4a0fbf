"""The waveform itself as a feature (int16 PCM), and the input check every feature applies to its waveform."""

from __future__ import annotations

import numpy as np

from audiopipe.errors import InvalidValue, WrongType
from audiopipe.features.base import FeatureSpec

INT16_SCALE = 32768.0  # the scale soundfile/libsndfile use for int16 <-> float, so the round trip is exact


def check_waveform(wav: np.ndarray, who: str) -> np.ndarray:
    """Return wav as contiguous float32 1-D, or raise a clear error naming the feature `who`.

    Integer arrays are refused rather than guessed at (is it int16 PCM? already scaled?).
    """
    if not isinstance(wav, np.ndarray):
        raise WrongType(f"{who}: expected a numpy waveform, got {type(wav).__name__}")
    if wav.ndim != 1:
        raise InvalidValue(f"{who}: expected a mono 1-D waveform, got shape {wav.shape}")
    if not np.issubdtype(wav.dtype, np.floating):
        raise WrongType(f"{who}: expected a float waveform in [-1, 1], got dtype {wav.dtype}")
    if wav.size == 0:
        raise InvalidValue(f"{who}: empty waveform")
    x = np.ascontiguousarray(wav, dtype=np.float32)
    if not np.isfinite(x).all():
        raise InvalidValue(f"{who}: waveform contains NaN or inf ({int((~np.isfinite(x)).sum())} samples)")
    return x


def float_to_int16(wav: np.ndarray) -> np.ndarray:
    """round(x * 32768) to nearest (ties to even), clipped to [-32768, 32767]; x = 1.0 becomes 32767.

    Samples decoded from 16-bit files (k / 32768) come back bit-exact.
    """
    return np.clip(np.rint(wav.astype(np.float64) * INT16_SCALE), -32768, 32767).astype(np.int16)


class Pcm:
    """{"pcm": int16 [N]} at sample_rate: the waveform the other features saw, stored losslessly as int16."""

    kind = "pcm"

    def __init__(self, sample_rate: int = 24000) -> None:
        sample_rate = int(sample_rate)
        if sample_rate <= 0:
            raise InvalidValue(f"pcm: sample_rate must be positive, got {sample_rate}")
        self.specs = (
            FeatureSpec(
                name="pcm", kind=self.kind, sample_rate=sample_rate, dtype="int16", channels=0, hop_length=1,
                params={"sample_rate": sample_rate},
            ),
        )

    def num_frames(self, num_samples: int) -> int:
        return num_samples

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        return {"pcm": float_to_int16(check_waveform(wav, self.kind))}
