"""3D-Speaker's ERes2Net and CAM++ in and out of our trainers (audiopipe/checkpoints/speaker.py, speaker.py).

The oracle is speakerlab's own code (tests/upstream/speaker_oracle.py, one interpreter start for the module): it
builds its models and writes their checkpoints with its own code (torch.save as the released files, its
Checkpointer for an experiment folder), loads our exports strictly into its classes, runs its extract.py on our
experiment folder, and steps its own LR and margin schedulers. Everything else here runs without it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import load_file, save_file

import core
import speaker
import speaker_data
import train_campplus
import train_eres2net
from audiopipe.checkpoints import speaker as ck
from audiopipe.checkpoints.files import CheckpointError
from audiopipe.checkpoints.load import load_matching
from upstream_oracle import run_upstream

SR = speaker_data.SAMPLE_RATE
TRAINERS = {"eres2net": train_eres2net, "campplus": train_campplus}
# Small sizes speakerlab's classes can build (its CAM++ fixes the front end and the 12/24/16 dense layers).
SMALL = {"eres2net": train_eres2net.CONFIGS["tiny"],
         "campplus": replace(train_campplus.CONFIGS["default"], embedding_size=32, growth_rate=8, bn_size=2,
                             init_channels=32)}
# The released sizes, once each: ERes2Net VoxCeleb (192-d), base (512-d) and large (m_channels 64); CAM++
# VoxCeleb (512-d) and common (192-d).
RELEASED = [("eres2net", "default"), ("eres2net", "base"), ("eres2net", "large"), ("campplus", "default"),
            ("campplus", "common")]
EXPERIMENT_CLASSES = 12  # the CosineClassifier of speakerlab's experiment folder: 4 speakers x 3 speeds


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def encoder_of(name: str, mcfg) -> torch.nn.Module:
    mod = TRAINERS[name]
    return mod.ERes2Net(mcfg) if name == "eres2net" else mod.CAMPPlus(mcfg)


def config_of(name: str, size: str):
    return SMALL[name] if size == "small" else TRAINERS[name].CONFIGS[size]


def randomized(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """BatchNorm statistics and affine parameters away from 0/1, so a misplaced norm tensor shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))
                if m.affine:
                    m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=g))
    return model.eval()


def write_our_run(run: Path, name: str, mcfg, num_classes: int = 6, seed: int = 3) -> dict[str, torch.Tensor]:
    """A run folder as our trainer leaves it: ckpt-*.pt (model = encoder + AAM head + counter) and
    model_config.json. Returns the model state."""
    torch.manual_seed(seed)
    model = speaker.SpeakerModel(randomized(encoder_of(name, mcfg), seed), mcfg.embedding_size, num_classes,
                                 lambda step: 0.0)
    run.mkdir(parents=True)
    state = model.state_dict()
    torch.save({"step": 40, "epoch": 2, "model": state, "optimizer": {}, "rng": []}, run / "ckpt-00000040.pt")
    (run / "model_config.json").write_text(json.dumps({"model": name, **core_asdict(mcfg)}))
    return state


def core_asdict(mcfg) -> dict:
    from dataclasses import asdict

    return asdict(mcfg)


def embed(name: str, mcfg, state: dict[str, torch.Tensor], feats: torch.Tensor) -> torch.Tensor:
    enc = encoder_of(name, mcfg)
    enc.load_state_dict(ck.encoder_state(state))
    with torch.no_grad():
        return enc.eval()(feats)


# ----------------------------------------------------------------------------- the oracle, once for the module

@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    """Runs every upstream job of this module in one call of speakerlab's code; returns the folder and its files."""
    root = tmp_path_factory.mktemp("speaker_oracle")
    feats = torch.randn(2, 150, 80, generator=torch.Generator().manual_seed(0))
    save_file({"feats": feats}, root / "in.safetensors")
    jobs, ours = [], {}
    cases = [(n, "small") for n in TRAINERS] + RELEASED
    for i, (name, size) in enumerate(cases):
        args = ck.converter(name).upstream_args(ck.converter(name).to_upstream(
            encoder_of(name, config_of(name, size)).state_dict()))
        tag = f"{name}-{size}"
        job = {"op": "build", "model": name, "args": args, "seed": i, "inputs": str(root / "in.safetensors"),
               "file": str(root / f"{tag}.up.ckpt"), "out": str(root / f"{tag}.up.out.safetensors")}
        if size == "small":
            job.update(experiment=str(root / f"{tag}.up-exp"), classes=EXPERIMENT_CLASSES, epoch=3)
        jobs.append(job)
        # our side: a run of ours exported with our code, for speakerlab to load strictly
        state = write_our_run(root / f"{tag}.run", name, config_of(name, size), seed=100 + i)
        res = ck.export_upstream(name, root / f"{tag}.run", root / f"{tag}.ours.ckpt", layout="file")
        ours[tag] = state
        jobs.append({"op": "load", "model": name, "args": res["args"], "file": res["path"],
                     "inputs": str(root / "in.safetensors"), "out": str(root / f"{tag}.ours.out.safetensors")})
    # speakerlab's extract.py on an experiment folder we exported (small ERes2Net and CAM++), on two wav files
    rng = np.random.default_rng(0)
    scp = []
    for k in range(2):
        t = np.arange(int(1.3 * SR)) / SR
        wav = 0.2 * np.sin(2 * np.pi * (180 + 90 * k) * t * (1 + 0.3 * t)) + 0.02 * rng.standard_normal(len(t))
        sf.write(root / f"utt{k}.wav", wav, SR, subtype="PCM_16")
        scp.append(f"utt{k} {root / f'utt{k}.wav'}")
    (root / "wav.scp").write_text("\n".join(scp) + "\n")
    for name in TRAINERS:
        tag = f"{name}-small"
        ck.export_upstream(name, root / f"{tag}.run", root / f"{tag}.ours-exp",
                           check_config=ck.MODEL_CONFIG_CHECKS.get(name))
        jobs.append({"op": "extract", "exp_dir": str(root / f"{tag}.ours-exp"), "wav_scp": str(root / "wav.scp"),
                     "out": str(root / f"{tag}.extract.safetensors")})
    jobs.append({"op": "schedules", "steps_per_epoch": 7, "out": str(root / "schedules.json"),
                 "recipes": {n: vars(TRAINERS[n].RECIPE) for n in TRAINERS}})
    (root / "plan.json").write_text(json.dumps(jobs))
    run_upstream("speaker_oracle.py", root / "plan.json")
    return {"root": root, "feats": feats, "ours": ours}


# ----------------------------------------------------------------------------- in: upstream's files, --init-from

@pytest.mark.parametrize("name,size", [(n, "small") for n in TRAINERS] + RELEASED)
def test_upstream_checkpoint_loads_with_init_from(oracle, name, size):
    """speakerlab's torch.save'd state dict through the trainer's --init-from reader: every tensor of the network
    loads, the AAM head is new, and the embeddings equal speakerlab's within 1e-5 (in upstream mode)."""
    root, tag = oracle["root"], f"{name}-{size}"
    mcfg = config_of(name, size)
    model = speaker.SpeakerModel(encoder_of(name, mcfg), mcfg.embedding_size, 6, lambda s: 0.0)
    read = speaker.init_weights(name, model, TRAINERS[name].upstream_args, TRAINERS[name].CONFIGS, size)
    path = str(root / f"{tag}.up.ckpt")
    assert speaker.init_is_upstream(core.RunConfig(init_from=path))
    report = load_matching(model, read(path), speaker.INIT_HINTS)
    assert sorted(report.new) == ["head.weight", "micro_batches"] and report.dropped == []
    assert len(report.loaded) == len(model.encoder.state_dict())
    want = load_file(root / f"{tag}.up.out.safetensors")["emb"]
    with torch.no_grad():
        got = model.encoder.eval()(oracle["feats"])
    assert (got - want).abs().max() < 1e-5


def test_pooling_epsilon_is_upstream_s_by_default(oracle):
    """The configs' pooling epsilon is speakerlab's (1e-8); a run with another (--pool-eps 1e-7) computes other
    embeddings from the same weights, which is why its export is refused without --allow-different. The size of
    that difference is what docs/trainers/eres2net.md quotes."""
    root = oracle["root"]
    state = ck.from_upstream_file("eres2net", root / "eres2net-default.up.ckpt")
    want = load_file(root / "eres2net-default.up.out.safetensors")["emb"]
    assert all(c.pool_eps == ck.UPSTREAM_POOL_EPS == 1e-8 for c in train_eres2net.CONFIGS.values())
    same = embed("eres2net", train_eres2net.CONFIGS["default"], state, oracle["feats"])
    other = embed("eres2net", replace(train_eres2net.CONFIGS["default"], pool_eps=1e-7), state, oracle["feats"])
    assert (same - want).abs().max() < (other - want).abs().max()


@pytest.mark.parametrize("name", list(TRAINERS))
def test_upstream_experiment_folder_loads_with_its_head(oracle, name):
    """An experiment folder of speakerlab's trainer (its Checkpointer): the embedding model, and the AAM head when
    this run has the same classes; with other classes the head starts fresh."""
    root, tag = oracle["root"], f"{name}-small"
    mcfg = SMALL[name]
    exp = root / f"{tag}.up-exp"
    want_head = load_file(root / f"{tag}.up.out.safetensors")["classifier"]
    for classes, head_loaded in ((EXPERIMENT_CLASSES, True), (9, False)):
        model = speaker.SpeakerModel(encoder_of(name, mcfg), mcfg.embedding_size, classes, lambda s: 0.0)
        read = speaker.init_weights(name, model, TRAINERS[name].upstream_args, TRAINERS[name].CONFIGS, "x")
        report = load_matching(model, read(str(exp)), speaker.INIT_HINTS)
        assert ("head.weight" in report.loaded) is head_loaded
        if head_loaded:
            assert torch.equal(model.head.weight.detach(), want_head)
        with torch.no_grad():
            got = model.encoder.eval()(oracle["feats"])
        assert (got - load_file(root / f"{tag}.up.out.safetensors")["emb"]).abs().max() < 1e-5


# ----------------------------------------------------------------------------- out: our exports in speakerlab

@pytest.mark.parametrize("name,size", [(n, "small") for n in TRAINERS] + RELEASED)
def test_our_export_loads_strictly_in_speakerlab(oracle, name, size):
    """Our checkpoint, exported as a plain state dict: speakerlab's class loads it with strict load_state_dict
    and its embeddings equal ours (in upstream mode) within 1e-5."""
    root, tag = oracle["root"], f"{name}-{size}"
    got = load_file(root / f"{tag}.ours.out.safetensors")["emb"]
    ours = embed(name, config_of(name, size), oracle["ours"][tag], oracle["feats"])
    assert (got - ours).abs().max() < 1e-5


@pytest.mark.parametrize("name", list(TRAINERS))
def test_speakerlab_extract_reads_our_experiment_folder(oracle, name):
    """speakerlab/bin/extract.py (its config reader, Checkpointer, FBank and model) on our exported experiment
    folder gives the embeddings our trainer's own path gives (fbank_batch + the encoder) for the same wav files."""
    root, tag = oracle["root"], f"{name}-small"
    got = load_file(root / f"{tag}.extract.safetensors")
    assert sorted(got) == ["utt0", "utt1"]
    mcfg = SMALL[name]
    for k in range(2):
        wav, _ = sf.read(root / f"utt{k}.wav", dtype="float32")
        feats = speaker_data.fbank_batch(torch.from_numpy(wav)[None])
        ours = embed(name, mcfg, oracle["ours"][tag], feats)[0]
        assert got[f"utt{k}"].shape == ours.shape
        assert (got[f"utt{k}"] - ours).abs().max() < 1e-4 * max(1.0, ours.abs().max().item())
    cfg = (root / f"{tag}.ours-exp" / "config.yaml").read_text()
    assert ck.UPSTREAM_CLASS[name] in cfg and "num_epoch: 3" in cfg  # our ckpt was in epoch 2 (0-based)


def test_schedules_match_speakerlab_s(oracle):
    """LR and margin at every step of a short run equal speakerlab's WarmupCosineScheduler and MarginScheduler
    (its own classes, stepped as its train.py steps them), for both recipes."""
    got = json.loads((oracle["root"] / "schedules.json").read_text())
    for name, mod in TRAINERS.items():
        r = mod.RECIPE
        s = speaker.EpochSchedule(r.lr, r.min_lr, r.epochs, r.warmup_epochs, r.margin, r.margin_start_epoch,
                                  r.margin_fix_epoch)
        s.steps_per_epoch = 7
        steps = range(len(got[name]["lr"]))
        assert len(steps) > 7 * r.margin_fix_epoch
        assert np.allclose([s.lr(k) for k in steps], got[name]["lr"], rtol=1e-12, atol=0)
        assert np.allclose([s.margin(k) for k in steps], got[name]["margin"], rtol=1e-12, atol=1e-15)


# ----------------------------------------------------------------------------- without the oracle

@pytest.mark.parametrize("name,size", [("eres2net", "tiny"), ("eres2net", "large"), ("campplus", "tiny"),
                                       ("campplus", "default")])
def test_names_round_trip(name, size):
    """ours -> upstream -> ours gives back every tensor under its own name (tiny CAM++ included: the renaming
    does not depend on sizes speakerlab can build)."""
    enc = encoder_of(name, TRAINERS[name].CONFIGS[size])
    state = {"encoder." + k: v for k, v in enc.state_dict().items()}
    conv = ck.converter(name)
    up = conv.to_upstream(state)
    assert len(up) == len(state) and not any(k.startswith("encoder.") for k in up)
    back = conv.from_upstream(up)
    assert list(back) == list(state) and all(back[k] is state[k] for k in state)


def test_export_refuses_what_speakerlab_cannot_build(tmp_path):
    write_our_run(tmp_path / "tiny", "campplus", train_campplus.CONFIGS["tiny"])
    with pytest.raises(CheckpointError, match=r"speakerlab's CAMPPlus builds only 32 channels"):
        ck.export_upstream("campplus", tmp_path / "tiny", tmp_path / "x.ckpt", layout="file")
    write_our_run(tmp_path / "dil", "campplus", replace(SMALL["campplus"], block_dilations=(1, 1, 1)))
    with pytest.raises(CheckpointError, match=r"block_dilations=\[1, 1, 1\]"):
        ck.export_upstream("campplus", tmp_path / "dil", tmp_path / "y", check_config=ck.check_campplus_config)
    write_our_run(tmp_path / "e", "eres2net", SMALL["eres2net"])
    with pytest.raises(CheckpointError, match="torch.load"):
        ck.export_upstream("eres2net", tmp_path / "e", tmp_path / "z.safetensors", layout="file")
    with pytest.raises(CheckpointError, match="is a eres2net run, not campplus"):
        ck.export_upstream("campplus", tmp_path / "e", tmp_path / "w.ckpt", layout="file")
    ck.export_upstream("eres2net", tmp_path / "e", tmp_path / "exp")
    with pytest.raises(CheckpointError, match="exists: export into a new folder"):
        ck.export_upstream("eres2net", tmp_path / "e", tmp_path / "exp")
    with pytest.raises(SystemExit, match="export: error: .*no_run: no such file"):
        ck.main(["--model", "eres2net", "--checkpoint", str(tmp_path / "no_run"), "--export-upstream",
                 str(tmp_path / "v")])


def test_export_cli_writes_an_experiment_folder(tmp_path, capsys):
    state = write_our_run(tmp_path / "run", "eres2net", SMALL["eres2net"], num_classes=9)
    assert ck.main(["--model", "eres2net", "--checkpoint", str(tmp_path / "run"), "--export-upstream",
                    str(tmp_path / "exp")]) == 0
    assert "m_channels=8" in capsys.readouterr().out
    folder = tmp_path / "exp" / "models" / "CKPT-EPOCH-3-00"
    emb = torch.load(folder / "embedding_model.ckpt", weights_only=True)
    assert torch.equal(emb["seg_1.weight"], state["encoder.embed.weight"])
    assert torch.equal(torch.load(folder / "classifier.ckpt", weights_only=True)["weight"], state["head.weight"])
    assert (folder / "epoch_counter.ckpt").read_text() == "3"
    # and back in: the folder is a 3D-Speaker checkpoint for --init-from, head included
    assert ck.is_upstream_checkpoint(tmp_path / "exp") and not ck.is_upstream_checkpoint(tmp_path / "run")
    back = ck.from_upstream_file("eres2net", tmp_path / "exp")
    assert all(torch.equal(back[k], state[k]) for k in back) and set(back) == set(state) - {"micro_batches"}


def test_export_refuses_another_pooling_epsilon_unless_allowed(tmp_path, capsys):
    """A run trained with a pooling epsilon other than speakerlab's (or whose model_config.json is gone) is refused
    in one line naming it; --allow-different writes it and prints the difference; the default run exports
    without a note."""
    from audiopipe.checkpoints.rules import ExportDiffers
    from audiopipe.cli import main as cli

    write_our_run(tmp_path / "eps", "eres2net", replace(SMALL["eres2net"], pool_eps=1e-7))
    with pytest.raises(ExportDiffers) as e:
        ck.export_upstream("eres2net", tmp_path / "eps", tmp_path / "x")
    assert "\n" not in str(e.value) and "pool_eps (--pool-eps) 1e-07 (upstream: 1e-08)" in str(e.value)
    assert not (tmp_path / "x").exists()
    assert cli(["export-checkpoint", str(tmp_path / "eps"), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "pool_eps (--pool-eps) 1e-07" in err and "--allow-different" in err and not (tmp_path / "x").exists()
    assert cli(["export-checkpoint", str(tmp_path / "eps"), "--out", str(tmp_path / "x"), "--allow-different"]) == 0
    out = capsys.readouterr().out
    assert "note: computes differently in upstream: pool_eps (--pool-eps) 1e-07 (upstream: 1e-08)" in out
    assert (tmp_path / "x" / "config.yaml").is_file()
    with pytest.raises(SystemExit, match="pool_eps"):  # the module's own command refuses alike
        ck.main(["--model", "eres2net", "--checkpoint", str(tmp_path / "eps"), "--export-upstream",
                 str(tmp_path / "y")])
    (tmp_path / "eps" / "model_config.json").unlink()
    with pytest.raises(ExportDiffers, match="model_config.json missing"):
        ck.export_upstream("eres2net", tmp_path / "eps", tmp_path / "z", layout="file")
    write_our_run(tmp_path / "default", "eres2net", SMALL["eres2net"])
    assert cli(["export-checkpoint", str(tmp_path / "default"), "--out", str(tmp_path / "d")]) == 0
    assert "note:" not in capsys.readouterr().out


@pytest.mark.parametrize("name,have,want,flag", [("eres2net", "default", "base", "--config base"),
                                                  ("eres2net", "base", "large", "--config large"),
                                                  ("campplus", "default", "common", "--config common")])
def test_init_from_another_size_names_the_config(tmp_path, name, have, want, flag):
    """A released checkpoint of another size ends in one line that names the --config that builds it."""
    mod = TRAINERS[name]
    path = tmp_path / "other.ckpt"
    ck.write_embedding_file(ck.converter(name).to_upstream(encoder_of(name, mod.CONFIGS[want]).state_dict()), path)
    mcfg = mod.CONFIGS[have]
    model = speaker.SpeakerModel(encoder_of(name, mcfg), mcfg.embedding_size, 6, lambda s: 0.0)
    read = speaker.init_weights(name, model, mod.upstream_args, mod.CONFIGS, have)
    with pytest.raises(CheckpointError) as e:
        read(str(path))
    msg = str(e.value)
    assert "\n" not in msg and msg.endswith(f"use {flag}") and f"--config {have} builds" in msg


def test_a_run_continued_or_resumed_keeps_its_pooling_epsilon(tmp_path):
    """The epsilon a run trained with (model_config.json) is found from --init-from of its folder or checkpoint,
    and from --out when resuming; a fresh run has none to keep."""
    write_our_run(tmp_path / "ft", "eres2net", replace(SMALL["eres2net"], pool_eps=1e-7))  # not the default
    for init in (tmp_path / "ft", tmp_path / "ft" / "ckpt-00000040.pt"):
        assert speaker.previous_model_config(core.RunConfig(init_from=str(init)))["pool_eps"] == 1e-7
    assert speaker.previous_model_config(core.RunConfig(out=str(tmp_path / "ft"), resume=True))["pool_eps"] == 1e-7
    assert speaker.previous_model_config(core.RunConfig(out=str(tmp_path / "new"), resume=True)) == {}


def test_init_from_refuses_a_malicious_pickle(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "pretrained_eres2net.ckpt"
    torch.save({"conv1.weight": torch.zeros(1), "evil": Boom()}, path)
    with pytest.raises(SystemExit, match=r"--init-from .*refused.*never fully unpickled"):
        speaker.init_is_upstream(core.RunConfig(init_from=str(path)))


@pytest.mark.parametrize("name", list(TRAINERS))
def test_overfitting_one_batch_drives_the_loss_down(name):
    """The learning test: 8 crops of 4 classes, the full margin from the start, SGD at the recipe's settings
    (momentum, Nesterov, weight decay) with a constant LR of 0.01: the loss falls far below where it starts (about
    12 -> under 0.1 for both; at 0.02 tiny ERes2Net's loss rebounds to ~6 once the batch statistics shift)."""
    torch.manual_seed(0)
    mcfg = TRAINERS[name].CONFIGS["tiny"]
    model = speaker.SpeakerModel(encoder_of(name, mcfg), mcfg.embedding_size, 4, lambda step: 0.2)
    g = torch.Generator().manual_seed(1)
    t = torch.arange(SR // 2) / SR
    harmonics = torch.tensor([1.0, 2.0, 3.0])[:, None]
    # four "speakers" (harmonic series on different fundamentals) under noise, two crops each
    wav = torch.stack([0.1 * torch.sin(2 * torch.pi * (120 + 60 * (k % 4)) * harmonics * t).sum(0)
                       + 0.05 * torch.randn(len(t), generator=g) for k in range(8)])
    labels = torch.arange(8) % 4
    opt = speaker.sgd(model, core.RunConfig(lr=0.01, weight_decay=1e-4))
    losses = []
    for _ in range(30):
        loss, _ = model(wav, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], losses
