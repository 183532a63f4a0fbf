"""engine="auto" on a codec job (the ns2 preset): a small one stays in this process, with a note saying why,
instead of paying Ray's start-up; a large one would go to Ray (the rule: audiopipe.shard.run.codec_stays_local)."""

from __future__ import annotations

import shutil

import audiopipe as ap
from audiopipe.shard import run


def test_a_small_codec_job_stays_local_under_auto(espeak_corpus, tmp_path):
    corpus = tmp_path / "c"
    for u in espeak_corpus.utterances[:3]:
        spk, utt = u.id.split("/")
        (corpus / spk).mkdir(parents=True, exist_ok=True)
        for ext in (".wav", ".txt"):
            shutil.copy(espeak_corpus.root / spk / (utt + ext), corpus / spk / (utt + ext))
    audio = sum(u.duration for u in espeak_corpus.utterances[:3])
    assert run.codec_stays_local(audio, 2) and not run.codec_stays_local(3600.0, 2)
    s = ap.shard(corpus, tmp_path / "o", preset="ns2", codec_random_init=True, workers=2)
    assert s.written == 3 and s.engine == "local", s.lines()
    assert any(n.startswith("local engine: ") and "codec work" in n for n in s.notes), s.notes
