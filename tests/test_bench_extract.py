"""The hand-written baseline of benchmarks/bench_extract.py takes the path it claims: one .npy per utterance,
the same 100-bin HTK mel as audiopipe's (float32 STFT instead of float64: equal within float32 noise)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_extract import corpus_files, run_handwritten  # noqa: E402

from audiopipe.decode.audio import load_audio, resample  # noqa: E402
from audiopipe.features.mel import VocosMel  # noqa: E402


def test_handwritten_pool_writes_one_npy_per_utterance_equal_to_audiopipes_mel(espeak_corpus, asterisk_corpus,
                                                                                tmp_path):
    files = corpus_files(espeak_corpus.root)[:4] + corpus_files(asterisk_corpus.root)[:4]
    run_handwritten(files, tmp_path / "npy", workers=2)
    written = sorted((tmp_path / "npy").glob("*.npy"))
    assert [p.name for p in written] == [f"{i:06d}.npy" for i in range(len(files))]
    mel = VocosMel()
    for f, npy in zip(files, written):
        wav, sr = load_audio(f)
        ref = mel(resample(wav, sr, 24000))["mel"]
        got = np.load(npy, allow_pickle=False)
        assert got.shape == ref.shape and got.dtype == np.float32
        loud = ref > np.log(1e-3)  # well above the 1e-5 floor, where a float32 FFT's noise is negligible
        assert loud.mean() > 0.3
        np.testing.assert_allclose(got[loud], ref[loud], atol=1e-2)
        assert np.median(np.abs(got - ref)) < 1e-4


def test_profile_times_every_stage_of_a_worker(espeak_corpus):
    # The profile wraps the hot path's functions by name: a renamed one would silently read 0 s and its time
    # would land in "glue". Every stage must be seen, and the tar only when tars are written.
    from bench_extract import PROFILE_PARTS, profile_worker

    for tar in (True, False):
        prof = profile_worker(espeak_corpus.root, tar, rounds=1)
        assert prof["utterances"] == 24
        parts = prof["rounds"][0]["parts_s"]
        for part in PROFILE_PARTS:
            if part == "tar file" and not tar:
                assert parts[part] == 0.0
            else:
                assert parts[part] > 0.0, part
        assert parts["glue"] < 0.5 * prof["rounds"][0]["total_s"]
        assert parts["glue"] >= 0.0  # no stage counted twice (the floor, run after, calls the mel as well)


def test_profile_together_runs_the_profile_alone_then_in_every_process_at_once(espeak_corpus):
    from bench_extract import PROFILE_PARTS, profile_together

    runs = profile_together(espeak_corpus.root, True, procs=2, rounds=1, inner=1)
    assert len(runs["alone"]) == 1 and len(runs["together"]) == 2  # one round from each process
    for r in runs["alone"] + runs["together"]:
        assert all(r["parts_s"][p] > 0.0 for p in PROFILE_PARTS), r["parts_s"]
        assert r["handwritten_s"] > 0.0 and r["floor_s"] > 0.0
        assert r["total_s"] >= sum(r["parts_s"][p] for p in PROFILE_PARTS)  # the stages are parts of the shard


def test_ceiling_runs_every_file_in_every_process(tmp_path):
    """--ceiling: N processes each run the whole floor (decode, resample, mel) over every file, at once, in
    processes of their own; scaling is t_1 / t_N of those runs."""
    import json
    import subprocess

    import soundfile as sf

    from corpora import harmonic_tone

    corpus = tmp_path / "c"
    corpus.mkdir()
    for i in range(3):
        sf.write(corpus / f"u{i}.wav", harmonic_tone(150.0 + 20 * i, 1.0, 16000), 16000)
    out = tmp_path / "ceiling.json"
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_extract.py"
    r = subprocess.run([sys.executable, str(script), "--ceiling", "--wav-corpus", str(corpus), "--corpora", "WAV",
                        "--files", "0", "--workers", "1,2", "--rounds", "1", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())["ceiling"]["WAV"]
    (rnd,) = got["rounds"]
    assert got["files"] == 3 and got["procs"] == 2
    assert got["scaling"]["median"] == rnd["scaling"] == rnd["t1_s"] / rnd["t2_s"]
    one, *two = rnd["processes"]  # each phase's wall time holds the stage time its processes measured inside
    assert rnd["t1_s"] >= one["floor_s"] > 0 and rnd["t2_s"] >= max(p["floor_s"] for p in two) > 0
    procs = rnd["processes"]
    assert [p["files"] for p in procs] == [3, 3, 3]  # 1 alone, then 2 at once: each ran every file
    assert len({p["pid"] for p in procs}) == 3  # three processes of their own
