"""The scale rehearsal's corpus (benchmarks/bench_scale.py) is deterministic whatever the number of processes,
holds no two identical files, resumes an interrupted build, and is what discovery finds; its throughput deciles
follow the shards in the order they finished."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_scale import SR, build, deciles  # noqa: E402

from audiopipe.corpus.demo import ASTERISK_SOUNDS  # noqa: E402

pytestmark = pytest.mark.skipif(not ASTERISK_SOUNDS.is_dir(), reason="asterisk prompts not installed")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_corpus_is_deterministic_unique_and_resumable(tmp_path):
    a = build(tmp_path / "a", 120, seed=3, per_speaker=50, processes=1, progress=False)
    b = build(tmp_path / "b", 120, seed=3, per_speaker=50, processes=2, progress=False)
    fa, fb = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert fa == fb
    assert a["utterances"] == 120 and a["speakers"] == 3
    assert a["bytes"] == sum(len(v) for v in fa.values())
    wavs = [v for k, v in fa.items() if k.endswith(".wav")]
    assert len(set(wavs)) == 120  # every utterance's bytes its own, read from the files (not the build's count)
    c = build(tmp_path / "c", 120, seed=4, per_speaker=50, processes=1, progress=False)
    assert _files(tmp_path / "c") != fa and c["unique_contents"] == 120  # the seed matters

    # an interrupted build: a speaker folder without its metadata.csv is written again, the others are kept
    (tmp_path / "b" / "spk0001" / "metadata.csv").unlink()
    (tmp_path / "b" / "spk0001" / "wavs" / "u0000060.wav").write_bytes(b"half")
    again = build(tmp_path / "b", 120, seed=3, per_speaker=50, processes=1, progress=False)
    assert _files(tmp_path / "b") == fa and again["bytes"] == a["bytes"] and again["unique_contents"] == 120


def test_discovery_finds_every_utterance_with_its_speaker_and_text(tmp_path):
    import soundfile as sf

    from audiopipe.corpus.discover import discover

    build(tmp_path, 60, seed=0, per_speaker=25, processes=1, progress=False)
    d = discover(str(tmp_path))
    assert d.discovered == 60 and not d.rejects
    assert {u.speaker for u in d.utterances} == {"spk0000", "spk0001", "spk0002"}
    for u in d.utterances:
        info = sf.info(u.path)
        assert info.samplerate == SR and 0.5 <= info.duration <= 4.0 and u.text


def test_deciles_follow_the_finishing_order():
    tasks = [{"name": f"s{i}", "start": i, "end": 20 - i, "cpu": 1.0} for i in range(20)]
    manifest = {"shards": [{"name": f"s{i}", "duration": 100.0 + i} for i in range(20)]}
    d = deciles({"tasks": tasks}, manifest)
    first, last = d["deciles"][0], d["deciles"][-1]
    assert len(d["deciles"]) == 10 and first["tasks"] == 2
    assert first["audio_s"] == 119.0 + 118.0  # s19 and s18 finished first
    assert last["audio_s"] == 100.0 + 101.0
    assert d["last_over_first"] == round((201.0 / 2) / (237.0 / 2), 3)
