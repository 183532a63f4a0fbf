"""Kaldi fbank: kaldi-native-fbank feature, the batched torch twin against it, frame counts, CMN."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from audiopipe.corpus.demo import ASTERISK_SOUNDS, MissingSource, speak
from audiopipe.features.fbank import KaldiFbank, kaldi_fbank_torch, kaldi_mel_banks, mean_normalize

SR = 16000


@pytest.fixture(scope="module")
def signals(tmp_path_factory) -> dict[str, np.ndarray]:
    """Wideband material at 16 kHz: espeak-ng speech, a full-band chirp, white noise, tone + silence."""
    wav = tmp_path_factory.mktemp("fbank") / "espeak.wav"
    try:
        speak("Seven green boxes stood beside the open door.", "en-gb", 150, 40, wav)
    except MissingSource:
        pytest.skip("espeak-ng not installed")
    x, sr = sf.read(wav, dtype="float32")
    t = np.arange(2 * SR) / SR
    return {
        "espeak": soxr.resample(x, sr, SR).astype(np.float32),
        "chirp": (0.5 * np.sin(2 * np.pi * (30 * t + (7800 - 30) / 4 * t**2))).astype(np.float32),
        "noise": (0.05 * np.random.default_rng(0).standard_normal(SR)).astype(np.float32),
        "tone_gap": np.concatenate([np.zeros(4000), 0.3 * np.sin(2 * np.pi * 300 * t[:8000])]).astype(np.float32),
    }


@pytest.mark.parametrize("scale", [1.0, 32768.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_matches_kaldi_native_fbank(signals, scale, dtype):
    knf_feat = KaldiFbank(input_scale=scale)
    for name, x in signals.items():
        ref = knf_feat(x)["fbank"]  # [80, T]
        assert ref.shape == (80, 1 + (len(x) - 400) // 160)
        got = kaldi_fbank_torch(torch.from_numpy(x).to(dtype)[None], input_scale=scale)[0].T.numpy()
        assert got.shape == ref.shape
        diff = np.abs(got - ref)
        # Bands far below the frame's loudest hold float32 rounding noise of kaldi-native-fbank itself
        # (a chirp's off-band bins sit ~120 dB down), so the bound depends on the distance to the peak.
        below_peak_db = (ref.max(axis=0, keepdims=True) - ref) * 10 / np.log(10)
        assert diff[below_peak_db < 60].max() < 5e-4, (name, diff[below_peak_db < 60].max())
        assert diff[below_peak_db < 80].max() < 2e-3, (name, diff[below_peak_db < 80].max())


def test_real_narrowband_speech_agrees_where_there_is_energy():
    # 8 kHz Asterisk speech upsampled: bands above 4 kHz hold only rounding noise, where float32 Kaldi and
    # any other implementation differ; the speech band must agree.
    if not ASTERISK_SOUNDS.is_dir():
        pytest.skip("asterisk-core-sounds-en-wav not installed")
    x, sr = sf.read(ASTERISK_SOUNDS / "auth-incorrect.wav", dtype="float32")
    x = soxr.resample(x, sr, SR).astype(np.float32)
    ref = KaldiFbank()(x)["fbank"]
    got = kaldi_fbank_torch(torch.from_numpy(x)[None])[0].T.numpy()
    strong = ref > ref.max(axis=0, keepdims=True) - 6 * np.log(10)  # within 60 dB of the frame's peak
    assert strong.mean() > 0.3
    assert np.abs(got - ref)[strong].max() < 1e-3


def test_batch_of_random_crops_equals_per_crop_features(signals):
    x = signals["espeak"]
    rng = np.random.default_rng(1)
    crop = 12000
    starts = rng.integers(0, len(x) - crop, size=4)
    batch = np.stack([x[s : s + crop] for s in starts])
    got = kaldi_fbank_torch(torch.from_numpy(batch))
    assert got.shape == (4, 1 + (crop - 400) // 160, 80)
    feat = KaldiFbank()
    for row, crop_wav in zip(got, batch):
        np.testing.assert_allclose(row.T.numpy(), feat(crop_wav)["fbank"], atol=5e-3)


def test_input_scale_shifts_log_energies_by_a_constant(signals):
    x = signals["noise"]
    a = KaldiFbank()(x)["fbank"]
    b = KaldiFbank(input_scale=32768.0)(x)["fbank"]
    np.testing.assert_allclose(b - a, 2 * np.log(32768.0), atol=1e-3)
    assert KaldiFbank().specs[0].config_hash != KaldiFbank(input_scale=32768).specs[0].config_hash


def test_mel_banks_shape_and_edges():
    banks = kaldi_mel_banks(80, SR, 512, 20.0, 0.0)
    assert banks.shape == (80, 256)
    assert (banks >= 0).all() and (banks <= 1).all()
    assert banks[:, 0].sum() == 0  # 0 Hz is below low_freq
    assert (banks.max(axis=1) > 0.3).all()  # no empty filter
    with pytest.raises(ValueError, match="low_freq"):
        kaldi_mel_banks(80, SR, 512, 9000.0, 0.0)


@pytest.mark.parametrize("n", [400, 401, 559, 560, 16000])
def test_frame_counts_and_short_input(n):
    feat = KaldiFbank()
    x = np.random.default_rng(n).uniform(-0.5, 0.5, n).astype(np.float32)
    assert feat(x)["fbank"].shape == (80, feat.num_frames(n)) == (80, 1 + (n - 400) // 160)
    assert feat.num_frames(399) == 0
    with pytest.raises(ValueError, match="shorter than one"):
        feat(x[:399])
    with pytest.raises(ValueError, match="shorter than one"):
        kaldi_fbank_torch(torch.zeros(1, 399))


def test_mean_normalize_numpy_torch_and_lengths():
    rng = np.random.default_rng(0)
    stored = rng.normal(3.0, 1.0, (80, 50)).astype(np.float32)  # [80, T], time last
    cmn = mean_normalize(stored)
    np.testing.assert_allclose(cmn.mean(axis=-1), 0, atol=1e-5)
    batch = torch.from_numpy(rng.normal(3.0, 1.0, (2, 30, 80)))  # [B, T, 80]
    lengths = [30, 20]
    batch[1, 20:] = 0.0  # padding
    out = mean_normalize(batch, time_axis=1, lengths=lengths)
    torch.testing.assert_close(out[0], batch[0] - batch[0].mean(0, keepdim=True))
    torch.testing.assert_close(out[1, :20], batch[1, :20] - batch[1, :20].mean(0, keepdim=True))
    assert (out[1, 20:] == 0).all()  # padding untouched
    np.testing.assert_allclose(mean_normalize(batch.numpy(), time_axis=1, lengths=lengths), out.numpy())
    with pytest.raises(ValueError, match="lengths"):
        mean_normalize(batch, time_axis=1, lengths=[31, 5])


def test_cached_constants_survive_inference_mode():
    # A first call under inference_mode must not leave inference tensors in the cache for later autograd use.
    with torch.inference_mode():
        kaldi_fbank_torch(torch.zeros(1, 800, dtype=torch.float64))
    wav = (0.1 * torch.randn(2, 1600, dtype=torch.float64)).requires_grad_(True)
    kaldi_fbank_torch(wav).sum().backward()
    assert torch.isfinite(wav.grad).all()
