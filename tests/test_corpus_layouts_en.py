"""English corpus layouts as released: LibriTTS(-R) from its top folder, VCTK 0.92 and 0.80, an ESPnet recipe's
data dir, and the Kaldi and walk cases that used to go wrong without a word (split names as speakers, a missing
recording reported twice). Real speech (espeak-ng, Asterisk) at 24 kHz: the shards' pcm must equal the samples."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from audiopipe.cli import main
from audiopipe.corpus.discover import discover
from audiopipe.corpus.options import CorpusOptions
from corpora_en import make_espnet, make_libritts, make_vctk, write
from en_helpers import assert_rows_match, shard_rows


def reasons(d):
    return {r.source: r.reason for r in d.rejects}


@pytest.fixture(scope="module")
def libritts(tmp_path_factory, speech_pool):
    root = tmp_path_factory.mktemp("libritts") / "LibriTTS"
    return root, make_libritts(root, speech_pool)


@pytest.fixture(scope="module")
def vctk(tmp_path_factory, speech_pool):
    root = tmp_path_factory.mktemp("vctk") / "VCTK-Corpus-0.92"
    return root, make_vctk(root, speech_pool)


# ----------------------------------------------------------------------------------------------- LibriTTS

def test_libritts_top_folder_speakers_come_from_file_names_not_splits(libritts):
    root, expected = libritts
    d = discover(root)
    assert {u.id: (u.speaker, u.text) for u in d.utterances} == {k: (e.speaker, e.text) for k, e in expected.items()}
    assert not {u.speaker for u in d.utterances} & {"dev-clean", "test-clean"}
    assert d.rejects == []  # the ._ resource forks are not audio and are not counted
    for u in d.utterances:
        e = expected[u.id]
        assert (u.extra["original_text"], u.extra["gender"], u.extra["snr"]) == \
            (e.extra["original_text"], e.extra["gender"], e.extra["snr"])
    assert any("original_text" in n and "keep_columns=" in n for n in d.notes)


def test_libritts_split_folder_keeps_its_ids(libritts):
    root, expected = libritts
    d = discover(root / "dev-clean")  # one split as the root: ids relative to it, as a walk gave them
    want = {k.split("/", 1)[1]: e.speaker for k, e in expected.items() if k.startswith("dev-clean/")}
    assert {u.id: u.speaker for u in d.utterances} == want


def test_libritts_falls_back_to_trans_tsv(libritts, tmp_path):
    root, expected = libritts
    copy = tmp_path / "LibriTTS"
    shutil.copytree(root, copy)
    for p in copy.rglob("*.normalized.txt"):
        p.unlink()
    d = discover(copy)
    assert {u.id: u.text for u in d.utterances} == {k: e.text for k, e in expected.items()}


def test_libritts_shards_with_kept_columns_by_the_readme_command(libritts, tmp_path, capsys):
    root, expected = libritts
    out = tmp_path / "out"
    assert main(["shard", "--corpus", str(root), "--features", "pcm", "--keep-columns",
                 "original_text,gender,snr", "--workers", "2", "--no-progress", "--out", str(out)]) == 0
    rows = shard_rows(out)
    assert_rows_match(rows, expected)
    for uid, e in expected.items():
        assert rows[uid]["original_text"] == e.extra["original_text"]
        assert rows[uid]["gender"] == e.extra["gender"]
        assert float(rows[uid]["snr"]) == e.extra["snr"]  # numbers are kept as their JSON text
    err = capsys.readouterr().err
    assert "not written to the shards: subset" in err and err.count("not written to the shards") == 1


# ----------------------------------------------------------------------------------------------- VCTK

def test_vctk_092_reads_txt_and_one_microphone(vctk):
    root, expected = vctk
    d = discover(root)
    assert {u.id: (u.speaker, u.text) for u in d.utterances} == \
        {k: (e.speaker, e.text) for k, e in expected["mic1"].items()}  # each sentence once, with its text
    assert all(u.extra["gender"] and u.extra["accent"] for u in d.utterances)
    assert any("mic1 recordings taken, 9 files of the other microphone left out" in n for n in d.notes)
    mic2 = discover(root, options=CorpusOptions(vctk_mic="mic2"))
    assert sorted(u.id for u in mic2.utterances) == sorted(expected["mic2"])


def test_vctk_shards_the_chosen_microphone_and_counts_missing_transcripts(vctk, tmp_path, capsys):
    root, expected = vctk
    out = tmp_path / "out"
    assert main(["shard", "--corpus", str(root), "--preset", "f5tts", "--workers", "2", "--no-progress",
                 "--out", str(out)]) == 0
    assert_rows_match(shard_rows(out), expected["mic1"], pcm=False)
    err = capsys.readouterr().err
    # p315 has no transcripts (as in VCTK 0.92): said once, with the flag that refuses them
    assert err.count("3 of 9 utterances have no transcript, and --preset f5tts trains on transcripts; "
                     "--require-text refuses them") == 1
    out2 = tmp_path / "out2"
    assert main(["shard", "--corpus", str(root), "--features", "pcm", "--vctk-mic", "mic2", "--require-text",
                 "--workers", "2", "--no-progress", "--out", str(out2)]) == 0
    assert_rows_match(shard_rows(out2), {k: e for k, e in expected["mic2"].items() if e.text})
    assert "rejects: no_text 3" in capsys.readouterr().out


def test_vctk_080_layout(tmp_path, speech_pool):
    root = tmp_path / "VCTK-Corpus"
    expected = make_vctk(root, speech_pool, "0.80")["mic1"]
    d = discover(root)
    assert {u.id: (u.speaker, u.text) for u in d.utterances} == {k: (e.speaker, e.text) for k, e in expected.items()}
    assert d.utterances[0].extra["gender"] == "F"


# ----------------------------------------------------------------------------------------------- ESPnet / Kaldi

def test_espnet_wav_scp_paths_relative_to_the_recipe(tmp_path, speech_pool):
    recipe = tmp_path / "egs2" / "demo" / "tts1"
    expected = make_espnet(recipe, speech_pool)
    d = discover(recipe / "data" / "train")
    assert d.rejects == []
    assert {u.id: (u.speaker, u.text) for u in d.utterances} == {k: (e.speaker, e.text) for k, e in expected.items()}
    assert any(str(recipe) in n and "ESPnet" in n for n in d.notes)
    for u in d.utterances:  # the very file the recipe names
        assert np.array_equal((np.asarray(__import__("soundfile").read(u.path, dtype="int16")[0])),
                              expected[u.id].pcm)


def test_kaldi_missing_recording_is_one_reject_not_a_second_misreport(tmp_path, speech_pool):
    data = tmp_path / "data"
    write(data / "a.wav", np.concatenate([c.pcm for c in speech_pool[0][:2]]))
    (data / "wav.scp").write_text("recA a.wav\nrecB gone.wav\n")
    (data / "segments").write_text("recA-0 recA 0.0 1.0\nrecB-0 recB 0.0 1.0\nrecB-1 recB 1.0 2.0\n"
                                    "recC-0 recC 0.0 1.0\n")
    d = discover(data)
    assert [u.id for u in d.utterances] == ["recA-0"]
    assert reasons(d) == {"gone.wav": "missing", "segments#recC-0": "kaldi_missing_recording"}
    assert d.discovered == 3  # the missing recording once, not once more per segment
    assert "does not list" not in next(r for r in d.rejects if r.reason == "missing").detail


# ----------------------------------------------------------------------------------------------- walks

def test_split_named_speaker_folders_are_a_warning(tmp_path, speech_pool):
    for split in ("train", "dev-clean"):
        write(tmp_path / split / "a.wav", speech_pool[0][0].pcm)
    d = discover(tmp_path)
    assert {u.speaker for u in d.utterances} == {"train", "dev-clean"}
    assert any("named like splits or corpus folders: dev-clean, train" in n for n in d.notes)
    assert not discover(tmp_path, speaker="dir:0").notes  # asked for explicitly: no warning
