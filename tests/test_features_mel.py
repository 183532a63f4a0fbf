"""Log-mel features against librosa: filterbanks, vocos mel, HiFi-GAN mel, frame counts, batching, errors."""

from __future__ import annotations

import math

import librosa
import numpy as np
import pytest
import soundfile as sf
import soxr
import torch

from audiopipe.corpus.demo import ASTERISK_SOUNDS, MissingSource, speak
from audiopipe.features.mel import (
    SlaneyMel,
    VocosMel,
    hifigan_mel_kwargs,
    hz_to_mel,
    mel_filterbank,
    mel_spectrogram,
    mel_to_hz,
    vocos_mel_kwargs,
)

PROMPTS = ("vm-goodbye", "auth-incorrect", "vm-next")

pytestmark = pytest.mark.usefixtures("librosa_kernels")  # compiled once per run (conftest)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> dict[str, tuple[np.ndarray, int]]:
    """Real speech (three Asterisk prompts, 8 kHz) and one espeak-ng sentence (22.05 kHz), float32."""
    if not ASTERISK_SOUNDS.is_dir():
        pytest.skip("asterisk-core-sounds-en-wav not installed")
    out = {}
    for name in PROMPTS:
        x, sr = sf.read(ASTERISK_SOUNDS / f"{name}.wav", dtype="float32")
        out[name] = (x, sr)
    wav = tmp_path_factory.mktemp("mel") / "espeak.wav"
    try:
        speak("The quick brown fox jumps over the lazy dog.", "en-us", 160, 50, wav)
    except MissingSource:
        pytest.skip("espeak-ng not installed")
    x, sr = sf.read(wav, dtype="float32")
    out["espeak"] = (x, sr)
    return out


def at_rate(sig: tuple[np.ndarray, int], sr: int) -> np.ndarray:
    x, src = sig
    return soxr.resample(x, src, sr).astype(np.float32) if src != sr else x


def chirp(sr: int, seconds: float = 2.0, f0: float = 40.0, f1: float | None = None) -> np.ndarray:
    f1 = 0.48 * sr if f1 is None else f1
    t = np.arange(int(sr * seconds)) / sr
    return (0.6 * np.sin(2 * np.pi * (f0 * t + (f1 - f0) / (2 * seconds) * t**2))).astype(np.float32)


def librosa_vocos_mel(x: np.ndarray, dtype=np.float64) -> np.ndarray:
    s = librosa.feature.melspectrogram(
        y=x.astype(dtype), sr=24000, n_fft=1024, hop_length=256, win_length=1024, window="hann",
        center=True, pad_mode="reflect", power=1.0, n_mels=100, fmin=0, fmax=12000, htk=True, norm=None,
    )
    return np.log(np.maximum(s, 1e-5))


def librosa_hifigan_mel(x: np.ndarray, dtype=np.float64) -> np.ndarray:
    pad = (1024 - 256) // 2
    xp = np.pad(x.astype(dtype), (pad, pad), mode="reflect")
    spec = librosa.stft(xp, n_fft=1024, hop_length=256, win_length=1024, window="hann", center=False)
    mag = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    fb = librosa.filters.mel(sr=22050, n_fft=1024, n_mels=80, fmin=0, fmax=8000, htk=False, norm="slaney",
                             dtype=dtype)
    return np.log(np.maximum(fb @ mag, 1e-5))


@pytest.mark.parametrize(
    "sr,n_fft,n_mels,fmin,fmax,scale,norm",
    [
        (24000, 1024, 100, 0.0, 12000.0, "htk", None),
        (22050, 1024, 80, 0.0, 8000.0, "slaney", "slaney"),
        (16000, 512, 80, 20.0, None, "htk", "slaney"),
        (44100, 2048, 128, 30.0, 16000.0, "slaney", None),
    ],
)
def test_filterbank_matches_librosa(sr, n_fft, n_mels, fmin, fmax, scale, norm):
    ours = mel_filterbank(sr, n_fft, n_mels, fmin, fmax, scale, norm)
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax, htk=scale == "htk",
                              norm=norm, dtype=np.float64)
    assert ours.shape == (n_mels, n_fft // 2 + 1)
    np.testing.assert_allclose(ours, ref, rtol=1e-10, atol=1e-12)


def test_mel_scale_round_trip_and_librosa():
    f = np.array([0.0, 55.0, 700.0, 999.0, 1000.0, 1001.0, 4000.0, 11025.0])
    for scale in ("htk", "slaney"):
        m = hz_to_mel(f, scale)
        np.testing.assert_allclose(m, librosa.hz_to_mel(f, htk=scale == "htk"), rtol=1e-12)
        np.testing.assert_allclose(mel_to_hz(m, scale), f, rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="mel scale"):
        hz_to_mel(100.0, "bark")


def _worst_above(mel: np.ndarray, ref: np.ndarray, level: float) -> float:
    return float(np.abs(mel - ref)[ref > np.log(level)].max(initial=0.0))


# The stored mel is float32 (audiopipe.features.mel.stft_magnitude), as librosa's own is on a float32 waveform
# (a complex64 STFT). Two float32 FFTs differ by noise relative to a frame's loud bins, so bands near the 1e-5
# floor may differ by up to ~1 nat; above 1e-2 they agree to < 5e-4 nats (measured: ~2e-4), above 1 to ~2e-6.
def test_vocos_mel_matches_librosa_on_speech_and_chirp(speech):
    feat = VocosMel()
    worst = {(dt, level): 0.0 for dt in ("float32", "float64") for level in (1e-2, 1.0)}
    for x in [at_rate(s, 24000) for s in speech.values()] + [chirp(24000)]:
        mel = feat(x)["mel"]
        assert mel.dtype == np.float32 and mel.shape == (100, len(x) // 256 + 1) == (100, feat.num_frames(len(x)))
        for dt, level in worst:
            worst[dt, level] = max(worst[dt, level], _worst_above(mel, librosa_vocos_mel(x, np.dtype(dt)), level))
    assert max(worst[dt, 1e-2] for dt in ("float32", "float64")) < 5e-4, worst
    assert max(worst[dt, 1.0] for dt in ("float32", "float64")) < 1e-5, worst


def test_slaney_mel_matches_hifigan_recipe(speech):
    feat = SlaneyMel()
    worst = {(dt, level): 0.0 for dt in ("float32", "float64") for level in (1e-2, 1.0)}
    for x in [at_rate(s, 22050) for s in speech.values()] + [chirp(22050)]:
        mel = feat(x)["mel"]
        assert mel.shape == (80, feat.num_frames(len(x)))
        for dt, level in worst:
            ref = librosa_hifigan_mel(x, np.dtype(dt))
            assert ref.shape == mel.shape
            worst[dt, level] = max(worst[dt, level], _worst_above(mel, ref, level))
    assert max(worst[dt, 1e-2] for dt in ("float32", "float64")) < 5e-4, worst
    assert max(worst[dt, 1.0] for dt in ("float32", "float64")) < 1e-5, worst


def test_batched_float32_matches_librosa_above_floor(speech):
    # The trainer path runs in float32: float32 FFT noise (~1e-7 of a frame's peak) only matters in bands
    # near the 1e-5 floor, so compare where the band has real energy.
    x = at_rate(speech["espeak"], 24000)
    y = chirp(24000, seconds=len(x) / 24000)
    with torch.inference_mode():
        out = mel_spectrogram(torch.from_numpy(np.stack([x, y])), **vocos_mel_kwargs()).numpy()
    for got, sig in zip(out, (x, y)):
        ref = librosa_vocos_mel(sig)
        strong = ref > np.log(1e-2)
        assert strong.mean() > 0.05
        assert np.abs(got - ref)[strong].max() < 1e-3


def test_batch_items_are_independent():
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal((3, 22050))).astype(np.float64)
    kw = hifigan_mel_kwargs()
    with torch.inference_mode():
        batch = mel_spectrogram(torch.from_numpy(x), **kw)
        single = torch.stack([mel_spectrogram(torch.from_numpy(row)[None], **kw)[0] for row in x])
    assert batch.shape == (3, 80, 22050 // 256)
    torch.testing.assert_close(batch, single, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kw", [vocos_mel_kwargs(), hifigan_mel_kwargs()], ids=["center", "hifigan"])
def test_lengths_make_each_row_of_a_padded_batch_equal_its_utterance_alone(speech, kw):
    # Utterances of different lengths zero-padded into one batch (what a GPU extraction or a trainer does):
    # with lengths, every one of a row's own frames equals the utterance's mel computed alone.
    from audiopipe.features.mel import stft_num_frames

    rate = kw["sample_rate"]
    clips = [at_rate(speech[n], rate) for n in (*PROMPTS, "espeak")] + [at_rate(speech["vm-next"], rate)[:700]]
    lengths = [len(c) for c in clips]
    batch = torch.zeros(len(clips), max(lengths))
    for row, c in enumerate(clips):
        batch[row, : len(c)] = torch.from_numpy(c)
    naive_off = []
    with torch.inference_mode():
        got = mel_spectrogram(batch, lengths=torch.tensor(lengths), **kw)
        naive = mel_spectrogram(batch, **kw)
        for row, c in enumerate(clips):
            alone = mel_spectrogram(torch.from_numpy(c)[None], **kw)[0]
            t = stft_num_frames(len(c), kw["n_fft"], kw["hop_length"], kw["padding"])
            assert alone.shape[-1] == t
            torch.testing.assert_close(got[row, :, :t], alone, rtol=0, atol=1e-5)
            if len(c) < max(lengths):
                naive_off.append(float((naive[row, :, :t] - alone).abs().max()))
                # Once past its own reflection (n_fft samples after its end), a row's frames are of zeros:
                # the silence floor, with nothing of the longer rows leaking in.
                tail = got[row, :, t + kw["n_fft"] // kw["hop_length"]:]
                assert tail.numel() > 0
                torch.testing.assert_close(tail, torch.full_like(tail, math.log(1e-5)), rtol=0, atol=1e-6)
    # Without lengths a row's last frames see the batch's zeros instead of its own reflection (rows that end
    # in digital silence reflect zeros anyway, so not every row shows it).
    assert max(naive_off) > 0.1


def test_lengths_keep_the_gradient_and_are_checked():
    wav = (0.1 * torch.randn(2, 6000)).requires_grad_(True)
    mel_spectrogram(wav, lengths=torch.tensor([6000, 3000]), **vocos_mel_kwargs()).sum().backward()
    assert torch.isfinite(wav.grad).all() and wav.grad[1, 3000:].abs().max() == 0  # padding gets no gradient
    for bad in ([6000], [6000, 7000], [6000, 100], [6000.0, 3000.0]):
        with pytest.raises(ValueError, match="lengths"):
            mel_spectrogram(wav.detach(), lengths=torch.tensor(bad), **vocos_mel_kwargs())


def test_gradient_is_finite_through_digital_silence():
    # A mel loss on generated audio must not turn exact zeros (silence, padding) into NaN gradients.
    wav = torch.zeros(2, 8000, dtype=torch.float32)
    wav[1, 2000:4000] = torch.sin(torch.arange(2000) * 0.3)
    wav.requires_grad_(True)
    for kw in (vocos_mel_kwargs(), hifigan_mel_kwargs()):
        mel_spectrogram(wav, **kw).sum().backward()
        assert torch.isfinite(wav.grad).all()
        wav.grad = None


@pytest.mark.parametrize("n", [513, 1024, 1025, 24000, 24000 + 255, 24000 + 256])
def test_frame_counts_are_exact(n):
    x = np.random.default_rng(n).uniform(-0.5, 0.5, n).astype(np.float32)
    vocos = VocosMel()
    assert vocos(x)["mel"].shape[-1] == vocos.num_frames(n) == n // 256 + 1
    slaney = SlaneyMel()
    assert slaney(x)["mel"].shape[-1] == slaney.num_frames(n)


def test_configurable_parameters_change_output_and_hash():
    base, other = VocosMel(), VocosMel(n_mels=80, fmax=None, sample_rate=16000)
    assert other.params["fmax"] == 8000.0  # None resolves to Nyquist, so the stored spec says what was used
    assert base.specs[0].config_hash != other.specs[0].config_hash
    assert VocosMel(fmin=0).specs[0].config_hash == VocosMel(fmin=0.0).specs[0].config_hash
    x = chirp(16000)
    assert other(x)["mel"].shape == (80, len(x) // 256 + 1)
    assert VocosMel().specs[0].kind == "vocos_mel" and SlaneyMel().specs[0].kind == "slaney_mel"
    assert VocosMel().specs[0].name == SlaneyMel().specs[0].name == "mel"


def test_bad_input_is_refused_clearly():
    feat = VocosMel()
    with pytest.raises(ValueError, match="too short"):
        feat(np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="mono"):
        feat(np.zeros((2, 4000), np.float32))
    with pytest.raises(TypeError, match="float"):
        feat(np.zeros(4000, np.int16))
    with pytest.raises(ValueError, match="NaN"):
        feat(np.full(4000, np.nan, np.float32))
    with pytest.raises(TypeError, match="unknown parameter"):
        VocosMel(n_mel=80)
    with pytest.raises(ValueError, match="fmax"):
        SlaneyMel(fmax=20000)
    with pytest.raises(ValueError, match="padding"):
        VocosMel(padding="same")
