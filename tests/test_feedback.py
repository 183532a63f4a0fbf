"""Feedback on long or surprising work: progress bars on verify and tokens, and a warning when rows without a
transcript are exported to NeMo or trained on by F5-TTS."""

from __future__ import annotations

import shutil

import pytest

import audiopipe as ap
from audiopipe.cli import main
from audiopipe.errors import AudiopipeWarning


def test_verify_and_kmeans_tokens_show_a_progress_bar(f5_shards, tmp_path, capsys):
    from audiopipe.tokens.kmeans import kmeans_tokens

    assert ap.verify(f5_shards, progress=True).ok
    err = capsys.readouterr().err
    assert "verify: 100%" in err and "utt" in err
    assert main(["verify", str(f5_shards), "--no-progress"]) == 0
    assert "verify:" not in capsys.readouterr().err
    kmeans_tokens(f5_shards, tmp_path / "tok", k=4, steps=5, batch_size=256, progress=True)
    err = capsys.readouterr().err
    assert "k-means fit (4 units)" in err and "tokens: 100%" in err


@pytest.fixture(scope="module")
def untranscribed(espeak_corpus, tmp_path_factory):
    """4 utterances, 2 of them without a transcript, sharded with the pcm (NeMo needs audio)."""
    from shard_helpers import shard

    corpus = tmp_path_factory.mktemp("untranscribed")
    for k, u in enumerate(espeak_corpus.utterances[:4]):
        shutil.copy(espeak_corpus.root / f"{u.id}.wav", corpus / f"u{k}.wav")
        if k % 2:
            shutil.copy(espeak_corpus.root / f"{u.id}.txt", corpus / f"u{k}.txt")
    out = tmp_path_factory.mktemp("untranscribed_shards")
    shard(corpus, out, [("vocos_mel", {}), ("pcm", {})])
    return out


def test_export_nemo_warns_about_empty_texts(untranscribed, tmp_path, capsys):
    with pytest.warns(AudiopipeWarning, match=r'2 of 4 lines have an empty "text".*require_text=True'):
        s = ap.export_nemo(untranscribed, tmp_path / "a")
    assert s["untranscribed"] == 2
    assert main(["export-nemo", "--shards", str(untranscribed), "--out", str(tmp_path / "b"), "--no-progress"]) == 0
    assert 'audiopipe: note: 2 of 4 lines have an empty "text"' in capsys.readouterr().err


def test_the_f5_trainer_warns_before_training_on_empty_texts(untranscribed, f5_shards, capsys):
    from train_f5tts import warn_untranscribed

    warn_untranscribed([str(untranscribed)])
    assert "[f5tts] warning: 2 of 4 utterances have no transcript" in capsys.readouterr().out
    warn_untranscribed([str(f5_shards)])
    assert capsys.readouterr().out == ""
