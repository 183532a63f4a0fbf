"""NS2 trainer: MAS against a brute-force search, the model's shapes, masks and loss terms, both prompt rules,
learning (one batch overfits), EnCodec's decoder on the model's latent, and real 2-process torchruns on ns2
shards made here: resumed bit-exactly, and started from an Amphion checkpoint folder."""

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

from audiopipe.checkpoints.ns2 import from_codec, write_upstream
from audiopipe.features.codec import quantizer_state
from audiopipe.presets import PRESETS
from audiopipe.shard.job import CodecSettings
from launch import run_group
from mas import mas_durations, maximum_path
from shard_helpers import shard
from train_ns2 import (
    AMPHION_FORWARD,
    CONFIGS,
    LEGACY_RULES,
    LOSS_TERMS,
    MODEL_KEYS,
    NaturalSpeech2,
    PromptSplit,
    codec_quantizer,
    amphion_lr,
    main,
    resolve_modes,
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


def random_codec(layers=32, size=1024, dim=128, seed=0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(layers, size, dim, generator=g) * 0.3
    return {"quantizer.embed": embed, "quantizer.embed_avg": embed.clone(),
            "quantizer.cluster_size": torch.ones(layers, size), "quantizer.inited": torch.ones(layers, 1)}


def tiny(cfg=None, seed=0) -> NaturalSpeech2:
    """The tiny model with random frozen codebooks (the trainer takes them from the shards' codec)."""
    torch.manual_seed(seed)
    cfg = cfg or CONFIGS["tiny"]
    model = NaturalSpeech2(cfg)
    model.set_codec(random_codec(cfg.codec_layers, cfg.codebook_size, cfg.latent_dim))
    return model


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


def model_inputs(batch: dict) -> dict:
    return {k: batch[k] for k in MODEL_KEYS if k in batch}


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


def test_phones_rule_draws_amphions_prompt_sizes():
    """Amphion: k = randint(int(0.1 n), int(0.5 n) + 1), at least 1; MFA rows whose k would give the prompt no
    frame (a 0-frame first phone) get a k that gives it one."""
    split = PromptSplit(seed=1, rule="phones")
    seen = set()
    for seed in range(40):
        out = split(make_batch(lengths=(60, 40), n_phones=(20, 7), seed=seed))
        k = out["prompt_phones"].tolist()
        assert 2 <= k[0] <= 10 and 1 <= k[1] <= 3
        seen.add(k[0])
        assert "prompt_codes" not in out, "the model cuts, once the durations are known"
    assert seen == set(range(2, 11)), "every size Amphion draws"
    batch = make_batch(lengths=(10, 12), n_phones=(3, 3))
    batch["durations"] = torch.tensor([[0, 0, 10], [0, 5, 7]], dtype=torch.int32)
    batch["durations_lengths"] = torch.tensor([3, 3])
    with pytest.raises(ValueError, match="'u0': its MFA durations leave no frame"):
        split(batch)
    batch["durations"][0] = torch.tensor([0, 4, 6])
    assert split(batch)["prompt_phones"].tolist() == [1, 1]  # 0-frame first phone: Amphion starts at phone 1


def test_prompt_split_refuses_unusable_utterances():
    with pytest.raises(ValueError, match="'u1' has 1 codec frame"):
        PromptSplit()(make_batch(lengths=(10, 1), n_phones=(3, 1)))
    with pytest.raises(ValueError, match="'u0' has 5 frames for 9 phones"):
        PromptSplit()(make_batch(lengths=(5, 8), n_phones=(9, 3)))
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        PromptSplit(vocab_size=50)(make_batch())
    with pytest.raises(ValueError, match="min_frac"):
        PromptSplit(0.6, 0.5)
    with pytest.raises(ValueError, match="'u1' has 1 phone"):
        PromptSplit(rule="phones")(make_batch(lengths=(10, 8), n_phones=(3, 1)))


def test_code_accuracy_counts_the_greedy_residual_decode():
    """code_acc is the share of (frame, codebook) indices the residual decode of the predicted latent recovers,
    over real frames only. Orthogonal codebook rows (norm 6) make the answer known: a latent of the right codes decodes
    to all of them, one with codebook 1 shifted to half, one with every code shifted to none."""
    cfg = dataclasses.replace(CONFIGS["tiny"], n_codebooks=2, codec_layers=2, codebook_size=4)
    model = NaturalSpeech2(cfg)
    with torch.no_grad():
        model.quantizer.embed.copy_(6 * torch.eye(cfg.latent_dim)[:8].reshape(2, 4, -1))
    codes = torch.randint(0, 4, (2, 2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.arange(10)[None] < torch.tensor([10, 7])[:, None]
    wrong_pad = codes.clone()
    wrong_pad[1, :, 7:] = (wrong_pad[1, :, 7:] + 1) % 4  # padded frames: never counted
    half = torch.stack([codes[:, 0], (codes[:, 1] + 1) % 4], 1)
    for latent_of, acc in ((wrong_pad, 1.0), (half, 0.5), ((codes + 1) % 4, 0.0)):
        ce, got = model.code_ce(model.latent(latent_of), codes, mask)
        assert got.item() == acc
    assert model.code_ce(model.latent(codes), codes, mask)[0].item() < 1e-3 < ce.item()
    assert torch.equal(model.requantize(model.latent(codes)), codes), "orthogonal rows: the labels come back"


@pytest.mark.parametrize("rule", ["frames", "phones"])
def test_forward_backward_shapes_and_every_loss_term(rule):
    cfg = dataclasses.replace(CONFIGS["tiny"], prompt_rule=rule)
    model = tiny(cfg)
    batch = PromptSplit(seed=0, rule=rule)(make_batch())
    out = model(**model_inputs(batch))
    b, p = 2, batch["phones"].shape[1]
    if rule == "frames":
        tt = batch["target_mask"].shape[1]
        assert out["x0_pred"].shape == (b, cfg.latent_dim, tt) and out["pitch_log"].shape == (b, tt)
        assert out["dur_log"].shape == (b, p)
        assert out["durations"].sum(1).tolist() == batch["codes_lengths"].tolist()
        assert ((out["durations"] >= 1) == batch["phones_mask"]).all(), "MAS: every real phone gets >= 1 frame"
    else:  # the target: the phones after the prompt's and their frames
        k = batch["prompt_phones"]
        assert (out["durations"] > 0).sum(1).tolist() == (batch["phones_lengths"] - k).tolist()
        assert out["x0_pred"].shape[2] == int(out["durations"].sum(1).max())
    for k in LOSS_TERMS:
        assert torch.isfinite(out[k]) and out[k].item() > 0, k
    total = sum(w * out[k] for k, w in zip(LOSS_TERMS, (1, 1, 1, cfg.noise_loss_weight, cfg.ce_loss_weight,
                                                           cfg.align_loss_weight)))
    assert out["loss"].item() == pytest.approx(total.item(), rel=1e-6)
    out["loss"].backward()
    missing = [n for n, prm in model.named_parameters() if prm.grad is None]
    assert not missing, f"parameters without gradient (DDP would fail): {missing}"
    assert all(torch.isfinite(prm.grad).all() for prm in model.parameters())
    assert model.align_proj.weight.grad.abs().sum() > 0
    assert not any(n.startswith("quantizer.") for n, _ in model.named_parameters()), "the codec stays frozen"


def test_phones_rule_with_mfa_durations_is_amphions_cut():
    """With MFA durations the phones rule is Amphion's get_target_and_reference: prompt = the first k phones'
    frames, target = the other phones and their frames, and on those the model runs Amphion's forward."""
    model = tiny(dataclasses.replace(CONFIGS["tiny"], prompt_rule="phones", **AMPHION_FORWARD)).eval()
    batch = make_batch(lengths=(40, 29), n_phones=(9, 6))
    batch["durations"] = torch.tensor([[4, 4, 0, 4, 3, 5, 5, 5, 10], [5, 5, 5, 5, 5, 4, 0, 0, 0]])
    batch["durations_lengths"] = torch.tensor([9, 6])
    batch = PromptSplit(seed=2, rule="phones")(batch)
    k, n_ph, t_len = batch["prompt_phones"].tolist(), [9, 6], [40, 29]
    fe = [int(batch["durations"][i, :k[i]].sum()) for i in range(2)]
    tt = [t_len[i] - fe[i] for i in range(2)]
    pn = [n_ph[i] - k[i] for i in range(2)]
    n = max(tt)
    t, noise = torch.tensor([0.3, 0.6]), torch.randn(2, 128, n)

    def cut(x, a, b, width, value=0):
        return torch.stack([F_pad(x[i, ..., a[i]:b[i]], width, value) for i in range(2)])

    with torch.no_grad():
        out = model(**model_inputs(batch), t=t, noise=noise)
        end = [fe[i] + tt[i] for i in range(2)]
        ph_end = [k[i] + pn[i] for i in range(2)]
        direct = model.amphion_forward(
            code=cut(batch["codes"].long(), fe, end, n), pitch=cut(batch["f0"], fe, end, n, 1.0),
            duration=cut(batch["durations"].long(), k, ph_end, max(pn)),
            phone_id=cut(batch["phones"].long(), k, ph_end, max(pn)),
            ref_code=cut(batch["codes"].long(), [0, 0], fe, max(fe)),
            phone_mask=torch.arange(max(pn))[None] < torch.tensor(pn)[:, None],
            mask=torch.arange(n)[None] < torch.tensor(tt)[:, None],
            ref_mask=torch.arange(max(fe))[None] < torch.tensor(fe)[:, None], t=t, noise=noise)
    assert out["durations"].tolist() == direct["durations"].tolist()
    torch.testing.assert_close(out["x0_pred"], direct["x0_pred"], atol=0, rtol=0)
    assert out["loss"].item() == direct["loss"].item() and out["align"].item() == 0.0


def F_pad(x: torch.Tensor, n: int, value: float = 0) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, n - x.shape[-1]), value=value)


def test_padding_does_not_change_real_outputs():
    """audiopipe's forward (--forward audiopipe) masks padding everywhere; Amphion's, the default, does not (it is
    tested against Amphion's code in test_checkpoint_ns2.py)."""
    pair = split_at(make_batch(lengths=(30, 44), n_phones=(7, 10), seed=4), torch.tensor([9, 15]))
    one = make_batch(lengths=(30,), n_phones=(7,), seed=4)
    for k in ("codes", "f0", "phones"):  # the same first utterance, without its neighbour's padding
        one[k] = pair[k][:1, ..., :one[k].shape[-1]].clone()
    one = split_at(one, torch.tensor([9]))
    t = torch.tensor([0.3, 0.7])
    noise = torch.randn(2, 128, pair["target_mask"].shape[1])
    gaps = {}
    legacy = dataclasses.replace(CONFIGS["tiny"], **LEGACY_RULES)
    for name, cfg in (("audiopipe", legacy), ("amphion", dataclasses.replace(legacy, mask_padding=False))):
        model = tiny(cfg).eval()
        with torch.no_grad():
            model.wavenet.out_proj.weight.normal_(0, 0.1)  # zero at init, which would hide the denoiser
            a = model(**model_inputs(pair), t=t, noise=noise)
            s = model(**model_inputs(one), t=t[:1], noise=noise[:1, :, :one["target_mask"].shape[1]])
        n_t, n_p = 21, 7
        gaps[name] = max(float((a[k][0, ..., :n] - s[k][0]).abs().max())
                         for k, n in (("x0_pred", n_t), ("dur_log", n_p), ("pitch_log", n_t)))
        if name == "audiopipe":
            assert torch.equal(a["durations"][0, :n_p], s["durations"][0])
            torch.testing.assert_close(a["dur_log"][0, :n_p], s["dur_log"][0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a["pitch_log"][0, :n_t], s["pitch_log"][0], atol=1e-5, rtol=1e-5)
    assert gaps["audiopipe"] < 1e-5 < gaps["amphion"], gaps


def test_mfa_durations_replace_mas_item_by_item():
    model = tiny(dataclasses.replace(CONFIGS["tiny"], **LEGACY_RULES)).eval()
    batch = make_batch(lengths=(40, 29), n_phones=(9, 6))
    # Item 0 has MFA durations (a zero-frame phone is allowed there); item 1 has none, as collate pads it.
    batch["durations"] = torch.tensor([[4, 4, 0, 4, 8, 5, 5, 5, 5], [0] * 9], dtype=torch.int32)
    batch["durations_lengths"] = torch.tensor([9, 0])
    batch = PromptSplit(seed=0)(batch)
    with torch.no_grad():
        out = model(**model_inputs(batch))
    assert out["durations"][0].tolist() == [4, 4, 0, 4, 8, 5, 5, 5, 5]
    assert out["durations"][1, :6].min() >= 1 and out["durations"][1].sum() == 29  # MAS
    assert torch.isfinite(out["loss"])
    bad = dict(batch, durations_lengths=torch.tensor([8, 0]))
    with pytest.raises(ValueError, match="'u0': 8 durations"):
        PromptSplit()(bad)


@pytest.mark.parametrize("rule", ["frames", "phones"])
def test_overfitting_one_batch_drives_the_loss_down(rule):
    """A learning test: 90 Adam steps on one batch (t and noise drawn anew each step, as in training). The mean
    of the last 8 losses falls below 70 % of the first 8's, and so does the diffusion term (x0) (measured with
    one and two torch threads: 0.57 / 0.44-0.45 of the first with frames, 0.47-0.53 / 0.41-0.42 with phones; at 60
    steps the phones run with one thread was still at 0.79, the float order of one thread against two). Those
    figures are audiopipe's forward's. The test runs the config's default, Amphion's forward, whose diffusion term
    falls less far in 90 steps: to 0.62 of the first with phones and one thread (the suite's), so its bound is
    0.7 for both terms."""
    model = tiny(dataclasses.replace(CONFIGS["tiny"], prompt_rule=rule, enc_dropout=0.0, pred_dropout=0.0))
    batch = PromptSplit(seed=0, rule=rule)(make_batch(lengths=(24, 20), n_phones=(6, 5)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    hist = []
    for _ in range(90):
        out = model(**model_inputs(batch))
        opt.zero_grad()
        out["loss"].backward()
        opt.step()
        hist.append((out["loss"].item(), out["x0"].item()))
    first, last = np.mean(hist[:8], axis=0), np.mean(hist[-8:], axis=0)
    assert last[0] < 0.7 * first[0] and last[1] < 0.7 * first[1], (first, last)


# ----------------------------------------------------------------------------- EnCodec's decoder on our latent


@pytest.fixture(scope="module")
def codec_folder(tmp_path_factory):
    """A save_pretrained EnCodec 24 kHz folder (seeded random weights: no download), as users pass it."""
    from audiopipe.features.codec import _random_init_model

    folder = tmp_path_factory.mktemp("encodec")
    _random_init_model(0).save_pretrained(folder)
    return folder


def test_encodec_decodes_the_models_latent(codec_folder, ns2_shards):
    """The model's latent of a known utterance's codes, through EnCodec's own decoder, is the audio EnCodec makes
    from those codes itself: no renormalisation stands between the model and the codec."""
    from transformers import EncodecModel

    from audiopipe.reader.arrow_dataset import ShardDataset

    codec = EncodecModel.from_pretrained(str(codec_folder), local_files_only=True).eval()
    model = NaturalSpeech2(CONFIGS["tiny"])
    model.set_codec(from_codec(quantizer_state(checkpoint=codec_folder)))
    row = ShardDataset(ns2_shards, ["codes"])[0]
    codes = torch.from_numpy(np.asarray(row["codes"])).long()[None]  # [1, 16, T]
    with torch.no_grad():
        ours = codec.decoder(model.latent(codes))
        theirs = codec.decode(codes[None], [None]).audio_values  # EnCodec's own codes -> audio
        latent_theirs = codec.quantizer.decode(codes.transpose(0, 1))
    assert torch.equal(model.latent(codes), latent_theirs)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    assert ours.shape[-1] == codes.shape[-1] * 320 and ours.abs().max() > 0
    # Shards made with --codec-random-init record the seed: the trainer rebuilds the same quantizer from it.
    seeded = codec_quantizer("random-init:0", "")
    assert all(torch.equal(seeded[k], v) for k, v in from_codec(quantizer_state(checkpoint=codec_folder)).items())


# ----------------------------------------------------------------------------- torchrun on real shards


@pytest.fixture(scope="module")
def ns2_shards(espeak_corpus, codec_folder, tmp_path_factory):
    """The ns2 preset on 4 espeak utterances (2 speakers), EnCodec from a save_pretrained folder."""
    corpus = tmp_path_factory.mktemp("ns2_corpus")
    for u in espeak_corpus.utterances:
        spk, utt = u.id.split("/")
        if spk in ("spk0", "spk1") and utt in ("utt000", "utt001"):
            (corpus / spk).mkdir(exist_ok=True)
            for ext in (".wav", ".txt"):
                shutil.copy(espeak_corpus.root / spk / (utt + ext), corpus / spk / (utt + ext))
    out = tmp_path_factory.mktemp("ns2_shards")
    p = PRESETS["ns2"]
    summary = shard(corpus, out, list(p.features), codec=CodecSettings(checkpoint=str(codec_folder)), trim=p.trim,
                    phones=p.phones, align_to=p.align_to, presets=("ns2",))
    assert summary.written == 4
    return out


def run_args(shards: Path, out: Path, codec: Path | None, *extra: str, steps: int = 4) -> list[str]:
    return ["--shards", str(shards), "--config", "tiny", "--out", str(out), "--max-steps", str(steps),
            "--batch-frames", "500", "--log-every", "1", "--ckpt-every", "2", "--lr", "1e-3", "--warmup-steps", "1",
            *(["--codec-checkpoint", str(codec)] if codec else []), *extra]


def torchrun(shards: Path, out: Path, codec: Path | None, *extra: str, steps: int = 4, expect_rc: int = 0):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "trainers" / "train_ns2.py"), *run_args(shards, out, codec, *extra, steps=steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = run_group(cmd, timeout=300, env=env)
    assert r.returncode == expect_rc, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def straight_run(ns2_shards, codec_folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("ns2_run")
    return out, torchrun(ns2_shards, out, codec_folder)


def test_torchrun_two_ranks_logs_every_term(ns2_shards, straight_run):
    """A run from scratch with no rule flags trains with Amphion's rules, so its export has nothing to refuse."""
    out, r = straight_run
    assert "monotonic alignment search" in r.stdout
    assert ("prompt rule phones, phone table amphion, forward: positions per batch item, padding read (Amphion), "
            "code labels requantized, lr schedule amphion") in r.stdout
    assert "not Amphion's rules" not in r.stdout
    assert len(usable_subset(ns2_shards)[0]) == 4
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs] == [1, 2, 3, 4]
    for rec in recs:
        assert rec["world"] == 2
        for k in (*LOSS_TERMS, "loss", "code_acc"):
            assert np.isfinite(rec[k]), k
    # Amphion's schedule (--lr 1e-3, --warmup-steps 1, 4 steps): LR 0 at the first step, then the cosine to 0
    assert [x["lr"] for x in recs] == pytest.approx([amphion_lr(s, 1e-3, 1, 4) for s in range(4)], abs=1e-12)
    assert recs[0]["lr"] == 0.0 and recs[1]["lr"] == pytest.approx(1e-3)
    assert sorted(p.name for p in out.glob("ckpt-*.pt")) == ["ckpt-00000002.pt", "ckpt-00000004.pt"]
    recorded = json.loads((out / "ns2_config.json").read_text())
    assert {k: recorded[k] for k in LEGACY_RULES} == {k: v for k, v in dataclasses.asdict(CONFIGS["tiny"]).items()
                                                       if k in LEGACY_RULES}
    from audiopipe.checkpoints.ns2 import export_cli

    assert export_cli(out, out.parent / "exported")["notes"] == []  # refused otherwise: nothing differs


def test_resume_is_exact(ns2_shards, straight_run, tmp_path):
    out, _ = straight_run
    shutil.copy(out / "ckpt-00000002.pt", tmp_path / "ckpt-00000002.pt")
    shutil.copy(out / "ns2_config.json", tmp_path / "ns2_config.json")
    r = torchrun(ns2_shards, tmp_path, None, "--resume")  # the codec's quantizer comes with the checkpoint
    assert "resumed from ckpt-00000002.pt at step 2" in r.stdout
    full = torch.load(out / "ckpt-00000004.pt", weights_only=True)["model"]
    half = torch.load(out / "ckpt-00000002.pt", weights_only=True)["model"]
    resumed = torch.load(tmp_path / "ckpt-00000004.pt", weights_only=True)["model"]
    assert any(not torch.equal(full[k], half[k]) for k in full), "steps 3-4 must change the weights"
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    straight = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()][2:]
    again = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in again] == [x["loss"] for x in straight]


def test_rule_flags_and_what_auto_takes():
    """A flag given wins; auto takes a resumed run's record (a field it lacks: audiopipe's rules, the defaults
    before it was recorded), Amphion's for an Amphion --init-from, else the config's."""
    from argparse import Namespace

    auto = Namespace(prompt_rule="auto", phone_table="auto", forward="auto", lr_schedule="auto")
    rules = list(LEGACY_RULES)

    def picked(cfg):
        return {k: getattr(cfg, k) for k in rules}

    tiny_cfg = CONFIGS["tiny"]
    assert picked(resolve_modes(tiny_cfg, auto, False)) == picked(tiny_cfg)
    legacy_cfg = dataclasses.replace(tiny_cfg, **LEGACY_RULES)  # a --config JSON that chose audiopipe's rules
    assert picked(resolve_modes(legacy_cfg, auto, False)) == LEGACY_RULES
    assert picked(resolve_modes(legacy_cfg, auto, True)) == picked(tiny_cfg)  # an Amphion --init-from
    old = {k: v for k, v in dataclasses.asdict(legacy_cfg).items() if k != "lr_schedule"}  # an older record
    assert picked(resolve_modes(tiny_cfg, auto, False, recorded=old)) == LEGACY_RULES
    given = Namespace(prompt_rule="frames", phone_table="auto", forward="audiopipe", lr_schedule="cosine")
    got = picked(resolve_modes(tiny_cfg, given, False))
    assert got == {**picked(tiny_cfg), "prompt_rule": "frames", "positions": "time", "mask_padding": True,
                   "ce_labels": "codes", "lr_schedule": "cosine"}


def test_an_older_run_resumes_with_its_own_rules(ns2_shards, straight_run, tmp_path, capsys):
    """A run started with audiopipe's rules, its ns2_config.json from before the LR schedule was recorded, resumes
    with no rule flags under its own rules (and its record gains the schedule it used); a flag that contradicts
    the record, or a record that is gone, is refused in one line. The rules are read and recorded before any rank
    trains, so the resume runs in this process (a world of one resuming the 2-rank checkpoint): a torchrun would
    add only the launch (~10 s of CPU); the 2-rank resume is test_resume_is_exact's."""
    out, _ = straight_run
    shutil.copy(out / "ckpt-00000002.pt", tmp_path / "ckpt-00000002.pt")
    old = {k: v for k, v in {**json.loads((out / "ns2_config.json").read_text()), **LEGACY_RULES}.items()
           if k != "lr_schedule"}
    (tmp_path / "ns2_config.json").write_text(json.dumps(old))
    base = ["--shards", str(ns2_shards), "--config", "tiny", "--out", str(tmp_path), "--resume"]
    with pytest.raises(SystemExit, match=r"another model config \(\{'positions': \('time', 'batch'\)"):
        main(base + ["--forward", "amphion"])
    capsys.readouterr()
    main(run_args(ns2_shards, tmp_path, None, "--resume", steps=3))
    stdout = capsys.readouterr().out
    assert ("prompt rule frames, phone table audiopipe, forward: positions per time step, padding masked, code "
            "labels codes, lr schedule cosine") in stdout
    assert "not Amphion's rules" in stdout and "resumed from ckpt-00000002.pt at step 2" in stdout
    assert json.loads((tmp_path / "ns2_config.json").read_text()) == {**old, "lr_schedule": "cosine"}
    rec = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()][-1]
    assert rec["step"] == 3 and np.isfinite(rec["loss"])
    (tmp_path / "ns2_config.json").unlink()
    with pytest.raises(SystemExit, match="ns2_config.json is missing, so the rules this run was started with"):
        main(base)


def test_init_from_an_amphion_checkpoint_folder_trains_in_amphions_mode(ns2_shards, codec_folder, tmp_path):
    """An Amphion checkpoint folder (Amphion's tensor names and layout, the shards' codec in it) starts a 2-rank
    run: the auto choices become Amphion's, every tensor but our alignment projection loads, and training runs."""
    source = NaturalSpeech2(CONFIGS["tiny"])
    source.set_codec(from_codec(quantizer_state(checkpoint=codec_folder)))
    write_upstream(source.state_dict(), tmp_path / "epoch-0001_step-0000100_loss-1.0")
    out = tmp_path / "run"
    r = torchrun(ns2_shards, out, codec_folder, "--init-from", str(tmp_path / "epoch-0001_step-0000100_loss-1.0"),
                 steps=2)
    assert "prompt rule phones, phone table amphion, forward: positions per batch item" in r.stdout
    assert "not Amphion's rules" not in r.stdout
    assert "new (kept as initialised): 2 (align_proj.weight, align_proj.bias)" in r.stdout
    assert "dropped (not in this model): none" in r.stdout
    recs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in recs] == [1, 2] and all(np.isfinite(x["loss"]) for x in recs)
    saved = torch.load(out / "ckpt-00000002.pt", weights_only=True)["model"]
    assert torch.equal(saved["quantizer.embed"], source.state_dict()["quantizer.embed"]), "the codec stays frozen"


def test_start_up_refusals_are_one_line(ns2_shards, codec_folder, tmp_path):
    base = ["--shards", str(ns2_shards), "--config", "tiny", "--out", str(tmp_path / "r"), "--max-steps", "1"]
    with pytest.raises(SystemExit, match="made with the EnCodec checkpoint sha256:.*--codec-checkpoint DIR"):
        main(base)
    other = tmp_path / "other_codec"
    shutil.copytree(codec_folder, other)
    weights = next(other.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(SystemExit, match="is sha256:.*but the shards' codes were made with sha256"):
        main(base + ["--codec-checkpoint", str(other)])
    big = tmp_path / "big.json"
    big.write_text(json.dumps({**dataclasses.asdict(CONFIGS["tiny"]), "vocab_size": 50}))
    with pytest.raises(SystemExit, match=r"phone table \(amphion\) has 89 entries.*vocab_size is 50"):
        main(["--shards", str(ns2_shards), "--config", str(big), "--out", str(tmp_path / "r"),
              "--codec-checkpoint", str(codec_folder)])
