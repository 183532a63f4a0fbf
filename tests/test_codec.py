"""EnCodec 24 kHz tokens: batching invariance, local checkpoints, frame counts (random-init weights, CPU)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from audiopipe.features.codec import (  # noqa: E402
    HOP_LENGTH,
    CodecCheckpointError,
    EncodecEncoder,
    _random_init_model,
    checkpoint_identity,
)

# Lengths around the interesting edges: whole hops, one sample short/over, the 7-frame batching threshold
# (1920 = 6 hops, 1921 = just over), sub-hop clips. ~4.3 s of audio in total keeps the file fast on CPU.
LENGTHS = [24000, 23999, 17001, 9600, 5000, 2241, 1921, 1920, 1500, 321, 1]


def _speechy(n: int, seed: int) -> np.ndarray:
    """A vibrato tone plus noise: varied enough that codes change from frame to frame."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / 24000
    tone = 0.3 * np.sin(2 * np.pi * 180 * t * (1 + 0.3 * np.sin(2 * np.pi * 3 * t)))
    return (tone + 0.02 * rng.standard_normal(n)).astype(np.float32)


@pytest.fixture(scope="module")
def tok() -> EncodecEncoder:
    return EncodecEncoder(random_init=True, seed=0, device="cpu")


@pytest.fixture(scope="module")
def wavs() -> list[np.ndarray]:
    return [_speechy(n, seed=i) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def batch_codes(tok, wavs) -> list[np.ndarray]:
    return tok.encode_batch(wavs)


def test_spec_describes_codes(tok):
    spec = tok.spec
    assert (spec.name, spec.dtype, spec.channels, spec.hop_length, spec.sample_rate) == (
        "codes", "int16", 16, 320, 24000)
    assert spec.frame_rate == 75.0
    assert spec.params["bandwidth"] == 12.0
    assert spec.params["checkpoint"] == "random-init:0"
    assert tok.specs == (spec,)


def test_shape_dtype_range(batch_codes):
    for n, codes in zip(LENGTHS, batch_codes):
        assert codes.dtype == np.int16
        assert codes.shape == (16, math.ceil(n / HOP_LENGTH))
        assert codes.min() >= 0 and codes.max() < 1024
    # Informative random weights: codes vary over time and over codebooks.
    longest = batch_codes[0]
    assert len(np.unique(longest[0])) > 30
    assert len(np.unique(longest[:, 10])) > 8


def test_batched_equals_one_at_a_time(tok, wavs, batch_codes):
    for n, wav, batched in zip(LENGTHS, wavs, batch_codes):
        alone = tok(wav)["codes"]
        np.testing.assert_array_equal(batched, alone, err_msg=f"length {n}")


def test_batch_order_and_sub_batching_do_not_matter(tok, wavs, batch_codes, monkeypatch):
    # A tiny per-pass budget forces many sub-batches with other neighbours and other padded widths.
    monkeypatch.setattr(tok, "max_batch_samples", 30000)
    order = [3, 0, 7, 5, 1]
    assert len(tok._plan([wavs[i] for i in order])) >= 3
    for i, codes in zip(order, tok.encode_batch([wavs[i] for i in order])):
        np.testing.assert_array_equal(codes, batch_codes[i])


def test_num_frames_matches_encodec(tok):
    # num_frames is ceil(N / 320), exactly what EnCodec itself returns for unpadded input.
    for n in [1, 319, 320, 321, 641, 4799, 4800]:
        raw = torch.from_numpy(_speechy(n, seed=n))[None, None]
        with torch.inference_mode():
            frames = tok._model.encode(raw, bandwidth=12.0).audio_codes.shape[-1]
        assert tok.num_frames(n) == frames == math.ceil(n / 320)


def test_only_the_partial_last_hop_differs_from_unpadded_encodec(tok, wavs, batch_codes):
    # The documented deviation: EnCodec alone reflect-pads a partial last hop, we zero-pad it. In clips of at
    # most 7 frames the final conv's left reflect-pad also reads that last frame, so the first frames move too.
    checked = 0
    for n, wav, codes in zip(LENGTHS, wavs, batch_codes):
        if tok.num_frames(n) <= tok.min_batch_frames:
            continue
        checked += 1
        with torch.inference_mode():
            raw = tok._model.encode(torch.from_numpy(wav)[None, None], bandwidth=12.0).audio_codes[0, 0]
        raw = raw.numpy()
        stop = codes.shape[1] - (1 if n % HOP_LENGTH else 0)
        np.testing.assert_array_equal(codes[:, :stop], raw[:, :stop], err_msg=f"length {n}")
    assert checked == 6


def test_random_init_is_seeded_and_lower_bandwidth_uses_fewer_codebooks(tok, wavs, batch_codes):
    six = EncodecEncoder(random_init=True, seed=0, device="cpu", bandwidth=6.0)
    codes = six(wavs[3])["codes"]
    assert six.spec.channels == 8 and codes.shape == (8, 30)
    # Same seed, same weights; and residual VQ's first codebooks do not depend on how many follow.
    np.testing.assert_array_equal(codes, batch_codes[3][:8])
    other = _random_init_model(1).state_dict()
    mine = tok._model.state_dict()
    assert not torch.equal(other["quantizer.layers.0.codebook.embed"], mine["quantizer.layers.0.codebook.embed"])


def test_save_pretrained_round_trip(tok, wavs, batch_codes, tmp_path):
    tok._model.save_pretrained(tmp_path)
    loaded = EncodecEncoder(checkpoint=tmp_path, device="cpu")
    identity = loaded.spec.params["checkpoint"]
    assert identity.startswith("sha256:") and len(identity) == len("sha256:") + 64
    assert identity == checkpoint_identity(tmp_path)
    assert loaded.spec.config_hash != tok.spec.config_hash
    for codes, ref in zip(loaded.encode_batch(wavs[:6]), batch_codes[:6]):
        np.testing.assert_array_equal(codes, ref)


def test_checkpoint_errors_name_the_path(tmp_path):
    missing = tmp_path / "no-such-encodec"
    with pytest.raises(CodecCheckpointError, match="no-such-encodec"):
        EncodecEncoder(checkpoint=missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CodecCheckpointError, match="no weight file.*empty"):
        EncodecEncoder(checkpoint=empty)
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"not weights")
    with pytest.raises(CodecCheckpointError, match="got a file"):
        EncodecEncoder(checkpoint=a_file)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text(json.dumps({"model_type": "encodec"}))
    (corrupt / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CodecCheckpointError, match="could not load.*corrupt"):
        EncodecEncoder(checkpoint=corrupt)


def test_wrong_architecture_is_refused(tok, tmp_path):
    tok._model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["normalize"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CodecCheckpointError, match="not EnCodec 24 kHz.*normalize"):
        EncodecEncoder(checkpoint=tmp_path)


def test_incomplete_weights_are_refused(tok, tmp_path):
    # transformers would fill a missing tensor with random values and only warn: that must be an error here.
    from safetensors.torch import load_file, save_file

    tok._model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["encoder.layers.0.conv.bias"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CodecCheckpointError, match="lacks or misshapes 1 .*encoder.layers.0.conv.bias"):
        EncodecEncoder(checkpoint=tmp_path)


def test_constructor_and_input_errors(tok):
    with pytest.raises(ValueError, match="exactly one"):
        EncodecEncoder()
    with pytest.raises(ValueError, match="bandwidth"):
        EncodecEncoder(random_init=True, bandwidth=7.0)
    with pytest.raises(ValueError, match="mono"):
        tok(np.zeros((2, 100), dtype=np.float32))
    with pytest.raises(ValueError, match="empty"):
        tok(np.zeros(0, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        tok(np.full(400, np.nan, dtype=np.float32))
    with pytest.raises(ValueError, match="float"):
        tok(np.zeros(400, dtype=np.int16))


def test_the_shard_jobs_codec_chunks_are_cut_in_length_order_and_give_each_clips_own_codes(tok, wavs, batch_codes):
    """The Ray codec stage sends a shard's clips in chunks; in_length_order cuts them from the clips sorted
    longest first (near-equal lengths per chunk) and puts every clip's codes back in its place."""
    from audiopipe.shard.codec_stage import in_length_order

    sent: list[list[int]] = []

    def submit(chunk):
        sent.append([len(w) for w in chunk])
        return tok.encode_batch(chunk)

    codes = in_length_order(wavs, 3, submit, list)
    assert [n for chunk in sent for n in chunk] == sorted((len(w) for w in wavs), reverse=True)
    assert all(len(c) <= 3 for c in sent)
    for got, want in zip(codes, batch_codes):
        np.testing.assert_array_equal(got, want)
