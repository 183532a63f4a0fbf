"""Amphion's NS2 trainer step as the oracle of audiopipe's NS2 training step (runs in the side venv).

    python ns2_steps.py AMPHION_DIR DIR   # DIR/inputs.json written by tests/test_step_parity_ns2.py

AMPHION_DIR is a checkout of github.com/open-mmlab/Amphion. Its trainer module imports Amphion's whole training
stack (data preprocessors, text front ends, tensorboard), so the functions the step needs are taken from its
source files as written and run unchanged: NS2Trainer's _build_optimizer (AdamW on the parameters that train),
_build_scheduler (diffusers' get_scheduler with the config's lr_scheduler, warmup and total steps) and
_train_step (the model's forward, its loss terms from ns2_loss.py, zero_grad, backward, clipping at 0.5, the
optimizer step, the scheduler step), and NS2Dataset's align_length, get_target_and_reference (the prompt cut,
clip_mode "start") and get_phone_map, and NS2Collator.__call__. The model is ns2_fixture.build's (Amphion's
NaturalSpeech2 class, seeded, at DIR/inputs.json "model"), wrapped in DistributedDataParallel as accelerate
wraps it for Amphion's training (one gloo process here), in train mode, fp32, deterministic algorithms, one
thread.

For each step in DIR/inputs.json "batches" (utterance indices), every utterance (codes, pitch, durations, phone
symbols) goes through align_length and get_target_and_reference (numpy's global RNG seeded once, as Amphion's
dataset draws the prompt size), the collator makes the batch, and _train_step takes it. A forward pre-hook
records the torch RNG state the forward starts from. Writes:
  DIR/init/pytorch_model.bin   the weights before step 1
  DIR/final/pytorch_model.bin  the weights after the last step
  DIR/steps.pt                 per step: the collated batch, each utterance's prompt phones and first prompt
                               phone, the RNG state, the LR the step used, its loss and loss terms, and the
                               gradients the optimizer stepped with (after clipping)
  DIR/schedule.json            the LR diffusers' scheduler gives over a longer run (DIR/inputs.json "schedule")
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from ns2_fixture import SEED, TRAIN, Cfg, build


def functions(path: Path, cls: str, names: tuple[str, ...], scope: dict) -> dict:
    """The methods `names` of class `cls` in Amphion's source file, compiled as written in `scope`."""
    tree = ast.parse(path.read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    out = {}
    for fn in body:
        if isinstance(fn, ast.FunctionDef) and fn.name in names:
            ns: dict = {}
            exec(compile(ast.Module(body=[fn], type_ignores=[]), f"{path.name}:{cls}.{fn.name}", "exec"), scope, ns)
            out[fn.name] = ns[fn.name]
    missing = set(names) - set(out)
    assert not missing, f"{path} {cls} has no {sorted(missing)}"
    return out


def main(amphion: Path, d: Path) -> None:
    from accelerate import Accelerator
    from diffusers import get_scheduler
    from models.tts.naturalspeech2.ns2_loss import diff_ce_loss, diff_loss, log_dur_loss, log_pitch_loss
    from text.cmudict import valid_symbols

    inp = json.loads((d / "inputs.json").read_text())
    src = amphion / "models" / "tts" / "naturalspeech2"
    scope = {"torch": torch, "np": np, "F": F, "pad_sequence": pad_sequence, "get_scheduler": get_scheduler,
             "log_pitch_loss": log_pitch_loss, "log_dur_loss": log_dur_loss, "diff_loss": diff_loss,
             "diff_ce_loss": diff_ce_loss, "valid_symbols": valid_symbols}
    Trainer = type("NS2TrainerStep", (), functions(src / "ns2_trainer.py", "NS2Trainer",
                                                    ("_build_optimizer", "_build_scheduler", "_train_step"), scope))
    Dataset = type("NS2DatasetCut", (), functions(src / "ns2_dataset.py", "NS2Dataset",
                                                  ("align_length", "get_target_and_reference", "get_phone_map"),
                                                  scope))
    collate = functions(src / "ns2_dataset.py", "NS2Collator", ("__call__",), scope)["__call__"]

    torch.distributed.init_process_group("gloo", init_method=f"file://{d / 'pg'}", rank=0, world_size=1)
    model = build(amphion, inp["model"])  # Amphion's class, seeded, at the test's config
    (d / "init").mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), d / "init" / "pytorch_model.bin")
    cfg = Cfg({"model": inp["model"], "preprocess": {"clip_mode": "start"},
               "train": {**TRAIN, "adam": {"lr": inp["lr"]}, "lr_scheduler": "cosine",
                         "lr_warmup_steps": inp["warmup"], "num_train_steps": inp["total"],
                         "gradient_accumulation_step": 1}})
    trainer = Trainer()
    trainer.cfg = cfg
    trainer.model = torch.nn.parallel.DistributedDataParallel(model)  # what accelerate's prepare gives it
    trainer.model.train()
    trainer.optimizer = trainer._build_optimizer()
    trainer.scheduler = trainer._build_scheduler()
    trainer.accelerator = Accelerator(cpu=True, gradient_accumulation_steps=1)
    trainer.optimizer = trainer.accelerator.prepare(trainer.optimizer)
    trainer.scheduler = trainer.accelerator.prepare(trainer.scheduler)
    dataset = Dataset()
    dataset.cfg = cfg
    phone2id, _ = dataset.get_phone_map()

    rng_at_forward: list[torch.Tensor] = []
    model.register_forward_pre_hook(lambda *_: rng_at_forward.append(torch.get_rng_state()))
    np.random.seed(SEED)
    steps = []
    for indices in inp["batches"]:
        items, cuts = [], []
        for i in indices:
            u = inp["utterances"][i]
            code = np.array(u["code"], dtype=np.int64)
            pitch = np.array(u["pitch"], dtype=np.float32)
            duration = np.array(u["duration"], dtype=np.int64)
            phone_id = np.array([phone2id[p] for p in u["phones"]])
            code, pitch, duration, phone_id, frames = dataset.align_length(code, pitch, duration, phone_id,
                                                                           code.shape[1])
            out = dataset.get_target_and_reference(code, pitch, duration, phone_id, frames)
            start = 1 if (duration[0] == 0 and len(out["ref_phone_id"]) == 1) else 0  # its clip_mode "start"
            cuts.append((len(out["ref_phone_id"]), start))
            items.append({"code": out["code"], "frame_nums": out["frame_nums"], "pitch": out["pitch"],
                          "duration": out["duration"], "phone_id": out["phone_id"],
                          "phone_id_frame": np.repeat(out["phone_id"], out["duration"]),
                          "ref_code": out["ref_code"], "ref_frame_nums": out["ref_frame_nums"]})
        batch = collate(None, items)
        lr = trainer.optimizer.param_groups[0]["lr"]
        loss, terms, _ = trainer._train_step(batch)
        steps.append({"batch": {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)},
                      "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
                      "prompt_phones": [c[0] for c in cuts], "prompt_start": [c[1] for c in cuts],
                      "torch_rng": rng_at_forward[-1], "lr": lr, "loss": loss,
                      "terms": {k: float(v) for k, v in terms.items()}})
    assert len(rng_at_forward) == len(steps), "one forward per step"
    torch.save(steps, d / "steps.pt")
    (d / "final").mkdir(exist_ok=True)
    torch.save(model.state_dict(), d / "final" / "pytorch_model.bin")
    # diffusers' schedule over a longer run, as _build_scheduler makes it (the LR each step uses, from step 0)
    s = inp["schedule"]
    probe = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=s["lr"])
    sched = get_scheduler("cosine", optimizer=probe, num_warmup_steps=s["warmup"], num_training_steps=s["total"])
    lrs = []
    for _ in range(s["steps"]):
        lrs.append(probe.param_groups[0]["lr"])
        probe.step()
        sched.step()
    (d / "schedule.json").write_text(json.dumps(lrs))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    amphion_dir = Path(sys.argv[1]).resolve()
    sys.path.insert(0, str(amphion_dir))
    main(amphion_dir, Path(sys.argv[2]).resolve())
