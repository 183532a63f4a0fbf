"""3D-Speaker's own code (speakerlab) as the oracle of tests/test_checkpoint_speaker.py. Runs in the side venv.

    python speaker_oracle.py PLAN.json

PLAN.json is a list of jobs, run in order, all in this one process (one interpreter start for the whole test
module). Tensors come and go as safetensors files; every job writes its results to its own "out" file.

  {"op": "build", "model": "eres2net"|"campplus", "args": {...}, "seed": 0, "inputs": IN, "out": OUT,
   "file": PATH, "experiment": DIR, "classes": N}
      speakerlab's class with these constructor arguments, seeded, its BatchNorm statistics and affine
      parameters made non-trivial; saved as the released checkpoints are (torch.save of the state dict) at PATH,
      and, with "experiment", by speakerlab's own Checkpointer (embedding model, a CosineClassifier of N classes,
      the epoch counter) under DIR/models. OUT gets the eval-mode embeddings of IN["feats"] and the classifier.
  {"op": "load", "model": ..., "args": {...}, "file": PATH, "inputs": IN, "out": OUT}
      the class built with these arguments, then load_state_dict(torch.load(PATH)) (strict, as speakerlab's
      infer_sv.py loads a released file); OUT gets the eval-mode embeddings of IN["feats"].
  {"op": "extract", "exp_dir": DIR, "wav_scp": SCP, "out": OUT}
      speakerlab/bin/extract.py's main() on the experiment folder DIR (its config.yaml, its Checkpointer, its
      FBank); OUT gets the embeddings it wrote to DIR/embeddings (read back with kaldiio).
  {"op": "schedules", "steps_per_epoch": N, "recipes": {model: {lr, min_lr, epochs, ...}}, "out": OUT.json}
      speakerlab's WarmupCosineScheduler and MarginScheduler (on an ArcMarginLoss), stepped with iter_num as its
      train.py steps them, for two epochs past each recipe's end; OUT gets the LR and margin of every step.
"""

from __future__ import annotations

import json
import os
import sys

import soundfile
import torch
from safetensors.torch import load_file, save_file

from speakerlab.models.campplus.DTDNN import CAMPPlus
from speakerlab.models.campplus.classifier import CosineClassifier
from speakerlab.models.eres2net.ERes2Net import ERes2Net
from speakerlab.utils.checkpoint import Checkpointer
from speakerlab.utils.epoch import EpochCounter

CLASSES = {"eres2net": ERes2Net, "campplus": CAMPPlus}


def _randomize_norms(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Running statistics and affine parameters away from their initial 0/1, so that a misplaced BatchNorm tensor
    changes the output."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=gen))
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=gen))
                m.num_batches_tracked.fill_(7)
                if m.affine:
                    m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape, generator=gen))
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))


def _embed(model: torch.nn.Module, inputs: str) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(load_file(inputs)["feats"]).contiguous()


def build(job: dict) -> None:
    torch.manual_seed(job.get("seed", 0))
    model = CLASSES[job["model"]](**job["args"])
    _randomize_norms(model, torch.Generator().manual_seed(job.get("seed", 0) + 1))
    torch.save(model.state_dict(), job["file"])
    out = {"emb": _embed(model, job["inputs"])}
    if job.get("experiment"):
        classifier = CosineClassifier(input_dim=job["args"]["embedding_size"], out_neurons=job["classes"])
        counter = EpochCounter(limit=job.get("epoch", 3))
        for _ in range(job.get("epoch", 3)):
            next(counter)
        ck = Checkpointer(os.path.join(job["experiment"], "models"),
                          {"embedding_model": model, "classifier": classifier, "epoch_counter": counter})
        ck.save_checkpoint(epoch=counter.current)
        out["classifier"] = classifier.weight.detach().contiguous()
    save_file(out, job["out"])


def load(job: dict) -> None:
    model = CLASSES[job["model"]](**job["args"])
    model.load_state_dict(torch.load(job["file"], map_location="cpu"))  # strict, as infer_sv.py
    save_file({"emb": _embed(model, job["inputs"])}, job["out"])


def extract(job: dict) -> None:
    import kaldiio
    import torchaudio
    from speakerlab.bin import extract as sl_extract

    # torchaudio 2.11's load() decodes through torchcodec and FFmpeg, which this venv does not have (its CUDA-linked
    # extension is removed as well); extract.py only needs the float waveform, which soundfile reads alike.
    def load_wav(path: str):
        data, sr = soundfile.read(path, dtype="float32", always_2d=True)
        return torch.from_numpy(data.T.copy()), sr

    torchaudio.load = load_wav
    sl_extract.torchaudio.load = load_wav
    os.environ.update(LOCAL_RANK="0", WORLD_SIZE="1")
    sys.argv = ["extract.py", "--exp_dir", job["exp_dir"], "--data", job["wav_scp"]]
    sl_extract.main()
    scp = os.path.join(job["exp_dir"], "embeddings", "xvector_00.scp")
    embs = {k: torch.from_numpy(v.copy()).reshape(-1) for k, v in kaldiio.load_scp(scp).items()}
    save_file(embs, job["out"])


def schedules(job: dict) -> None:
    from speakerlab.loss.margin_loss import ArcMarginLoss
    from speakerlab.process.scheduler import MarginScheduler, WarmupCosineScheduler

    spe, out = job["steps_per_epoch"], {}
    for name, r in job["recipes"].items():
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=r["lr"])
        lr_s = WarmupCosineScheduler(opt, min_lr=r["min_lr"], max_lr=r["lr"], warmup_epoch=r["warmup_epochs"],
                                     fix_epoch=r["epochs"], step_per_epoch=spe)
        m_s = MarginScheduler(ArcMarginLoss(scale=32.0, margin=r["margin"]),
                              increase_start_epoch=r["margin_start_epoch"], fix_epoch=r["margin_fix_epoch"],
                              step_per_epoch=spe, initial_margin=0.0, final_margin=r["margin"])
        lrs, margins = [], []
        for iter_num in range(int((r["epochs"] + 2) * spe)):
            lr_s.step(iter_num)
            m_s.step(iter_num)
            lrs.append(opt.param_groups[0]["lr"])
            margins.append(m_s.get_margin())
        out[name] = {"lr": lrs, "margin": margins}
    with open(job["out"], "w") as f:
        json.dump(out, f)


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    for job in plan:
        {"build": build, "load": load, "extract": extract, "schedules": schedules}[job["op"]](job)
        print(f"{job['op']} {job.get('model', job.get('exp_dir'))} ok", flush=True)


if __name__ == "__main__":
    main()
