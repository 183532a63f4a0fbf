"""benchmarks/bench_gpu_features.py does what it says on a machine without soundfile or soxr (the GPU machine):
it reads the clips it made, batches them by length, and each batched feature equals the one-at-a-time one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.corpus.demo import ASTERISK_SOUNDS

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu_features.py"
# Run the script with soundfile and soxr unimportable, as on the GPU machine's image.
WITHOUT_DECODERS = ("import runpy, sys; sys.modules['soundfile'] = None; sys.modules['soxr'] = None; "
                    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    if not ASTERISK_SOUNDS.is_dir():
        pytest.skip("asterisk-core-sounds-en-wav not installed")
    dest = tmp_path_factory.mktemp("gpuclips")
    subprocess.run([sys.executable, str(SCRIPT), "--make-clips", str(dest), "--corpus", str(ASTERISK_SOUNDS),
                    "--seconds", "12"], check=True, capture_output=True)
    return dest


def test_clips_are_real_speech_at_each_features_rate(clips):
    for rate in (16000, 24000):
        files = sorted((clips / str(rate)).glob("*.wav"))
        assert len(files) >= 4
        info = sf.info(files[0])
        assert (info.samplerate, info.channels, info.subtype) == (rate, 1, "PCM_16")
    lengths = [sf.info(p).frames / 24000 for p in (clips / "24000").glob("*.wav")]
    assert sum(lengths) >= 12 and len(set(lengths)) > 1  # utterances of their own lengths, not crops


def test_batched_mel_and_fbank_equal_one_at_a_time_without_soundfile(clips, tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-c", WITHOUT_DECODERS, str(SCRIPT), "--clips", str(clips), "--device", "cpu",
                        "--features", "mel,fbank", "--batch", "1,4", "--rounds", "1", "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu"
    lengths = {rate: sorted(sf.info(p).frames for p in (clips / str(rate)).glob("*.wav")) for rate in (16000, 24000)}
    seen = set()
    for res in doc["results"]:
        for row in res["rows"]:
            seen.add((row["feature"], row["batch"]))
            rate = 24000 if row["feature"] == "mel" else 16000
            assert row["audio_s"] == pytest.approx(sum(lengths[rate]) / rate)
            assert row["parity"]["shapes_equal"] is True
            assert row["parity"]["max_abs_diff"] <= 1e-5  # naive zero-padded mel batches differ by > 0.1 nat
            # Batches of 4 taken longest first: the padding efficiency follows from the clip lengths alone.
            desc = lengths[rate][::-1]
            groups = [desc[i:i + row["batch"]] for i in range(0, len(desc), row["batch"])]
            expect = sum(desc) / sum(len(g) * g[0] for g in groups)
            assert row["padding_efficiency"] == pytest.approx(expect)
            if row["batch"] == 1:
                assert row["padding_efficiency"] == 1.0
    assert seen == {("mel", 1), ("mel", 4), ("fbank", 1), ("fbank", 4)}
    assert "| mel | batch 4 |" in r.stdout


def test_refuses_unknown_features_and_a_missing_cuda(clips):
    r = subprocess.run([sys.executable, str(SCRIPT), "--clips", str(clips), "--features", "mel,pitch"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown feature(s) pitch" in r.stderr
    import torch

    if not torch.cuda.is_available():
        r = subprocess.run([sys.executable, str(SCRIPT), "--clips", str(clips), "--device", "cuda"],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "no CUDA device" in r.stderr


def test_length_sorted_batches_cover_every_clip_once():
    sys.path.insert(0, str(SCRIPT.parent))
    from bench_gpu_features import batches, padding_efficiency

    clips = [np.zeros(n, np.float32) for n in (5, 9, 1, 7, 3)]
    plan = batches(clips, 2)
    assert plan == [[1, 3], [0, 4], [2]]
    assert padding_efficiency(clips, plan) == pytest.approx(25 / (18 + 10 + 1))
