"""The demo corpus is recorded speech only: every file is an Asterisk prompt from a Debian package, with its text."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile as sf

from audiopipe.corpus import demo


def test_demo_corpus_is_recorded_speech_of_three_speakers_in_three_languages(tmp_path):
    n = demo.build_demo_corpus(tmp_path, per_voice=3)
    wavs = sorted(tmp_path.rglob("*.wav"))
    assert n == len(wavs) == 3 * len(demo.VOICES) == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v.speaker for v in demo.VOICES)
    for wav in wavs:
        src = wav.resolve()
        assert src.parent == demo.SOUNDS / next(v.folder for v in demo.VOICES if v.speaker == wav.parent.name)
        assert sf.info(str(src)).samplerate == 8000
        assert wav.with_suffix(".txt").read_text(encoding="utf-8").strip()
    texts = {wav.parent.name: wav.with_suffix(".txt").read_text(encoding="utf-8") for wav in wavs}
    assert any("\u0400" <= ch <= "\u04ff" for ch in texts["ru_ivrvoice"])  # Russian text for the Russian voice


def test_demo_corpus_names_the_missing_package(tmp_path, monkeypatch):
    monkeypatch.setattr(demo, "DOCS", tmp_path / "no-docs")
    with pytest.raises(demo.MissingSource, match="asterisk-core-sounds-en ") as e:
        demo.build_demo_corpus(tmp_path / "out")
    assert "apt-get install" in str(e.value) and not (tmp_path / "out").exists()
    assert demo.main([str(tmp_path / "out")]) == 2


def test_demo_command_writes_what_the_readme_says(tmp_path, capsys):
    assert demo.main([str(tmp_path / "wavs")]) == 0
    wavs = list(Path(tmp_path / "wavs").rglob("*.wav"))
    hours = sum(sf.info(str(w)).duration for w in wavs) / 3600
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    assert f"{len(wavs)} utterances, {hours:.3f} h, {len(demo.VOICES)} speakers" in readme
