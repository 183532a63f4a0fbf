"""NS2 weights between audiopipe and Amphion, against Amphion's own code.

tests/data/ns2_amphion/ was made by Amphion's code (tests/upstream/ns2_fixture.py `make`, from an Amphion checkout):
its NaturalSpeech2 class at a small config, the checkpoint accelerate's save_state wrote for it, and its forward
outputs and trainer loss terms on a fixed padded batch. Here: that checkpoint loads into ours through the
trainer's --init-from reader, our model in Amphion's forward mode gives Amphion's outputs within 1e-5, and our
export has exactly Amphion's tensors. Where an Amphion checkout is given (AUDIOPIPE_AMPHION_SRC, a work tree or a
git dir, with the side venv of tests/upstream), Amphion's class loads our export strictly and its outputs are ours.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from audiopipe.checkpoints.files import CheckpointError
from audiopipe.checkpoints.load import ShapeMismatch, load_matching
from audiopipe.checkpoints.ns2 import (
    AMPHION_PHONES,
    amphion_phone_map,
    config_from_upstream,
    export_cli,
    export_run,
    from_upstream,
    read_upstream,
    to_upstream,
    upstream_config,
)
from audiopipe.text.en_phones import PHONES
from train_ns2 import (
    AMPHION_FORWARD,
    INIT_HINTS,
    LEGACY_RULES,
    NS2Config,
    NaturalSpeech2,
    PhoneRemap,
    make_init_reader,
)
from upstream_oracle import run_upstream, upstream_source

FIXTURE = Path(__file__).parent / "data" / "ns2_amphion"
META = json.loads((FIXTURE / "meta.json").read_text())
OUTPUTS = ("x0_pred", "noise_pred", "dur_pred_log", "pitch_pred_log")


def fixture_config(**changes) -> NS2Config:
    codec = META["codec"]
    return NS2Config(**{**config_from_upstream(META["model"]), "n_codebooks": codec["n_q"],
                        "codec_layers": codec["n_q"], "codebook_size": codec["bins"], **changes})


def amphion_rules(**changes) -> NS2Config:
    """The fixture's config as a run records it when trained with Amphion's rules (--forward amphion
    --prompt-rule phones --phone-table amphion): what export-checkpoint writes without a word."""
    return fixture_config(**{**AMPHION_FORWARD, "prompt_rule": "phones", "phone_table": "amphion", **changes})


def fixture_io() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    io = load_file(str(FIXTURE / "io.safetensors"))
    return {k[3:]: v for k, v in io.items() if k.startswith("in.")}, io


def amphion_model(state=None, **changes) -> NaturalSpeech2:
    """Our model in Amphion's forward mode with the fixture's weights, loaded as --init-from loads them."""
    model = NaturalSpeech2(fixture_config(**{**AMPHION_FORWARD, **changes})).eval()
    report = load_matching(model, state or make_init_reader(None, 4)(str(FIXTURE / "amphion_checkpoint")),
                           INIT_HINTS)
    assert report.new == ["align_proj.weight", "align_proj.bias"] and report.dropped == []
    return model


def our_outputs(model: NaturalSpeech2, x: dict, io: dict) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return model.amphion_forward(**x, t=io["t"], noise=io["noise"])


def test_amphion_checkpoint_loads_and_gives_amphions_outputs():
    x, io = fixture_io()
    model = amphion_model()
    out = our_outputs(model, x, io)
    # Every output on every position (Amphion's forward leaves padding unmasked; so does ours in its mode).
    for k in OUTPUTS:
        theirs = io[k]
        ours = out[{"dur_pred_log": "dur_log", "pitch_pred_log": "pitch_log"}.get(k, k)]
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0, msg=k)
    for ours, theirs in (("pitch", "pitch"), ("duration", "duration"), ("x0", "x0"), ("noise", "noise"),
                         ("ce", "ce"), ("loss", "loss")):
        assert abs(out[ours].item() - io[f"loss.{theirs}"].item()) < 1e-5, ours
    assert torch.equal(model.latent(x["code"]), io["latent"]), "the latent is the frozen quantizer's decode"
    assert torch.equal(model.requantize(io["latent"]), io["gt_indices"]), "Amphion's latent_to_code labels"


def test_our_forward_differs_from_amphions_where_it_deliberately_does():
    """audiopipe's forward (one position per time step, padding masked) is another function of the same weights:
    the fixture's padded batch shows it; each of Amphion's choices alone closes part of the gap."""
    x, io = fixture_io()
    gaps = {}
    for name, changes in {"audiopipe": dict(positions="time", mask_padding=True, ce_labels="codes"),
                          "time positions only": dict(positions="time"),
                          "masked padding only": dict(mask_padding=True)}.items():
        out = our_outputs(amphion_model(**changes), x, io)
        real = x["mask"].bool()[:, None]
        gaps[name] = float(((out["x0_pred"] - io["x0_pred"]).abs() * real).max())
    assert all(g > 1e-3 for g in gaps.values()), gaps


def test_export_has_amphions_tensors_exactly():
    theirs = torch.load(FIXTURE / "amphion_checkpoint" / "pytorch_model.bin", weights_only=True)
    ours = read_upstream(FIXTURE / "amphion_checkpoint")
    back = to_upstream(ours)
    assert sorted(back) == sorted(theirs)
    for k in theirs:
        assert back[k].shape == theirs[k].shape and back[k].dtype == theirs[k].dtype, k
        torch.testing.assert_close(back[k], theirs[k], atol=0, rtol=0, msg=k)  # sinusoid tables included
    assert [list(v.shape) for v in back.values()] == [META["shapes"][k] for k in back]
    # Both ways: ours -> Amphion -> ours is the identity (our align_proj has no Amphion counterpart).
    model = NaturalSpeech2(fixture_config())
    mine = {k: v for k, v in model.state_dict().items()}
    again = from_upstream(to_upstream(mine))
    assert sorted(again) == sorted(k for k in mine if not k.startswith("align_proj."))
    assert all(torch.equal(again[k], mine[k]) for k in again)


def test_export_folder_and_config(tmp_path):
    """Our run folder -> Amphion's checkpoint folder: pytorch_model.bin (what its inference loads), optionally
    model.safetensors, and Amphion's model config when the run recorded ours."""
    model = amphion_model()
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"step": 3, "model": model.state_dict(), "optimizer": {}}, run / "ckpt-00000003.pt")
    cfg = dataclasses.asdict(fixture_config())
    (run / "ns2_config.json").write_text(json.dumps(cfg))
    out = export_run(run, tmp_path / "amphion", safetensors=True)
    assert sorted(p.name for p in out.iterdir()) == ["exp_config.json", "model.safetensors", "pytorch_model.bin"]
    exported = json.loads((out / "exp_config.json").read_text())
    assert exported["model"] == json.loads(json.dumps(upstream_config(cfg)))
    # Amphion's config for the fixture, back through our reading of it: the same model section.
    assert config_from_upstream(exported["model"]) == config_from_upstream(META["model"])
    for f in ("pytorch_model.bin", "model.safetensors"):
        state = read_upstream(out / f)
        assert all(torch.equal(state[k], v) for k, v in model.state_dict().items() if k in state)


def test_mismatches_end_in_one_line_that_names_the_flag(tmp_path):
    state = make_init_reader(None, 4)(str(FIXTURE / "amphion_checkpoint"))
    model = NaturalSpeech2(fixture_config(vocab_size=120))
    with pytest.raises(ShapeMismatch) as e:
        load_matching(model, state, INIT_HINTS)
    msg = str(e.value)
    assert "\n" not in msg and "phone_emb.weight" in msg and "vocab_size" in msg and "--phone-table" in msg
    model = NaturalSpeech2(fixture_config(codebook_size=32))
    with pytest.raises(ShapeMismatch, match="codec_layers / codebook_size"):
        load_matching(model, state, INIT_HINTS)
    # Amphion's file under another name would load nothing and select none of Amphion's modes: refused.
    renamed = tmp_path / "ns2_amphion.bin"
    shutil.copy(FIXTURE / "amphion_checkpoint" / "pytorch_model.bin", renamed)
    with pytest.raises(CheckpointError, match="holds Amphion's NS2 tensors: give its folder, or name the file"):
        make_init_reader(None, 4)(str(renamed))
    # The shards' codec must be the checkpoint's: other codebooks are refused, naming the fix.
    other = {"quantizer.embed": state["quantizer.embed"] + 0.5}
    with pytest.raises(CheckpointError, match="codebooks differ.*shard with the codec"):
        make_init_reader(other, 4)(str(FIXTURE / "amphion_checkpoint"))


def test_export_refuses_rules_amphion_does_not_run_unless_allowed(tmp_path, capsys):
    """A run whose prompt rule, phone table or forward is not Amphion's (audiopipe's rules, chosen by flag), or
    whose ns2_config.json is gone, is refused in one line naming each; --allow-different writes it and prints each
    difference; a run with Amphion's rules (the trainer's defaults) exports without a note."""
    from audiopipe.checkpoints.rules import ExportDiffers
    from audiopipe.cli import main as cli

    model = NaturalSpeech2(fixture_config())
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"step": 2, "model": model.state_dict(), "optimizer": {}}, run / "ckpt-00000002.pt")
    flags = {"--phone-table audiopipe": dict(phone_table="audiopipe"), "--prompt-rule frames":
             dict(prompt_rule="frames"), "--forward (positions) time": dict(positions="time"),
             "--forward (padding) True": dict(mask_padding=True)}
    for named, change in flags.items():
        (run / "ns2_config.json").write_text(json.dumps(dataclasses.asdict(amphion_rules(**change))))
        with pytest.raises(ExportDiffers) as e:
            export_cli(run, tmp_path / "x")
        assert "\n" not in str(e.value) and named in str(e.value) and str(e.value).count("(upstream: ") == 1
    assert not (tmp_path / "x").exists()
    # audiopipe's rules (--prompt-rule frames --phone-table audiopipe --forward audiopipe): all four, through the
    # command
    (run / "ns2_config.json").write_text(json.dumps(dataclasses.asdict(fixture_config(**LEGACY_RULES))))
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert all(f in err for f in flags) and "--allow-different" in err and not (tmp_path / "x").exists()
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "x"), "--allow-different"]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: computes differently")]
    assert len(notes) == 4 and all(any(f in n for n in notes) for f in flags)
    assert (tmp_path / "x" / "pytorch_model.bin").is_file()
    (run / "ns2_config.json").write_text(json.dumps(dataclasses.asdict(amphion_rules(ce_labels="codes"))))
    assert export_cli(run, tmp_path / "y")["notes"] == []  # the loss's labels do not change the forward
    (run / "ns2_config.json").write_text(json.dumps(dataclasses.asdict(fixture_config())))  # the defaults
    assert export_cli(run, tmp_path / "w")["notes"] == []
    (run / "ns2_config.json").unlink()
    with pytest.raises(ExportDiffers, match="ns2_config.json missing"):
        export_cli(run, tmp_path / "z")


def test_untrusted_files_are_refused_in_one_line(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned > " + str(tmp_path / "owned"),))

    folder = tmp_path / "ck"
    folder.mkdir()
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"prior_encoder.x": Evil()}, f)
    with pytest.raises(CheckpointError, match="refused") as e:
        read_upstream(folder)
    assert "\n" not in str(e.value) and not (tmp_path / "owned").exists()
    with pytest.raises(CheckpointError, match="no model.safetensors or pytorch_model.bin"):
        read_upstream(tmp_path)
    torch.save({"weight": torch.zeros(2)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="not an Amphion NaturalSpeech2 checkpoint"):
        read_upstream(folder)


def test_phone_table_is_amphions_and_remaps_shard_ids():
    assert list(AMPHION_PHONES) == META["phone_table"]  # what Amphion's get_phone_map builds
    lut = amphion_phone_map(PHONES)
    words = ["HH", "AH0", "L", "OW1", ",", "|", "W", "ER1", "L", "D", "."]
    ids = [PHONES.index(w) for w in words]

    def batch(**more):
        return {"phones": torch.tensor([ids, ids[:4] + [0] * 7], dtype=torch.int16),
                "phones_mask": torch.tensor([[True] * 11, [True] * 4 + [False] * 7]),
                "phones_lengths": torch.tensor([11, 4]), **more}

    out = PhoneRemap(lut)(batch())
    expect = ["HH", "AH0", "L", "OW1", "sp", "W", "ER1", "L", "D", "sp"]  # "|" dropped, punctuation read as sp
    assert [AMPHION_PHONES[i] for i in out["phones"][0].tolist()] == expect
    assert out["phones_lengths"].tolist() == [10, 4] and out["phones_mask"].sum(1).tolist() == [10, 4]
    assert out["phones"][1, 4:].eq(0).all()
    # MFA durations ride along (collate pads them to the widest row that has any: 0 wide when none has).
    out = PhoneRemap(lut)(batch(durations=torch.zeros(2, 0, dtype=torch.int32),
                                durations_lengths=torch.tensor([0, 0])))
    assert out["durations"].shape == (2, 10) and out["durations_lengths"].tolist() == [0, 0]
    dur = torch.tensor([[3, 2, 2, 4, 1, 0, 2, 3, 2, 2, 1], [2, 2, 3, 1] + [0] * 7])
    out = PhoneRemap(lut)(batch(durations=dur.clone(), durations_lengths=torch.tensor([11, 4])))
    assert out["durations"][0].tolist() == [3, 2, 2, 4, 1, 2, 3, 2, 2, 1]
    assert out["durations_lengths"].tolist() == [10, 4]
    dur[0, 5] = 2  # frames on the word boundary: they would be lost
    with pytest.raises(ValueError, match="holds 2 frames of its MFA alignment"):
        PhoneRemap(lut)(batch(durations=dur, durations_lengths=torch.tensor([11, 4])))
    with pytest.raises(CheckpointError, match="no entry in Amphion's phone table"):
        amphion_phone_map(list(PHONES) + ["ʃ"])


# ----------------------------------------------------------------------------- Amphion's code itself


def amphion_source(tmp_path_factory) -> Path:
    return upstream_source("AUDIOPIPE_AMPHION_SRC", "Amphion is not on the package registry: set AUDIOPIPE_AMPHION_SRC "
                           "to a checkout of github.com/open-mmlab/Amphion to run its code against our export",
                           "models/tts/naturalspeech2", ["models/tts/naturalspeech2", "modules/naturalpseech2",
                                                         "text/cmudict.py"], tmp_path_factory)


def test_amphion_loads_our_cli_export_strictly_with_equal_outputs(tmp_path, tmp_path_factory):
    """`audiopipe export-checkpoint` on an NS2 run folder (model found by its ns2_config.json): Amphion's folder,
    loaded by Amphion's own code with outputs equal to ours; no silent overwrite; EMA and unknown formats refused."""
    from audiopipe.cli import main as cli

    x, io = fixture_io()
    model = amphion_model()
    # Weights of our own making (a few optimizer steps on the fixture's batch), so nothing is Amphion's anymore.
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(3):
        loss = model.amphion_forward(**x, t=io["t"], noise=io["noise"])["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"step": 5, "model": model.state_dict(), "optimizer": {}}, run / "ckpt-00000005.pt")
    (run / "ns2_config.json").write_text(json.dumps(dataclasses.asdict(amphion_rules())))
    out = tmp_path / "export"
    assert cli(["export-checkpoint", str(run), "--out", str(out), "--format", "both"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["exp_config.json", "model.safetensors", "pytorch_model.bin"]
    assert cli(["export-checkpoint", str(run), "--out", str(out)]) == 2  # no silent overwrite
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "e"), "--weights", "ema"]) == 2
    assert cli(["export-checkpoint", str(run), "--out", str(tmp_path / "e"), "--format", "pt"]) == 2
    assert cli(["export-checkpoint", str(run), "--out", str(out), "--overwrite"]) == 0
    src = amphion_source(tmp_path_factory)
    run_upstream("ns2_fixture.py", "check", src, FIXTURE, out, tmp_path / "out")
    theirs = load_file(str(tmp_path / "out" / "io.safetensors"))
    ours = our_outputs(model, x, io)
    assert not torch.allclose(theirs["x0_pred"], io["x0_pred"]), "the trained weights must change the outputs"
    for k in OUTPUTS:
        torch.testing.assert_close(ours[{"dur_pred_log": "dur_log", "pitch_pred_log": "pitch_log"}.get(k, k)],
                                   theirs[k], atol=1e-5, rtol=0, msg=k)
    assert abs(ours["loss"].item() - theirs["loss.loss"].item()) < 1e-5
    # accelerate's safetensors layout (one name of the shared phone embedding) reads back to the same weights.
    st = read_upstream(tmp_path / "out" / "accelerate" / "model.safetensors")
    assert all(torch.equal(st[k], v) for k, v in model.state_dict().items() if k in st)
