"""Frame energy: the L2 norm of each frame's magnitude spectrum (FastSpeech 2 / NaturalSpeech 2 "energy")."""

from __future__ import annotations

import numpy as np
import torch

from audiopipe.errors import InvalidValue
from audiopipe.features.base import FeatureSpec
from audiopipe.features.mel import stft_magnitude, stft_num_frames
from audiopipe.features.pcm import check_waveform
from audiopipe.features.spectral import StftKey


# 2: from the float32 |STFT| the mel shares (mel.stft_magnitude), not float64; values move by a few float32 ulps.
ENERGY_VERSION = 2


class Energy:
    """{"energy": float32 [T]}: sqrt(sum_k |STFT[k, t]|^2), hann window, the same framing as the mel.

    Defaults are the vocos mel framing (24 kHz, n_fft = win = 1024, hop 256, centred reflect padding);
    the NaturalSpeech 2 preset uses hop 320 at 24 kHz. padding="hifigan" gives the HiFi-GAN mel framing.
    """

    kind = "energy"

    def __init__(
        self,
        sample_rate: int = 24000,
        n_fft: int = 1024,
        hop_length: int = 256,
        win_length: int = 1024,
        padding: str = "center",
    ) -> None:
        sample_rate, n_fft, hop_length, win_length = int(sample_rate), int(n_fft), int(hop_length), int(win_length)
        if padding not in ("center", "hifigan"):
            raise InvalidValue(f"energy: unknown padding {padding!r}: expected 'center' or 'hifigan'")
        if not 0 < win_length <= n_fft or hop_length <= 0:
            raise InvalidValue(f"energy: need 0 < win_length <= n_fft and hop_length > 0, got "
                               f"win_length={win_length} n_fft={n_fft} hop_length={hop_length}")
        self.params = {
            "sample_rate": sample_rate, "n_fft": n_fft, "hop_length": hop_length, "win_length": win_length,
            "padding": padding,
        }
        self.specs = (
            FeatureSpec(
                name="energy", kind=self.kind, sample_rate=sample_rate, dtype="float32", channels=0,
                hop_length=hop_length, params=dict(self.params), version=ENERGY_VERSION,
            ),
        )

    def num_frames(self, num_samples: int) -> int:
        p = self.params
        return stft_num_frames(num_samples, p["n_fft"], p["hop_length"], p["padding"])

    @property
    def stft_key(self) -> StftKey:
        """The framing of the |STFT| this energy sums: a mel with an equal key shares it."""
        p = self.params
        return StftKey(p["sample_rate"], p["n_fft"], p["hop_length"], p["win_length"], p["padding"], 0.0)

    def from_magnitude(self, mag: np.ndarray) -> dict[str, np.ndarray]:
        # The FFT's float32 noise is relative to the frame itself, so even the quietest frames keep ~1e-6.
        energy = torch.linalg.vector_norm(torch.from_numpy(mag), dim=0, dtype=torch.float64)
        return {"energy": energy.numpy().astype(np.float32)}

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        return self.from_magnitude(stft_magnitude(check_waveform(wav, self.kind), self.stft_key))
