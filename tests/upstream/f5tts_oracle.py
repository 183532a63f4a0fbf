"""F5-TTS's own code as the oracle of audiopipe's F5 checkpoints (runs in the side venv: f5-tts 1.1.22).

    python f5tts_oracle.py train DIR   # DIR/inputs.safetensors and DIR/arch.json written by the test
    python f5tts_oracle.py load DIR    # DIR/export*/: files audiopipe exported
    python f5tts_oracle.py base DIR    # F5TTS_v1_Base at full size (test_checkpoint_f5tts, on request)

train: builds F5's CFM + DiT at the test's small config, gives its zero-initialised layers random values (so every
       input matters), and trains it with F5's own Trainer (its optimizer, LR schedule, EMA and checkpoint
       writer, one process on the CPU) for a few updates on two fixed utterances, saving every update.
       Writes DIR/ckpts/model_<u>.pt (kept: those the EMA test needs) and model_last.pt, DIR/vocab.txt,
       DIR/released.safetensors (the EMA state dict alone, as F5 publishes it and as its checkpoint pruner writes
       it), DIR/v0.pt (an F5TTS_Base-style model: text_mask_padding off, rotary on one head, its EMA state dict
       from ema_pytorch), and DIR/outputs.safetensors: the DiT's outputs for the inputs, through F5's inference
       loader (`load_model`, EMA weights), and CFM.forward's training loss under fixed seeds.
load:  loads every model_*.safetensors / model_*.pt in each DIR/export*/ strictly with F5's inference loader
       (`load_model` with the exported model_cfg.yaml and vocab.txt), and each again as a `pretrained_*` file with
       its Trainer's `load_checkpoint` (fine-tuning), and writes DIR/export_outputs.safetensors.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# Kept by `train` for the EMA test: the updates after which F5's EMA changes (the first, then every 10th).
def ema_updates(n: int) -> list[int]:
    return [u for u in range(1, n + 1) if u == 1 or (u - 1) % 10 == 0]


def dit_outputs(transformer, inp: dict[str, torch.Tensor], tag: str, out: dict[str, torch.Tensor]) -> None:
    """The DiT's output for the padded batch (with F5's mask, as in training) and for one unpadded utterance
    (no mask, as F5's single-utterance inference), with and without the CFG drops."""
    from f5_tts.model.utils import lens_to_mask

    transformer.eval()
    with torch.no_grad():
        mask = lens_to_mask(inp["lens"], length=inp["x"].shape[1])
        for drop in (0, 1, 2):
            kw = dict(drop_audio_cond=drop >= 1, drop_text=drop == 2)
            out[f"{tag}.batch.{drop}"] = transformer(x=inp["x"], cond=inp["cond"], text=inp["text"],
                                                     time=inp["time"], mask=mask, **kw)
        out[f"{tag}.single"] = transformer(x=inp["x1"], cond=inp["cond1"], text=inp["text1"], time=inp["time1"])


def cfm_loss(cfm, inp: dict[str, torch.Tensor], out: dict[str, torch.Tensor], tag: str) -> None:
    """CFM.forward (its span, noise, time, drops and dropout) under fixed seeds, in training mode."""
    for seed in (3, 4, 11):
        torch.manual_seed(seed)
        random.seed(seed)
        cfm.train()
        loss, cond, pred = cfm(inp["mel"], text=inp["text"], lens=inp["lens"])
        out[f"{tag}.loss.{seed}"] = loss.detach().reshape(1)
        out[f"{tag}.pred.{seed}"] = pred.detach()


def build(arch: dict, vocab_size: int):
    from f5_tts.model import CFM, DiT

    torch.manual_seed(0)
    model = CFM(transformer=DiT(**arch, text_num_embeds=vocab_size, mel_dim=100),
                mel_spec_kwargs=dict(n_fft=1024, hop_length=256, win_length=1024, n_mel_channels=100,
                                     target_sample_rate=24000, mel_spec_type="vocos"))
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.normal_(0, 0.2)
    return model


class Utterances(torch.utils.data.Dataset):
    """Two fixed utterances in the form F5's collate_fn takes."""

    def __init__(self, inp):
        self.items = [(inp["mel"][i, : int(n)].T.contiguous(), "".join(chr(c) for c in inp["chars"][i] if c >= 0))
                      for i, n in enumerate(inp["lens"][:2])]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        mel, text = self.items[i]
        return {"mel_spec": mel, "text": text}


def train(d: Path) -> None:
    from ema_pytorch import EMA
    from f5_tts.infer.utils_infer import load_model
    from f5_tts.model import DiT, Trainer

    inp = load_file(str(d / "inputs.safetensors"))
    cfg = json.loads((d / "arch.json").read_text())
    arch, vocab = cfg["arch"], cfg["vocab"]
    (d / "ckpts").mkdir(exist_ok=True)
    (d / "vocab.txt").write_text("".join(s + "\n" for s in vocab), encoding="utf-8")
    shutil.copy(d / "vocab.txt", d / "ckpts" / "vocab.txt")
    model = build(arch, len(vocab))
    model.vocab_char_map = {s: i for i, s in enumerate(vocab)}
    updates = cfg["updates"]
    trainer = Trainer(model, epochs=updates, learning_rate=cfg["lr"], num_warmup_updates=cfg["warmup"],
                      save_per_updates=1, checkpoint_path=str(d / "ckpts"), batch_size_per_gpu=2,
                      batch_size_type="sample", max_grad_norm=1.0, logger=None, last_per_updates=10**9)
    trainer.train(Utterances(inp), num_workers=1)
    keep = {f"model_{u}.pt" for u in ema_updates(updates)} | {f"model_{updates}.pt", "model_last.pt"}
    for f in (d / "ckpts").glob("model_*.pt"):
        if f.name not in keep:
            f.unlink()
    last = torch.load(d / "ckpts" / "model_last.pt", weights_only=True, map_location="cpu")
    save_file(last["ema_model_state_dict"], str(d / "released.safetensors"))  # what F5's pruner writes
    shutil.copy(d / "vocab.txt", d / "released_vocab.txt")
    out: dict[str, torch.Tensor] = {}
    for name in ("ckpts/model_last.pt", "released.safetensors"):
        loaded = load_model(DiT, arch, str(d / name), mel_spec_type="vocos", vocab_file=str(d / "vocab.txt"),
                            device="cpu")
        dit_outputs(loaded.transformer, inp, name, out)
        if name == "released.safetensors":
            cfm_loss(loaded, inp, out, name)
    # F5TTS_Base (v0): filler embedded, nothing masked in the text blocks, rotary on the first head only
    v0 = build({**arch, "text_mask_padding": False, "pe_attn_head": 1}, len(vocab))
    ema = EMA(v0, include_online_model=False)
    ema.update()  # the first update copies the weights, as the Trainer's does
    torch.save({"ema_model_state_dict": ema.state_dict(), "model_state_dict": v0.state_dict()}, d / "v0.pt")
    dit_outputs(v0.transformer, inp, "v0", out)
    save_file({k: v.contiguous() for k, v in out.items()}, str(d / "outputs.safetensors"))


def load(d: Path) -> None:
    from omegaconf import OmegaConf
    from f5_tts.infer.utils_infer import load_model
    from f5_tts.model import DiT, Trainer

    inp = load_file(str(d / "inputs.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for exp in sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("export")):
        cfg = OmegaConf.load(exp / "model_cfg.yaml")
        files = sorted(exp.glob("model_*.safetensors")) + sorted(exp.glob("model_*.pt"))
        assert files, f"nothing exported in {exp}"
        for f in files:
            tag = f"{exp.name}/{f.name}"
            # F5's inference path (infer_cli): strict load_state_dict of the EMA slot
            loaded = load_model(DiT, cfg.model.arch, str(f), mel_spec_type="vocos",
                                vocab_file=str(exp / "vocab.txt"), device="cpu")
            dit_outputs(loaded.transformer, inp, tag, out)
            # F5's fine-tuning path: a pretrained_* file in the checkpoint folder, loaded by its Trainer
            ck = d / "finetune" / exp.name / f.suffix[1:]
            ck.mkdir(parents=True)
            shutil.copy(f, ck / f"pretrained_{f.name}")
            fresh = build(dict(cfg.model.arch), len(loaded.vocab_char_map))
            trainer = Trainer(fresh, epochs=1, learning_rate=1e-4, checkpoint_path=str(ck), logger=None)
            trainer.scheduler = None
            assert trainer.load_checkpoint() == 0  # a pretrained start: update 0, fresh optimizer
            dit_outputs(fresh.transformer, inp, f"finetune.{tag}", out)
            out[f"ema_step.{tag}"] = trainer.ema_model.step.reshape(1)
    save_file({k: v.contiguous() for k, v in out.items()}, str(d / "export_outputs.safetensors"))


def base(d: Path) -> None:
    """F5TTS_v1_Base at full size, from F5's own config file and vocabulary: its EMA state dict as released
    (ema_pytorch's first update copies the weights) and its DiT's outputs for DIR/inputs.safetensors."""
    from importlib.resources import files

    from ema_pytorch import EMA
    from omegaconf import OmegaConf

    arch = dict(OmegaConf.load(str(files("f5_tts").joinpath("configs/F5TTS_v1_Base.yaml"))).model.arch)
    vocab = files("f5_tts").joinpath("infer/examples/vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    (d / "vocab.txt").write_text("".join(s + "\n" for s in vocab), encoding="utf-8")
    model = build(arch, len(vocab))
    ema = EMA(model, include_online_model=False)
    ema.update()
    save_file(ema.state_dict(), str(d / "model_1.safetensors"))
    out = {"parameters": torch.tensor([sum(p.numel() for p in model.parameters())])}
    dit_outputs(model.transformer, load_file(str(d / "inputs.safetensors")), "base", out)
    save_file({k: v.contiguous() for k, v in out.items()}, str(d / "outputs.safetensors"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")
    {"train": train, "load": load, "base": base}[sys.argv[1]](Path(sys.argv[2]))
