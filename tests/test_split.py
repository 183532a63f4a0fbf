"""ap.split: whole speakers (or single rows) held out, as make_loader's subset= indices."""

from __future__ import annotations

import numpy as np
import pytest

import audiopipe as ap
from audiopipe.index.lengths import LengthIndex


def test_split_by_speaker_holds_out_whole_speakers_and_the_loader_reads_only_the_rest(f5_shards):
    speakers = np.asarray(LengthIndex.open(f5_shards).table.column("speaker").to_pylist())
    s = ap.split(f5_shards, by="speaker", test=1, seed=3)
    assert len(s.test_speakers) == 1 and set(speakers[s.test]) == set(s.test_speakers)
    assert not set(speakers[s.train]) & set(s.test_speakers)
    assert np.array_equal(np.sort(np.concatenate([s.train, s.test])), np.arange(len(speakers)))
    assert ap.split(f5_shards, by="speaker", test=1, seed=3).test_speakers == s.test_speakers  # seeded
    assert len(ap.split(f5_shards, by="speaker", test=0.5).test_speakers) == len(set(speakers)) // 2
    seen = set()
    for batch in ap.make_loader(f5_shards, ["mel"], max_frames=4000, subset=s.train, shuffle=False):
        seen.update(batch["speaker"])
    assert seen == set(speakers) - set(s.test_speakers)


def test_split_by_utterance_and_over_a_list_of_shard_sets(f5_shards):
    n = len(LengthIndex.open(f5_shards).table)
    s = ap.split(f5_shards, by="utterance", test=0.25, seed=1)
    assert len(s.test) == round(0.25 * n) and len(s.train) + len(s.test) == n and s.test_speakers == []
    both = ap.split([f5_shards, f5_shards], by="speaker", test=2)
    assert len(both.train) + len(both.test) == 2 * n  # rows numbered as make_loader numbers a mix
    assert all(":" in name for name in both.test_speakers)  # a speaker of one set is not one of the other


@pytest.mark.parametrize("kwargs, says", [
    (dict(by="gender"), "by='gender': choose from speaker, utterance"),
    (dict(test=4), "test=4 holds out 4 of 4 speakers"),
    (dict(test=1.5), "test=1.5: give a fraction in (0, 1)"),
    (dict(test=0), "test=0 holds out 0 of 4 speakers"),
])
def test_split_refuses_what_leaves_nothing_to_train_or_test(f5_shards, kwargs, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")) as e:
        ap.split(f5_shards, **kwargs)
    assert isinstance(e.value, ap.AudiopipeError)
