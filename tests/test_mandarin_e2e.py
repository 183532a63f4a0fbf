"""End to end on a small Mandarin corpus (AISHELL-3 layout, espeak-ng `cmn` speech):

    audiopipe shard --corpus ./aishell3 --preset f5tts,gpt_sovits --language zh
    torchrun trainers/train_f5tts.py --tokenizer pinyin ...        (2 ranks, a few steps, exact resume)
    audiopipe tokens (k-means units) ; torchrun trainers/train_gpt_sovits.py ...   (2 ranks, a few steps)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from launch import run_group
import train_f5tts as f5  # trainers/ is on the tests' path (pyproject: pythonpath)
from audiopipe.cli import main as cli
from audiopipe.text.f5_pinyin import build_vocab, f5_pinyin_tokens
from audiopipe.reader.texts import shard_texts
from audiopipe.text.f5_vocab import pinyin_vocab_for
from audiopipe.text.frontend import gpt_sovits_phones
from audiopipe.text.symbols import gpt_sovits_symbols, symbols_to_ids

REPO = Path(__file__).resolve().parent.parent

from corpora_zh import make_aishell3  # noqa: E402

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.fixture(scope="module")
def zh(tmp_path_factory):
    from audiopipe.tokens.kmeans import kmeans_tokens

    corpus = tmp_path_factory.mktemp("aishell3")
    expected = make_aishell3(corpus, per_speaker=4)
    shards = tmp_path_factory.mktemp("zh_shards")
    assert cli(["shard", "--corpus", str(corpus), "--out", str(shards), "--preset", "f5tts,gpt_sovits",
                "--language", "zh", "--workers", "2", "--no-progress"]) == 0
    tokens = tmp_path_factory.mktemp("zh_tokens")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # 4 mel frames per unit: 23 units/s, like GPT-SoVITS's 25 Hz tokens
        kmeans_tokens(shards, tokens, k=16, feature="mel", stack=4, steps=20, batch_size=256)
    finally:
        torch.set_num_threads(n)
    return expected, shards, tokens


def test_shards_hold_gpt_sovits_phone_ids_and_the_table(zh):
    expected, shards, tokens = zh
    m = json.loads((shards / "manifest.json").read_text())
    assert m["phones"]["vocab"] == list(gpt_sovits_symbols()) and m["job"]["language"] == "zh"
    assert json.loads((tokens / "manifest.json").read_text())["phones"] == m["phones"]  # carried to the tokens
    rows = [r for e in m["shards"] for r in
            pa.ipc.open_file(pa.memory_map(str(shards / e["arrow"]["path"]))).read_all().to_pylist()]
    assert sorted(r["id"] for r in rows) == sorted(expected)
    for r in rows:
        assert r["text"] == expected[r["id"]][1]
        assert r["phones"] == symbols_to_ids(gpt_sovits_phones(r["text"], "zh"))
    # 今天天气很好 by hand: 3-3 sandhi on 很好 only when jieba keeps them one word; here they are two words, so
    # the boundary rule joins them (hen3 hao3 -> hen2 hao3).
    row = next(r for r in rows if r["text"] == "今天天气很好")
    table = gpt_sovits_symbols()
    assert " ".join(table[i] for i in row["phones"]) == "j in1 t ian1 t ian1 q i4 h en2 h ao3"


def test_f5_pinyin_tokenizer_round_trip(zh):
    _, shards, _ = zh
    texts = shard_texts(shards)
    vocab = build_vocab(f5_pinyin_tokens(t) for t in texts)
    tok = f5.Tokenizer(vocab, split=f5_pinyin_tokens)
    ids = tok.encode("你好世界")
    assert [vocab[i] for i in ids] == [" ", "ni2", " ", "hao3", " ", "shi4", " ", "jie4"]
    # A user vocab missing symbols: counted and reported, mapped to 0 as F5 does.
    user = shards.parent / "user_vocab.txt"
    user.write_text("".join(s + "\n" for s in vocab if s not in ("jin1", "hao3")), encoding="utf-8")
    pv = pinyin_vocab_for(shard_texts(shards), user)
    n_jin = sum(f5_pinyin_tokens(t).count("jin1") for t in texts)
    n_hao = sum(f5_pinyin_tokens(t).count("hao3") for t in texts)
    assert pv.unknown == {"jin1": n_jin, "hao3": n_hao} and n_jin > 0 and n_hao > 0
    assert f"{n_jin + n_hao} of" in pv.report()


def _torchrun(script: str, shards: Path, out: Path, steps: int, *extra: str) -> str:
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(REPO / "trainers" / script),
           "--shards", str(shards), "--config", "tiny", "--out", str(out), "--max-steps", str(steps),
           "--log-every", "1", "--ckpt-every", "2", "--warmup-steps", "100", *extra]
    r = run_group(cmd, timeout=300, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _log(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


def _straight_and_resumed(script: str, shards: Path, tmp: Path, *extra: str) -> tuple[str, Path, Path]:
    straight, resumed = tmp / "straight", tmp / "resumed"
    stdout = _torchrun(script, shards, straight, 3, *extra)
    resumed.mkdir()
    shutil.copy(straight / "ckpt-00000002.pt", resumed)
    _torchrun(script, shards, resumed, 3, "--resume", *extra)
    a = torch.load(straight / "ckpt-00000003.pt", weights_only=True)
    b = torch.load(resumed / "ckpt-00000003.pt", weights_only=True)
    assert a["model"].keys() == b["model"].keys() and a["sampler"] == b["sampler"]
    assert all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())
    log = _log(straight)
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["world"] == 2 for r in log)
    assert [r["loss"] for r in _log(resumed)] == [r["loss"] for r in log[2:]]  # bit-identical step 3
    return stdout, straight, resumed


def test_f5tts_pinyin_two_ranks_and_resume(zh, tmp_path):
    _, shards, _ = zh
    stdout, straight, _ = _straight_and_resumed("train_f5tts.py", shards, tmp_path, "--tokenizer", "pinyin",
                                                "--batch-frames", "1200", "--lr", "1e-3")
    assert "pinyin vocab" in stdout and "tokens known" in stdout  # every symbol is in the corpus vocab
    cfg = json.loads((straight / "model_config.json").read_text())
    vocab = (straight / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert cfg["tokenizer"] == "pinyin" and cfg["model"]["text_num_embeds"] == len(vocab)
    assert cfg["mel_hash"] == f5.MEL_HASH and cfg["model"]["dim"] == 64
    assert vocab == build_vocab(f5_pinyin_tokens(t) for t in shard_texts(shards))


def test_gpt_sovits_chinese_phones_two_ranks(zh, tmp_path):
    """Two ranks train on the Mandarin phone ids and units. (Their exact resume is the trainer's, whatever the
    language: tests/test_train_gpt_sovits.py resumes a 2-rank run bit-exactly; not run a second time here.)"""
    _, _, tokens = zh
    stdout = _torchrun("train_gpt_sovits.py", tokens, tmp_path / "run", 3, "--batch-frames", "1500", "--lr", "3e-3")
    assert "pass the filters" in stdout and "phones: gpt_sovits table, 322 symbols" in stdout
    log = _log(tmp_path / "run")
    assert [r["step"] for r in log] == [1, 2, 3] and all(r["world"] == 2 and math.isfinite(r["loss"]) for r in log)
    assert (tmp_path / "run" / "ckpt-00000002.pt").exists()


def test_export_f5_pinyin_writes_token_lists_and_keeps_a_given_vocab(zh, tmp_path):
    from audiopipe.export.f5 import export_f5

    _, shards, _ = zh
    texts = shard_texts(shards)
    summary = export_f5(shards, tmp_path / "zh_pinyin", tokenizer="pinyin")
    with pa.memory_map(str(tmp_path / "zh_pinyin" / "raw.arrow")) as src:
        raw = pa.ipc.open_stream(src).read_all()
    assert raw.schema.field("text").type == pa.list_(pa.string())  # as F5's pinyin preparation stores it
    assert raw.column("text").to_pylist() == [f5_pinyin_tokens(t) for t in texts]
    vocab = (tmp_path / "zh_pinyin" / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert vocab == build_vocab(f5_pinyin_tokens(t) for t in texts) and summary["tokenizer"] == "pinyin"
    given = tmp_path / "given.txt"
    given.write_text("".join(s + "\n" for s in vocab if s != "jin1"), encoding="utf-8")
    s2 = export_f5(shards, tmp_path / "zh_given", tokenizer="pinyin", vocab_file=given)
    assert s2["unknown_symbols"] == {"jin1": sum(f5_pinyin_tokens(t).count("jin1") for t in texts)}
    assert (tmp_path / "zh_given" / "vocab.txt").read_text(encoding="utf-8") == given.read_text(encoding="utf-8")
