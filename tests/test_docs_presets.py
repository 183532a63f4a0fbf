"""presets.resolve does what its docstring says: shared requests collapse, clashing ones are a one-line error."""

from __future__ import annotations

import pytest

from audiopipe import presets
from audiopipe.presets import PRESETS, Preset, resolve


def test_shared_feature_requests_collapse():
    p = resolve(["gpt_sovits", "eres2net"])
    assert [k for k, _ in p.features] == ["pcm", "kaldi_fbank"]  # the pcm @16 kHz request is computed once
    assert p.phones and p.transcripts


def test_front_end_steps_apply_to_the_whole_job():
    p = resolve(["f5tts", "ns2"])
    assert p.trim == PRESETS["ns2"].trim and p.align_to == "codes"


def test_clashing_feature_requests_are_an_error(monkeypatch):
    monkeypatch.setitem(PRESETS, "pcm24", Preset("pcm @24 kHz", features=(("pcm", {"sample_rate": 24000}),)))
    with pytest.raises(ValueError, match="ask for feature 'pcm' twice with different parameters"):
        presets.resolve(["eres2net", "pcm24"])
    # a different column name is a different request, not a clash
    monkeypatch.setitem(PRESETS, "pcm24n", Preset("", features=(("pcm", {"sample_rate": 24000, "name": "pcm24"}),)))
    assert len(resolve(["eres2net", "pcm24n"]).features) == 3
