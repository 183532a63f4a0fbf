"""GPT-SoVITS stage 1 trainer: the model's masks and targets, and real torchrun runs on token shards made here
(2 processes, exact resume from a checkpoint, data-wait logged)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parent.parent

from train_gpt_sovits import (
    CONFIGS,
    ModelConfig,
    Text2Semantic,
    attention_mask,
    main,
    make_loss_fn,
    next_token_targets,
    top_k_accuracy,
)

from corpora import make_asterisk_corpus
from shard_helpers import shard

TORCHRUN = Path(sys.executable).parent / "torchrun"
TINY = CONFIGS["tiny"]


def model(seed: int = 0, c: ModelConfig = TINY) -> Text2Semantic:
    torch.manual_seed(seed)
    return Text2Semantic(c).eval()  # eval: dropout off, so outputs are comparable


def batch(seed: int, phone_lens: list[int], token_lens: list[int], c: ModelConfig = TINY):
    g = torch.Generator().manual_seed(seed)
    b, p, t = len(phone_lens), max(phone_lens), max(token_lens)
    phones = torch.randint(1, 99, (b, p), generator=g)
    tokens = torch.randint(0, c.eos, (b, t), generator=g)
    return phones, torch.tensor(phone_lens), tokens, torch.tensor(token_lens)


# ----------------------------------------------------------------------------- model

def test_shapes_targets_and_reference_sizes():
    m = model()
    phones, pl, tokens, tl = batch(0, [7, 4], [9, 5])
    logits, targets = m(phones, pl, tokens, tl)
    assert logits.shape == (2, 9, TINY.vocab_size) and targets.shape == (2, 9)
    assert targets[0, :8].tolist() == tokens[0, 1:].tolist() and targets[0, 8] == TINY.eos
    assert targets[1, :4].tolist() == tokens[1, 1:5].tolist() and targets[1, 4] == TINY.eos
    assert (targets[1, 5:] == -100).all()  # padding is never a target
    d = CONFIGS["default"]  # GPT-SoVITS configs/s1longer.yaml
    assert (d.dim, d.heads, d.layers, d.ff, d.vocab_size, d.eos) == (512, 16, 24, 2048, 1025, 1024)


def test_future_tokens_do_not_change_past_logits():
    m = model()
    phones, pl, tokens, tl = batch(1, [6], [12])
    with torch.no_grad():
        ref, _ = m(phones, pl, tokens, tl)
        changed = tokens.clone()
        changed[0, 7:] = (changed[0, 7:] + 1) % TINY.eos
        out, _ = m(phones, pl, changed, tl)
    # Logit t predicts token t+1 from tokens <= t: positions < 7 are untouched, position 7 sees the change.
    # (If phones could attend to tokens, the change would leak into every position through the phones.)
    torch.testing.assert_close(out[0, :7], ref[0, :7], rtol=0, atol=1e-6)
    assert (out[0, 7] - ref[0, 7]).abs().max() > 1e-3


def test_phones_condition_every_token():
    m = model()
    phones, pl, tokens, tl = batch(2, [6], [5])
    with torch.no_grad():
        ref, _ = m(phones, pl, tokens, tl)
        phones2 = phones.clone()
        phones2[0, 5] = (phones2[0, 5] % 98) + 1
        out, _ = m(phones2, pl, tokens, tl)
    assert ((out[0] - ref[0]).abs().amax(-1) > 1e-4).all()


def test_padding_does_not_change_real_outputs():
    m = model()
    phones, pl, tokens, tl = batch(3, [5, 9], [6, 11])  # item 0 is padded in both phones and tokens
    with torch.no_grad():
        alone, _ = m(phones[:1, :5], pl[:1], tokens[:1, :6], tl[:1])
        phones[0, 5:] = 77  # garbage in the padding
        tokens[0, 6:] = 3
        both, _ = m(phones, pl, tokens, tl)
    torch.testing.assert_close(both[0, :6], alone[0], rtol=0, atol=1e-5)


def test_mask_and_targets_by_hand():
    m = attention_mask(torch.tensor([2]), torch.tensor([2]), tx=3, ty=3)[0, 0].int()
    # rows: queries p0 p1 p2(pad) t0 t1 t2(pad); columns: keys in the same order
    assert m.tolist() == [[1, 1, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0],
                          [1, 1, 1, 0, 0, 0],  # a padded query sees itself only besides real phones
                          [1, 1, 0, 1, 0, 0],
                          [1, 1, 0, 1, 1, 0],
                          [1, 1, 0, 1, 1, 1]]
    t = next_token_targets(torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([3, 1]), eos=10)
    assert t.tolist() == [[6, 7, 10], [10, -100, -100]]


def test_loss_and_top_k_accuracy():
    logits = torch.tensor([[[0.0, 3, 2, 1, 0], [5, 0, 0, 0, 1], [0, 0, 0, 0, 9]]])
    # targets 3 (rank 3 of 5: in top-3), 4 (rank 2: in), 4 = EOS (ignored), then padding
    targets = torch.tensor([[3, 4, 4]])
    assert top_k_accuracy(logits, targets, k=3, eos=4) == 1.0
    assert top_k_accuracy(logits, targets, k=1, eos=4) == 0.0
    assert top_k_accuracy(logits, torch.tensor([[1, -100, 4]]), k=1, eos=4) == 1.0
    m = model()
    phones, pl, tokens, tl = batch(4, [5, 8], [10, 7])
    b = {"phones": phones.short(), "phones_lengths": pl, "semantic": tokens.short(), "semantic_lengths": tl,
         "index": [3, 8]}
    loss, logs = make_loss_fn(TINY)(m, b)
    # An untrained model is close to uniform over the vocabulary: cross-entropy near log(1025).
    assert abs(float(loss.detach()) - np.log(TINY.vocab_size)) < 1.0
    # The logged accuracy is top-3 over this batch's own logits and targets (recomputed in eval mode, where the
    # forward is deterministic); an untrained model is at chance, about 3 / 1025.
    m.eval()
    _, logs_eval = make_loss_fn(TINY)(m, b)
    with torch.no_grad():
        logits, targets = m(b["phones"].long(), b["phones_lengths"], b["semantic"].long(), b["semantic_lengths"])
    assert float(logs_eval["top3_acc"]) == float(top_k_accuracy(logits, targets, k=3, eos=TINY.eos))
    assert float(logs["top3_acc"]) < 0.1
    m.train()
    loss.backward()
    assert all(p.grad is not None for p in m.parameters())  # every parameter, positions' alpha included


# ----------------------------------------------------------------------------- real runs

@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    """12 real prompts -> shards (pcm, fbank, phones) -> 32 k-means units: a tiny but real stage-1 corpus."""
    from audiopipe.tokens.kmeans import kmeans_tokens

    corpus = tmp_path_factory.mktemp("ast12")
    make_asterisk_corpus(corpus, n=12)
    shards = tmp_path_factory.mktemp("ast12_shards")
    shard(corpus, shards, [("pcm", {"sample_rate": 16000}), ("kaldi_fbank", {})], phones=True)
    out = tmp_path_factory.mktemp("ast12_tokens")
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kmeans_tokens(shards, out, k=32, steps=30, batch_size=512)
    finally:
        torch.set_num_threads(n)
    return shards, out


def torchrun(token_dir: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(REPO / "trainers" / "train_gpt_sovits.py"),
           "--shards", str(token_dir), "--config", "tiny", "--out", str(out), "--batch-frames", "1500",
           "--lr", "3e-3", "--warmup-steps", "1", "--log-every", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def log(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


def test_two_process_run_and_exact_resume(token_dir, tmp_path):
    _, tokens = token_dir
    straight = tmp_path / "straight"
    r = torchrun(tokens, straight, "--max-steps", "4", "--ckpt-every", "2")
    assert "pass the filters; tokens kmeans-fbank-32 at 25/s, codebook 32" in r.stdout
    recs = log(straight)
    assert [x["step"] for x in recs] == [1, 2, 3, 4]
    assert all(x["world"] == 2 and x["data_wait_share"] == pytest.approx(x["data_wait"] / x["step_time"]) and "top3_acc" in x for x in recs)
    assert recs[-1]["loss"] < recs[0]["loss"]  # it learns, even in 4 steps

    # Resume: start a second run from the straight run's step-2 checkpoint; steps 3-4 must be bit-identical.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(straight / "ckpt-00000002.pt", resumed)
    r = torchrun(tokens, resumed, "--max-steps", "4", "--ckpt-every", "2", "--resume")
    assert "resumed from ckpt-00000002.pt" in r.stdout
    a = torch.load(straight / "ckpt-00000004.pt", weights_only=True)
    b = torch.load(resumed / "ckpt-00000004.pt", weights_only=True)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert [x["loss"] for x in log(resumed)] == [x["loss"] for x in recs[2:]]


def test_refuses_a_folder_without_tokens(token_dir, tmp_path):
    shards, _ = token_dir
    with pytest.raises(SystemExit, match="no 'semantic' tokens.*audiopipe tokens"):
        main(["--shards", str(shards), "--config", "tiny", "--out", str(tmp_path / "x"), "--max-steps", "1"])
