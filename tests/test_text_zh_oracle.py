"""GPT-SoVITS v2's own Chinese front end as the oracle of ours, on the 200 sentences of tests/data/zh_sentences.txt
(news, dialogue, numbers, dates, units, English words, everyday prose).

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


from audiopipe.text.frontend import gpt_sovits_phones
from upstream_oracle import run_upstream, upstream_source

HERE = Path(__file__).resolve().parent
SENTENCES = [line.strip() for line in (HERE / "data" / "zh_sentences.txt").read_text(encoding="utf-8").splitlines()
             if line.strip() and not line.startswith("#")]

# Sentences where GPT-SoVITS's own front end and ours differ, and why (docs/features.md lists them).
KNOWN = {
    # its normaliser reads a bare number of 3+ digits digit by digit unless its measure-word list follows
    "北京到上海的距离大约是1200公里。": "number read digit by digit (幺二零零公里)",
    "列车时速最高可达350公里。": "number read digit by digit (三五零公里)",
    "请拨打110报警。": "number read digit by digit (幺幺零)",
    # its normaliser reads letters before they are dropped: a hyphen between letters as 减, m as 米
    "你的Wi-Fi密码是多少？": "Wi-Fi's hyphen read as 减 (minus)",
    "我们下午开个Zoom会议吧。": "Zoom's m read as 米 (metre)",
    "我的email地址变了。": "email's m read as 米 (metre)",
    # its list of words whose final 儿 keeps its own tone
    "窗外的鸟儿叽叽喳喳地叫个不停。": "鸟儿: 儿 keeps er2 there",
}


def gpt_sovits_text_dir(tmp_path_factory) -> Path:
    # text files only: its Japanese dictionary and G2PW model are large and not needed here
    return upstream_source("AUDIOPIPE_GPT_SOVITS_SRC", "GPT-SoVITS's v2 front end is not on the package registry: set "
                           "AUDIOPIPE_GPT_SOVITS_SRC to a checkout of github.com/RVC-Boss/GPT-SoVITS to compare our "
                           "Mandarin phones with its own", "GPT_SoVITS/text/chinese2.py", ["GPT_SoVITS/text"],
                           tmp_path_factory, keep=(".py", ".txt", ".rep")) / "GPT_SoVITS"


def test_mandarin_phones_equal_gpt_sovits_v2(tmp_path, tmp_path_factory):
    src = gpt_sovits_text_dir(tmp_path_factory)
    assert len(SENTENCES) >= 200
    sentences = tmp_path / "sentences.json"
    sentences.write_text(json.dumps(SENTENCES, ensure_ascii=False), encoding="utf-8")
    run_upstream("gpt_sovits_zh.py", src, sentences, tmp_path / "theirs.json")
    theirs = json.loads((tmp_path / "theirs.json").read_text(encoding="utf-8"))["phones"]
    differ = {}
    for text, expected in zip(SENTENCES, theirs):
        ours = gpt_sovits_phones(text, "zh")
        if ours != expected:
            differ[text] = [d for d in difflib.ndiff(ours, expected) if d[0] in "+-"]
    for text, diff in differ.items():
        print(f"{text} {KNOWN.get(text, 'NEW')}: {' '.join(diff)}")
    print(f"identical: {len(SENTENCES) - len(differ)} of {len(SENTENCES)}")
    assert set(differ) - set(KNOWN) == set(), "sentences that differ from GPT-SoVITS for no known reason"
    assert set(KNOWN) - set(differ) == set(), "known differences that are gone: remove them from KNOWN"
