"""GPT-SoVITS's stage-1 optimizer run by its own code on given gradients, for tests/test_train_gpt_sovits.py.

    gpt_sovits_optim.py CONFIG.json OUT.safetensors

Two runs, each from seeded parameters and seeded gradients (all saved, so the test replays them):
  "real": the optimizer and LR scheduler exactly as Text2SemanticLightningModule.configure_optimizers builds them
          for the model of CONFIG, stepped as its training_step steps them (opt.step(), then scheduler.step());
          records the LR each step ran with.
  "clip": ScaledAdam with clipping_update_period 4 (1000 in training) on a few tensors, with gradient spikes, so
          that its clipping threshold and the clipped size updates are exercised in a short run.
"""

import builtins
import json
import sys
import typing
from pathlib import Path

builtins.Tuple = typing.Tuple  # GPT-SoVITS's AR code annotates with a Tuple that torch 2.13 no longer exports

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from gpt_sovits.AR.models.t2s_lightning_module import Text2SemanticLightningModule  # noqa: E402
from gpt_sovits.AR.modules.optim import ScaledAdam  # noqa: E402

REAL_STEPS, CLIP_STEPS = 9, 14


def grads_for(params, g, step, spike=1.0):
    for name, p in params:
        p.grad = torch.randn(p.shape, generator=g) * 0.1 * spike
    return {f"grad.{step}.{n}": p.grad.clone() for n, p in params}


def main(config_path: str, out: str) -> None:
    saved = {}
    config = json.loads(Path(config_path).read_text())
    torch.manual_seed(0)
    module = Text2SemanticLightningModule(config, "****", is_train=False)
    params = list(module.model.named_parameters())
    saved.update({f"real.init.{n}": p.detach().clone() for n, p in params})
    conf = module.configure_optimizers()
    opt, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
    g = torch.Generator().manual_seed(1)
    for step in range(REAL_STEPS):
        saved.update({"real." + k: v for k, v in grads_for(params, g, step).items()})
        saved[f"real.lr.{step}"] = torch.tensor([opt.param_groups[0]["lr"]], dtype=torch.float64)
        opt.step()
        opt.zero_grad()
        scheduler.step()
        saved.update({f"real.after.{step}.{n}": p.detach().clone() for n, p in params})

    shapes = {"w1": (6, 5), "w2": (6, 5), "b": (6,), "alpha1": (1,), "alpha2": (1,), "emb": (9, 5)}
    gen = torch.Generator().manual_seed(2)
    tensors = [(n, torch.nn.Parameter(torch.randn(s, generator=gen))) for n, s in shapes.items()]
    saved.update({f"clip.init.{n}": p.detach().clone() for n, p in tensors})
    opt = ScaledAdam([p for _, p in tensors], lr=0.002, betas=(0.9, 0.95), clipping_scale=2.0,
                     parameters_names=[[n for n, _ in tensors]], show_dominant_parameters=False,
                     clipping_update_period=4)
    for step in range(CLIP_STEPS):
        spike = 30.0 if step in (6, 9, 10) else 1.0
        saved.update({"clip." + k: v for k, v in grads_for(tensors, gen, step, spike).items()})
        opt.step()
        opt.zero_grad()
        saved.update({f"clip.after.{step}.{n}": p.detach().clone() for n, p in tensors})
    save_file({k: v.contiguous() for k, v in saved.items()}, out)


if __name__ == "__main__":
    main(*sys.argv[1:])
