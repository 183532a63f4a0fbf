"""Decoding, header checks, reject reasons and resampling."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import (
    DecodeLimits,
    RejectError,
    check_header,
    load_audio,
    read_info,
    resample,
    resample_to,
    resampler_info,
)
from corpora import harmonic_tone


def sine(freq: float, sr: int, seconds: float = 1.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(sr * seconds)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_frequency(x: np.ndarray, sr: int) -> float:
    """Frequency of the strongest FFT bin, refined by parabolic interpolation on the log spectrum."""
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    k = int(np.argmax(spec[1:-1])) + 1
    a, b, c = np.log(spec[k - 1: k + 2] + 1e-20)
    return (k + 0.5 * (a - c) / (a - 2 * b + c)) * sr / len(x)


# ---------------------------------------------------------------------------------------------------------------
# resampling


@pytest.mark.parametrize("sr_in,sr_out", [(16000, 22050), (44100, 16000), (8000, 24000), (48000, 16000),
                                          (22050, 24000), (24000, 8000)])
def test_resample_keeps_a_1khz_tone_at_1khz(sr_in, sr_out):
    x = sine(1000.0, sr_in, seconds=1.0)
    y = resample(x, sr_in, sr_out)
    assert y.dtype == np.float32 and y.ndim == 1
    assert abs(len(y) - len(x) * sr_out / sr_in) <= 1
    assert peak_frequency(y, sr_out) == pytest.approx(1000.0, abs=0.5)
    core = y[len(y) // 4: 3 * len(y) // 4]  # away from the filter's edge transients
    assert np.max(np.abs(core)) == pytest.approx(0.5, abs=0.01)


def test_resample_removes_content_above_the_new_nyquist():
    x = sine(6000.0, 16000) + sine(1000.0, 16000)
    y = resample(x, 16000, 8000)  # 6 kHz is above the 4 kHz Nyquist: it must not alias to 2 kHz
    spec = np.abs(np.fft.rfft(y))
    freqs = np.fft.rfftfreq(len(y), 1 / 8000)
    at = lambda f: spec[np.argmin(np.abs(freqs - f))]  # noqa: E731
    assert at(2000.0) < 1e-3 * at(1000.0)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 20000), sr_in=st.sampled_from([8000, 16000, 22050, 24000, 44100, 48000]),
       sr_out=st.sampled_from([8000, 16000, 22050, 24000, 44100, 48000]))
def test_resample_length_ratio_exact_within_one_sample(n, sr_in, sr_out):
    y = resample(np.zeros(n, np.float32), sr_in, sr_out)
    assert abs(len(y) - n * sr_out / sr_in) <= 1


def test_resample_identity_and_resample_to():
    x = sine(440.0, 16000)
    assert resample(x, 16000, 16000) is x
    out = resample_to(x, 16000, [24000, 16000, 22050, 24000])
    assert list(out) == [16000, 22050, 24000]
    assert out[16000] is x
    np.testing.assert_array_equal(out[22050], resample(x, 16000, 22050))
    assert len(out[24000]) == 24000


def test_resample_refuses_bad_input():
    with pytest.raises(ValueError, match="mono 1-D"):
        resample(np.zeros((100, 2), np.float32), 16000, 8000)
    with pytest.raises(ValueError, match="positive"):
        resample(np.zeros(100, np.float32), 0, 8000)


def test_resampler_info_names_library_version_quality():
    info = resampler_info()
    assert info["library"] == "soxr" and info["quality"] == "HQ"
    assert info["version"] and info["version"][0].isdigit()


# ---------------------------------------------------------------------------------------------------------------
# decoding


def test_mono_mix_averages_channels(tmp_path):
    tone = harmonic_tone(200.0, 0.5, 16000)
    sf.write(tmp_path / "st.wav", np.stack([tone, 0.5 * tone], axis=1), 16000, subtype="FLOAT")
    wav, sr = load_audio(tmp_path / "st.wav")
    assert sr == 16000 and wav.dtype == np.float32 and wav.shape == tone.shape and wav.flags.c_contiguous
    np.testing.assert_allclose(wav, 0.75 * tone, atol=1e-6)


def test_pcm16_decodes_to_unit_range(tmp_path):
    tone = harmonic_tone(200.0, 0.5, 16000, peak=0.9)
    sf.write(tmp_path / "a.wav", tone, 16000, subtype="PCM_16")
    wav, _ = load_audio(tmp_path / "a.wav")
    np.testing.assert_allclose(wav, tone, atol=1.0 / 32768)


@pytest.mark.parametrize("name", ["valid_wav.wav", "valid_flac.flac", "valid_aiff.aiff", "valid_float.wav"])
def test_lossless_formats_decode_exactly(broken_corpus, name):
    wav, sr = load_audio(broken_corpus.root / name)
    ref = harmonic_tone(200.0, 1.0, 16000)
    assert sr == 16000 and len(wav) == len(ref)
    np.testing.assert_allclose(wav, ref, atol=1.0 / 32768)


@pytest.mark.parametrize("name", ["valid_vorbis.ogg", "valid_opus.opus", "valid_mp3.mp3"])
def test_lossy_formats_decode_to_the_same_pitch(broken_corpus, name):
    if name not in broken_corpus.expected:
        pytest.skip(f"{name} was not written by this libsndfile")
    wav, sr = load_audio(broken_corpus.root / name)
    assert wav.dtype == np.float32 and len(wav) == sf.info(str(broken_corpus.root / name)).frames
    voiced = wav[int(0.3 * sr): int(1.0 * sr)]
    assert peak_frequency(voiced, sr) == pytest.approx(200.0, abs=2.0)


def test_check_header_reasons_follow_the_limits(tmp_path):
    sf.write(tmp_path / "st.wav", np.zeros((16000, 2), np.float32) + 0.1, 16000)
    info = sf.info(str(tmp_path / "st.wav"))
    check_header(info)  # 1 s stereo at 16 kHz passes the defaults
    cases = {
        "too_short": DecodeLimits(min_duration=2.0),
        "too_long": DecodeLimits(max_duration=0.5),
        "too_many_channels": DecodeLimits(max_channels=1),
        "bad_sample_rate": DecodeLimits(min_sample_rate=22050),
    }
    for reason, limits in cases.items():
        with pytest.raises(RejectError) as e:
            check_header(info, limits)
        assert e.value.reason == reason
    with pytest.raises(RejectError, match=r"1\.000 s is shorter than the minimum 2\.0 s"):
        check_header(info, DecodeLimits(min_duration=2.0))


def test_check_header_accepts_an_utterance(synthetic_corpus):
    u = discover(synthetic_corpus.root).utterances[0]
    check_header(u)
    with pytest.raises(RejectError, match="too_long"):
        check_header(u, DecodeLimits(max_duration=1.0))


def test_silence_threshold_is_configurable(tmp_path):
    sf.write(tmp_path / "a.wav", harmonic_tone(200.0, 0.5, 16000, peak=0.5), 16000)  # peak -6 dBFS
    load_audio(tmp_path / "a.wav")
    with pytest.raises(RejectError, match=r"peak -6\.0 dBFS is below the -3\.0 dBFS") as e:
        load_audio(tmp_path / "a.wav", DecodeLimits(silence_dbfs=-3.0))
    assert e.value.reason == "silent"


def test_nan_and_inf_are_counted(tmp_path):
    x = harmonic_tone(200.0, 0.5, 16000)
    x[[10, 20, 30]] = [np.nan, np.inf, -np.inf]
    sf.write(tmp_path / "bad.wav", x, 16000, subtype="FLOAT")
    with pytest.raises(RejectError, match=f"3 of {len(x)} samples are NaN or infinite"):
        load_audio(tmp_path / "bad.wav")


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(RejectError) as e:
        load_audio(tmp_path / "nope.wav")
    assert e.value.reason == "missing"
    (tmp_path / "e.wav").write_bytes(b"")
    with pytest.raises(RejectError) as e:
        read_info(tmp_path / "e.wav")
    assert e.value.reason == "empty"


def _set_data_chunk_size(path: Path, size: int) -> None:
    data = bytearray(path.read_bytes())
    pos = data.index(b"data")
    data[pos + 4: pos + 8] = struct.pack("<I", size)
    path.write_bytes(bytes(data))


def test_wav_truncation_is_found_from_the_data_chunk(tmp_path):
    x = harmonic_tone(200.0, 1.0, 16000)
    p = tmp_path / "a.wav"
    sf.write(p, x, 16000, subtype="PCM_16")
    _set_data_chunk_size(p, 2 * len(x) + 2000)  # claims 1000 frames more than the file holds
    assert sf.info(str(p)).frames == len(x)  # libsndfile quietly believes the file size...
    with pytest.raises(RejectError, match=f"decoded {len(x)} of the {len(x) + 1000} frames") as e:
        load_audio(p)  # ...the data chunk tells the truth
    assert e.value.reason == "truncated"


def test_streaming_placeholder_sizes_are_not_truncation(tmp_path):
    x = harmonic_tone(200.0, 1.0, 16000)
    p = tmp_path / "a.wav"
    sf.write(p, x, 16000, subtype="PCM_16")
    _set_data_chunk_size(p, 0xFFFFFFFF)  # what tools writing to a pipe leave behind
    wav, _ = load_audio(p)
    assert len(wav) == len(x)


def test_reject_error_pickles_and_prints():
    e = pickle.loads(pickle.dumps(RejectError("too_short", "0.1 s < 0.3 s")))
    assert (e.reason, e.detail, str(e)) == ("too_short", "0.1 s < 0.3 s", "too_short: 0.1 s < 0.3 s")


def test_limits_round_trip():
    lim = DecodeLimits(min_duration=0.5, silence_dbfs=-50.0)
    assert DecodeLimits(**lim.to_dict()) == lim
    assert DecodeLimits().to_dict() == {"min_duration": 0.3, "max_duration": 30.0, "max_channels": 2,
                                        "min_sample_rate": 4000, "max_sample_rate": 192000,
                                        "silence_dbfs": -60.0}
