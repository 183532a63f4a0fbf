"""The offline STFT path (stft_magnitude + sparse mel, audiopipe/features/spectral.py) against the batched
torch functions trainers use: the stored float32 features must not drift apart."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from audiopipe.corpus.demo import ASTERISK_SOUNDS
from audiopipe.features.energy import Energy
from audiopipe.features.mel import SlaneyMel, VocosMel, magnitude_spectrogram, mel_spectrogram


def _speech() -> list[tuple[np.ndarray, int]]:
    if not ASTERISK_SOUNDS.is_dir():
        pytest.skip("asterisk-core-sounds-en-wav is not installed")
    out = []
    for name in ("vm-goodbye", "auth-incorrect", "vm-next", "activated"):
        x, sr = sf.read(str(ASTERISK_SOUNDS / f"{name}.wav"), dtype="float32")
        out.append((x, sr))
    t = np.arange(40000) / 24000.0
    out.append(((0.3 * np.sin(2 * np.pi * (200 + 3000 * t) * t)).astype(np.float32), 24000))  # chirp
    out.append((np.r_[np.zeros(6000), 1e-6 * np.ones(6000), 0.2 * np.ones(200)].astype(np.float32), 24000))
    return out


@pytest.mark.parametrize("cls", [VocosMel, SlaneyMel])
def test_offline_mel_equals_the_batched_torch_mel(cls):
    f = cls()
    for x, sr in _speech():
        x = soxr.resample(x, sr, f.params["sample_rate"]).astype(np.float32)
        with torch.inference_mode():
            ref = mel_spectrogram(torch.from_numpy(x.astype(np.float64))[None], **f.params)[0].numpy()
        got = f(x)["mel"]
        assert got.dtype == np.float32 and got.shape == ref.shape
        # float64 sums in another order: at most one float32 rounding step apart (in practice identical).
        ulps = np.abs(got.view(np.int32).astype(np.int64) - ref.astype(np.float32).view(np.int32))
        assert ulps.max() <= 1


def test_offline_energy_equals_the_torch_norm_of_the_magnitude():
    e = Energy(hop_length=320, n_fft=1280, win_length=1280)
    for x, sr in _speech():
        x = soxr.resample(x, sr, 24000).astype(np.float32)
        with torch.inference_mode():
            mag = magnitude_spectrogram(torch.from_numpy(x.astype(np.float64))[None], n_fft=1280, hop_length=320,
                                        win_length=1280)[0]
            ref = torch.linalg.vector_norm(mag, dim=0).numpy().astype(np.float32)
        np.testing.assert_allclose(e(x)["energy"], ref, rtol=1e-6, atol=0)
