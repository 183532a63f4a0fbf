"""--init-from another model family's checkpoint: every trainer refuses it in one line, exit 2, before any work.

The files are real: a train_f5tts run's ckpt-*.pt and its F5-TTS export, a train_eres2net run's ckpt-*.pt, and
the exports for the other three families (Amphion's folder, GPT-SoVITS's .ckpt, speakerlab's CAM++ file) written
by audiopipe.checkpoints from tiny models. Every trainer is given every other family's files through its main.
The speaker trainers get their PCM shards and train_f5tts its mel shards; train_ns2 and train_gpt_sovits get the
mel shards too (theirs need a codec and k-means tokens): the check runs before a trainer reads its shards, so the
line comes from --init-from alone. (Before it, train_eres2net trained from scratch on an F5 checkpoint, exit 0,
and train_f5tts ended an ERes2Net one in a traceback.)
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speaker
import train_campplus
import train_eres2net
import train_f5tts
import train_gpt_sovits
import train_ns2
from audiopipe.checkpoints import family as fam
from audiopipe.checkpoints import f5tts as f5_io
from audiopipe.checkpoints import gpt_sovits as gs_io
from audiopipe.checkpoints import ns2 as ns2_io
from audiopipe.checkpoints import speaker as spk_io
from shard_helpers import shard

ROOT = Path(__file__).resolve().parent.parent
TRAINERS = {"f5tts": train_f5tts, "ns2": train_ns2, "gpt_sovits": train_gpt_sovits, "eres2net": train_eres2net,
            "campplus": train_campplus}
SR = 16000

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _speaker(family: str) -> torch.nn.Module:
    mod = TRAINERS[family]
    net = (mod.ERes2Net if family == "eres2net" else mod.CAMPPlus)(mod.CONFIGS["tiny"])
    return speaker.SpeakerModel(net, mod.CONFIGS["tiny"].embedding_size, 6, lambda *_: 0.2)


def _models() -> dict[str, torch.nn.Module]:
    """Each trainer's tiny model, as the trainer builds it."""
    return {"f5tts": train_f5tts.F5TTS(train_f5tts.CONFIGS["tiny"]),
            "ns2": train_ns2.NaturalSpeech2(train_ns2.CONFIGS["tiny"]),
            "gpt_sovits": train_gpt_sovits.Text2Semantic(train_gpt_sovits.CONFIGS["tiny"]),
            "eres2net": _speaker("eres2net"), "campplus": _speaker("campplus")}


def _upstream_names(family: str, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"f5tts": lambda s: f5_io.to_upstream(s, dim_head=train_f5tts.CONFIGS["tiny"].dim_head),
            "ns2": ns2_io.to_upstream, "gpt_sovits": gs_io.to_upstream,
            "eres2net": spk_io.eres2net_to_upstream, "campplus": spk_io.campplus_to_upstream}[family](state)


class Files(dict):
    """{family: its files}, and the PCM shards the speaker trainers read."""

    spk_shards: Path


@pytest.fixture(scope="module")
def files(f5_shards, espeak_corpus, tmp_path_factory) -> dict[str, list[Path]]:
    """{family: [checkpoint files and folders of that family]}, as our trainers and exports write them."""
    tmp = tmp_path_factory.mktemp("families")
    torch.manual_seed(0)
    models = _models()
    # train_f5tts, one step: its ckpt-*.pt, and that run exported as F5-TTS's .safetensors
    f5_run = tmp / "f5_run"
    train_f5tts.main(["--shards", str(f5_shards), "--config", "tiny", "--out", str(f5_run), "--max-steps", "1",
                      "--batch-frames", "1600", "--prefetch", "0"])
    f5_export = f5_io.export_run(f5_run, tmp / "f5_export")["files"]
    # train_eres2net, one step on 16 kHz PCM shards: its ckpt-*.pt
    spk_shards = tmp / "spk_shards"
    shard(espeak_corpus.root, spk_shards, [("pcm", {"sample_rate": SR})])
    er_run = tmp / "eres2net_run"
    train_eres2net.main(["--shards", str(spk_shards), "--config", "tiny", "--out", str(er_run), "--max-steps", "1",
                         "--batch-frames", str(4 * SR), "--crop-seconds", "1", "--cpu-threads", "1",
                         "--prefetch", "0"])
    # the exports of the other families' tiny models
    ns2_folder = ns2_io.write_upstream(models["ns2"].state_dict(), tmp / "amphion_ns2")
    gs_file = gs_io.write_upstream(models["gpt_sovits"].state_dict(), tmp / "s1.ckpt",
                                   gs_io.upstream_config(dataclasses.asdict(train_gpt_sovits.CONFIGS["tiny"])),
                                   "tiny", "fp32")
    made = Files()
    cp_file = spk_io.write_embedding_file(spk_io.campplus_to_upstream(models["campplus"].state_dict()),
                                          tmp / "campplus_voxceleb.bin")
    made.update({"f5tts": [sorted(f5_run.glob("ckpt-*.pt"))[-1], *(Path(p) for p in f5_export
                                                                 if str(p).endswith(".safetensors"))],
                 "ns2": [ns2_folder], "gpt_sovits": [gs_file],
                 "eres2net": [sorted(er_run.glob("ckpt-*.pt"))[-1], er_run], "campplus": [cp_file]})
    made.spk_shards = spk_shards
    return made


def test_every_family_is_told_by_its_names_in_both_namings():
    """Each model's state dict, in our names and in its upstream project's, is its own family and no other."""
    for family, model in _models().items():
        ours = model.state_dict()
        assert fam.family_of(ours) == family
        assert fam.family_of(_upstream_names(family, ours)) == family
        assert fam.family_of({"step": 3, "model": ours}) == family
    assert fam.family_of({"0.weight": torch.zeros(1)}) is None


def test_files_of_the_trainers_own_family_pass(files):
    for family, paths in files.items():
        assert paths
        for p in paths:
            fam.expect_family(p, family, f"train_{family}")  # raises for a file of another family


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_trainer_refuses_every_other_family_in_one_line(trainer, files, f5_shards, tmp_path, capsys):
    want = fam.FAMILIES[trainer]
    shards = files.spk_shards if trainer in ("eres2net", "campplus") else f5_shards
    for other, paths in files.items():
        if other == trainer:
            continue
        for p in paths:
            out = tmp_path / f"{other}-{p.name}"
            with pytest.raises(SystemExit) as e:
                TRAINERS[trainer].main(["--shards", str(shards), "--config", "tiny", "--out", str(out),
                                        "--max-steps", "1", "--init-from", str(p)])
            assert e.value.code == 2, (trainer, p)
            err = capsys.readouterr().err
            lines = err.splitlines()
            assert len(lines) == 1, err
            assert lines[0].startswith(f"{trainer}: error: --init-from "), lines[0]
            assert f": not {want.a} {want.display} checkpoint: it is " in lines[0]
            assert f"{fam.FAMILIES[other].display} weights (what train_{other} reads)" in lines[0]
            assert f"train_{trainer} starts from {want.starts_from}" in lines[0]
            assert str(p if p.is_file() else fam._weights_file(p)) in lines[0]
            assert not out.exists(), "refused before the run folder is made"


def test_an_unknown_model_is_refused(f5_shards, tmp_path, capsys):
    """A checkpoint of no family we know (a plain state dict) is refused too, naming its first tensors."""
    plain = tmp_path / "plain.pt"
    torch.save({"0.weight": torch.zeros(2, 2)}, plain)
    with pytest.raises(SystemExit) as e:
        train_gpt_sovits.main(["--shards", str(f5_shards), "--out", str(tmp_path / "run"), "--init-from", str(plain)])
    assert e.value.code == 2
    assert capsys.readouterr().err == (f"gpt_sovits: error: --init-from {plain}: not a GPT-SoVITS s1 checkpoint: it is "
                                       f"a weights file of no model the trainers know (its tensors: '0.weight'); "
                                       f"train_gpt_sovits starts from {fam.FAMILIES['gpt_sovits'].starts_from}\n")


def test_the_script_exits_2_with_the_line_and_no_traceback(files, f5_shards, tmp_path):
    """As a user runs it: train_ns2.py --init-from a train_f5tts checkpoint."""
    init = files["f5tts"][0]
    r = subprocess.run([sys.executable, str(ROOT / "trainers" / "train_ns2.py"), "--shards", str(f5_shards),
                        "--config", "tiny", "--out", str(tmp_path / "run"), "--init-from", str(init)],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, r.stderr[-3000:]
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.startswith(f"ns2: error: --init-from {init}: not a NaturalSpeech 2 checkpoint: it is an "
                               f"audiopipe trainer checkpoint (step 1) of F5-TTS weights (what train_f5tts reads)")
