"""Hostile input at decoding: every container's declared length is checked against its data, a length the
header cannot give is measured, and a segment of a long recording costs the memory of the segment.

The tests marked "before" in their docstring fail on the code before audiopipe/decode/declared.py and the
seeking RecordingCache: a cut AIFF/W64/AU/RF64/NIST file was written as a shorter clip, a streamed FLAC was
refused as 5.8e14 s long, and a 3 s segment decoded its whole recording."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import soundfile as sf

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits, RejectError, load_audio, read_info
from audiopipe.decode.segments import RecordingCache

from hostile_inputs import (CONTAINERS, DECLARED_LENGTH, RATE, audio_bytes, decoded, peak_rss_growth,
                            rf64_claiming, signal, streamed_flac, write_tar)

SR = 16000


def _containers(declared_only: bool) -> list:
    out = []
    for fmt, subtype, ext in CONTAINERS:
        if declared_only and fmt not in DECLARED_LENGTH:
            continue
        out.append(pytest.param(fmt, subtype, ext, id=f"{fmt}-{subtype}"))
    return out


def _write(tmp_path, fmt, subtype, ext, seconds=1.0):
    sr = RATE.get(subtype, RATE.get(fmt, SR))
    data = audio_bytes(signal(seconds, sr), sr, fmt, subtype)
    p = tmp_path / f"a.{ext}"
    p.write_bytes(data)
    return p, data, sr


@pytest.mark.parametrize("fmt, subtype, ext", _containers(False))
def test_every_container_decodes_to_what_it_holds(tmp_path, fmt, subtype, ext):
    """No false alarm: a whole file of every container is accepted with exactly what libsndfile decodes."""
    p, data, sr = _write(tmp_path, fmt, subtype, ext)
    try:
        want = decoded(data)
    except RuntimeError:
        pytest.skip(f"libsndfile cannot read back {fmt}/{subtype} it wrote")
    wav, got_sr = load_audio(p, DecodeLimits())
    assert got_sr == sf.info(io.BytesIO(data)).samplerate and same(wav, want, fmt)
    assert read_info(p).frames == len(want)


def same(a: np.ndarray, b: np.ndarray, fmt: str) -> bool:
    """Equal samples; MP3 within float rounding (mpg123 synthesises a frame a hair differently depending on where
    a read starts: 6e-8 apart, far below one 16-bit step)."""
    if fmt == "MP3":
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=0, atol=1e-6))
    return np.array_equal(a, b)


@pytest.mark.parametrize("fmt, subtype, ext", _containers(True))
def test_a_container_cut_short_is_truncated_not_a_shorter_clip(tmp_path, fmt, subtype, ext):
    """Before: AIFF, W64, AU, RF64, NIST, CAF, SVX, ... cut by a quarter were written as shorter clips."""
    p, data, _ = _write(tmp_path, fmt, subtype, ext, seconds=2.0)
    p.write_bytes(data[:len(data) * 3 // 4])
    try:
        sf.info(str(p))
        want = "truncated"
    except RuntimeError:  # libsndfile refuses to open some cut containers (CAF): unreadable, never a short clip
        want = "unreadable"
    with pytest.raises(RejectError) as e:
        load_audio(p, DecodeLimits())
    assert e.value.reason == want, e.value


def test_an_rf64_claiming_a_trillion_frames_is_truncated(tmp_path):
    """Before: written as a 2 s row."""
    p = tmp_path / "a.rf64"
    p.write_bytes(rf64_claiming(10**12, signal(2.0, SR), SR))
    with pytest.raises(RejectError, match="1000000000000") as e:
        load_audio(p, DecodeLimits())
    assert e.value.reason == "truncated"


@pytest.mark.parametrize("offset", [0, 8, 23])
def test_an_au_whose_data_offset_lies_inside_its_header_is_refused_whole_and_by_segment(tmp_path, offset):
    """Found by tests/fuzz_corpus.py: with the offset inside the 24-byte header, libsndfile read the header's
    bytes as samples through soundfile.read and skipped them through block reads, so the clip written
    depended on how it was read."""
    b = bytearray(audio_bytes(signal(1.0, SR), SR, "AU", "PCM_16"))
    b[4:8] = offset.to_bytes(4, "big")
    p = tmp_path / "a.au"
    p.write_bytes(bytes(b))
    with pytest.raises(RejectError, match=f"data offset {offset} lies inside its own 24-byte header") as e:
        load_audio(p, DecodeLimits())
    assert e.value.reason == "unreadable"
    d = _kaldi_dir(tmp_path, p, [("a-x", 0.1, 0.6)])
    with pytest.raises(RejectError, match="inside its own 24-byte header"):
        RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits())


def test_a_streamed_flac_is_measured_and_accepted(tmp_path):
    """Before: refused as `too_long: 5.8e14 s` (libsndfile reports SF_COUNT_MAX frames for total_samples 0)."""
    x = signal(2.5, SR)
    (tmp_path / "spk").mkdir()
    p = tmp_path / "spk" / "a.flac"
    p.write_bytes(streamed_flac(x, SR))
    assert sf.info(str(p)).frames > 10**15  # what libsndfile says of such a stream
    d = discover(tmp_path)
    assert [(u.id, u.num_samples) for u in d.utterances] == [("spk/a", len(x))]
    wav, _ = RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits())
    assert np.array_equal(wav, decoded(audio_bytes(x, SR, "FLAC", "PCM_16")))


def test_a_streamed_flac_over_the_limit_is_too_long_after_decoding_no_more_than_allowed(tmp_path):
    p = tmp_path / "a.flac"
    p.write_bytes(streamed_flac(signal(40.0, SR), SR))
    (wav, got), grew = peak_rss_growth(lambda: _reject_of(lambda: load_audio(p, DecodeLimits(max_duration=5.0))))
    assert got.reason == "too_long"
    assert grew < 40 * SR * 4 / 2  # well under the 2.5 MB the whole 40 s would take as float32


def _reject_of(fn):
    try:
        return fn(), None
    except RejectError as e:
        return None, e


def test_a_streamed_flac_cut_short_is_truncated(tmp_path):
    p = tmp_path / "a.flac"
    data = streamed_flac(signal(3.0, SR), SR)
    p.write_bytes(data[:len(data) // 2])
    with pytest.raises(RejectError) as e:
        load_audio(p, DecodeLimits())
    assert e.value.reason in ("truncated", "unreadable")


def test_a_tar_member_whose_header_declares_more_than_the_member_holds_is_truncated(tmp_path):
    """Before: a member's WAV was checked against libsndfile's frames only, so a cut WAV packed into a tar was
    written as a shorter clip."""
    whole = audio_bytes(signal(2.0, SR), SR, "AIFF", "PCM_16")
    write_tar(tmp_path / "ZH-B000000.tar", [
        ("k.json", json.dumps({"id": "k", "text": "t"}).encode()), ("k.wav", whole[:len(whole) * 3 // 4])])
    d = discover(tmp_path)
    with pytest.raises(RejectError) as e:
        RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits())
    assert e.value.reason == "truncated"


# --------------------------------------------------------------------------------------------- segments

def _kaldi_dir(root, path, segments: list[tuple[str, float, float]]):
    (root / "wav.scp").write_text(f"rec {path}\n")
    (root / "segments").write_text("".join(f"{u} rec {a} {b}\n" for u, a, b in segments))
    return discover(root)


def test_a_segment_of_a_long_recording_costs_the_segment_not_the_recording(tmp_path):
    """Before: a 3 s segment of a 20-minute recording decoded all of it (77 MB as float32 here; 1 GB for the
    2-hour recording of the report)."""
    minutes = 20
    rec = tmp_path / "long.wav"
    with sf.SoundFile(rec, "w", SR, 1, "PCM_16") as f:
        for i in range(minutes):
            f.write(signal(60.0, SR, seed=i))
    d = _kaldi_dir(tmp_path, rec, [("rec-a", 600.0, 603.0)])
    cache = RecordingCache(d.utterances)
    (wav, sr), grew = peak_rss_growth(lambda: cache.load(d.utterances[0], DecodeLimits()))
    whole_bytes = minutes * 60 * SR * 4
    assert grew < whole_bytes / 8, f"peak memory rose {grew / 1e6:.1f} MB for a 3 s segment"
    with sf.SoundFile(rec) as f:
        f.seek(600 * SR)
        assert np.array_equal(wav, f.read(3 * SR, dtype="float32"))


@pytest.mark.parametrize("fmt, subtype, ext", [("OGG", "VORBIS", "ogg"), ("MP3", "MPEG_LAYER_III", "mp3"),
                                               ("OGG", "OPUS", "opus"), ("FLAC", "PCM_16", "flac"),
                                               ("WAV", "IMA_ADPCM", "wav")])
def test_segments_of_every_codec_equal_the_same_frames_of_the_whole_decode(tmp_path, fmt, subtype, ext):
    """Codecs whose seeks are approximate (Vorbis, MP3) are read forward, so a segment is exactly those frames of
    the whole decode, in any order of the segments (a backward one starts the pass again)."""
    sr = 48000 if subtype == "OPUS" else SR
    p = tmp_path / f"rec.{ext}"
    p.write_bytes(audio_bytes(signal(12.0, sr), sr, fmt, subtype))
    whole, _ = sf.read(str(p), dtype="float32")
    segs = [("rec-2", 6.5, 8.0), ("rec-0", 0.77, 2.0), ("rec-1", 3.1, 4.4), ("rec-3", 9.0, 11.5)]
    d = _kaldi_dir(tmp_path, p, segs)
    cache = RecordingCache(d.utterances)
    for u in d.utterances:
        wav, _ = cache.load(u, DecodeLimits())
        a, b = u.extra["start_frame"], u.extra["end_frame"]
        assert same(wav, whole[a:b], fmt), u.id
    assert cache.decodes == 1 and cache._open == {}


def test_segments_of_a_recording_cut_short_are_truncated_where_it_is_missing(tmp_path):
    p = tmp_path / "rec.aiff"
    data = audio_bytes(signal(10.0, SR), SR, "AIFF", "PCM_16")
    p.write_bytes(data[:len(data) // 2])  # 5 of the 10 s declared are there
    d = _kaldi_dir(tmp_path, p, [("rec-a", 1.0, 3.0), ("rec-b", 4.5, 6.0)])
    assert [u.id for u in d.utterances] == ["rec-a"]  # the header read finds 5 s: rec-b is past its end
    d.utterances[0].extra["end_frame"] = 6 * SR  # as if the file had been cut after discovery
    with pytest.raises(RejectError) as e:
        RecordingCache(d.utterances).load(d.utterances[0], DecodeLimits())
    assert e.value.reason == "truncated" and "of the 160000 frames its header declares" in e.value.detail


def test_nan_in_a_segment_is_refused_and_the_other_segments_are_kept(tmp_path):
    x = signal(6.0, SR)
    x[4 * SR + 10] = np.nan
    p = tmp_path / "rec.wav"
    sf.write(p, x, SR, subtype="FLOAT")
    d = _kaldi_dir(tmp_path, p, [("rec-a", 0.5, 2.0), ("rec-b", 3.5, 5.0)])
    cache = RecordingCache(d.utterances)
    wav, _ = cache.load(d.utterances[0], DecodeLimits())
    assert np.array_equal(wav, x[int(0.5 * SR):2 * SR])
    with pytest.raises(RejectError) as e:
        cache.load(d.utterances[1], DecodeLimits())
    assert e.value.reason == "nan_inf"
    assert math.isfinite(float(np.max(np.abs(wav))))


def test_segment_bytes_from_an_in_memory_table_cell_are_read_by_seeking_too():
    """The cell path (Hugging Face bytes) goes through the same Recording reader: memory is the cell's bytes."""
    from audiopipe.decode.segments import Recording

    data = audio_bytes(signal(5.0, SR), SR, "FLAC", "PCM_16")
    r = Recording(lambda: (sf.SoundFile(io.BytesIO(data)), io.BytesIO(data), len(data)), "cell", DecodeLimits())
    got = r.read(SR, 2 * SR)
    assert np.array_equal(got[:, 0], decoded(data)[SR:2 * SR])
