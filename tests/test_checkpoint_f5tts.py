"""F5-TTS checkpoints in and out, proven against F5-TTS's own code (tests/upstream/f5tts_oracle.py, side venv).

The oracle builds F5's CFM/DiT at a small config (the architecture code is the same at every size), trains it
for a few updates with F5's own Trainer (its optimizer, schedule, EMA and checkpoint writer), and reports what
F5's inference loader computes with those files. Here: the files load into audiopipe's model with --init-from's
reader and give the same outputs and the same training loss in upstream mode; the EMA and LR rules give what
F5's Trainer gave; and audiopipe's export loads strictly into F5's inference loader and its fine-tuning loader
with equal outputs. The name mapping, the refusals and the one-line errors are tested without the oracle.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import train_f5tts as f5
from audiopipe.checkpoints import f5tts as ck
from audiopipe.checkpoints.files import CheckpointError, write_torch
from launch import run_group
from upstream_oracle import run_upstream

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = Path(sys.executable).with_name("torchrun")
# The small parity config: F5's position convolution is fixed at kernel 31, 16 groups (so dim is a multiple of 16).
ARCH = dict(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2, text_dim=16, conv_layers=1)
VOCAB = [" "] + [chr(c) for c in range(33, 127)] + ["é"]
# The `tiny` preset's sizes (the vocabulary is the test's)
TINY = {k: v for k, v in asdict(f5.CONFIGS["tiny"]).items() if k not in ("text_num_embeds", "upstream_forward")}
UPDATES, WARMUP, LR = 125, 20, 3e-3  # past update 111, so F5's EMA has moved by decay more than once


def our_config(**kw) -> f5.ModelConfig:
    return f5.ModelConfig(**{**ARCH, "conv_pos_kernel": 31, "conv_pos_groups": 16, "text_num_embeds": len(VOCAB),
                             **kw})


def our_model(weights: dict[str, torch.Tensor], **kw) -> f5.F5TTS:
    m = f5.F5TTS(our_config(**kw))
    m.load_state_dict(weights, strict=True)
    return m.eval()


def make_inputs() -> dict[str, torch.Tensor]:
    """A padded batch of 3 (text shorter than the mel, and one longer: truncated) and one unpadded utterance."""
    g = torch.Generator().manual_seed(7)
    tok = f5.Tokenizer(VOCAB)
    texts = ["Hello there, é!", "short one", "a transcript longer than its mel"]
    lens = torch.tensor([40, 31, 18])
    n = int(lens.max())
    mel = torch.randn(3, n, 100, generator=g) * 2 - 5
    mask = f5.lengths_to_mask(lens, n)
    mel = mel.masked_fill(~mask[..., None], 0.0)  # F5's collate pads with zeros
    chars = torch.full((3, 40), -1)
    for i, t in enumerate(texts):
        chars[i, :len(t)] = torch.tensor([ord(c) for c in t])
    return {"mel": mel, "lens": lens, "text": tok.batch(texts), "chars": chars,
            "x": torch.randn(3, n, 100, generator=g), "cond": mel * (torch.rand(3, n, 1, generator=g) > 0.6),
            "time": torch.rand(3, generator=g), "x1": torch.randn(1, 50, 100, generator=g),
            "cond1": torch.randn(1, 50, 100, generator=g) * (torch.arange(50) < 20)[None, :, None],
            "text1": tok.batch(["one utterance, no padding"]), "time1": torch.tensor([0.42])}


def our_outputs(m: f5.F5TTS, inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    with torch.no_grad():
        for drop in (0, 1, 2):
            out[f"batch.{drop}"] = m.transformer(inp["x"], inp["cond"], inp["text"], inp["time"], inp["lens"],
                                                 drop_audio_cond=drop >= 1, drop_text=drop == 2)
        out["single"] = m.transformer(inp["x1"], inp["cond1"], inp["text1"], inp["time1"], torch.tensor([50]))
    return out


def assert_same_outputs(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor], tag: str) -> None:
    for k, v in ours.items():
        ref = theirs[f"{tag}.{k}"]
        # padded frames: F5 zeroes attention outputs there but its output layer still adds biases; compare all
        assert ref.abs().max() > 0.05, (tag, k)  # the weights are not trivial
        torch.testing.assert_close(v, ref, rtol=0, atol=1e-5, msg=lambda m: f"{tag}.{k}: {m}")


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("f5_oracle")
    save_file(make_inputs(), str(d / "inputs.safetensors"))
    (d / "arch.json").write_text(json.dumps({"arch": {**ARCH, "text_mask_padding": True, "pe_attn_head": None,
                                                      "attn_mask_enabled": False},
                                             "vocab": VOCAB, "updates": UPDATES, "warmup": WARMUP, "lr": LR}))
    run_upstream("f5tts_oracle.py", "train", d)
    return d


# ----------------------------------------------------------------------------- upstream files in

@pytest.mark.parametrize("name", ["ckpts/model_last.pt", "released.safetensors"])
def test_f5_files_load_and_run_as_in_f5(oracle, name):
    """F5's Trainer checkpoint and the released-style .safetensors: the EMA weights, strictly, same outputs."""
    got = ck.read_f5_checkpoint(oracle / name)
    assert got.origin == "upstream" and got.dim_head == ARCH["dim_head"] and got.ema_step == UPDATES
    assert got.weights is got.ema_weights and got.ema_initted
    assert ck.architecture(got.weights, got.dim_head) == {**{k: ARCH[k] for k in ARCH}, "text_num_embeds": len(VOCAB),
                                                          "mel_dim": 100, "conv_pos_kernel": 31}
    theirs = load_file(str(oracle / "outputs.safetensors"))
    assert_same_outputs(our_outputs(our_model(got.weights, upstream_forward=True), make_inputs()), theirs, name)
    if name.endswith(".pt"):  # the online weights are there too, and differ from the EMA copy
        assert got.online_weights is not None and got.online_weights.keys() == got.weights.keys()
        assert any(not torch.equal(got.online_weights[k], got.weights[k]) for k in got.weights)


def test_training_loss_is_f5s_under_the_same_seeds(oracle):
    """Span, noise, flow time, CFG drops and dropout drawn in F5's order: the same loss as F5's CFM.forward."""
    theirs = load_file(str(oracle / "outputs.safetensors"))
    m = our_model(ck.read_f5_checkpoint(oracle / "released.safetensors").weights, upstream_forward=True)
    inp = make_inputs()
    drops = set()
    for seed in (3, 4, 11):
        torch.manual_seed(seed)
        random.seed(seed)
        m.train()
        batch = {"mel": inp["mel"].transpose(1, 2), "mel_lengths": inp["lens"], "text_ids": inp["text"]}
        loss, logs = f5.loss_fn(m, batch)
        drops.add((logs["drop_audio"], logs["drop_text"]))
        torch.testing.assert_close(loss.reshape(1), theirs[f"released.safetensors.loss.{seed}"], rtol=1e-5, atol=0)
    assert len(drops) > 1  # the seeds cover more than one drop case


def test_masked_forward_differs_only_through_filler_and_padding(oracle):
    """audiopipe's own forward on the same weights: the same where no filler or padding exists, else not."""
    w = ck.read_f5_checkpoint(oracle / "released.safetensors").weights
    up, masked = our_model(w, upstream_forward=True), our_model(w)
    inp = make_inputs()
    n = 24  # text as long as the mel: no filler, no padding
    args = (inp["x1"][:, :n], inp["cond1"][:, :n], f5.Tokenizer(VOCAB).batch(["x" * n]), inp["time1"],
            torch.tensor([n]))
    with torch.no_grad():
        torch.testing.assert_close(up.transformer(*args), masked.transformer(*args), rtol=0, atol=1e-6)
    a, b = our_outputs(up, inp), our_outputs(masked, inp)
    assert (a["single"] - b["single"]).abs().max() > 1e-3  # filler after the text: the GRN statistics differ
    assert (a["batch.0"] - b["batch.0"]).abs().max() > 1e-3


def test_f5_v0_base_layout_runs_as_in_f5(oracle):
    """F5TTS_Base (text_mask_padding off, rotary on one head) through --config base_v0's settings."""
    got = ck.read_f5_checkpoint(oracle / "v0.pt")
    assert got.ema_step == 1 and got.online_weights is not None
    m = our_model(got.weights, upstream_forward=True, text_mask_padding=False, pe_attn_head=1)
    assert_same_outputs(our_outputs(m, make_inputs()), load_file(str(oracle / "outputs.safetensors")), "v0")
    assert not f5.CONFIGS["base_v0"].text_mask_padding and f5.CONFIGS["base_v0"].pe_attn_head == 1


@pytest.mark.skipif(not os.environ.get("AUDIOPIPE_F5_FULL_BASE"), reason="F5TTS_v1_Base at full size (336 M "
                    "parameters, ~8 GB of memory, minutes on a CPU): set AUDIOPIPE_F5_FULL_BASE=1 to run it")
def test_full_v1_base_runs_as_in_f5(tmp_path):
    """The released size: F5's own F5TTS_v1_Base config and vocabulary, the same check as at the small size."""
    save_file(make_inputs(), str(tmp_path / "inputs.safetensors"))  # text ids < 96: inside F5's vocabulary too
    run_upstream("f5tts_oracle.py", "base", tmp_path, timeout=1800)
    got = ck.read_f5_checkpoint(tmp_path / "model_1.safetensors")
    theirs = load_file(str(tmp_path / "outputs.safetensors"))
    tok = f5.Tokenizer.from_file(tmp_path / "vocab.txt")
    assert got.vocab_file == tmp_path / "vocab.txt" and tok.size == 2545
    m = f5.F5TTS(replace(f5.CONFIGS["default"], text_num_embeds=tok.size, upstream_forward=True))
    m.load_state_dict(got.weights, strict=True)
    # 335,924,836 with a byte vocabulary, plus (2545 - 256) x 512 for the released pinyin one
    assert f5.count_parameters(m) == int(theirs["parameters"]) == 337_096_804
    assert_same_outputs(our_outputs(m.eval(), make_inputs()), theirs, "base")


# ----------------------------------------------------------------------------- F5's training rules

def test_ema_is_f5_trainers_ema(oracle):
    """Replaying the online weights F5's Trainer saved through EmaHook gives the EMA it saved, update for update
    (ema_pytorch's copy at the first update, copies every 10 until 100, then lerps with its decay warmup)."""
    hook = f5.EmaHook()
    online = {u: ck.read_f5_checkpoint(oracle / "ckpts" / f"model_{u}.pt").online_weights
              for u in range(1, UPDATES + 1) if (oracle / "ckpts" / f"model_{u}.pt").exists()}
    model = our_model(online[1])
    hook.on_start(model, resumed=False)
    for u in range(1, UPDATES + 1):
        if u in online:  # the EMA only reads the weights at these updates; the others are not kept
            model.load_state_dict(online[u])
        hook.after_step(u, model)
    last = ck.read_f5_checkpoint(oracle / "ckpts" / "model_last.pt")
    assert hook.step == last.ema_step == UPDATES and hook.initted
    lerps = [u for u in online if u > 101]
    assert len(lerps) >= 2 and 0.8 < hook.decay() < 0.9  # past the copies, into the decay warmup
    for k, v in last.ema_weights.items():
        torch.testing.assert_close(hook.weights[k], v, rtol=0, atol=1e-6, msg=lambda m: f"{k}: {m}")
    assert not torch.equal(last.ema_weights[k], online[max(online)][k])


def test_lr_schedule_is_f5_trainers(oracle):
    """F5's LinearLR warmup + LinearLR decay, read from the scheduler state its Trainer saved after each update."""
    from audiopipe.checkpoints.files import read_weights

    seen = 0
    for u in range(1, UPDATES + 1):
        p = oracle / "ckpts" / f"model_{u}.pt"
        if not p.exists():
            continue
        used_next = read_weights(p)["scheduler_state_dict"]["_last_lr"][0]  # the LR of update u + 1
        assert f5.f5_lr(u, LR, WARMUP, UPDATES) == pytest.approx(used_next, rel=1e-6, abs=1e-12), u
        seen += 1
    assert seen > 10 and f5.f5_lr(0, LR, WARMUP, UPDATES) == pytest.approx(LR * 1e-8)


# ----------------------------------------------------------------------------- our files out

def _fake_run(folder: Path, online, ema, step: int, ema_step: int, **cfg_kw) -> Path:
    """A run folder as trainers/train_f5tts.py leaves it (checkpoint with the EMA hook, config, vocab)."""
    folder.mkdir(parents=True)
    write_torch({"step": step, "model": online, "hooks": {"ema": {"step": ema_step, "initted": True,
                                                                    "weights": ema}}},
                folder / f"ckpt-{step:08d}.pt")
    (folder / "model_config.json").write_text(json.dumps({"trainer": "f5tts", "tokenizer": "vocab",
                                                          "model": asdict(our_config(**cfg_kw))}))
    (folder / "vocab.txt").write_text("".join(s + "\n" for s in VOCAB), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def finetuned(oracle, f5_shards, tmp_path_factory) -> tuple[Path, str]:
    """F5's Trainer checkpoint fine-tuned on real shards by the trainer under torchrun (2 ranks), 6 updates."""
    d = tmp_path_factory.mktemp("f5_finetune")
    cfg = d / "parity.json"
    cfg.write_text(json.dumps({**ARCH, "conv_pos_kernel": 31, "conv_pos_groups": 16}))
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(ROOT / "trainers" / "train_f5tts.py"),
           "--shards", str(f5_shards), "--config", str(cfg), "--out", str(d / "run"), "--max-steps", "6",
           "--batch-frames", "1600", "--log-every", "1", "--ckpt-every", "6", "--lr", "1e-3", "--warmup-steps", "2",
           "--init-from", str(oracle / "ckpts" / "model_last.pt"), "--vocab", str(oracle / "vocab.txt")]
    r = run_group(cmd, timeout=240, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return d / "run", r.stdout


@pytest.fixture(scope="module")
def exported(oracle, finetuned, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two runs exported with `audiopipe export-checkpoint --format both`, then loaded by F5's code (one oracle
    call): the torchrun fine-tune above, and a run folder whose EMA and online weights differ a lot."""
    from audiopipe.cli import main as cli

    d = tmp_path_factory.mktemp("f5_export")
    (d / "inputs.safetensors").symlink_to(oracle / "inputs.safetensors")
    start = ck.read_f5_checkpoint(oracle / "released.safetensors").weights
    g = torch.Generator().manual_seed(1)
    online = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in start.items()}
    ema = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in start.items()}
    run = _fake_run(d / "made", online, ema, step=30, ema_step=155, upstream_forward=True)
    # the `tiny` preset (README's first run): F5's DiT builds it, so it exports
    tiny_w = {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in
              f5.F5TTS(our_config(**TINY, upstream_forward=True)).state_dict().items()}
    tiny = _fake_run(d / "tiny", tiny_w, tiny_w, step=20, ema_step=20, **TINY, upstream_forward=True)
    for src, name in ((run, "export_made"), (finetuned[0], "export_finetuned"), (tiny, "export_tiny")):
        assert cli(["export-checkpoint", str(src), "--out", str(d / name), "--format", "both"]) == 0
    assert cli(["export-checkpoint", str(run), "--out", str(d / "export_made")]) == 2  # no silent overwrite
    run_upstream("f5tts_oracle.py", "load", d)
    return d, ema, online


def test_export_loads_strictly_in_f5s_inference_and_finetuning(exported):
    d, ema, online = exported
    assert sorted(p.name for p in (d / "export_made").iterdir()) == [
        "model_30.pt", "model_30.safetensors", "model_cfg.yaml", "vocab.txt"]
    theirs = load_file(str(d / "export_outputs.safetensors"))
    ours = our_outputs(our_model(ema, upstream_forward=True), make_inputs())
    for name in ("export_made/model_30.safetensors", "export_made/model_30.pt"):
        assert_same_outputs(ours, theirs, name)  # F5's inference reads the EMA weights
        assert_same_outputs(ours, theirs, f"finetune.{name}")  # and fine-tunes from them
        assert int(theirs[f"ema_step.{name}"]) == 155  # its EMA continues from our EMA's count
    tiny = our_outputs(our_model(ck.read_f5_checkpoint(d / "export_tiny" / "model_20.pt").ema_weights,
                                 **TINY, upstream_forward=True), make_inputs())
    assert_same_outputs(tiny, theirs, "export_tiny/model_20.safetensors")  # the tiny preset runs in F5 as here
    back = ck.read_f5_checkpoint(d / "export_made" / "model_30.pt")  # and the way back is the identity
    assert all(torch.equal(back.online_weights[k], online[k]) and torch.equal(back.ema_weights[k], ema[k])
               for k in online)


def test_f5_checkpoint_fine_tunes_under_torchrun_and_goes_back(oracle, finetuned, exported):
    """F5's Trainer checkpoint in, 6 updates on real shards with 2 ranks, F5's files out, F5's code runs them."""
    run, stdout = finetuned
    start = ck.read_f5_checkpoint(oracle / "ckpts" / "model_last.pt")
    assert "forward upstream" in stdout and "F5-TTS training checkpoint, EMA weights" in stdout
    assert "the EMA continues from its weights at update 125" in stdout
    assert "new (kept as initialised): none; dropped (not in this model): none" in stdout
    cfg = json.loads((run / "model_config.json").read_text())
    assert cfg["model"]["upstream_forward"] and cfg["trainer"] == "f5tts"
    mine = ck.read_f5_checkpoint(run)
    assert mine.step == 6 and mine.ema_step == UPDATES + 6
    # F5's EMA rule from the checkpoint's count: only update 131 (count 130) moves it, by 1 - decay(131)
    hook = f5.EmaHook()
    hook.step = UPDATES + 6
    w = 1 - hook.decay()
    for k, v in mine.ema_weights.items():
        torch.testing.assert_close(v, start.ema_weights[k].lerp(mine.online_weights[k], w), rtol=0, atol=1e-6)
    assert any(not torch.equal(mine.online_weights[k], start.weights[k]) for k in start.weights)
    d = exported[0]
    theirs = load_file(str(d / "export_outputs.safetensors"))
    ours = our_outputs(our_model(mine.ema_weights, upstream_forward=True), make_inputs())
    for name in ("model_6.safetensors", "model_6.pt"):
        assert_same_outputs(ours, theirs, f"export_finetuned/{name}")
        assert int(theirs[f"ema_step.export_finetuned/{name}"]) == UPDATES + 6


# ----------------------------------------------------------------------------- without the oracle

def test_names_round_trip_and_unknown_tensors_are_refused():
    m = f5.F5TTS(our_config())
    state = m.state_dict()
    up = ck.to_upstream(state, dim_head=16)
    assert len(up) == len(state) + 1 and ck.ROTARY in up
    back, dim_head = ck.from_upstream(up)
    assert dim_head == 16 and back.keys() == state.keys()
    assert all(back[k] is v for k, v in state.items())
    with pytest.raises(CheckpointError, match="q_norm"):
        ck.from_upstream({**up, "transformer.transformer_blocks.0.attn.q_norm.weight": torch.ones(16)})
    with pytest.raises(CheckpointError, match="rotary"):
        ck.from_upstream({**up, ck.ROTARY: up[ck.ROTARY] * 2})
    with pytest.raises(CheckpointError, match="no place"):
        ck.to_upstream({**m.state_dict(), "transformer.extra.weight": torch.ones(1)}, dim_head=16)
    legacy = {**up, "mel_spec.mel_stft.mel_scale.fb": torch.ones(3)}  # old F5 files: dropped, as F5 drops them
    assert ck.from_upstream(legacy)[0].keys() == back.keys()


def _released(tmp_path: Path, vocab: list[str] | None, **cfg_kw) -> Path:
    """An F5-style released file (EMA state dict) of a random model, with vocab.txt beside it when given."""
    n = len(vocab) if vocab else 256
    m = f5.F5TTS(replace(our_config(**cfg_kw), text_num_embeds=n))
    folder = tmp_path / "F5TTS_small"
    folder.mkdir(exist_ok=True)
    path = ck.write_upstream_safetensors(folder / "model_9.safetensors", weights=m.state_dict(), ema_step=9,
                                         dim_head=cfg_kw.get("dim_head", ARCH["dim_head"]))
    if vocab:
        (folder / "vocab.txt").write_text("".join(s + "\n" for s in vocab), encoding="utf-8")
    return path


def _main_error(tmp_path: Path, *args: str) -> str:
    cfg = tmp_path / "parity.json"
    cfg.write_text(json.dumps({**ARCH, "conv_pos_kernel": 31, "conv_pos_groups": 16}))
    # --init-from is refused before any shard is read: a folder that only passes the flags' check will do
    shards = tmp_path / "shards"
    shards.mkdir(exist_ok=True)
    (shards / "manifest.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        f5.main(["--shards", str(shards), "--out", str(tmp_path / "run"), "--config", str(cfg), *args])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("f5tts: error: --") and "--init-from" in msg
    return msg


def test_init_from_refuses_a_vocabulary_mismatch_in_one_line(tmp_path):
    released = _released(tmp_path, VOCAB)
    msg = _main_error(tmp_path, "--init-from", str(released))  # byte tokenizer against a char vocabulary
    assert f"{len(VOCAB)}-symbol vocab.txt" in msg and "UTF-8 bytes" in msg and "--vocab" in msg
    assert str(released.parent / "vocab.txt") in msg
    other = tmp_path / "other.txt"
    other.write_text("".join(s + "\n" for s in VOCAB[:50]), encoding="utf-8")
    msg = _main_error(tmp_path, "--init-from", str(released), "--vocab", str(other))
    assert f"has {len(VOCAB)} text symbols but --vocab {other} has 50" in msg
    shuffled = tmp_path / "shuffled.txt"
    shuffled.write_text("".join(s + "\n" for s in [VOCAB[0], VOCAB[2], VOCAB[1], *VOCAB[3:]]), encoding="utf-8")
    msg = _main_error(tmp_path, "--init-from", str(released), "--vocab", str(shuffled))
    assert "2 of its" in msg and "other ids" in msg


def test_init_from_names_the_config_that_fits(tmp_path):
    released = _released(tmp_path, VOCAB, depth=3)
    msg = _main_error(tmp_path, "--init-from", str(released), "--vocab", str(released.parent / "vocab.txt"))
    assert "depth 3" in msg and "depth 2" in msg and "JSON" in msg


def test_init_from_refuses_a_malicious_pickle_and_a_stranger(tmp_path, capsys):
    from test_checkpoint_files import _Evil

    marker = tmp_path / "pwned"
    evil = tmp_path / "model_1.pt"
    torch.save({"ema_model_state_dict": {"x": torch.zeros(1)}, "payload": _Evil(marker)}, evil)
    assert "refused" in _main_error(tmp_path, "--init-from", str(evil)) and not marker.exists()
    stranger = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(2)}, str(stranger))
    with pytest.raises(SystemExit) as e:  # refused before anything else is read (init_family.py): exit 2
        f5.main(["--shards", str(tmp_path / "shards"), "--out", str(tmp_path / "run"), "--init-from", str(stranger)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and f"{stranger}: not an F5-TTS checkpoint" in err


def test_export_refusals(tmp_path):
    from audiopipe.cli import main as cli

    m = f5.F5TTS(our_config()).state_dict()
    run = tmp_path / "run"
    run.mkdir()
    write_torch({"step": 3, "model": m, "hooks": {}}, run / "ckpt-00000003.pt")
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "x")]) == 2  # no model_config.json: which?
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "x"), "--model", "f5tts"]) == 2
    (run / "model_config.json").write_text(json.dumps({"trainer": "f5tts", "tokenizer": "byte",
                                                       "model": asdict(our_config())}))
    with pytest.raises(CheckpointError, match="no EMA weights.*--weights online"):
        ck.export_run(run, tmp_path / "x", weights="ema")
    summary = ck.export_run(run, tmp_path / "x")  # default: the online weights when no EMA was kept
    assert summary["weights"] == "online" and any("byte" in n for n in summary["notes"])
    with pytest.raises(CheckpointError, match="already in F5-TTS's format"):
        ck.export_run(tmp_path / "x" / "model_3.safetensors", tmp_path / "y")
    k7 = tmp_path / "k7"  # a position convolution F5's DiT cannot build (its kernel is fixed at 31)
    k7.mkdir()
    mcfg = replace(f5.CONFIGS["tiny"], conv_pos_kernel=7)
    write_torch({"step": 3, "model": f5.F5TTS(mcfg).state_dict()}, k7 / "ckpt-00000003.pt")
    (k7 / "model_config.json").write_text(json.dumps({"trainer": "f5tts", "tokenizer": "byte",
                                                      "model": asdict(mcfg)}))
    with pytest.raises(CheckpointError, match="kernel 7.*31"):
        ck.export_run(k7, tmp_path / "z")


def test_init_from_options_ema_restart_cosine_and_a_kept_forward(f5_shards, tmp_path):
    """--ema-restart counts the EMA from 0 (F5 would continue the file's 9 updates); --lr-schedule cosine is
    core's; a resumed run keeps the forward it was trained with, and says so when told otherwise."""
    import core

    released = _released(tmp_path, VOCAB)
    cfg = tmp_path / "parity.json"
    cfg.write_text(json.dumps({**ARCH, "conv_pos_kernel": 31, "conv_pos_groups": 16}))
    out = tmp_path / "run"
    common = ["--shards", str(f5_shards), "--out", str(out), "--config", str(cfg), "--batch-frames", "1600",
              "--log-every", "1", "--vocab", str(released.parent / "vocab.txt"), "--lr", "1e-3"]
    f5.main([*common, "--max-steps", "2", "--init-from", str(released), "--ema-restart", "--lr-schedule", "cosine",
             "--warmup-steps", "1"])
    state = torch.load(out / "ckpt-00000002.pt", weights_only=True)
    assert state["hooks"]["ema"]["step"] == 2 and state["hooks"]["ema"]["initted"]
    rc = core.RunConfig(lr=1e-3, warmup_steps=1, max_steps=2)
    assert [json.loads(x)["lr"] for x in (out / "log.jsonl").read_text().splitlines()] == \
        [core.lr_at(0, rc), core.lr_at(1, rc)]
    assert json.loads((out / "model_config.json").read_text())["model"]["upstream_forward"]
    with pytest.raises(SystemExit, match="trained with the upstream forward; a resumed run keeps it"):
        f5.main([*common, "--max-steps", "3", "--resume", "--forward", "masked"])


def test_export_checkpoint_serves_the_speaker_models_too(tmp_path, capsys):
    """One command for every trainer: the speaker runs (model_config.json {"model": "eres2net", ...}) go through
    audiopipe.checkpoints.speaker's export, as an experiment folder or the embedding model's file."""
    from audiopipe.cli import main as cli
    from test_checkpoint_speaker import SMALL, write_our_run

    state = write_our_run(tmp_path / "run", "eres2net", SMALL["eres2net"], num_classes=9)
    assert cli(["export-checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 0
    assert "speakerlab/bin/extract.py --exp_dir" in capsys.readouterr().out
    emb = torch.load(tmp_path / "exp" / "models" / "CKPT-EPOCH-3-00" / "embedding_model.ckpt", weights_only=True)
    assert torch.equal(emb["seg_1.weight"], state["encoder.embed.weight"])
    assert cli(["export-checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "exp")]) == 2  # kept
    assert cli(["export-checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "f"), "--format", "file"]) == 0
    assert torch.equal(torch.load(tmp_path / "f" / "embedding_model.ckpt", weights_only=True)["seg_1.weight"],
                       state["encoder.embed.weight"])
    assert cli(["export-checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "g"), "--weights", "ema"]) == 2
    assert cli(["export-checkpoint", str(tmp_path / "run"), "--out", str(tmp_path / "g"), "--format", "pt"]) == 2
