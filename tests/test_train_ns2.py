"""NS2 trainer: MAS against a brute-force search, the model's shapes, masks and loss terms, the prompt/target
split, and a real 2-process torchrun on ns2 shards made here, resumed bit-exactly from a checkpoint."""

from __future__ import annotations

import dataclasses

import itertools
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

from audiopipe.presets import PRESETS
from audiopipe.shard.job import CodecSettings
from launch import run_group
from mas import mas_durations, maximum_path
from shard_helpers import shard
from train_ns2 import (
    CONFIGS,
    LOSS_TERMS,
    NaturalSpeech2,
    PromptSplit,
    split_at,
    usable_subset,
)

# ----------------------------------------------------------------------------- monotonic alignment search


def brute_force(value: np.ndarray) -> tuple[float, list[int]]:
    """Best score and durations over every way to cut T frames into P non-empty consecutive runs."""
    p, t = value.shape
    best, best_d = -np.inf, None
    for cuts in itertools.combinations(range(1, t), p - 1):
        bounds = (0, *cuts, t)
        score = sum(value[i, bounds[i]:bounds[i + 1]].sum() for i in range(p))
        if score > best:
            best, best_d = score, [bounds[i + 1] - bounds[i] for i in range(p)]
    return best, best_d


def check_path(path: np.ndarray, p: int, t: int) -> None:
    assert (path[:p, :t].sum(0) == 1).all(), "every frame belongs to exactly one phone"
    assert (path[:p, :t].sum(1) >= 1).all(), "every phone gets at least one frame"
    owner = path[:p, :t].argmax(0)
    assert owner[0] == 0 and owner[-1] == p - 1
    assert set(np.diff(owner).tolist()) <= {0, 1}, "monotonic, one phone at a time"
    assert path[p:].sum() == 0 and path[:, t:].sum() == 0, "nothing outside the lengths"


def test_mas_finds_the_brute_force_optimum():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = int(rng.integers(1, 5))
        t = int(rng.integers(p, 9))
        v = rng.standard_normal((p, t))
        path = maximum_path(v[None], [p], [t])[0]
        check_path(path, p, t)
        best, durations = brute_force(v)
        assert (v * path).sum() == pytest.approx(best, abs=1e-9)
        assert path.sum(1).tolist() == durations  # continuous scores: the optimum is unique


def test_mas_batch_ignores_padding_and_matches_single_items():
    rng = np.random.default_rng(1)
    p_lens, t_lens = np.array([3, 5, 1, 4]), np.array([7, 5, 4, 12])
    v = rng.standard_normal((4, 5, 12))
    noisy = v.copy()
    for b in range(4):
        noisy[b, p_lens[b]:] = np.nan  # padding may hold anything
        noisy[b, :, t_lens[b]:] = -np.inf
    batch = maximum_path(noisy, p_lens, t_lens)
    for b in range(4):
        p, t = p_lens[b], t_lens[b]
        check_path(batch[b], p, t)
        single = maximum_path(v[b:b + 1, :p, :t], [p], [t])[0]
        assert np.array_equal(batch[b, :p, :t], single)
    assert batch[1].sum(1).tolist() == [1] * 5  # T == P: one frame each


def test_mas_errors():
    v = np.zeros((1, 4, 3))
    with pytest.raises(ValueError, match="frames >= phones"):
        maximum_path(v, [4], [3])
    bad = np.zeros((1, 2, 3))
    bad[0, 1, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        maximum_path(bad, [2], [3])
    with pytest.raises(ValueError, match="one entry per batch item"):
        maximum_path(np.zeros((2, 2, 3)), [2], [3, 3])


def test_mas_torch_front_end():
    logp = torch.randn(2, 4, 9)
    pm = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    fm = torch.arange(9)[None] < torch.tensor([[6], [9]])
    path, dur = mas_durations(logp, pm, fm)
    assert path.shape == (2, 4, 9) and path.dtype == logp.dtype
    assert dur.tolist()[0][3] == 0 and dur.sum(1).tolist() == [6, 9]


# ----------------------------------------------------------------------------- batches and the model


def make_batch(lengths=(40, 29), n_phones=(9, 6), seed=0) -> dict:
    """A collated-looking batch (as PadCollator gives it): random codes, f0 > 0, phone ids, zero padding."""
    g = torch.Generator().manual_seed(seed)
    b, t, p = len(lengths), max(lengths), max(n_phones)
    lens, plens = torch.tensor(lengths), torch.tensor(n_phones)
    fmask = torch.arange(t)[None] < lens[:, None]
    pmask = torch.arange(p)[None] < plens[:, None]
    codes = torch.randint(0, 1024, (b, 16, t), generator=g).to(torch.int16) * fmask[:, None]
    f0 = (80 + 150 * torch.rand(b, t, generator=g)) * fmask
    phones = torch.randint(8, 99, (b, p), generator=g).to(torch.int16) * pmask
    return {"codes": codes, "codes_lengths": lens, "codes_mask": fmask, "f0": f0, "f0_lengths": lens,
            "f0_mask": fmask, "phones": phones, "phones_lengths": plens, "phones_mask": pmask,
            "padding_ratio": {"codes": 0.0}, "id": [f"u{i}" for i in range(b)], "index": list(range(seed, seed + b))}


MODEL_KEYS = ("codes", "codes_mask", "phones", "phones_mask", "f0", "prompt_codes", "prompt_mask",
              "prompt_lengths", "target_codes", "target_mask", "target_f0")


def model_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in MODEL_KEYS}


def test_prompt_split_is_a_prefix_and_the_rest():
    batch = make_batch()
    codes = batch["codes"].clone()
    out = PromptSplit(0.1, 0.5, seed=3)(dict(batch))
    tp, tt = out["prompt_lengths"], out["target_lengths"]
    assert (tp + tt == batch["codes_lengths"]).all() and (tp >= 1).all() and (tt >= 1).all()
    assert ((tp >= (0.1 * batch["codes_lengths"]).floor()) & (tp <= 0.5 * batch["codes_lengths"])).all()
    for i in range(2):
        whole = torch.cat([out["prompt_codes"][i, :, :tp[i]], out["target_codes"][i, :, :tt[i]]], dim=1)
        assert torch.equal(whole, codes[i, :, :batch["codes_lengths"][i]].long())
        assert torch.equal(out["target_f0"][i, :tt[i]], batch["f0"][i, tp[i]:batch["codes_lengths"][i]])
    assert (out["target_f0"] > 0).all(), "padding must be log-safe"
    assert out["prompt_mask"].sum(1).tolist() == tp.tolist() and out["target_mask"].sum(1).tolist() == tt.tolist()
    # Its own memory: the collated batch sits in a ring buffer that the next batch overwrites.
    batch["codes"].zero_()
    assert torch.equal(torch.cat([out["prompt_codes"][0, :, :tp[0]], out["target_codes"][0, :, :tt[0]]], 1),
                       codes[0, :, :batch["codes_lengths"][0]].long())
    again = PromptSplit(0.1, 0.5, seed=3)(make_batch())
    assert torch.equal(again["prompt_lengths"], tp), "a pure function of (seed, utterance indices)"
    clone = pickle.loads(pickle.dumps(PromptSplit(0.2, 0.3, seed=5)))  # DataLoader workers get a pickled copy
    assert (clone.min_frac, clone.max_frac, clone.seed) == (0.2, 0.3, 5)


def test_prompt_split_refuses_unusable_utterances():
    with pytest.raises(ValueError, match="'u1' has 1 codec frame"):
        PromptSplit()(make_batch(lengths=(10, 1), n_phones=(3, 1)))
    with pytest.raises(ValueError, match="'u0' has 5 frames for 9 phones"):
        PromptSplit()(make_batch(lengths=(5, 8), n_phones=(9, 3)))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        PromptSplit(vocab_size=50)(make_batch())
    with pytest.raises(ValueError, match="min_frac"):
        PromptSplit(0.6, 0.5)


def test_code_accuracy_counts_the_greedy_residual_decode():
    """code_acc is the share of (frame, codebook) indices the residual decode of the predicted latent recovers,
    over real frames only. Orthonormal codebook rows make the answer known: a latent of the right codes decodes
    to all of them, one with codebook 1 shifted to half, one with every code shifted to none."""
    cfg = dataclasses.replace(CONFIGS["tiny"], n_codebooks=2, codebook_size=4)
    model = NaturalSpeech2(cfg)
    with torch.no_grad():
        model.code_emb.copy_(torch.eye(cfg.latent_dim)[:8].reshape(2, 4, -1))
    codes = torch.randint(0, 4, (2, 2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(10)[None] < torch.tensor([10, 7])[:, None]
    wrong_pad = codes.clone()
    wrong_pad[1, :, 7:] = (wrong_pad[1, :, 7:] + 1) % 4  # padded frames: never counted
    half = torch.stack([codes[:, 0], (codes[:, 1] + 1) % 4], 1)
    for latent_of, acc in ((wrong_pad, 1.0), (half, 0.5), ((codes + 1) % 4, 0.0)):
        ce, got = model.code_ce(model.latent(latent_of), codes, mask)
        assert got.item() == acc
    assert model.code_ce(model.latent(codes), codes, mask)[0].item() < 1e-3 < ce.item()


def test_forward_backward_shapes_and_every_loss_term():
    torch.manual_seed(0)
    cfg = CONFIGS["tiny"]
    model = NaturalSpeech2(cfg)
    batch = PromptSplit(seed=0)(make_batch())
    out = model(**model_inputs(batch))
    b, tt, p = 2, batch["target_mask"].shape[1], batch["phones"].shape[1]
    assert out["x0_pred"].shape == (b, cfg.latent_dim, tt)
    assert out["dur_log"].shape == (b, p) and out["pitch_log"].shape == (b, tt)
    assert out["durations"].sum(1).tolist() == batch["codes_lengths"].tolist()
    assert ((out["durations"] >= 1) == batch["phones_mask"]).all(), "MAS: every real phone gets >= 1 frame"
    for k in LOSS_TERMS:
        assert torch.isfinite(out[k]) and out[k].item() > 0, k
    total = sum(w * out[k] for k, w in zip(LOSS_TERMS, (1, 1, 1, cfg.noise_loss_weight, cfg.ce_loss_weight,
                                                           cfg.align_loss_weight)))
    assert out["loss"].item() == pytest.approx(total.item(), rel=1e-6)
    out["loss"].backward()
    missing = [n for n, prm in model.named_parameters() if prm.grad is None]
    assert not missing, f"parameters without gradient (DDP would fail): {missing}"
    assert all(torch.isfinite(prm.grad).all() for prm in model.parameters())
    # The latent tables learn (prompt path and cross-entropy), the diffusion target does not pull on them.
    assert model.code_emb.grad.abs().sum() > 0 and model.align_proj.weight.grad.abs().sum() > 0


def test_padding_does_not_change_real_outputs():
    torch.manual_seed(0)
    cfg = CONFIGS["tiny"]
    model = NaturalSpeech2(cfg).eval()
    pair = split_at(make_batch(lengths=(30, 44), n_phones=(7, 10), seed=4), torch.tensor([9, 15]))
    one = make_batch(lengths=(30,), n_phones=(7,), seed=4)
    for k in ("codes", "f0", "phones"):  # the same first utterance, without its neighbour's padding
        one[k] = pair[k][:1, ..., :one[k].shape[-1]].clone()
    one = split_at(one, torch.tensor([9]))
    t = torch.tensor([0.3, 0.7])
    noise = torch.randn(2, cfg.latent_dim, pair["target_mask"].shape[1])
    with torch.no_grad():
        a = model(**model_inputs(pair), t=t, noise=noise)
        s = model(**model_inputs(one), t=t[:1], noise=noise[:1, :, :one["target_mask"].shape[1]])
    n_t, n_p = 21, 7
    assert torch.equal(a["durations"][0, :n_p], s["durations"][0])
    torch.testing.assert_close(a["dur_log"][0, :n_p], s["dur_log"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a["pitch_log"][0, :n_t], s["pitch_log"][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a["x0_pred"][0, :, :n_t], s["x0_pred"][0], atol=1e-5, rtol=1e-5)


def test_mfa_durations_replace_mas_item_by_item():
    torch.manual_seed(0)
    model = NaturalSpeech2(CONFIGS["tiny"]).eval()
    batch = make_batch(lengths=(40, 29), n_phones=(9, 6))
    # Item 0 has MFA durations (a zero-frame phone is allowed there); item 1 has none, as collate pads it.
    batch["durations"] = torch.tensor([[4, 4, 0, 4, 8, 5, 5, 5, 5], [0] * 9], dtype=torch.int32)
    batch["durations_lengths"] = torch.tensor([9, 0])
    batch = PromptSplit(seed=0)(batch)
    with torch.no_grad():
        out = model(**model_inputs(batch), durations=batch["durations"], durations_lengths=batch["durations_lengths"])
    assert out["durations"][0].tolist() == [4, 4, 0, 4, 8, 5, 5, 5, 5]
    assert out["durations"][1, :6].min() >= 1 and out["durations"][1].sum() == 29  # MAS
    assert torch.isfinite(out["loss"])
    bad = dict(batch, durations_lengths=torch.tensor([8, 0]))
    with pytest.raises(ValueError, match="'u0': 8 durations"):
        PromptSplit()(bad)


# ----------------------------------------------------------------------------- torchrun on real shards


@pytest.fixture(scope="module")
def ns2_shards(espeak_corpus, tmp_path_factory):
    """The ns2 preset on 4 espeak utterances (2 speakers), EnCodec with random init (no weights offline)."""
    corpus = tmp_path_factory.mktemp("ns2_corpus")
    for u in espeak_corpus.utterances:
        spk, utt = u.id.split("/")
        if spk in ("spk0", "spk1") and utt in ("utt000", "utt001"):
            (corpus / spk).mkdir(exist_ok=True)
            for ext in (".wav", ".txt"):
                shutil.copy(espeak_corpus.root / spk / (utt + ext), corpus / spk / (utt + ext))
    out = tmp_path_factory.mktemp("ns2_shards")
    p = PRESETS["ns2"]
    summary = shard(corpus, out, list(p.features), codec=CodecSettings(random_init=True), trim=p.trim,
                    phones=p.phones, align_to=p.align_to, presets=("ns2",))
    assert summary.written == 4
    return out


def torchrun(shards: Path, out: Path, *extra: str):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "trainers" / "train_ns2.py"), "--shards", str(shards), "--config", "tiny", "--out", str(out),
           "--max-steps", "4", "--batch-frames", "500", "--log-every", "1", "--ckpt-every", "2", "--lr", "1e-3",
           "--warmup-steps", "1", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = run_group(cmd, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def straight_run(ns2_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("ns2_run")
    return out, torchrun(ns2_shards, out)


def test_torchrun_two_ranks_logs_every_term(ns2_shards, straight_run):
    out, r = straight_run
    assert "monotonic alignment search" in r.stdout
    assert len(usable_subset(ns2_shards)[0]) == 4
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs] == [1, 2, 3, 4]
    for rec in recs:
        assert rec["world"] == 2
        for k in (*LOSS_TERMS, "loss", "code_acc"):
            assert np.isfinite(rec[k]), k
    assert sorted(p.name for p in out.glob("ckpt-*.pt")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]


def test_resume_is_exact(ns2_shards, straight_run, tmp_path):
    out, _ = straight_run
    shutil.copy(out / "ckpt-00000002.pt", tmp_path / "ckpt-00000002.pt")
    r = torchrun(ns2_shards, tmp_path, "--resume")
    assert "resumed from ckpt-00000002.pt at step 2" in r.stdout
    full = torch.load(out / "ckpt-00000004.pt", weights_only=True)["model"]
    half = torch.load(out / "ckpt-00000002.pt", weights_only=True)["model"]
    resumed = torch.load(tmp_path / "ckpt-00000004.pt", weights_only=True)["model"]
    assert any(not torch.equal(full[k], half[k]) for k in full), "steps 3-4 must change the weights"
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    straight = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()][2:]
    again = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in again] == [x["loss"] for x in straight]
