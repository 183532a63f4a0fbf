"""Whose folder is it: `shard` writes only into an empty folder or one it made (its marker, written first, holds
the job identity). Any other folder is a one-line refusal naming what is there, with every file left as it was;
a folder of ours made before the marker existed is adopted when its plan names the same job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audiopipe.shard.job import JobError
from audiopipe.shard.output import MARKER_NAME
from shard_helpers import shard, tree_digest

MEL = [("vocos_mel", {})]


def _user_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "manifest.json").write_text('{"mine": true}\n')
    (root / "rejects.jsonl").write_text("my notes\n")
    (root / ".draft.tmp-12").write_text("a draft")
    return root


def test_a_users_folder_is_refused_in_one_line_and_left_as_it_was(synthetic_corpus, tmp_path):
    out = _user_folder(tmp_path / "mine")
    before = tree_digest(out)
    with pytest.raises(JobError) as e:
        shard(synthetic_corpus.root, out, MEL, workers=0)
    msg = str(e.value)
    assert "is not empty and was not made by audiopipe shard (it holds .draft.tmp-12, manifest.json, " \
           "rejects.jsonl)" in msg and "\n" not in msg
    assert tree_digest(out) == before and not (out / MARKER_NAME).exists()


def test_a_foreign_plan_is_a_refusal_not_a_key_error(synthetic_corpus, tmp_path):
    out = tmp_path / "foreign"
    out.mkdir()
    (out / "plan.json").write_text('{"units": []}')
    with pytest.raises(JobError, match=r"was not made by audiopipe shard \(it holds plan\.json\)"):
        shard(synthetic_corpus.root, out, MEL, workers=0)


def test_the_marker_is_written_first_and_names_the_job(synthetic_corpus, tmp_path):
    out = tmp_path / "new"
    s = shard(synthetic_corpus.root, out, MEL, workers=0)
    marker = json.loads((out / MARKER_NAME).read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert marker["job_identity"] == plan["job_identity"] and s.written == 12
    # Another job's settings on the same folder: refused by the marker, nothing touched.
    before = tree_digest(out)
    with pytest.raises(JobError, match="holds shards made with other settings"):
        shard(synthetic_corpus.root, out, [("kaldi_fbank", {})], workers=0)
    assert tree_digest(out) == before
    # A folder of ours from before the marker: adopted (its plan names this job), up to date.
    (out / MARKER_NAME).unlink()
    assert shard(synthetic_corpus.root, out, MEL, workers=0).up_to_date
    assert json.loads((out / MARKER_NAME).read_text()) == marker
    # ... but not once a file of someone else's sits in it.
    (out / MARKER_NAME).unlink()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(JobError, match=r"it holds arrow, done, index\.arrow, manifest\.json, notes\.txt and 3 more"):
        shard(synthetic_corpus.root, out, MEL, workers=0)


def test_a_row_longer_than_one_row_may_be_is_refused_by_its_declared_length(tmp_path):
    """A 3-hour row with --max-duration 20000 peaked at 10.9 GB. A row longer than MAX_ROW_S is refused from its
    header, naming the limit, whatever --max-duration says; the other rows are written."""
    import numpy as np
    import soundfile as sf

    from audiopipe.shard.run import MAX_ROW_S

    corpus = tmp_path / "c"
    corpus.mkdir()
    sr = 8000
    sf.write(corpus / "long.wav", np.zeros(int((MAX_ROW_S + 1) * sr), np.int16), sr, subtype="PCM_16")
    t = np.arange(sr) / sr
    sf.write(corpus / "short.wav", (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), sr, subtype="PCM_16")
    s = shard(corpus, tmp_path / "out", [("pcm", {})], workers=0, max_duration=20000.0)
    assert s.written == 1 and s.reject_reasons == {"too_long": 1}
    rej = [json.loads(line) for line in (tmp_path / "out" / "rejects.jsonl").read_text().splitlines()]
    assert rej[0]["source"] == "long.wav" and f"longer than the {MAX_ROW_S:.0f} s one row may be" in rej[0]["detail"]
