"""Corpus layouts (Kaldi data dir with segments, AISHELL-3, Emilia) on small Mandarin corpora spoken by espeak-ng,
and a shard run that stores GPT-SoVITS phone ids with the symbol table in the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits
from audiopipe.decode.segments import RecordingCache
from audiopipe.text.frontend import gpt_sovits_phones
from audiopipe.text.symbols import gpt_sovits_symbols, symbols_to_ids

from corpora_zh import SPEAKERS, make_aishell3, make_emilia, make_kaldi
from shard_helpers import make_job
from audiopipe.shard.run import run_job


@pytest.fixture(scope="module")
def kaldi(tmp_path_factory):
    root = tmp_path_factory.mktemp("kaldi") / "data" / "train"
    root.mkdir(parents=True)
    return root, make_kaldi(root)


@pytest.fixture(scope="module")
def aishell(tmp_path_factory):
    root = tmp_path_factory.mktemp("aishell3")
    return root, make_aishell3(root)


@pytest.fixture(scope="module")
def emilia(tmp_path_factory):
    root = tmp_path_factory.mktemp("emilia")
    return root, make_emilia(root)


def reasons(d) -> dict[str, str]:
    return {r.source: r.reason for r in d.rejects}


# ----------------------------------------------------------------------------- Kaldi

def test_kaldi_data_dir_with_segments(kaldi):
    root, expected = kaldi
    d = discover(root)  # detected from wav.scp
    assert [u.id for u in d.utterances] == sorted(expected)
    for u in d.utterances:
        rec, text, start, end = expected[u.id]
        assert (u.text, u.speaker, u.extra["recording"]) == (text, rec.split("-")[0], rec)
        assert (u.extra["start_frame"], u.extra["end_frame"]) == (start, end)  # segments' seconds -> frames
        assert u.num_samples == end - start and u.duration == pytest.approx((end - start) / u.sample_rate)
        assert u.source == f"audio/{rec}.wav"
    assert reasons(d) == {"wav.scp#piped": "kaldi_pipe", "wav.scp#archived": "kaldi_ark",
                          "segments#ghost-0": "kaldi_missing_recording", "segments#late-0": "bad_segment"}
    pipe = next(r for r in d.rejects if r.reason == "kaldi_pipe")
    assert "wav.scp:" in pipe.detail and "not run" in pipe.detail


def test_segments_decode_each_recording_once(kaldi):
    root, expected = kaldi
    utts = discover(root).utterances
    cache = RecordingCache(utts)
    for u in utts:
        wav, sr = cache.cut(u, DecodeLimits())
        whole, _ = sf.read(u.path, dtype="float32")
        _, _, start, end = expected[u.id]
        np.testing.assert_array_equal(wav, whole[start:end])
    assert cache.decodes == len(SPEAKERS)  # 6 segments, 2 recordings, 2 decodes
    assert cache._decoded == {}  # every recording freed after its last segment


def test_malformed_kaldi_line_names_file_and_line(tmp_path):
    (tmp_path / "wav.scp").write_text("onlyanid\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"wav.scp:1"):
        discover(tmp_path)


def test_layout_choice(kaldi, tmp_path):
    root, _ = kaldi
    with pytest.raises(ValueError, match="does not look like a aishell3 corpus"):
        discover(root, layout="aishell3")
    walked = discover(root, layout="files")  # plain walking: whole recordings, ids from paths
    assert sorted(u.id for u in walked.utterances) == [f"audio/{s}-rec{r}" for r, (s, _, _) in enumerate(SPEAKERS)]


def test_kaldi_shard_with_chinese_phones(kaldi, tmp_path):
    root, expected = kaldi
    job = make_job(root, tmp_path / "out", [("pcm", {"sample_rate": 16000})], phones=True, presets=("gpt_sovits",))
    job.language = "zh"
    summary = run_job(job, workers=2, show_progress=False)
    assert summary.written == len(expected)
    assert summary.reject_reasons == {"kaldi_pipe": 1, "kaldi_ark": 1, "kaldi_missing_recording": 1,
                                      "bad_segment": 1}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["phones"]["vocab"] == list(gpt_sovits_symbols()) and manifest["phones"]["language"] == "zh"
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "out" / "arrow" / "shard-000000.arrow"))).read_all()
    for row in table.to_pylist():
        _, text, start, end = expected[row["id"]]
        assert row["text"] == text
        assert row["phones"] == symbols_to_ids(gpt_sovits_phones(text, "zh"))
        assert len(row["pcm"]) == pytest.approx((end - start) * 16000 / 22050, abs=2)


# ----------------------------------------------------------------------------- AISHELL-3

def test_aishell3_layout(aishell):
    root, expected = aishell
    (root / "train" / "content.txt").open("a", encoding="utf-8").write("SSB00059999.wav\t好 hao3\n")
    d = discover(root)
    assert {u.id: (u.speaker, u.text, u.extra["pinyin"]) for u in d.utterances} == expected
    assert reasons(d) == {"train/wav/SSB0005/SSB00059999.wav": "missing"}
    split_only = discover(root / "train")  # the split folder works as a root too
    assert len(split_only.utterances) == len(expected)


# ----------------------------------------------------------------------------- Emilia

def test_emilia_layout_and_per_line_language(emilia):
    root, expected = emilia
    d = discover(root)
    assert {u.id: (u.speaker, u.text, u.extra["language"]) for u in d.utterances} == expected
    assert all(u.source.endswith(".mp3") and u.extra["dnsmos"] == 3.2 for u in d.utterances)
    assert list(reasons(d).values()) == ["missing"]
    en = next(u for u in d.utterances if u.extra["language"] == "en")
    # --language auto: the line's tag picks the English G2P (ARPAbet inside GPT-SoVITS's table)
    assert gpt_sovits_phones(en.text, "auto", en.extra["language"]) == ["HH", "AH0", "L", "OW1", "W", "ER1", "L",
                                                                           "D", "."]
