"""Amphion's NaturalSpeech2 as the oracle: its model, its checkpoint and its outputs, made by its own code.

    python tests/upstream/ns2_fixture.py make  AMPHION_DIR OUT          # writes the committed fixture
    python tests/upstream/ns2_fixture.py check AMPHION_DIR FIXTURE EXPORT OUT

AMPHION_DIR is a checkout of github.com/open-mmlab/Amphion (only models/tts/naturalspeech2, modules/naturalpseech2
and text/cmudict.py are imported; Amphion is not on the package registry, so tests/test_checkpoint_ns2.py runs on
the fixture this script wrote, and runs `check` only where AUDIOPIPE_AMPHION_SRC names a checkout). Runs in the
side venv of tests/upstream/venv.sh (torch, encodec, einops, accelerate, safetensors).

`make` builds Amphion's NaturalSpeech2 class at a small config (hidden 4), seeded, in eval mode; saves it with
accelerate's `save_state` (the call Amphion's trainer makes; safe_serialization=False gives the
pytorch_model.bin that Amphion's inference loads); runs its forward on a fixed padded batch of two utterances and
computes its trainer's loss terms with Amphion's own functions (ns2_loss.py, latent_to_code). It writes
  OUT/amphion_checkpoint/pytorch_model.bin   the checkpoint
  OUT/io.safetensors                        inputs, the t and noise Amphion drew, every output and loss term
  OUT/meta.json                             the model config, Amphion's phone table, the revision
`check` loads EXPORT/pytorch_model.bin strictly into the same class and writes its outputs on the fixture's inputs
(the same seed gives the same t and noise; they are checked) to OUT/io.safetensors, and saves the loaded model
again with accelerate's default (safetensors) to OUT/accelerate/.

One substitution, to keep the fixture small and offline: Amphion's constructor calls
`EncodecModel.encodec_model_24khz()`, which downloads the 24 kHz weights and holds 32 codebooks of 1024 x 128.
Here that factory builds the same architecture without weights and swaps in a seeded quantizer of 4 codebooks of
16 entries (dimension 128, EnCodec's own ResidualVectorQuantizer class). Everything else is Amphion's code.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import torch

SEED = 7
NQ, BINS = 4, 16
MODEL = {
    "latent_dim": 128,
    "prior_encoder": {
        "vocab_size": 100, "pitch_min": 50, "pitch_max": 1100, "pitch_bins_num": 32,
        "encoder": {"encoder_layer": 2, "encoder_hidden": 4, "encoder_head": 2, "conv_filter_size": 8,
                    "conv_kernel_size": 3, "encoder_dropout": 0.2, "use_cln": True},
        "duration_predictor": {"input_size": 4, "filter_size": 4, "kernel_size": 3, "conv_layers": 4,
                               "cross_attn_per_layer": 3, "attn_head": 2, "drop_out": 0.5},
        "pitch_predictor": {"input_size": 4, "filter_size": 4, "kernel_size": 5, "conv_layers": 4,
                            "cross_attn_per_layer": 3, "attn_head": 2, "drop_out": 0.5},
    },
    "diffusion": {
        "wavenet": {"input_size": 128, "hidden_size": 4, "out_size": 128, "num_layers": 4,
                    "cross_attn_per_layer": 3, "dilation_cycle": 2, "attn_head": 2, "drop_out": 0.2},
        "beta_min": 0.05, "beta_max": 20, "sigma": 1.0, "noise_factor": 1.0, "ode_solver": "euler",
        "diffusion_type": "diffusion",
    },
    "prompt_encoder": {"encoder_layer": 2, "encoder_hidden": 4, "encoder_head": 2, "conv_filter_size": 8,
                       "conv_kernel_size": 3, "encoder_dropout": 0.2, "use_cln": False},
    "query_emb": {"query_token_num": 4, "hidden_size": 4, "head_num": 2},
}
TRAIN = {"diff_ce_loss_lambda": 0.5, "diff_noise_loss_lambda": 1.0}  # Amphion's exp_config_base.json


class Cfg(dict):
    """Attribute access to a nested dict, as Amphion's JsonHParams gives its model code."""

    def __getattr__(self, key):
        value = self[key]
        return Cfg(value) if isinstance(value, dict) else value


def small_codec_factory():
    """Stands in for EncodecModel.encodec_model_24khz: the 24 kHz architecture, no download, a small quantizer."""
    from encodec import EncodecModel
    from encodec.quantization import ResidualVectorQuantizer

    original = EncodecModel.encodec_model_24khz

    def build(pretrained: bool = True, repository=None):
        model = original(pretrained=False)
        quantizer = ResidualVectorQuantizer(dimension=128, n_q=NQ, bins=BINS)
        g = torch.Generator().manual_seed(SEED)
        with torch.no_grad():
            for layer in quantizer.vq.layers:
                cb = layer._codebook
                cb.embed.copy_(torch.randn(cb.embed.shape, generator=g) * 0.5)
                cb.embed_avg.copy_(cb.embed * 3.0)
                cb.cluster_size.copy_(torch.rand(cb.cluster_size.shape, generator=g) * 10)
                cb.inited.fill_(1.0)
        model.quantizer = quantizer
        return model

    EncodecModel.encodec_model_24khz = staticmethod(build)


def amphion_phone_table(amphion: Path) -> list[str]:
    """Amphion's NS2 phone table, by running the body of NS2Dataset.get_phone_map (ns2_dataset.py) with
    text/cmudict.py's valid_symbols, without importing the dataset module's training-time dependencies."""
    from text.cmudict import valid_symbols

    src = (amphion / "models/tts/naturalspeech2/ns2_dataset.py").read_text()
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef) and n.name == "get_phone_map")
    scope = {"valid_symbols": valid_symbols}
    exec(compile(ast.Module(body=fn.body[:1], type_ignores=[]), "get_phone_map", "exec"), scope)
    return list(scope["symbols"])


def inputs() -> dict[str, torch.Tensor]:
    """A padded batch of two utterances in Amphion's collated form (NS2Collator's padding values)."""
    g = torch.Generator().manual_seed(SEED + 1)
    t_len, r_len, n_ph = (12, 9), (7, 5), (5, 4)
    durs = [torch.tensor([3, 2, 1, 4, 2]), torch.tensor([2, 3, 0, 4])]  # a 0-frame phone, as MFA can give
    b, t, r, n = 2, max(t_len), max(r_len), max(n_ph)
    x = {"code": torch.zeros(b, NQ, t, dtype=torch.long), "pitch": torch.full((b, t), 50.0),
         "duration": torch.zeros(b, n, dtype=torch.long), "phone_id": torch.zeros(b, n, dtype=torch.long),
         "ref_code": torch.zeros(b, NQ, r, dtype=torch.long), "phone_mask": torch.zeros(b, n),
         "mask": torch.zeros(b, t), "ref_mask": torch.zeros(b, r)}
    for i in range(b):
        x["code"][i, :, :t_len[i]] = torch.randint(0, BINS, (NQ, t_len[i]), generator=g)
        x["ref_code"][i, :, :r_len[i]] = torch.randint(0, BINS, (NQ, r_len[i]), generator=g)
        x["pitch"][i, :t_len[i]] = 80 + 200 * torch.rand(t_len[i], generator=g)
        x["duration"][i, :n_ph[i]] = durs[i]
        x["phone_id"][i, :n_ph[i]] = torch.randint(1, 89, (n_ph[i],), generator=g)
        x["phone_mask"][i, :n_ph[i]] = 1
        x["mask"][i, :t_len[i]] = 1
        x["ref_mask"][i, :r_len[i]] = 1
    return x


def run(model, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Amphion's forward (eval: no dropout) and its trainer's loss terms (ns2_trainer._train_step's formulas with
    ns2_loss's functions). t and noise are Amphion's own draws, recorded by a spy on forward_diffusion."""
    from models.tts.naturalspeech2.ns2_loss import diff_ce_loss, diff_loss, log_dur_loss, log_pitch_loss

    seen = {}
    original = model.diffusion.forward_diffusion

    def spy(x0, diffusion_step):
        xt, z = original(x0=x0, diffusion_step=diffusion_step)
        seen.update(t=diffusion_step.clone(), noise=z.clone())
        return xt, z

    model.diffusion.forward_diffusion = spy
    torch.manual_seed(SEED + 2)
    with torch.no_grad():
        diff_out, prior_out = model(code=x["code"], pitch=x["pitch"], duration=x["duration"],
                                    phone_id=x["phone_id"], ref_code=x["ref_code"], phone_mask=x["phone_mask"],
                                    mask=x["mask"], ref_mask=x["ref_mask"])
        x0 = model.code_to_latent(x["code"])
        pred_indices, pred_dist = model.latent_to_code(diff_out["x0_pred"], nq=x["code"].shape[1])
        gt_indices, _ = model.latent_to_code(x0, nq=x["code"].shape[1])
        terms = {
            "pitch": log_pitch_loss(prior_out["pitch_pred_log"], x["pitch"], mask=x["mask"]),
            "duration": log_dur_loss(prior_out["dur_pred_log"], x["duration"], mask=x["phone_mask"]),
            "x0": diff_loss(diff_out["x0_pred"], x0, mask=x["mask"]),
            "noise": diff_loss(diff_out["noise_pred"], diff_out["noise"], mask=x["mask"]),
            "ce": diff_ce_loss(pred_dist, gt_indices, mask=x["mask"]),
        }
        terms["loss"] = (terms["pitch"] + terms["duration"] + terms["x0"]
                         + terms["noise"] * TRAIN["diff_noise_loss_lambda"] + terms["ce"] * TRAIN["diff_ce_loss_lambda"])
    model.diffusion.forward_diffusion = original
    return {**{f"in.{k}": v for k, v in x.items()}, "t": seen["t"], "noise": seen["noise"],
            "x0_pred": diff_out["x0_pred"], "noise_pred": diff_out["noise_pred"],
            "dur_pred_log": prior_out["dur_pred_log"], "pitch_pred_log": prior_out["pitch_pred_log"],
            "prior_out": prior_out["prior_out"], "latent": x0, "gt_indices": gt_indices.transpose(0, 1),
            **{f"loss.{k}": v.reshape(()) for k, v in terms.items()}}


def build(amphion: Path, model: dict | None = None):
    """Amphion's NaturalSpeech2 at `model` (default: the fixture's MODEL), seeded."""
    sys.path.insert(0, str(amphion))
    small_codec_factory()
    from models.tts.naturalspeech2.ns2 import NaturalSpeech2

    torch.manual_seed(SEED)
    model = NaturalSpeech2(Cfg(model or MODEL)).eval()
    # Trained-looking values where Amphion's init leaves constants (LayerNorm gains, the WaveNet's zeroed output
    # projection), so that every tensor's mapping is exercised by the outputs.
    g = torch.Generator().manual_seed(SEED + 3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 or name.endswith("out_proj.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def revision(amphion: Path) -> str:
    """The checkout's commit (or, for a `git archive` export, the commit its .revision file records)."""
    r = subprocess.run(["git", "-C", str(amphion), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode == 0:
        return r.stdout.strip()
    f = amphion / ".revision"
    return f.read_text().strip() if f.is_file() else "unknown"


def make(amphion: Path, out: Path) -> None:
    from accelerate import Accelerator
    from safetensors.torch import save_file

    model = build(amphion)
    out.mkdir(parents=True, exist_ok=True)
    acc = Accelerator(cpu=True)
    prepared = acc.prepare(model)
    ckdir = out / "amphion_checkpoint"
    acc.save_state(str(ckdir), safe_serialization=False)
    for extra in ckdir.iterdir():  # the RNG pickle and the like: not weights, not committed
        if extra.name != "pytorch_model.bin":
            extra.unlink()
    io = run(prepared, inputs())
    save_file({k: v.contiguous() for k, v in io.items()}, str(out / "io.safetensors"))
    meta = {"model": MODEL, "train": TRAIN, "codec": {"n_q": NQ, "bins": BINS, "dim": 128},
            "phone_table": amphion_phone_table(amphion), "amphion_revision": revision(amphion),
            "n_tensors": len(model.state_dict()), "shapes": {k: list(v.shape) for k, v in model.state_dict().items()}}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")


def check(amphion: Path, fixture: Path, export: Path, out: Path) -> None:
    from safetensors.torch import load_file, save_file

    model = build(amphion)
    state = torch.load(export / "pytorch_model.bin", map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)  # what NS2Inference.build_model does
    ref = load_file(str(fixture / "io.safetensors"))
    x = {k[3:]: v for k, v in ref.items() if k.startswith("in.")}
    io = run(model, x)
    for k in ("t", "noise"):
        assert torch.equal(io[k], ref[k]), f"{k} differs from the fixture's draw"
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in io.items()}, str(out / "io.safetensors"))
    # And the same weights as newer accelerate saves them by default (model.safetensors), for the reader's test.
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    acc.prepare(model)
    acc.save_state(str(out / "accelerate"), safe_serialization=True)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "make":
        make(Path(rest[0]).resolve(), Path(rest[1]))
    elif cmd == "check":
        check(*(Path(a).resolve() for a in rest))
    else:
        raise SystemExit(f"unknown command {cmd!r}: make or check")
