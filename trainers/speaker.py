"""What the two 3D-Speaker trainers (train_eres2net.py, train_campplus.py) share beyond data and scoring: the
command line, the model wrapper (embedding model + AAM head) and its loss, SGD, and core.train followed by the
EER on the held-out speakers.

  speaker_data.py   which utterances train; crops, speed perturbation, augmentation; fbank on the device
  speaker_eval.py   the AAM-softmax head and its margin schedule; the EER on held-out speakers
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from torch import nn

import core
from audiopipe.storage.atomic import write_json_atomic
from speaker_data import SAMPLE_RATE, SpeakerData, fbank_batch
from speaker_eval import AAMSoftmax, MarginSchedule, evaluate_eer


# ----------------------------------------------------------------------------- the model and its loss

class SpeakerModel(nn.Module):
    """Embedding model + AAM head: what DDP wraps and core checkpoints. forward(wav, labels) -> (loss, logs).

    The margin follows optimizer steps counted in a buffer, so it is saved with the weights and a resumed
    run continues the ramp where it stopped.
    """

    def __init__(self, encoder: nn.Module, embedding_dim: int, num_classes: int, margin: MarginSchedule,
                 scale: float = 32.0, grad_accum: int = 1):
        super().__init__()
        self.encoder = encoder
        self.head = AAMSoftmax(embedding_dim, num_classes, scale)
        self.margin = margin
        self.grad_accum = max(1, int(grad_accum))
        self.register_buffer("micro_batches", torch.zeros((), dtype=torch.int64))
        # A host copy of the buffer, read from it once after construction or a load: reading the buffer on
        # every call would make the CPU wait for the GPU on every micro-batch.
        self._micro: int | None = None

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._micro = None

    def forward(self, wav: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
        if self._micro is None:
            self._micro = int(self.micro_batches)
        m = self.margin(self._micro // self.grad_accum)
        if self.training:
            self.micro_batches += 1
            self._micro += 1
        emb = self.encoder(fbank_batch(wav))
        loss, cos = self.head(emb, labels, m)
        acc = (cos.detach().argmax(dim=1) == labels).float().mean()
        return loss, {"acc": acc, "margin": m}  # acc stays on the device until core logs it


def loss_fn(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    wav = batch["wav"]
    labels = torch.as_tensor(batch["label"], dtype=torch.int64, device=wav.device)
    return model(wav, labels)


def sgd(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """3D-Speaker's optimizer; core.train sets the learning rate of every step (warmup, then cosine)."""
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=weight_decay)


# ----------------------------------------------------------------------------- command line and wiring

def add_speaker_args(p: argparse.ArgumentParser, *, margin: float, aug_prob: float) -> None:
    g = p.add_argument_group("speaker training (3D-Speaker recipe)")
    g.add_argument("--heldout-speakers", type=int, default=2,
                   help="speakers left out of training for the EER trials (0: no EER; default %(default)s)")
    g.add_argument("--crop-seconds", type=float, default=3.0, help="training crop length (default %(default)s)")
    g.add_argument("--min-seconds", type=float, default=0.5,
                   help="utterances shorter than this are left out, and counted (default %(default)s)")
    g.add_argument("--no-speed-perturb", action="store_true", help="no 0.9/1.1 speed copies (one class/speaker)")
    g.add_argument("--noise-dir", default=None, help="folder of noise recordings (.wav/.flac/.ogg) to add")
    g.add_argument("--rir-dir", default=None, help="folder of room impulse responses to convolve with")
    g.add_argument("--aug-prob", type=float, default=aug_prob,
                   help="chance a crop is corrupted when --noise-dir/--rir-dir is given (default %(default)s)")
    g.add_argument("--snr-low", type=float, default=0.0)
    g.add_argument("--snr-high", type=float, default=15.0)
    g.add_argument("--scale", type=float, default=32.0, help="AAM-softmax scale (default %(default)s)")
    g.add_argument("--margin", type=float, default=margin, help="final AAM margin (default %(default)s)")
    g.add_argument("--margin-start-step", type=int, default=20_000, help="margin is 0 before this step")
    g.add_argument("--margin-ramp-steps", type=int, default=20_000, help="steps from 0 to --margin")
    g.add_argument("--eval-max-seconds", type=float, default=0.0,
                   help="embed at most this much of each held-out utterance (0: all of it)")
    g.add_argument("--cpu-threads", type=int, default=0,
                   help="torch CPU threads per rank (0: core's share of the cores); 1 helps on a busy machine")


def set_cpu_threads(args: argparse.Namespace, d: core.Dist) -> None:
    """After setup_dist: on a loaded machine, two spinning OpenMP threads per rank can be many times slower
    than one, so the thread count is a flag."""
    if args.cpu_threads > 0 and d.device.type == "cpu":
        torch.set_num_threads(args.cpu_threads)


#: RunConfig defaults of both trainers: 3D-Speaker's SGD settings; --batch-frames counts crop samples.
RUN_DEFAULTS = {"lr": 0.2, "weight_decay": 1e-4, "warmup_steps": 1000, "min_lr_ratio": 5e-5 / 0.2, "clip": 0.0,
                "batch_frames": 64 * 3 * SAMPLE_RATE}


def build_speaker_model(encoder: nn.Module, embedding_dim: int, data: SpeakerData, cfg: core.RunConfig,
                        args: argparse.Namespace, d: core.Dist) -> SpeakerModel:
    model = SpeakerModel(encoder, embedding_dim, data.num_classes,
                         MarginSchedule(args.margin, args.margin_start_step, args.margin_ramp_steps),
                         scale=args.scale, grad_accum=cfg.grad_accum)
    if d.world > 1 and d.device.type == "cuda":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # as 3D-Speaker; gloo/CPU has no SyncBN
    return model


def train_and_evaluate(name: str, model: SpeakerModel, data: SpeakerData, cfg: core.RunConfig,
                       args: argparse.Namespace, d: core.Dist) -> dict[str, Any]:
    """core.train with SGD and the crop transform, then (rank 0) the EER on the held-out speakers."""
    # core's loader.set_epoch reaches data.crops (the item_transform) through Loader.set_epoch.
    last = core.train(model, loss_fn, cfg, d, features=["pcm"], loader_kw=data.loader_kw,
                      optimizer=sgd(model, cfg.lr, cfg.weight_decay), log_name=name)
    if not d.main or not len(data.split.heldout):
        return last
    dirs = core.shard_dirs(cfg)
    res = evaluate_eer(model.encoder, dirs if len(dirs) > 1 else cfg.shards, data.split, d.device, data.speakers,
                       int(args.eval_max_seconds * SAMPLE_RATE))
    res["step"] = last.get("step")
    write_json_atomic(Path(cfg.out, "eer.json"), res)
    print(f"[{name}] EER {res['eer'] * 100:.2f}% on {res['target_trials']} target / {res['nontarget_trials']} "
          f"non-target trials ({res['utterances']} utterances of held-out speakers {res['speakers']}); "
          f"wrote {Path(cfg.out, 'eer.json')}", flush=True)
    return {**last, "eer": res["eer"]}
