"""Energy, pcm, waveform checks and the feature registry (rebuilding every kind from its stored spec)."""

from __future__ import annotations

import json

import librosa
import numpy as np
import pytest
import soundfile as sf

from audiopipe.features.base import FeatureSpec
from audiopipe.features.energy import Energy
from audiopipe.features.pcm import Pcm, check_waveform, float_to_int16
from audiopipe.features.registry import FEATURE_KINDS, build_feature

pytestmark = pytest.mark.usefixtures("librosa_kernels")  # compiled once per run (conftest)


def speechlike(sr: int, seconds: float = 1.5, seed: int = 0) -> np.ndarray:
    """Harmonic tone with a slow amplitude envelope plus a little noise: energy varies frame to frame."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(sr * seconds)) / sr
    x = sum(np.sin(2 * np.pi * 140 * k * t) / k for k in range(1, 8)) * (0.2 + 0.8 * np.sin(np.pi * t / seconds) ** 2)
    return (0.2 * x + 0.01 * rng.standard_normal(len(t))).astype(np.float32)


# ---------------------------------------------------------------------------------------------- energy


@pytest.mark.parametrize("hop", [256, 320])
def test_energy_matches_librosa_stft_norm(hop):
    x = speechlike(24000)
    feat = Energy(hop_length=hop)
    got = feat(x)["energy"]
    spec = librosa.stft(x.astype(np.float64), n_fft=1024, hop_length=hop, win_length=1024, window="hann",
                        center=True, pad_mode="reflect")
    ref = np.sqrt((np.abs(spec) ** 2).sum(axis=0))
    assert got.dtype == np.float32 and got.shape == ref.shape == (feat.num_frames(len(x)),) == (len(x) // hop + 1,)
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    assert got.max() / got.min() > 3  # the envelope shows


def test_energy_hifigan_framing_and_silence():
    feat = Energy(sample_rate=22050, padding="hifigan")
    x = speechlike(22050)
    pad = (1024 - 256) // 2
    spec = librosa.stft(np.pad(x.astype(np.float64), (pad, pad), mode="reflect"), n_fft=1024, hop_length=256,
                        center=False)
    np.testing.assert_allclose(feat(x)["energy"], np.linalg.norm(np.abs(spec), axis=0), rtol=1e-6)
    assert feat.num_frames(len(x)) == spec.shape[1]
    assert (Energy()(np.zeros(4000, np.float32))["energy"] == 0).all()
    with pytest.raises(ValueError, match="padding"):
        Energy(padding="same")


# ------------------------------------------------------------------------------------------------- pcm


def test_pcm_round_trips_16_bit_files_exactly(tmp_path):
    rng = np.random.default_rng(0)
    ints = rng.integers(-32768, 32768, 5000).astype(np.int16)
    path = tmp_path / "x.wav"
    sf.write(path, ints, 16000, subtype="PCM_16")
    floats, _ = sf.read(path, dtype="float32")
    out = Pcm(sample_rate=16000)(floats)["pcm"]
    assert out.dtype == np.int16 and out.shape == (5000,)
    np.testing.assert_array_equal(out, ints)


def test_pcm_rounds_to_nearest_and_clips():
    x = np.array([0.0, 1.0, -1.0, 1.5, -1.5, 0.4 / 32768, 0.6 / 32768, -0.6 / 32768, 2.5 / 32768], np.float32)
    np.testing.assert_array_equal(float_to_int16(x), [0, 32767, -32768, 32767, -32768, 0, 1, -1, 2])
    feat = Pcm(sample_rate=24000)
    assert feat.num_frames(1234) == 1234 and feat.specs[0].hop_length == 1 and feat.specs[0].channels == 0


# ------------------------------------------------------------------------------------------ input checks


def test_check_waveform_messages():
    ok = check_waveform(np.zeros(10, np.float64), "x")
    assert ok.dtype == np.float32 and ok.flags.c_contiguous
    with pytest.raises(TypeError, match="numpy"):
        check_waveform([0.0, 1.0], "pcm")
    with pytest.raises(ValueError, match="mono"):
        check_waveform(np.zeros((10, 2), np.float32), "pcm")
    with pytest.raises(TypeError, match="int16"):
        check_waveform(np.zeros(10, np.int16), "pcm")
    with pytest.raises(ValueError, match="empty"):
        check_waveform(np.zeros(0, np.float32), "pcm")
    with pytest.raises(ValueError, match="NaN or inf .1 samples"):
        check_waveform(np.array([0.0, np.inf], np.float32), "pcm")


# ------------------------------------------------------------------------------------------------ registry

NON_DEFAULT = {
    "vocos_mel": {"n_mels": 80, "fmax": None, "sample_rate": 16000, "hop_length": 160},
    "slaney_mel": {"sample_rate": 24000, "n_mels": 100, "fmax": 12000, "hop_length": 300, "win_length": 1200,
                   "n_fft": 2048},
    "f0": {"hop_length": 320, "interpolate": True, "backend": "dio", "fmin": 60},
    "energy": {"hop_length": 320, "n_fft": 1280, "win_length": 1280},
    "kaldi_fbank": {"num_mel_bins": 64, "input_scale": 32768},
    "pcm": {"sample_rate": 16000},
}


def test_registry_lists_every_kind():
    assert set(FEATURE_KINDS) == {"vocos_mel", "slaney_mel", "f0", "energy", "kaldi_fbank", "pcm"}
    assert set(NON_DEFAULT) == set(FEATURE_KINDS)
    assert all(isinstance(v, str) and v and "\n" not in v for v in FEATURE_KINDS.values())


@pytest.mark.parametrize("kind", sorted(FEATURE_KINDS))
@pytest.mark.parametrize("variant", ["default", "custom"])
def test_rebuild_from_manifest_spec_reproduces_the_hash(kind, variant):
    params = {} if variant == "default" else NON_DEFAULT[kind]
    feat = build_feature(kind, **params)
    assert feat.specs and all(s.kind == kind for s in feat.specs)
    for spec in feat.specs:
        # What a manifest stores and a reader gets back: JSON of the spec dict.
        stored = json.loads(json.dumps(spec.to_dict()))
        rebuilt = build_feature(stored["kind"], **stored["params"])
        same = [s for s in rebuilt.specs if s.name == spec.name]
        assert len(same) == 1
        assert same[0] == FeatureSpec(**stored)
        assert same[0].config_hash == spec.config_hash
    if variant == "custom":
        default_hashes = {s.config_hash for s in build_feature(kind).specs}
        assert not default_hashes & {s.config_hash for s in feat.specs}


@pytest.mark.parametrize("kind", sorted(FEATURE_KINDS))
def test_built_features_honour_their_specs(kind):
    feat = build_feature(kind, **NON_DEFAULT[kind])
    sr = feat.specs[0].sample_rate
    x = speechlike(sr, seconds=0.7)
    out = feat(x)
    assert set(out) == {s.name for s in feat.specs}
    for spec in feat.specs:
        arr = out[spec.name]
        assert arr.dtype == np.dtype(spec.dtype)
        assert arr.shape[-1] == feat.num_frames(len(x))
        assert arr.shape == ((spec.channels, arr.shape[-1]) if spec.channels else (arr.shape[-1],))


def test_registry_errors_are_clear():
    with pytest.raises(ValueError, match="unknown feature kind 'mfcc'.*vocos_mel"):
        build_feature("mfcc")
    with pytest.raises(TypeError, match="feature 'f0'"):
        build_feature("f0", hop=256)
