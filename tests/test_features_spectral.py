"""The offline STFT path (float32 stft_magnitude + banded mel, audiopipe/features/spectral.py) against the
batched torch functions trainers use (float32, as the models' own mels) and against the float64 mel."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from audiopipe.corpus.demo import ASTERISK_SOUNDS
from audiopipe.features.energy import Energy
from audiopipe.features.mel import SlaneyMel, VocosMel, magnitude_spectrogram, mel_spectrogram, stft_magnitude


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
def test_offline_mel_equals_the_trainers_float32_mel(cls):
    # The models' own mels (F5-TTS/vocos, HiFi-GAN) are float32; so is the stored one. Same FFT, the mel summed
    # band by band instead of by BLAS: a few float32 roundings apart, near the floor too (the float64 mel
    # stored before differed from this by up to ~1 nat in bands near the 1e-5 floor).
    f = cls()
    for x, sr in _speech():
        x = soxr.resample(x, sr, f.params["sample_rate"]).astype(np.float32)
        with torch.inference_mode():
            ref = mel_spectrogram(torch.from_numpy(x)[None], **f.params)[0].numpy()
        got = f(x)["mel"]
        assert got.dtype == np.float32 and got.shape == ref.shape
        assert np.abs(got - ref).max() < 4e-6


@pytest.mark.parametrize("cls", [VocosMel, SlaneyMel])
def test_offline_mel_is_float64_accurate_where_the_mel_is_above_the_floor(cls):
    # float32 FFT noise is relative to a frame's loud bins: measured max |log-mel diff| to the float64 mel on
    # these clips: 1.8e-4 where the mel > 1e-2, 1.6e-6 where it is > 1 (vocos; slaney 3e-6 and 2e-7).
    f = cls()
    for x, sr in _speech():
        x = soxr.resample(x, sr, f.params["sample_rate"]).astype(np.float32)
        with torch.inference_mode():
            ref = mel_spectrogram(torch.from_numpy(x.astype(np.float64))[None], **f.params)[0].numpy()
        diff = np.abs(f(x)["mel"] - ref)
        assert diff[ref > np.log(1e-2)].max(initial=0) < 5e-4
        assert diff[ref > 0].max(initial=0) < 5e-6


def test_offline_magnitude_is_the_float32_stft_magnitude_time_contiguous():
    key = VocosMel().stft_key
    x = soxr.resample(*_speech()[0], 24000).astype(np.float32)
    mag = stft_magnitude(x, key)
    with torch.inference_mode():
        ref = magnitude_spectrogram(torch.from_numpy(x)[None], n_fft=1024, hop_length=256, win_length=1024)[0]
    assert mag.dtype == np.float32 and mag.flags.c_contiguous and mag.shape == tuple(ref.shape)
    np.testing.assert_allclose(mag, ref.numpy(), rtol=2e-7, atol=1e-7)  # sqrt(re^2 + im^2) both: ~1 ulp


def test_offline_energy_equals_the_torch_norm_of_the_magnitude():
    e = Energy(hop_length=320, n_fft=1280, win_length=1280)
    for x, sr in _speech():
        x = soxr.resample(x, sr, 24000).astype(np.float32)
        with torch.inference_mode():
            mag = magnitude_spectrogram(torch.from_numpy(x.astype(np.float64))[None], n_fft=1280, hop_length=320,
                                        win_length=1280)[0]
            ref = torch.linalg.vector_norm(mag, dim=0).numpy().astype(np.float32)
        np.testing.assert_allclose(e(x)["energy"], ref, rtol=1e-6, atol=0)
