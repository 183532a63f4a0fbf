"""Per-phone BERT features for GPT-SoVITS stage 1 (audiopipe.text.bert): against GPT-SoVITS's own feature code
on a random-init BERT saved locally with transformers' save_pretrained (never a hub), and through the whole chain:
`audiopipe shard --bert-checkpoint` -> verify -> token folder -> the trainer reads them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from audiopipe.text.bert import BertFeatureError, BertPhoneFeatures, assemble, spread, word2ph
from audiopipe.text.frontend import gpt_sovits_phones, gpt_sovits_segments
from upstream_oracle import run_upstream

REPO = Path(__file__).resolve().parent.parent
TEXTS = ["今天天气很好,我们去北京.", "他不喜欢喝茶!", "一个人在家…你好世界", "银行行长来了?"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A random-init BERT of chinese-roberta-wwm-ext-large's width (1024) but 3 layers, with a character
    vocabulary, saved as its folder is laid out (BertForMaskedLM + tokenizer, save_pretrained)."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from corpora_zh import ZH_SENTENCES

    d = tmp_path_factory.mktemp("tiny_bert")
    chars = sorted({c for t in TEXTS + [s for s, _ in ZH_SENTENCES] for c in t} | set("!?…,.-"))
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars]) + "\n",
                                 encoding="utf-8")
    BertTokenizerFast(vocab_file=str(d / "vocab.txt")).save_pretrained(str(d))
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=5 + len(chars), hidden_size=1024, num_hidden_layers=3, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64)
    BertForMaskedLM(cfg).save_pretrained(str(d))
    return d


def test_features_equal_gpt_sovits_own(bert_dir, tmp_path):
    from safetensors.torch import load_file

    segs = [gpt_sovits_segments(t, "zh") for t in TEXTS]
    norms = [s[0][2] for s in segs]
    assert all(len(s) == 1 and sum(word2ph(s[0][2])) == len(s[0][1]) for s in segs)
    (tmp_path / "in.json").write_text(json.dumps([[n, word2ph(n)] for n in norms], ensure_ascii=False),
                                      encoding="utf-8")
    run_upstream("gpt_sovits_bert.py", bert_dir, tmp_path / "in.json", tmp_path / "out.safetensors")
    theirs = load_file(tmp_path / "out.safetensors")
    bert = BertPhoneFeatures(bert_dir, batch_size=3)  # batched with padding: equal to one at a time
    chars = bert.char_features(norms)
    for i, (n, s) in enumerate(zip(norms, segs)):
        ours = spread(chars[i], word2ph(n))
        assert ours.shape == (1024, len(s[0][1]))
        np.testing.assert_allclose(ours, theirs[f"f{i}"].numpy(), rtol=0, atol=1e-5)
        stored = bert.phone_features(s)  # what the shards store: float16
        assert stored.dtype == np.float16
        np.testing.assert_allclose(stored.astype(np.float32), theirs[f"f{i}"].numpy(), rtol=2e-3, atol=2e-3)


def test_mixed_lines_zero_english_phones_and_misalignment_is_refused(bert_dir):
    bert = BertPhoneFeatures(bert_dir)
    segs = gpt_sovits_segments("我们去 Boston 喝茶", "mixed")
    assert [s[0] for s in segs] == ["zh", "en", "zh"]
    assert [p for s in segs for p in s[1]] == gpt_sovits_phones("我们去 Boston 喝茶", "mixed")
    f = bert.phone_features(segs)
    n_zh1, n_en = len(segs[0][1]), len(segs[1][1])
    assert f.shape == (1024, sum(len(s[1]) for s in segs))
    assert not f[:, n_zh1:n_zh1 + n_en].any()  # English phones: zeros, as GPT-SoVITS gives non-Chinese text
    assert np.abs(f[:, :n_zh1]).min(axis=0).max() > 0 and f[:, -1].any()
    np.testing.assert_array_equal(f[:, 0], f[:, 1])  # 我's two phones share its vector
    with pytest.raises(BertFeatureError, match="2 characters"):
        bert.char_features(["ab"])  # one word-piece for two characters: vectors would not line up
    with pytest.raises(BertFeatureError, match="phones"):
        assemble([("zh", ["n", "i3", "h"], "你")], [np.zeros((1, 1024))])


def test_bad_folders_are_refused_in_one_line(tmp_path):
    with pytest.raises(BertFeatureError, match="not a folder"):
        BertPhoneFeatures(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertFeatureError, match="no config.json"):
        BertPhoneFeatures(tmp_path / "empty")


def test_shard_verify_tokens_and_trainer_read_the_features(bert_dir, tmp_path, capsys):
    """AISHELL-3-style Mandarin (espeak-ng) -> `audiopipe shard --preset gpt_sovits,eres2net --language zh
    --bert-checkpoint` -> verify -> k-means tokens -> one training step that reads `bert`."""
    from corpora_zh import make_aishell3

    from audiopipe.cli import main as cli
    from audiopipe.index.lengths import LengthIndex
    from audiopipe.reader.loader import make_loader
    from audiopipe.shard.manifest import read_manifest
    from audiopipe.tokens.kmeans import kmeans_tokens

    expected = make_aishell3(tmp_path / "corpus", per_speaker=2)
    shards, tokens = tmp_path / "shards", tmp_path / "tokens"
    assert cli(["shard", "--corpus", str(tmp_path / "corpus"), "--out", str(shards), "--preset",
                "gpt_sovits,eres2net", "--language", "zh", "--bert-checkpoint", str(bert_dir), "--workers", "1",
                "--no-progress"]) in (0, None)
    spec = read_manifest(shards)["features"]["bert"]
    assert (spec["kind"], spec["dtype"], spec["channels"]) == ("bert_phones", "float16", 1024)
    idx = LengthIndex.open(shards)
    assert len(idx) == len(expected) and (idx.frames("bert") == idx.frames("phones")).all()
    assert cli(["verify", str(shards)]) in (0, None)
    loader = make_loader(str(shards), ["phones", "bert"], max_frames=10_000, shuffle=False)
    b = next(iter(loader))
    bert = BertPhoneFeatures(bert_dir)
    for i, text in enumerate(b["text"]):  # the stored features are those of the row's own transcript
        row = b["bert"][i, :, :int(b["bert_lengths"][i])].numpy()
        # the shard batched several lines with padding: equal up to float16's last bit
        np.testing.assert_allclose(row.astype(np.float32), bert.phone_features(gpt_sovits_segments(text, "zh")
                                                                               ).astype(np.float32),
                                   rtol=2e-3, atol=2e-3)
        assert np.abs(row).max() > 0
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kmeans_tokens(shards, tokens, k=16, steps=10, batch_size=256)
    finally:
        torch.set_num_threads(n)
    assert read_manifest(tokens)["features"]["bert"] == spec
    tidx = LengthIndex.open(tokens)
    assert (tidx.frames("bert") == tidx.frames("phones")).all()
    sys.path.insert(0, str(REPO / "trainers"))
    from train_gpt_sovits import main as train_main

    capsys.readouterr()
    train_main(["--shards", str(tokens), "--config", "tiny", "--out", str(tmp_path / "run"), "--max-steps", "1",
                "--batch-frames", "2000", "--prefetch", "0", "--min-ps-ratio", "0"])
    assert "BERT features: yes" in capsys.readouterr().out


def test_shard_refuses_bert_without_gpt_sovits_phones(bert_dir, tmp_path, capsys):
    from audiopipe.cli import main as cli

    (tmp_path / "c").mkdir()
    base = ["shard", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "o"), "--bert-checkpoint"]
    assert cli([*base, str(bert_dir), "--preset", "gpt_sovits"]) == 2  # --language en: ARPAbet ids
    assert "needs a preset with phones (gpt_sovits) and a language other than en (zh, mixed or auto)" in capsys.readouterr().err
    assert cli([*base, str(tmp_path / "nope"), "--preset", "gpt_sovits", "--language", "zh"]) == 2
    assert "BERT checkpoint folder not found" in capsys.readouterr().err
