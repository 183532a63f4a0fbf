"""ERes2Net and CAM++ training steps: audiopipe's speaker trainers against 3D-Speaker's own (speakerlab 0.0.6).

speakerlab's bin/train.py needs CUDA and NCCL, so tests/upstream/speaker_steps.py drives its components exactly
as that train() does (its model classes under a CosineClassifier, ArcMarginLoss, the recipes' SGD,
WarmupCosineScheduler and MarginScheduler stepped with iter_num), fp32 on the CPU, for 3 steps from weights its
own code builds. Our trainer's pieces (SpeakerModel with its AAM-softmax head, speaker.loss_fn, speaker.sgd with
the run defaults, EpochSchedule's LR and margin, no clipping) take the same 3 steps in core.train's order
(tests/step_parity.py). The schedule here is short (1 step per epoch, margin from 0 to 0.3 over epochs 0-2, so
all three steps see another LR and margin); tests/test_checkpoint_speaker.py compares whole recipes' schedules.
speakerlab builds CAM++ as its recipe does, with memory_efficient=True: each dense layer's first BN-ReLU + conv is
recomputed in the backward pass, which updates that BatchNorm's running statistics a second time; ours does the
same (CAMPPlusConfig.memory_efficient), and the weights compared after step 3 include those statistics.

Both sides get the same fbank features: ours (fbank_batch of the waveform, inside the model) are handed to
speakerlab, whose FBank (torchaudio's Kaldi fbank) agrees with it to 2e-3 (docs/trainers/eres2net.md); that
difference belongs to the features, not to the step.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import core
import speaker
import speaker_data
import train_campplus
import train_eres2net
from audiopipe.checkpoints import speaker as ck
from step_parity import max_gap, replay
from upstream_oracle import run_upstream

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Sizes speakerlab's classes build (its CAM++ fixes the front end and the 12/24/16 dense layers)
MODELS = {"eres2net": (train_eres2net.ERes2Net, train_eres2net.CONFIGS["tiny"]),
          "campplus": (train_campplus.CAMPPlus, replace(train_campplus.CONFIGS["default"], embedding_size=32,
                                                        growth_rate=8, bn_size=2, init_channels=32))}
RECIPE = speaker.Recipe(lr=0.02, min_lr=5e-5, epochs=4, warmup_epochs=1, margin=0.3, margin_start_epoch=0,
                        margin_fix_epoch=2, aug_prob=0.0)
STEPS, CLASSES, BATCH, SR = 3, 6, 6, speaker_data.SAMPLE_RATE


def batches() -> list[dict[str, torch.Tensor]]:
    """Three batches of 1 s crops: chirps of different pitch per class, plus noise."""
    rng = np.random.default_rng(0)
    t = np.arange(SR) / SR
    out = []
    for k in range(STEPS):
        labels = rng.permutation(CLASSES)[:BATCH]
        wav = np.stack([0.3 * np.sin(2 * np.pi * (120 + 40 * c) * t * (1 + 0.2 * t + 0.05 * k))
                        + 0.05 * rng.standard_normal(SR) for c in labels]).astype(np.float32)
        out.append({"wav": torch.from_numpy(wav), "label": torch.from_numpy(labels.astype(np.int64))})
    return out


# The steps here are sensitive to rounding: in speakerlab's own trainer, scaling the first step's gradients by
# 1 + 1e-7 * noise moves the third loss by 0.18 (CAM++). So our pieces do the same arithmetic in the same order
# (speaker_eval.aam_logits, train_campplus.CAMLayer) and both models come out equal to the last bit; a difference
# in any training rule (BatchNorm statistics, weight decay, margin, LR) shows far above the tolerance.
@pytest.mark.parametrize("name", list(MODELS))
def test_three_steps_equal_speakerlabs(name, tmp_path):
    cls, mcfg = MODELS[name]
    conv = ck.converter(name)
    bs = batches()
    save_file({**{f"feats.{k}": speaker_data.fbank_batch(b["wav"]) for k, b in enumerate(bs)},
               **{f"labels.{k}": b["label"] for k, b in enumerate(bs)}}, str(tmp_path / "batches.safetensors"))
    job = {"model": name, "args": conv.upstream_args(conv.to_upstream(cls(mcfg).state_dict())), "classes": CLASSES,
           "recipe": asdict(RECIPE), "steps_per_epoch": 1, "batches": str(tmp_path / "batches.safetensors"),
           "out": str(tmp_path)}
    (tmp_path / "job.json").write_text(json.dumps(job))
    run_upstream("speaker_steps.py", tmp_path / "job.json", timeout=300)

    def ours(saved: dict) -> dict[str, torch.Tensor]:
        return {**conv.from_upstream(saved["embedding_model"]), ck.HEAD: saved["classifier"]["weight"]}

    init = ours(torch.load(tmp_path / "init.pt", weights_only=True))
    final = ours(torch.load(tmp_path / "final.pt", weights_only=True))
    theirs = json.loads((tmp_path / "losses.json").read_text())
    # as train_<model>.main builds them: the schedule in epochs, the model under its AAM head, SGD
    cfg = core.RunConfig(**speaker.run_defaults(RECIPE))
    schedule = speaker.EpochSchedule(cfg.lr, cfg.lr * cfg.min_lr_ratio, RECIPE.epochs, RECIPE.warmup_epochs,
                                     RECIPE.margin, RECIPE.margin_start_epoch, RECIPE.margin_fix_epoch)
    schedule.start(cfg, 1)
    model = speaker.SpeakerModel(cls(mcfg), mcfg.embedding_size, CLASSES, schedule.margin)
    report = model.load_state_dict(init, strict=False)
    assert report.unexpected_keys == [] and report.missing_keys == ["micro_batches"]
    assert [schedule.lr(k) for k in range(STEPS)] == pytest.approx([s["lr"] for s in theirs], rel=1e-12)
    margins = [s["margin"] for s in theirs]
    assert [schedule.margin(k) for k in range(STEPS)] == pytest.approx(margins, rel=1e-12, abs=1e-15)
    assert len(set(margins)) == STEPS  # every step sees another margin
    losses = replay(model, speaker.loss_fn, bs, speaker.sgd(model, cfg), schedule.lr, cfg.clip)
    assert losses == pytest.approx([s["loss"] for s in theirs], abs=1e-5, rel=0)
    got = {k: v for k, v in model.state_dict().items() if k != "micro_batches"}
    gap, where = max_gap(got, final)
    assert gap < 1e-5, (where, gap)
    moved = max((got[k] - init[k]).abs().max().item() for k in got if got[k].is_floating_point())
    assert moved > 100 * 1e-5  # the steps moved the weights far beyond the tolerance


def test_campplus_recompute_changes_only_the_batchnorm_statistics():
    """memory_efficient (speakerlab's default) recomputes each dense layer's first BN-ReLU-conv in the backward pass:
    the same loss and gradients as keeping it, but that BatchNorm's running statistics move twice per step
    (1 - 0.9^2 = 0.19 of the way to the batch's, not 0.1); every other statistic moves once."""
    cfg = train_campplus.CONFIGS["tiny"]
    feats = speaker_data.fbank_batch(batches()[0]["wav"])
    runs = {}
    for me in (True, False):
        torch.manual_seed(0)
        model = train_campplus.CAMPPlus(replace(cfg, memory_efficient=me)).train()
        before = {k: v.clone() for k, v in model.state_dict().items()}
        model(feats).square().sum().backward()
        runs[me] = (before, model.state_dict(), {k: p.grad for k, p in model.named_parameters()})
    (b1, s1, g1), (b0, s0, g0) = runs[True], runs[False]
    assert all(torch.equal(b1[k], b0[k]) for k in b1)
    for k in g1:
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-5, atol=1e-6, msg=k)
    twice = [k for k in s1 if k.endswith("bottleneck.0.0.running_mean")]
    assert len(twice) == sum(cfg.block_layers)
    for k in s1:
        if k.endswith("running_mean") or k.endswith("running_var"):
            moved1, moved0 = s1[k] - b1[k], s0[k] - b0[k]
            ratio = 1.9 if k.rsplit(".", 1)[0] + ".running_mean" in twice else 1.0
            torch.testing.assert_close(moved1, ratio * moved0, rtol=1e-4, atol=1e-6, msg=k)
