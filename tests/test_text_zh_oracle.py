"""GPT-SoVITS v2's own Chinese front end as the oracle of ours, on two sets of sentences:
- tests/data/zh_sentences.txt: 200 sentences (news, dialogue, numbers, dates, units, English words, everyday prose)
  the front end's rules were worked out on;
- tests/data/zh_heldout.txt: 50 sentences of the same kinds (numbers with and without units, Latin letters in
  Chinese text, erhua, dates) written after the rules were settled and never used to tune them.

GPT-SoVITS is not on the package registry in a form that carries its v2 front end (`chinese2.py`): this is an
opt-in oracle. Set AUDIOPIPE_GPT_SOVITS_SRC to a checkout of github.com/RVC-Boss/GPT-SoVITS (a work tree, or a git
dir whose HEAD is exported) and run it with the upstream venv (`make upstream`):

    AUDIOPIPE_GPT_SOVITS_SRC=~/src/GPT-SoVITS pytest tests/test_text_zh_oracle.py -s

GPT-SoVITS's cleaner runs there (tests/upstream/gpt_sovits_zh.py) on the path it takes without its G2PW model;
our `gpt_sovits_phones(text, "zh")` runs here. Every sentence whose phones differ is printed with both sequences.
The known differences are pinned below by sentence, with their cause, so a new one fails the test.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import pytest

from audiopipe.text.frontend import gpt_sovits_phones
from upstream_oracle import run_upstream, upstream_source

HERE = Path(__file__).resolve().parent


def _sentences(name: str) -> list[str]:
    lines = (HERE / "data" / name).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


# Sentences where GPT-SoVITS's own front end and ours differ, and why (docs/features.md lists them), per set.
KNOWN = {
    "zh_sentences.txt": {},
    "zh_heldout.txt": {
        # its list of words neutral by usage is longer than ours (tone_sandhi.NEUTRAL_BY_USAGE): 幸福 reads fu5 there
        "他家住在幸福小区8栋502室。": "幸福: 福 neutral (fu5) there, fu2 here",
    },
}
MIN_SENTENCES = {"zh_sentences.txt": 200, "zh_heldout.txt": 40}


def gpt_sovits_text_dir(tmp_path_factory) -> Path:
    # text files only: its Japanese dictionary and G2PW model are large and not needed here
    return upstream_source("AUDIOPIPE_GPT_SOVITS_SRC", "GPT-SoVITS's v2 front end is not on the package registry: set "
                           "AUDIOPIPE_GPT_SOVITS_SRC to a checkout of github.com/RVC-Boss/GPT-SoVITS to compare our "
                           "Mandarin phones with its own", "GPT_SoVITS/text/chinese2.py", ["GPT_SoVITS/text"],
                           tmp_path_factory, keep=(".py", ".txt", ".rep")) / "GPT_SoVITS"


@pytest.mark.parametrize("name", sorted(KNOWN))
def test_mandarin_phones_equal_gpt_sovits_v2(name, tmp_path, tmp_path_factory):
    src = gpt_sovits_text_dir(tmp_path_factory)
    sentences_list = _sentences(name)
    known = KNOWN[name]
    assert len(sentences_list) >= MIN_SENTENCES[name]
    sentences = tmp_path / "sentences.json"
    sentences.write_text(json.dumps(sentences_list, ensure_ascii=False), encoding="utf-8")
    run_upstream("gpt_sovits_zh.py", src, sentences, tmp_path / "theirs.json")
    theirs = json.loads((tmp_path / "theirs.json").read_text(encoding="utf-8"))["phones"]
    differ = {}
    for text, expected in zip(sentences_list, theirs):
        ours = gpt_sovits_phones(text, "zh")
        if ours != expected:
            differ[text] = [d for d in difflib.ndiff(ours, expected) if d[0] in "+-"]
    for text, diff in differ.items():
        print(f"{text} {known.get(text, 'NEW')}: {' '.join(diff)}")
    print(f"{name}: identical: {len(sentences_list) - len(differ)} of {len(sentences_list)}")
    assert set(differ) - set(known) == set(), "sentences that differ from GPT-SoVITS for no known reason"
    assert set(known) - set(differ) == set(), "known differences that are gone: remove them from KNOWN"
