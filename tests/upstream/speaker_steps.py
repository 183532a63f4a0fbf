"""3D-Speaker's training step (speakerlab 0.0.6, in the side venv) as the oracle of audiopipe's speaker trainers.

    python speaker_steps.py JOB.json

speakerlab's bin/train.py needs CUDA and NCCL, so its components are driven here exactly as its train() drives
them, one process, fp32, the CPU: `nn.Sequential(embedding model, CosineClassifier)` (the model with its
constructor's defaults beyond JOB's args, as the recipes build it: CAM++ with memory_efficient=True),
ArcMarginLoss, SGD (the recipes' momentum 0.9, Nesterov, weight decay 1e-4), WarmupCosineScheduler and
MarginScheduler ("exp"), and for each batch: lr_scheduler.step(iter_num), margin_scheduler.step(iter_num),
forward, criterion, zero_grad, backward, optimizer.step().

JOB: {"model": "eres2net"|"campplus", "args": {...}, "classes": N, "recipe": {lr, min_lr, epochs, ...},
      "steps_per_epoch": S, "batches": IN.safetensors (feats.<k> [B, T, 80], labels.<k> [B]), "out": DIR}
Writes DIR/init.pt (the embedding model's and classifier's state dicts before the first step), DIR/final.pt
(after the last) and DIR/losses.json (each step's loss, LR and margin).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from speaker_oracle import CLASSES, _randomize_norms


def main(job: dict) -> None:
    from speakerlab.loss.margin_loss import ArcMarginLoss
    from speakerlab.models.campplus.classifier import CosineClassifier
    from speakerlab.process.scheduler import MarginScheduler, WarmupCosineScheduler

    out = Path(job["out"])
    torch.manual_seed(0)
    embedding_model = CLASSES[job["model"]](**job["args"])
    _randomize_norms(embedding_model, torch.Generator().manual_seed(1))
    classifier = CosineClassifier(input_dim=job["args"]["embedding_size"], out_neurons=job["classes"])
    model = torch.nn.Sequential(embedding_model, classifier)
    torch.save({"embedding_model": embedding_model.state_dict(), "classifier": classifier.state_dict()},
               out / "init.pt")
    r, spe = job["recipe"], job["steps_per_epoch"]
    optimizer = torch.optim.SGD(model.parameters(), lr=r["lr"], momentum=0.9, nesterov=True, weight_decay=1e-4)
    criterion = ArcMarginLoss(scale=32.0, margin=r["margin"], easy_margin=False)
    lr_scheduler = WarmupCosineScheduler(optimizer, min_lr=r["min_lr"], max_lr=r["lr"],
                                         warmup_epoch=r["warmup_epochs"], fix_epoch=r["epochs"], step_per_epoch=spe)
    margin_scheduler = MarginScheduler(criterion, increase_start_epoch=r["margin_start_epoch"],
                                       fix_epoch=r["margin_fix_epoch"], step_per_epoch=spe, initial_margin=0.0,
                                       final_margin=r["margin"], increase_type="exp")
    batches = load_file(job["batches"])
    model.train()
    log = []
    for iter_num in range(len(batches) // 2):
        lr_scheduler.step(iter_num)
        margin_scheduler.step(iter_num)
        x, y = batches[f"feats.{iter_num}"], batches[f"labels.{iter_num}"]
        output = model(x)
        loss = criterion(output, y)
        optimizer.zero_grad()
        loss.backward()
        if iter_num == 0:
            grads0 = {k: p.grad.detach().clone() for k, p in embedding_model.named_parameters() if p.grad is not None}
        optimizer.step()
        log.append({"loss": loss.item(), "lr": optimizer.param_groups[0]["lr"],
                    "margin": margin_scheduler.get_margin()})
    torch.save({"embedding_model": embedding_model.state_dict(), "classifier": classifier.state_dict()},
               out / "final.pt")
    torch.save(grads0, out / "grads0.pt")
    (out / "losses.json").write_text(json.dumps(log))


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    main(json.loads(Path(sys.argv[1]).read_text()))
