"""What the two 3D-Speaker trainers (train_eres2net.py, train_campplus.py) share beyond data and scoring: the
recipe and its command line, the schedule counted in epochs, the model wrapper (embedding model + AAM head) and its
loss, SGD, starting from a checkpoint (3D-Speaker's or ours), and what follows training (EER, export).

  speaker_data.py   which utterances train; crops and their random draws; fbank on the device
  speaker_augment.py  speed perturbation, reverb and noise for a whole batch on the device
  speaker_eval.py   the AAM-softmax head; the EER on held-out speakers
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from audiopipe.checkpoints import speaker as ckpt
from audiopipe.checkpoints.files import CheckpointError
from audiopipe.storage.atomic import write_json_atomic

import core
from speaker_data import AUTO_HELDOUT, HOLD_OUT_FROM, SAMPLE_RATE, SpeakerData, fbank_batch, heldout_count
from speaker_eval import AAMSoftmax, evaluate_eer

# ----------------------------------------------------------------------------- the recipe and its flags

@dataclass(frozen=True)
class Recipe:
    """One model's training numbers in 3D-Speaker's VoxCeleb recipe (egs/voxceleb/sv-<model>/conf/<model>.yaml).
    Each is a flag's default; epochs count passes over the training utterances, as upstream's do."""

    lr: float
    min_lr: float
    epochs: float
    warmup_epochs: float
    margin: float
    margin_start_epoch: float  # the margin is 0 before this epoch ...
    margin_fix_epoch: float  # ... and reaches `margin` here
    aug_prob: float


def run_defaults(r: Recipe) -> dict[str, Any]:
    """core's flags with the recipe's values: SGD's LR and weight decay, no clipping, a budget of 64 crops of 3 s
    per rank (upstream's 256 over 4 GPUs); training stops at the end of --epochs unless --max-steps comes first.
    One pass an epoch whatever the corpus size: an epoch is one pass over the crops (the recipe's epochs), and every
    batch already holds the same number of crops (speaker_data.fill_last_batch)."""
    return {"lr": r.lr, "min_lr_ratio": r.min_lr / r.lr, "weight_decay": 1e-4, "warmup_steps": 0, "clip": 0.0,
            "max_steps": 10 ** 9, "batch_frames": 64 * 3 * SAMPLE_RATE, "passes": 1}


#: What core's flags mean in the speaker trainers (their --help).
FLAG_HELP = {
    "max_steps": "stop after this many optimizer steps even before the end of --epochs",
    "lr": "peak learning rate of SGD (momentum 0.9, Nesterov)",
    "weight_decay": "SGD's weight decay",
    "warmup_steps": "not used: the speaker trainers warm up over --warmup-epochs",
    "min_lr_ratio": "the LR at the end of --epochs as a fraction of --lr (the recipe's min_lr / lr)",
    "passes": "passes over the training crops per epoch (1: the recipe's epochs; every batch already holds the same "
              "number of crops, whatever the corpus size; 0 = by corpus size)",
}


def add_speaker_args(p: argparse.ArgumentParser, r: Recipe) -> None:
    g = p.add_argument_group("speaker training (3D-Speaker's recipe; epochs are passes over the training crops)")
    g.add_argument("--epochs", type=float, default=r.epochs,
                   help="epochs to train; the LR's cosine reaches its minimum at the end (default %(default)s)")
    g.add_argument("--warmup-epochs", type=float, default=r.warmup_epochs,
                   help="linear LR warmup from the minimum to --lr (default %(default)s)")
    g.add_argument("--margin", type=float, default=r.margin, help="final AAM margin (default %(default)s)")
    g.add_argument("--margin-start-epoch", type=float, default=r.margin_start_epoch,
                   help="the margin is 0 before this epoch (default %(default)s)")
    g.add_argument("--margin-fix-epoch", type=float, default=r.margin_fix_epoch,
                   help="the margin rises to --margin by this epoch (default %(default)s)")
    g.add_argument("--scale", type=float, default=32.0, help="AAM-softmax scale (default %(default)s)")
    g.add_argument("--heldout-speakers", type=heldout_count, default=None, metavar="N|auto",
                   help=f"whole speakers left out of training for the EER trials (0: no EER; 1 is refused); auto: "
                        f"{AUTO_HELDOUT} from {HOLD_OUT_FROM} speakers on, else 0, all speakers train "
                        f"(default auto)")
    g.add_argument("--crop-seconds", type=float, default=3.0, help="training crop length (default %(default)s)")
    g.add_argument("--min-seconds", type=float, default=0.5,
                   help="utterances shorter than this are left out, and counted (default %(default)s)")
    g.add_argument("--no-speed-perturb", action="store_true",
                   help="no 0.9/1.1 speed copies, one class per speaker (default: perturbed, 3 classes per speaker)")
    g.add_argument("--noise-dir", default=None, help="folder of noise recordings (.wav/.flac/.ogg) to add "
                                                    "(default: none)")
    g.add_argument("--rir-dir", default=None, help="folder of room impulse responses to convolve with "
                                                  "(default: none)")
    g.add_argument("--aug-prob", type=float, default=r.aug_prob,
                   help="chance a crop is corrupted when --noise-dir/--rir-dir is given (default %(default)s)")
    g.add_argument("--snr-low", type=float, default=0.0, help="lowest noise SNR in dB (default %(default)s)")
    g.add_argument("--snr-high", type=float, default=15.0, help="highest noise SNR in dB (default %(default)s)")
    g.add_argument("--augment-on", choices=("device", "cpu"), default="device",
                   help="where speed perturbation, noise and reverb run: 'device', batched on the training device "
                        "next to the fbank (the loader only slices crops); 'cpu', per crop in the loader with soxr "
                        "and scipy, as 3D-Speaker does (default %(default)s)")
    g.add_argument("--sync-bn", action="store_true",
                   help="synchronise BatchNorm statistics across GPUs (default: off, as 3D-Speaker's trainer)")
    g.add_argument("--export-upstream", default=None, metavar="DIR",
                   help="after training, write a speakerlab experiment folder there (config.yaml + "
                        "models/CKPT-EPOCH-N-00/) that its extract.py reads (default: none)")
    g.add_argument("--eval-max-seconds", type=float, default=0.0,
                   help="embed at most this much of each held-out utterance (0: all of it; default %(default)s)")
    g.add_argument("--cpu-threads", type=int, default=0,
                   help="torch CPU threads per rank (0: core's share of the cores; 1 helps on a busy machine; "
                        "default %(default)s)")


def check_flags(cfg: core.RunConfig, args: argparse.Namespace, d: core.Dist) -> None:
    """Refusals that need the parsed flags, then the CPU thread count (after setup_dist: on a loaded machine two
    spinning OpenMP threads per rank can be many times slower than one)."""
    if cfg.warmup_steps:
        raise SystemExit("--warmup-steps: the speaker trainers warm up over epochs, as 3D-Speaker does: use "
                         "--warmup-epochs")
    if not 0 <= args.margin_start_epoch <= args.margin_fix_epoch:
        raise SystemExit(f"--margin-start-epoch {args.margin_start_epoch} must be between 0 and "
                         f"--margin-fix-epoch {args.margin_fix_epoch}")
    if args.epochs <= 0 or args.warmup_epochs < 0:
        raise SystemExit(f"--epochs must be above 0 and --warmup-epochs at least 0, got {args.epochs} and "
                         f"{args.warmup_epochs}")
    if args.sync_bn and d.device.type != "cuda":
        raise SystemExit("--sync-bn needs CUDA devices (torch's SyncBatchNorm runs on GPUs only)")
    if args.cpu_threads > 0 and d.device.type == "cpu":
        torch.set_num_threads(args.cpu_threads)


# ----------------------------------------------------------------------------- LR and margin, counted in epochs

class EpochSchedule:
    """3D-Speaker's LR and margin at optimizer step s (0-based, as its `iter_num`), with epochs of
    `steps_per_epoch` steps (known once the loader is made: `start`).

    LR (WarmupCosineScheduler): min_lr -> lr linearly over the warmup epochs, then a cosine down to min_lr at
    the end of `epochs`, then min_lr. Margin (MarginScheduler, "exp" increase): 0 until margin_start_epoch, then
    margin * (1 - (1e-3 / (1 + 1e-6)) ** t) for t from 0 to 1 at margin_fix_epoch, then margin.
    """

    def __init__(self, lr: float, min_lr: float, epochs: float, warmup_epochs: float, margin: float,
                 margin_start_epoch: float, margin_fix_epoch: float):
        self.lr_max, self.lr_min, self.epochs, self.warmup = lr, min_lr, epochs, warmup_epochs
        self.final_margin, self.m_start, self.m_fix = margin, margin_start_epoch, margin_fix_epoch
        self.steps_per_epoch: int | None = None

    @classmethod
    def from_flags(cls, cfg: core.RunConfig, args: argparse.Namespace) -> "EpochSchedule":
        return cls(cfg.lr, cfg.lr * cfg.min_lr_ratio, args.epochs, args.warmup_epochs, args.margin,
                   args.margin_start_epoch, args.margin_fix_epoch)

    def start(self, cfg: core.RunConfig, steps_per_epoch: int) -> None:
        """Fix the epoch length; training stops at the end of the last epoch (or at --max-steps before it)."""
        self.steps_per_epoch = max(1, int(steps_per_epoch))
        cfg.max_steps = min(cfg.max_steps, max(1, int(round(self.epochs * self.steps_per_epoch))))

    def _steps(self, epochs: float) -> float:
        if self.steps_per_epoch is None:
            raise RuntimeError("EpochSchedule used before start(): the epoch length is not known yet")
        return epochs * self.steps_per_epoch

    def lr(self, step: int) -> float:
        warm, end = self._steps(self.warmup), self._steps(self.epochs)
        if step < warm:
            return self.lr_min + (self.lr_max - self.lr_min) * step / warm
        if step < end:
            return self.lr_min + 0.5 * (self.lr_max - self.lr_min) * (1 + math.cos(math.pi * (step - warm) /
                                                                                   (end - warm)))
        return self.lr_min

    def margin(self, step: int) -> float:
        start, fix = self._steps(self.m_start), self._steps(self.m_fix)
        if step < start:
            return 0.0
        if step >= fix:
            return self.final_margin
        return self.final_margin * (1.0 - (1e-3 / (1.0 + 1e-6)) ** ((step - start) / (fix - start)))


# ----------------------------------------------------------------------------- the model and its loss

class SpeakerModel(nn.Module):
    """Embedding model + AAM head: what DDP wraps and core checkpoints. forward(wav, labels) -> (loss, logs).

    The margin follows optimizer steps counted in a buffer, so it is saved with the weights and a resumed
    run continues the ramp where it stopped.
    """

    def __init__(self, encoder: nn.Module, embedding_dim: int, num_classes: int, margin: Callable[[int], float],
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
    """AAM-softmax cross entropy of the batch's crops (finished waveforms) against their (speaker, speed) classes."""
    wav = batch["wav"]
    labels = torch.as_tensor(batch["label"], dtype=torch.int64, device=wav.device)
    return model(wav, labels)


def loss_for(data: SpeakerData) -> core.LossFn:
    """core.train's loss_fn: the batch's crops finished on the device first (speed, reverb, noise: inside the step,
    next to the fbank), unless the loader already finished them (--augment-on cpu)."""
    finish = data.finish
    if finish is None:
        return loss_fn

    def run(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        return loss_fn(model, {"wav": finish(batch), "label": batch["label"]})

    return run


def sgd(model: nn.Module, cfg: core.RunConfig) -> torch.optim.Optimizer:
    """3D-Speaker's optimizer; core.train sets the learning rate of every step (EpochSchedule.lr)."""
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9, nesterov=True, weight_decay=cfg.weight_decay)


def sync_batchnorm(model: SpeakerModel, args: argparse.Namespace, d: core.Dist) -> nn.Module:
    """SyncBatchNorm only when asked (--sync-bn): 3D-Speaker's supervised trainer keeps per-GPU statistics."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if args.sync_bn and d.world > 1 else model


# ----------------------------------------------------------------------------- starting from a checkpoint

def init_is_upstream(cfg: core.RunConfig) -> bool:
    """Whether this run starts from 3D-Speaker's weights (--init-from a released file or an experiment folder)
    and is not resuming one of its own checkpoints (then --init-from is not read)."""
    if not cfg.init_from or (cfg.resume and core.latest_checkpoint(Path(cfg.out)) is not None):
        return False
    try:
        return ckpt.is_upstream_checkpoint(cfg.init_from)
    except CheckpointError as e:
        raise SystemExit(f"--init-from {e}") from None


def previous_model_config(cfg: core.RunConfig) -> dict[str, Any]:
    """The model_config.json of the run these weights come from: --out's when resuming it, else that of our own
    run --init-from points at (a run folder or a ckpt-*.pt beside its model_config.json); {} for none."""
    if cfg.resume and core.latest_checkpoint(Path(cfg.out)) is not None:
        where = Path(cfg.out)
    elif cfg.init_from:
        where = Path(cfg.init_from) if Path(cfg.init_from).is_dir() else Path(cfg.init_from).parent
    else:
        return {}
    f = where / "model_config.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def init_weights(name: str, model: SpeakerModel, upstream_args: Callable[[Any], dict[str, Any] | None],
                 presets: Mapping[str, Any], config: str) -> Callable[[str], dict[str, torch.Tensor]]:
    """core.train's --init-from reader: 3D-Speaker's files (renamed to ours) or our own checkpoints.

    A checkpoint of another size ends in one line naming the --config that builds it (upstream_args(config) is a
    config's speakerlab constructor arguments, None for one speakerlab cannot build). Its AAM head is kept only
    when it has this run's classes (same speakers, same speed perturbation); otherwise the head starts fresh."""
    conv = ckpt.converter(name)

    def sizes(state: Mapping[str, torch.Tensor]) -> dict[str, Any] | None:
        try:
            return conv.upstream_args(conv.to_upstream(state))
        except CheckpointError:
            return None  # not a size speakerlab builds: load_matching names the first tensor that differs

    ours = sizes(model.state_dict())

    def read(path: str) -> dict[str, torch.Tensor]:
        state = (ckpt.from_upstream_file(name, path) if ckpt.is_upstream_checkpoint(path)
                 else core.read_own_weights(path))
        theirs = sizes(state)
        if theirs is not None and ours is not None and theirs != ours:
            fits = [k for k, c in presets.items() if upstream_args(c) == theirs]
            fix = f"--config {fits[0]}" if fits else f"--config with a JSON file of {_diff(theirs, ours)}"
            raise CheckpointError(f"{path} holds {DISPLAY[name]} with {_diff(theirs, ours)}, but --config {config} "
                                  f"builds {_diff(ours, theirs)}: use {fix}")
        head = state.get(ckpt.HEAD)
        if head is not None and tuple(head.shape) != tuple(model.head.weight.shape):
            state = {k: v for k, v in state.items() if k != ckpt.HEAD}
        return state

    return read


DISPLAY = {"eres2net": "ERes2Net", "campplus": "CAM++"}

#: load_matching's hint when a tensor differs in shape and the sizes above could not say more.
INIT_HINTS = {"encoder.": "the checkpoint is another size of this model: pick the matching --config"}


def _diff(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={a[k]}" for k in a if a[k] != b.get(k)) or "the same sizes"


def write_model_config(cfg: core.RunConfig, d: core.Dist, name: str, mcfg: Any) -> None:
    """--out/model_config.json: which network this run trains, for the export (some choices leave no trace in
    the weights)."""
    if d.main:
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(cfg.out, "model_config.json"), {"model": name, **asdict(mcfg)})


# ----------------------------------------------------------------------------- after training

def evaluate_and_export(name: str, model: SpeakerModel, data: SpeakerData, cfg: core.RunConfig,
                        args: argparse.Namespace, d: core.Dist, last: dict[str, Any]) -> dict[str, Any]:
    """On rank 0: the EER of the held-out speakers (--out/eer.json), then --export-upstream."""
    if not d.main:
        return last
    if len(data.split.heldout):
        dirs = core.shard_dirs(cfg)
        res = evaluate_eer(model.encoder, dirs if len(dirs) > 1 else cfg.shards, data.split, d.device,
                           data.speakers, int(args.eval_max_seconds * SAMPLE_RATE))
        res["step"] = last.get("step")
        write_json_atomic(Path(cfg.out, "eer.json"), res)
        print(f"[{name}] EER {res['eer'] * 100:.2f}% on {res['target_trials']} target / {res['nontarget_trials']} "
              f"non-target trials ({res['utterances']} utterances of held-out speakers {res['speakers']}); "
              f"wrote {Path(cfg.out, 'eer.json')}", flush=True)
        last = {**last, "eer": res["eer"]}
    if args.export_upstream:
        try:
            # asked for before training: written, with each way speakerlab computes otherwise printed
            done = ckpt.export_upstream(name, cfg.out, args.export_upstream,
                                        check_config=ckpt.MODEL_CONFIG_CHECKS.get(name), allow_different=True)
        except CheckpointError as e:
            raise SystemExit(f"{name}: error: --export-upstream {e}") from None
        print(f"[{name}] wrote {done['path']}: a speakerlab experiment folder of {ckpt.UPSTREAM_CLASS[name]}"
              f"({', '.join(f'{k}={v}' for k, v in done['args'].items())})", flush=True)
        for note in done["notes"]:
            print(f"[{name}] note: {note}", flush=True)
        last = {**last, "export": done["path"]}
    return last
