"""GPT-SoVITS stage 1 trainer: the model's masks, targets, BERT slot and losses; its ScaledAdam against GPT-SoVITS's
own on identical gradients; overfitting one batch with either recipe; --init-from a checkpoint GPT-SoVITS's code
wrote, and --export; real torchrun runs on token shards made here (2 processes, exact resume, data-wait logged)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
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
from launch import run_group
from shard_helpers import make_job
from upstream_oracle import run_upstream_jobs

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
    # Text2SemanticDecoder's parameter count at s1longer.yaml (v1: 512 phone rows), bert_proj included
    with torch.device("meta"):  # counted without allocating or initialising 77 M parameters
        assert sum(p.numel() for p in Text2Semantic(d).parameters()) == 77_493_762


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
    # rows: queries p0 p1 p2(pad) t0 t1 t2(pad); columns: keys in the same order. Padding is never a key, also
    # not for itself (GPT-SoVITS's mask: padded queries see the real phones and tokens before them).
    assert m.tolist() == [[1, 1, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0],
                          [1, 1, 0, 1, 0, 0],
                          [1, 1, 0, 1, 1, 0],
                          [1, 1, 0, 1, 1, 0]]
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
    # every parameter, positions' alpha included, except the BERT projection's weight: without features its input
    # is zero, so it has nothing to learn (GPT-SoVITS computes an all-zero gradient for it; ScaledAdam takes a
    # missing gradient as zeros, and AdamW then leaves the weight alone instead of decaying it)
    assert [n for n, p in m.named_parameters() if p.grad is None] == ["bert_proj.weight"]


def test_bert_features_reach_the_phones_and_none_means_zeros():
    m = model()
    phones, pl, tokens, tl = batch(5, [6, 4], [7, 5])
    with torch.no_grad():
        ref, _ = m(phones, pl, tokens, tl)  # no features: the projection of zeros, i.e. its bias
        zeros, _ = m(phones, pl, tokens, tl, torch.zeros(2, 1024, 6, dtype=torch.float16))
        bert = torch.zeros(2, 1024, 6)
        bert[0, :, 2] = torch.randn(1024)
        out, _ = m(phones, pl, tokens, tl, bert)
    torch.testing.assert_close(zeros, ref, rtol=0, atol=1e-6)
    assert (out[0] - ref[0]).abs().amax(-1).min() > 1e-4  # a feature on one phone reaches every token
    torch.testing.assert_close(out[1], ref[1], rtol=0, atol=1e-6)  # and no other utterance


def test_upstream_loss_sums_every_position_with_eos_on_padding():
    m = model()
    phones, pl, tokens, tl = batch(6, [5, 8], [9, 4])
    b = {"phones": phones.short(), "phones_lengths": pl, "semantic": tokens.short(), "semantic_lengths": tl}
    with torch.no_grad():
        logits, targets = m(phones, pl, tokens, tl)
        total, _ = make_loss_fn(TINY, "sum")(m, b)
        mean, logs = make_loss_fn(TINY, "mean")(m, b)
        accum4, _ = make_loss_fn(TINY, "sum", grad_accum=4)(m, b)
    tgt = targets.clone()
    tgt[1, 4:] = TINY.eos  # GPT-SoVITS's pad_y_eos: every padded position is trained to predict EOS
    lp = logits.log_softmax(-1)
    by_hand = -sum(lp[i, t, tgt[i, t]] for i in range(2) for t in range(9))
    assert float(total) == pytest.approx(float(by_hand), rel=1e-6)
    real = -sum(lp[i, t, targets[i, t]] for i in range(2) for t in range(int(tl[i])))
    assert float(mean) == pytest.approx(float(real) / 13, rel=1e-6) == pytest.approx(float(logs["ce"]), rel=1e-6)
    # with 4 batches a step, the core divides by 4: the sum mode undoes it, so gradients sum as upstream's do
    assert float(accum4) == pytest.approx(4 * float(total), rel=1e-6)


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Path:
    """The module's two upstream jobs in one side-venv process (GPT-SoVITS's imports cost seconds each start):
    optim.safetensors, GPT-SoVITS's stage-1 optimizer stepped by its own code (tests/upstream/gpt_sovits_optim.py),
    and s1-e1.ckpt, a small s1 model saved by its code (upstream_ckpt)."""
    tmp = tmp_path_factory.mktemp("upstream_s1")
    optim = {"optimizer": {"lr": 0.01, "lr_init": 0.00001, "lr_end": 0.0001, "warmup_steps": 2000,
                           "decay_steps": 40000},
             "model": {"vocab_size": 1025, "phoneme_vocab_size": 64, "embedding_dim": 16, "hidden_dim": 16,
                       "head": 2, "linear_units": 64, "n_layer": 2, "dropout": 0, "EOS": 1024}}
    (tmp / "optim.json").write_text(json.dumps(optim))
    cfg = {"train": {"seed": 1234, "epochs": 1, "batch_size": 8, "save_every_n_epoch": 1, "precision": "32"},
           "optimizer": {"lr": 0.01, "lr_init": 0.00001, "lr_end": 0.0001, "warmup_steps": 2000,
                         "decay_steps": 40000},
           "data": {"max_eval_sample": 8, "max_sec": 54, "num_workers": 4, "pad_val": 1024},
           "model": {"vocab_size": 1025, "phoneme_vocab_size": 512, "embedding_dim": 32, "hidden_dim": 32,
                     "head": 4, "linear_units": 128, "n_layer": 2, "dropout": 0, "EOS": 1024, "random_bert": 0},
           "inference": {"top_k": 5}}
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    run_upstream_jobs(("gpt_sovits_optim.py", tmp / "optim.json", tmp / "optim.safetensors"),
                      ("gpt_sovits_s1.py", "write", tmp / "cfg.json", tmp / "s1-e1.ckpt", 7))
    return tmp


def test_scaled_adam_steps_as_gpt_sovits_own(upstream):
    """GPT-SoVITS's optimizer and scheduler (its configure_optimizers) and a short-period ScaledAdam that clips,
    against ours on the same parameters and gradients, step by step; and the LR each step ran with."""
    from safetensors.torch import load_file
    from scaled_adam import ScaledAdam, upstream_lr

    d = load_file(upstream / "optim.safetensors")
    for run, kw in (("real", {}), ("clip", {"clipping_update_period": 4})):
        names = [k[len(run) + 6:] for k in d if k.startswith(run + ".init.")]
        params = {n: torch.nn.Parameter(d[f"{run}.init.{n}"].clone()) for n in names}
        opt = ScaledAdam(list(params.values()), **kw)
        steps = len({k.split(".")[2] for k in d if k.startswith(run + ".after.")})
        assert steps >= 9
        for s in range(steps):
            lr = upstream_lr(s) if run == "real" else 0.002
            if run == "real":  # what GPT-SoVITS's WarmupCosineLRSchedule left in the optimizer for this step
                assert lr == pytest.approx(float(d[f"real.lr.{s}"]), abs=1e-12), s
            for g in opt.param_groups:
                g["lr"] = lr
            for n, p in params.items():
                p.grad = d[f"{run}.grad.{s}.{n}"].clone()
            opt.step()
            for n, p in params.items():
                torch.testing.assert_close(p.detach(), d[f"{run}.after.{s}.{n}"], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"{run} step {s} {n}: {m}")
            if run == "clip" and s == 10:  # the spikes of steps 9 and 10 were clipped (the count restarts at 8)
                assert float(opt.state[next(iter(params.values()))]["num_clipped"]) == 2


# ----------------------------------------------------------------------------- real runs

@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    """12 real prompts -> shards (pcm, fbank, phones in GPT-SoVITS's symbol table) -> 32 k-means units: a tiny but
    real stage-1 corpus."""
    from audiopipe.shard.run import run_job
    from audiopipe.tokens.kmeans import kmeans_tokens

    corpus = tmp_path_factory.mktemp("ast12")
    make_asterisk_corpus(corpus, n=12)
    shards = tmp_path_factory.mktemp("ast12_shards")
    job = make_job(corpus, shards, [("pcm", {"sample_rate": 16000}), ("kaldi_fbank", {})], phones=True)
    job.language = "auto"  # English lines as GPT-SoVITS's phone ids, which its checkpoints read
    run_job(job, workers=0, show_progress=False)  # in this process: see shard_helpers.shard
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
    r = run_group(cmd, timeout=300, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def log(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]


def test_two_process_run_and_exact_resume(token_dir, tmp_path):
    _, tokens = token_dir
    straight = tmp_path / "straight"
    r = torchrun(tokens, straight, "--max-steps", "4", "--ckpt-every", "2")
    assert "pass the filters; tokens kmeans-fbank-32 at 25/s, codebook 32" in r.stdout
    assert "phones: gpt_sovits table, 322 symbols" in r.stdout and "loss mean (audiopipe); AdamW" in r.stdout
    recs = log(straight)
    assert [x["step"] for x in recs] == [1, 2, 3, 4]
    assert all(x["world"] == 2 and "top3_acc" in x and "ce" in x for x in recs)

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


@pytest.mark.parametrize("recipe", ["audiopipe", "upstream"])
def test_overfitting_one_batch_drives_the_loss_down(token_dir, recipe):
    """One real batch of the token folder, trained on again and again with each recipe's loss and optimizer:
    AdamW on the mean loss, or ScaledAdam at GPT-SoVITS's LR on its summed loss. (This replaces a check that
    the loss fell once over 4 steps.)"""
    from audiopipe.reader.loader import make_loader
    from scaled_adam import ScaledAdam, upstream_lr

    _, tokens = token_dir
    # One pass: on this small corpus the default plans several, whose fuller batches would make every step here
    # several times dearer than the figures below were measured with.
    loader = make_loader(str(tokens), ["semantic", "phones"], max_frames=100_000, seed=0, prefetch=0, passes=1)
    b = max(loader, key=lambda x: len(x["semantic_lengths"]))  # the bucketed plan's largest batch
    assert len(b["semantic_lengths"]) >= 2
    torch.manual_seed(0)
    m = Text2Semantic(replace(TINY, phone_vocab=322)).train()
    if recipe == "audiopipe":
        opt, lr_of, loss_fn = torch.optim.AdamW(m.parameters(), weight_decay=0.01), lambda s: 3e-3, make_loss_fn(TINY)
    else:
        opt, lr_of, loss_fn = ScaledAdam(m.parameters()), upstream_lr, make_loss_fn(TINY, "sum")
    ce = []
    # ScaledAdam moves each tensor by about lr x its RMS per step: at GPT-SoVITS's 0.002 that takes more steps
    # (measured on this batch: ce 5.2 after 60 steps, 1.7 after 200, 0.8 after 300)
    for step in range(60 if recipe == "audiopipe" else 200):
        for g in opt.param_groups:
            g["lr"] = lr_of(step)
        loss, logs = loss_fn(m, b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ce.append(float(logs["ce"]))
    # An untrained model is near uniform over 1025 ids (6.9 nats); the corpus's 32 units alone take about
    # 3.2 nats, so well below that the model has memorised the batch's sequences.
    assert ce[0] > 6.0 and min(ce[-5:]) < 2.5, (ce[0], ce[-5:])


@pytest.fixture(scope="module")
def upstream_ckpt(upstream) -> Path:
    """A small GPT-SoVITS s1 model (v1 layout: 512 phone rows), saved by GPT-SoVITS's code as its WebUI saves it."""
    return upstream / "s1-e1.ckpt"


def test_init_from_a_gpt_sovits_checkpoint_fine_tunes_and_exports(token_dir, upstream_ckpt, tmp_path, capsys):
    from audiopipe.checkpoints import gpt_sovits as io

    _, tokens = token_dir
    out, exported = tmp_path / "ft", tmp_path / "exported.ckpt"
    main(["--shards", str(tokens), "--out", str(out), "--init-from", str(upstream_ckpt), "--max-steps", "3",
          "--batch-frames", "1500", "--log-every", "1", "--prefetch", "0", "--export", str(exported)])
    said = capsys.readouterr().out
    # whole: all 31 tensors of the 2-layer model, bert_proj included; sizes from the checkpoint's config
    assert "loaded 31 tensors" in said and "new (kept as initialised): none; dropped (not in this model): none" in said
    assert "loss sum (GPT-SoVITS); ScaledAdam, lr 0.01 on the first step, then 0.002" in said
    assert "a step every 4 batches, clip off" in said
    assert [r["lr"] for r in log(out)] == [0.01, 0.002, 0.002]
    start, _, _ = io.read_upstream(upstream_ckpt)
    state, config, info = io.read_upstream(exported)
    assert config["model"]["phoneme_vocab_size"] == 512 and config["model"]["embedding_dim"] == 32
    assert config["optimizer"]["lr"] == 0.01  # the starting checkpoint's config, carried over
    assert set(state) == set(start) and any(not torch.equal(state[k], start[k]) for k in start)  # it trained
    run_cfg = json.loads((out / "model_config.json").read_text())
    assert run_cfg["trainer"] == "gpt_sovits" and run_cfg["optimizer"] == "scaled_adam"
    # the same weights through `audiopipe export-checkpoint`, which finds the trainer in model_config.json
    from audiopipe.cli import main as cli_main

    assert cli_main(["export-checkpoint", str(out), "--out", str(tmp_path / "cli"), "--format", "fp32"]) == 0
    said = capsys.readouterr().out
    assert "exported gpt_sovits step 3" in said and "GPT_weights_v2/" in said
    again, _, _ = io.read_upstream(tmp_path / "cli" / "gpt_sovits_s1-step3.ckpt")
    assert all(torch.allclose(again[k], state[k], atol=1e-3) for k in state)


def test_init_from_refusals_name_the_fix(token_dir, upstream_ckpt, tmp_path):
    _, tokens = token_dir
    arpabet = tmp_path / "arpabet_tokens"
    shutil.copytree(tokens, arpabet)
    m = json.loads((arpabet / "manifest.json").read_text())
    from audiopipe.text.en_phones import PHONES

    m["phones"] = {"vocab": list(PHONES)}  # the phones of a `--language en` sharding: audiopipe's ARPAbet ids
    (arpabet / "manifest.json").write_text(json.dumps(m))
    base = ["--out", str(tmp_path / "x"), "--max-steps", "1"]
    with pytest.raises(SystemExit, match=r"ARPAbet ids.*`audiopipe shard --language auto`"):
        main(["--shards", str(arpabet), "--init-from", str(upstream_ckpt), *base])
    with pytest.raises(SystemExit, match="--config tiny is not the model in --init-from .*leave --config out"):
        main(["--shards", str(tokens), "--init-from", str(upstream_ckpt), "--config", "tiny", *base])
    # one of ours with another phone table size: the mismatch names the tensor and the flag
    ours = tmp_path / "ours.pt"
    torch.save(Text2Semantic(replace(TINY, phone_vocab=400)).state_dict(), ours)
    with pytest.raises(SystemExit, match=r"phone_emb.weight.*\[400, 64\].*\[322, 64\].*--config .*phone_vocab"):
        main(["--shards", str(tokens), "--init-from", str(ours), "--config", "tiny", *base])


def test_refuses_a_folder_without_tokens(token_dir, tmp_path):
    shards, _ = token_dir
    with pytest.raises(SystemExit, match="no 'semantic' tokens.*audiopipe tokens"):
        main(["--shards", str(shards), "--config", "tiny", "--out", str(tmp_path / "x"), "--max-steps", "1"])


def test_shapes_pads_phones_and_tokens_to_the_same_rows(token_dir, tmp_path, capsys):
    """--shapes K: the tokens (the planned feature) pick each batch's shape, and the phones get the same rows
    (empty rows after the items), so a run with shapes trains, and its batches take at most K shapes."""
    _, tokens = token_dir
    out = tmp_path / "shapes"
    main(["--shards", str(tokens), "--out", str(out), "--config", "tiny", "--max-steps", "4", "--shapes", "2",
          "--batch-frames", "1500", "--log-every", "1", "--prefetch", "0"])
    rows = log(out)
    assert [r["step"] for r in rows if "loss" in r][-1] == 4 and all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
