"""The trainer core every trainers/train_*.py stands on: DDP, autocast, accumulation, clipping, LR schedule,
exact checkpoints, and the one number this project exists for, the share of each step spent waiting on data.

A trainer file defines a config, a model and `loss_fn(model, batch) -> (loss, {name: number})`, then calls
`train(...)`. Run under torchrun; a plain `python trainers/train_x.py` is a world of one.

Imports: trainers/ is a folder of scripts, not a package. `torchrun trainers/train_x.py` (or `python ...`) puts
trainers/ first on sys.path, so a trainer imports its siblings by name (`import core`, `from core import train`);
audiopipe comes from the installed package (`pip install -e .`, as the README's set-up does). No file here edits
sys.path, so the imports may stand in any order an import sorter gives them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

import numpy as np
import torch
import torch.distributed as dist

from audiopipe.checkpoints.files import CheckpointError, read_weights, tensors_only
from audiopipe.checkpoints.load import load_matching
from audiopipe.reader.errors import ConfigMismatch, ShardError
from audiopipe.reader.loader import Loader, make_loader
from audiopipe.sampler.corpus_weights import check_weights
from audiopipe.storage.s3 import ObjectStoreError, is_s3
from audiopipe.shard.manifest import read_manifest
from audiopipe.storage.atomic import atomic_path, write_text_atomic
from audiopipe.storage.paths import url_scheme


# ----------------------------------------------------------------------------- config and command line

@dataclass
class RunConfig:
    """What every trainer shares. Model sizes live in each trainer's own config."""

    shards: str = "./shards"  # one folder, or several comma-separated to mix (see weights)
    out: str = "./runs/run"
    config: str = "default"
    max_steps: int = 100_000
    batch_frames: int = 38_400  # padded frames per batch per rank
    bucket_budget: str = ""  # a per-length-bucket budget file (audiopipe/sampler/bucket_budget.py) instead
    quadratic: float = 0.0  # attention cost term of the batch budget (see BucketBatchSampler)
    max_items: int | None = None
    min_efficiency: float = 0.97  # split the most wasteful batches until the epoch pads no more than this
    pools: int = 0  # random pools an epoch is sorted in; 0: automatic
    passes: int = 0  # passes over the corpus per epoch; 0: by corpus size (several on a small one, else 1)
    shapes: int = 0  # at most this many batch shapes in the run; 0: off
    compile: bool = False  # torch.compile the model's forward and backward
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    precision: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU; or fp32 / bf16 / fp16
    num_workers: int = 0
    prefetch: int = 2  # padded batches made ready ahead of the step
    reader: str = "mmap"  # or "files": one .npy per utterance and feature (the benchmark baseline), for comparison
    on_corrupt: str = "fail"  # or "skip": train without the rows of shards found corrupt at open
    weights: str = ""  # with several --shards: comma-separated factors on each corpus's hours per epoch
    seed: int = 1234
    log_every: int = 10
    ckpt_every: int = 500
    resume: bool = False
    init_from: str = ""  # model weights to start from (an upstream checkpoint or one of ours); weights only
    skip_nonfinite: int = 0  # optimizer steps with a NaN/inf loss skipped before the run stops (0: stop at the first)
    verify: str = "size"  # or "checksum": every shard byte hashed once at open
    check_finite: bool = False  # every batch's features checked for NaN/inf where it is built
    profile_steps: int = 0  # rank 0 records this many steps after the first log window (step_profile.py)


FLAG_HELP = {
    "quadratic": "attention term of the batch budget: cost = n*m + quadratic*n*m^2 (0 = padded frames only)",
    "max_items": "at most this many utterances per batch",
    "min_efficiency": "padding efficiency the sampler reaches by splitting the most wasteful batches (0 = off: "
                      "full batches; docs/sampler.md)",
    "pools": "random pools each epoch is sorted and packed in (0 = automatic: the most that keep --min-efficiency)",
    "passes": "passes over the corpus per epoch, cut into batches as one stream (0 = by corpus size: several when "
              "it fills fewer than 4 batches, or fewer than 64 and one pass would leave its batches more than half "
              "empty, so that batches are full; else one; 1 = always one)",
    "shapes": "pad every batch to one of at most this many (items, frames) shapes for the whole run, for "
              "--compile (0 = off: each batch padded to its longest item; docs/sampler.md)",
    "bucket_budget": "a JSON file of batch budgets per length bucket (one calibrated per model and GPU by "
                     "benchmarks/gpu_proof.py; docs/sampler.md) used instead of --batch-frames; --max-items "
                     "still caps every bucket (default: none, one global --batch-frames budget)",
    "grad_accum": "micro-batches per optimizer step (each rank needs at least this many batches per epoch)",
    "lr": "peak learning rate",
    "weight_decay": "weight decay of the trainer's optimizer",
    "warmup_steps": "linear warmup steps, then cosine decay",
    "min_lr_ratio": "final LR as a fraction of --lr",
    "clip": "gradient norm clipping (0 = off)",
    "precision": "auto (bf16 on CUDA, fp32 on CPU), fp32, bf16 or fp16 (with a GradScaler)",
    "num_workers": "DataLoader workers (0 is usually fastest: reading is a slice of an mmap)",
    "prefetch": "padded batches made ready ahead of the step: built in a background thread while it runs, kept "
                "ready by each worker, their rows read ahead from storage (0 = nothing ahead)",
    "reader": "mmap (the shards) or files (one .npy per utterance: a benchmark baseline, to compare data wait)",
    "on_corrupt": "fail (stop at open, naming the corrupt shard) or skip (train without its rows, logged)",
    "weights": "with --shards a,b: each corpus's hours per epoch as a factor, e.g. 1,3 (1 = every utterance once, "
               "3 = three times, 0.5 = a random half of its hours, new each epoch; default all 1; docs/loader.md)",
    "seed": "seed for model init, batch plan and per-rank randomness",
    "log_every": "log every N steps (rank 0 prints; log.jsonl in --out)",
    "ckpt_every": "checkpoint every N steps (model, optimizer, scaler, sampler, RNG of every rank)",
    "init_from": "start from these model weights: an upstream checkpoint of this model (see the trainer's docs "
                 "page for the files it reads) or one of ours (a ckpt-*.pt, or a run folder for its latest); "
                 "weights only, so optimizer, step and data order start fresh. With --resume and a checkpoint "
                 "in --out, the resume wins",
    "skip_nonfinite": "optimizer steps whose loss is NaN or inf that are skipped (their batches dropped, each "
                      "named on one line) before the run stops; the run stops at the first beyond N with one line "
                      "naming the batch's utterance ids, and never writes a checkpoint holding NaN or inf",
    "verify": "size (sizes, footers, row counts: instant) or checksum (also every byte of every shard, once at "
              "open: finds bytes changed in place, e.g. NaN written over a feature)",
    "check_finite": "check every batch's features for NaN and inf where the batch is built (one pass over it): "
                    "stops with one line naming the feature and the utterance ids",
    "profile_steps": "record this many steps after the first --log-every window with torch.profiler (rank 0) and "
                     "write profile.json (per step: wall time, kernels and their time, calls that made the host "
                     "wait for the device, the costliest ops) and profile.txt in --out (0 = off; "
                     "docs/trainers/core.md)",
}

# Flags with a fixed set of values: argparse refuses anything else in one line, on every rank, before any work.
CHOICES = {
    "precision": ("auto", "fp32", "bf16", "fp16"),
    "reader": ("mmap", "files"),
    "on_corrupt": ("fail", "skip"),
    "verify": ("size", "checksum"),
}


def parse_args(description: str, defaults: dict[str, Any] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: list[str] | None = None,
               flag_help: dict[str, str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """flag_help: {field: help} where a trainer's meaning of a core flag is more precise than FLAG_HELP's."""
    p = argparse.ArgumentParser(description=description)
    helps = {**FLAG_HELP, **(flag_help or {})}
    base = RunConfig(**(defaults or {}))
    p.add_argument("--shards", default=base.shards,
                   help=f"shard folder or s3://bucket/prefix (AWS_* environment; docs/loader.md), or several "
                        f"comma-separated to mix in one plan (see --weights) (default {base.shards})")
    p.add_argument("--config", default=base.config,
                   help="model config: a name (tiny, default, ...) or a JSON file (default %(default)s)")
    p.add_argument("--out", default=base.out, help="checkpoints and logs (default %(default)s)")
    p.add_argument("--max-steps", type=int, default=base.max_steps,
                   help=f"{helps.get('max_steps', 'optimizer steps to train')} (default %(default)s)")
    p.add_argument("--batch-frames", type=int, default=base.batch_frames,
                   help="padded frames per batch per rank (default %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    for f in fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("shards", "config", "out", "max_steps", "batch_frames", "resume", "compile"):
            continue
        typ = type(getattr(base, f.name)) if getattr(base, f.name) is not None else int
        if typ is bool:  # a switch: --check-finite / --no-check-finite
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=getattr(base, f.name),
                           help=f"{helps.get(f.name, '')} (default: {'on' if getattr(base, f.name) else 'off'})")
            continue
        shown = " (default %(default)s)" if getattr(base, f.name) != "" else ""  # an empty default says nothing
        p.add_argument(flag, type=typ, default=getattr(base, f.name), choices=CHOICES.get(f.name),
                       help=f"{helps.get(f.name, '')}{shown}".strip())
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (inductor); with --shapes it meets at most that many batch "
                        "shapes, so it compiles at most that many times (default off; docs/trainers/core.md)")
    if extra:
        extra(p)
    a = p.parse_args(argv)
    for name in ("grad_accum", "log_every", "ckpt_every", "max_steps", "batch_frames"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(a, name)}")
    if a.skip_nonfinite < 0:
        p.error(f"--skip-nonfinite must be 0 (stop at the first) or more steps, got {a.skip_nonfinite}")
    if a.prefetch < 0:
        p.error(f"--prefetch must be 0 (off) or more batches, got {a.prefetch}")
    if a.profile_steps < 0 or (a.profile_steps and a.log_every + a.profile_steps > a.max_steps):
        p.error(f"--profile-steps {a.profile_steps}: the steps recorded follow the first --log-every window, so "
                f"--max-steps must be at least --log-every + --profile-steps ({a.log_every} + {a.profile_steps})")
    dirs = [s.strip() for s in a.shards.split(",")]
    if any(not s for s in dirs):
        p.error(f"--shards {a.shards!r} has an empty entry: give folders separated by single commas")
    if len(dirs) > 1 and a.reader != "mmap":
        p.error(f"--reader {a.reader} reads one shard folder; mixing several (--shards a,b) needs --reader mmap")
    if a.weights:
        if len(dirs) == 1:
            p.error("--weights goes with several --shards (a,b,...); one folder is read as it is")
        try:
            check_weights(a.weights.split(","), dirs)
        except ValueError as e:
            p.error(f"--weights: {e}")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out} is a file: give the folder the run writes its log and checkpoints to")
    for folder in dirs:  # before any trainer reads a manifest (texts, vocab, speakers) or starts a rank
        if url_scheme(folder) is None and not (Path(folder) / "manifest.json").is_file():
            p.error(f"--shards {folder}: no manifest.json there, so not a shard folder (write one with `audiopipe "
                    f"shard --corpus ... --out {folder}`)")
    cfg = RunConfig(**{f.name: getattr(a, f.name) for f in fields(RunConfig)})
    return cfg, a


def shard_dirs(cfg: RunConfig) -> list[str]:
    """The shard folders of --shards (one, or several to mix), in order."""
    return [s.strip() for s in cfg.shards.split(",")]


def corpus_offsets(cfg: RunConfig) -> list[int]:
    """Global index of each --shards folder's first utterance: a trainer that picks utterances per folder (a
    subset, budget lengths, speaker labels) adds these to hand the loader indices over the union."""
    # The manifest's count of rows written is the index's length, and it reads from s3:// as from a folder.
    sizes = [read_manifest(s)["totals"]["written"] for s in shard_dirs(cfg)]
    return [int(x) for x in np.concatenate([[0], np.cumsum(sizes)[:-1]])]


def load_model_config(name_or_path: str, presets: dict[str, Any], cls: type) -> Any:
    """A dataclass config from a preset name or a JSON file of overrides on the default."""
    if name_or_path in presets:
        return presets[name_or_path]
    path = Path(name_or_path)
    if path.is_file():
        return cls(**{**asdict(presets["default"]), **json.loads(path.read_text())})
    raise SystemExit(f"unknown --config {name_or_path!r}: use one of {sorted(presets)} or a JSON file")


# ----------------------------------------------------------------------------- distributed setup

@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)  # also every CUDA device's generator
    np.random.seed(seed)
    random.seed(seed)


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of one rank's draws during one optimizer step (dropout, noise, masks, crops from the global RNG).

    train() reseeds every rank with it at the start of each step, so a rank's draws depend only on where the run
    is: a run resumed from a checkpoint, under the same or another world size, draws at step s exactly what an
    uninterrupted run's rank draws at step s, and no trainer needs a reseeding workaround of its own.
    """
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def setup_dist(seed: int = 1234) -> Dist:
    """Join the torchrun group (if any) and seed everything alike on every rank, before the model is built."""
    seed_all(seed)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # Share the cores among ranks instead of every rank spawning one thread per core. A single process whose
        # caller set OMP_NUM_THREADS keeps it (torch already follows it), e.g. one thread beside other processes.
        if world > 1 or not os.environ.get("OMP_NUM_THREADS"):
            ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local, device)


def autocast_for(precision: str, device: torch.device):
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    if precision == "fp32":
        return precision, nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return precision, torch.autocast(device_type=device.type, dtype=dtype)


def lr_at(step: int, cfg: RunConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- checkpoints

def _rng_state() -> dict[str, Any]:
    st = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "python_pos": random.getstate()[2],
            "numpy": torch.from_numpy(st[1].astype(np.int64)), "numpy_pos": int(st[2]),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    random.setstate((3, tuple(s["python"]), s["python_pos"]))
    np.random.set_state(("MT19937", s["numpy"].numpy().astype(np.uint32), s["numpy_pos"], 0, 0.0))
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def save_checkpoint(out: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    scaler: torch.amp.GradScaler, loader: Loader, consumed: int, epoch: int, d: Dist,
                    extra: dict[str, Any] | None = None, hooks: Sequence["TrainHook"] = (),
                    name: str = "train") -> Path | None:
    """Called on every rank (it gathers each rank's RNG state); rank 0 writes. Weights holding NaN or inf are
    never written: every rank stops with one line (the weights are the same on every rank)."""
    _refuse_nonfinite_weights(model, step, d, name)
    rng = [_rng_state()]
    if d.world > 1:  # each rank draws its own dropout masks and crops: keep every rank's stream
        rng = [None] * d.world
        dist.all_gather_object(rng, _rng_state())
    if not d.main:
        return None
    raw = model.module if hasattr(model, "module") else model
    ckpt = {"step": step, "model": raw.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
            "sampler": loader.state_dict(consumed_batches=consumed), "epoch": epoch, "rng": rng,
            "extra": extra or {}, "hooks": {h.name: h.state_dict() for h in hooks}}
    path = out / f"ckpt-{step:08d}.pt"
    with atomic_path(path) as tmp:  # a crash or full disk while saving never leaves a half checkpoint as latest
        torch.save(ckpt, tmp)
    return path


def _refuse_nonfinite_weights(model: torch.nn.Module, step: int, d: Dist, name: str) -> None:
    floats = [t for t in model.state_dict().values() if torch.is_tensor(t) and t.is_floating_point()]
    if floats and not bool(torch.stack([torch.isfinite(t).all() for t in floats]).all()):
        bad = next(k for k, t in model.state_dict().items()
                   if torch.is_tensor(t) and t.is_floating_point() and not bool(torch.isfinite(t).all()))
        _fail(f"{name}: error: the weights hold NaN or inf at step {step} (first in {bad!r}): no checkpoint "
              f"written; the checkpoints already in the run folder are intact (resume from them with a lower "
              f"--lr, or check the data with --check-finite)", d)


# What a checkpoint of ours holds: a file without these is not one (another program's, or damaged).
CHECKPOINT_KEYS = ("step", "model", "optimizer", "scaler", "sampler", "epoch", "rng")


def _read_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    """One of our checkpoints, read without unpickling code; CheckpointError with a one-line reason."""
    import pickle

    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError:
        # torch's message suggests weights_only=False, i.e. running the file's code: never pass that on.
        raise CheckpointError(f"{path.name} holds objects other than tensors and plain values; it is not read "
                              f"(a checkpoint of ours holds none)") from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise CheckpointError(f"{path.name} cannot be read ({first}): damaged or cut short") from None
    missing = [k for k in CHECKPOINT_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path.name} is not a checkpoint of these trainers (no {', '.join(missing)})")
    return state


def load_resume(out: Path, device: torch.device, name: str) -> tuple[Path, dict[str, Any]] | None:
    """The latest readable checkpoint in `out` and its state: a damaged or refused latest is said in one line
    and the one before it is tried, down to the first. None when `out` holds none; CheckpointError (one line)
    when it holds some and none is readable."""
    cks = sorted(out.glob("ckpt-*.pt"), reverse=True)
    reasons: list[str] = []
    for ck in cks:
        try:
            state = _read_checkpoint(ck, device)
        except CheckpointError as e:
            reasons.append(str(e))
            continue
        for why in reasons:
            print(f"[{name}] --resume: {why}; using the earlier {ck.name}", file=sys.stderr, flush=True)
        return ck, state
    if cks:
        raise CheckpointError(f"--resume: no checkpoint in {out} can be read: {'; '.join(reasons)}")
    return None


def latest_checkpoint(out: Path) -> Path | None:
    cks = sorted(out.glob("ckpt-*.pt"))
    return cks[-1] if cks else None


def read_own_weights(path: str | Path) -> dict[str, torch.Tensor]:
    """The model weights of one of our checkpoints (a ckpt-*.pt, or a run folder for its latest), or of a plain
    state dict file. Read without unpickling code (audiopipe.checkpoints.files)."""
    p = Path(path)
    if p.is_dir():
        ck = latest_checkpoint(p)
        if ck is None:
            raise CheckpointError(f"{p}: a folder without ckpt-*.pt; give a checkpoint file")
        p = ck
    state = read_weights(p)
    if isinstance(state.get("model"), Mapping) and "step" in state:  # a ckpt-*.pt of trainers/core
        return tensors_only(state["model"], f"{p} (model)")
    return tensors_only(state, str(p))


class TrainHook(Protocol):
    """Work that runs beside the optimizer and is checkpointed with it, e.g. an EMA copy of the weights.

    on_start runs once the weights are final (after --init-from or --resume), before the first step; after_step
    after every optimizer step with the step count just reached; state_dict/load_state_dict go into and come out
    of each checkpoint under the hook's name."""

    name: str

    def on_start(self, model: torch.nn.Module, resumed: bool) -> None: ...

    def after_step(self, step: int, model: torch.nn.Module) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def init_weights_from(model: torch.nn.Module, path: str, read: Callable[[str], Mapping[str, torch.Tensor]],
                      hints: Mapping[str, str] | None = None) -> str:
    """Load `read(path)` into the model where names and shapes match; the one-line report of what happened."""
    return load_matching(model, read(path), hints).summary()


def _keep_log_until(path: Path, step: int) -> None:
    """A resumed run logs again the steps after its checkpoint: drop the earlier run's lines for them, so the log
    holds every step once."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(True)
    kept = [ln for ln in lines if ln.strip() and json.loads(ln).get("step", 0) <= step]
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(kept))


# ----------------------------------------------------------------------------- the loop

LossFn = Callable[[torch.nn.Module, dict[str, Any]], tuple[torch.Tensor, dict[str, Any]]]


def train(model: torch.nn.Module, loss_fn: LossFn, cfg: RunConfig, d: Dist, *, features: list[str],
          length_feature: str | None = None, expect: dict[str, str] | None = None,
          loader_kw: dict[str, Any] | None = None,
          to_device: Callable[[dict[str, Any], torch.device], dict[str, Any]] | None = None,
          optimizer: torch.optim.Optimizer | None = None, on_log: Callable[[dict[str, Any]], None] | None = None,
          log_name: str = "train", init_weights: Callable[[str], Mapping[str, torch.Tensor]] | None = None,
          init_hints: Mapping[str, str] | None = None, lr_fn: Callable[[int], float] | None = None,
          hooks: Sequence[TrainHook] = (), on_loader: Callable[[Loader], None] | None = None) -> dict[str, Any]:
    """Train until cfg.max_steps optimizer steps; returns the last logged record.

    loader_kw: passed to make_loader (item_transform, batch_transform, subset, lengths, collate_features, ...).
    loss_fn(model, batch) gets the batch on the device; it returns the loss and extra numbers to log. Return
    those as detached 0-d tensors (or plain Python numbers): they are summed on the device and read back only
    when a log line is due, so no step waits for the GPU.
    Randomness: every rank's global RNGs are reseeded at the start of each optimizer step from
    (seed, rank, step) (`step_seed`), so loss_fn may draw freely and --resume repeats the draws exactly.
    init_weights(path) -> state dict: how this trainer reads --init-from (an upstream file converted to our names;
    default: our own checkpoints, `read_own_weights`). It raises CheckpointError with a one-line reason; tensors
    whose shape follows a flag name that flag in init_hints ({name prefix: hint}).
    lr_fn(step) -> LR: the schedule (default `lr_at`: warmup + cosine); a param group's "lr_scale" multiplies it.
    hooks: run beside the optimizer and are checkpointed with it (TrainHook).
    on_loader(loader) runs once the loader is made, before any step: a schedule counted in epochs reads
    len(loader) (batches per rank per epoch) there.
    """
    out = Path(cfg.out)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
    model.to(d.device)
    resume_from = latest_checkpoint(out) if cfg.resume else None
    if cfg.init_from and resume_from is None:
        try:
            said = init_weights_from(model, cfg.init_from, init_weights or read_own_weights, init_hints)
        except CheckpointError as e:
            _fail(f"{log_name}: error: --init-from {e}", d)
        if d.main:
            print(f"[{log_name}] --init-from {cfg.init_from}: {said}", flush=True)
    elif cfg.init_from and d.main:
        print(f"[{log_name}] --resume continues {resume_from.name}; --init-from {cfg.init_from} is not read",
              flush=True)
    if cfg.resume and resume_from is None and d.main:  # a job script that always passes --resume: its first run
        print(f"[{log_name}] --resume: no checkpoint in {out} yet; starting at step 0", flush=True)
    lr_of = lr_fn or (lambda s: lr_at(s, cfg))
    try:
        loader = _make_loader(cfg, d, features, length_feature, expect, loader_kw or {}, out)
    except (ShardError, ConfigMismatch, FileNotFoundError, ValueError, ObjectStoreError) as e:
        # The shard set cannot be read as asked (missing, corrupt with --on-corrupt fail, another feature config,
        # a URL, an object store that stays down): the same on every rank, so every rank ends here and rank 0
        # says why in one line.
        _fail(f"{log_name}: error: {e}", d)
    if on_loader is not None:
        on_loader(loader)
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    precision, autocast = autocast_for(cfg.precision, d.device)
    scaler = torch.amp.GradScaler(d.device.type, enabled=precision == "fp16")
    step, epoch, resumed = 0, 0, False
    log_path = out / "log.jsonl"
    if resume_from is not None:
        ck, state = _resume_state(model, opt, scaler, loader, out, d, log_name)
        step, epoch, resumed = state["step"], state["epoch"], True
        for h in hooks:
            if h.name in state.get("hooks", {}):
                h.load_state_dict(state["hooks"][h.name])
        if d.main:
            _keep_log_until(log_path, step)
        # Same world size: each rank continues its own stream. Another world size: fresh per-rank streams from
        # the restored step (the steps reseed anyway; this covers draws made between steps).
        rng = state["rng"]
        if len(rng) == d.world:
            _set_rng_state(rng[d.rank])
        else:
            seed_all(step_seed(cfg.seed, d.rank, step))
        if d.main:
            print(f"[{log_name}] resumed from {ck.name} at step {step} (epoch {epoch}); the sampler continues "
                  f"with the next unseen batch", flush=True)
    if d.main:  # after a resume: under another world size the sampler keeps the passes the run was saved with
        say_passes(loader, cfg, log_name)
    profile = None
    if cfg.profile_steps and d.main:
        from step_profile import StepProfile  # here: `from trainers.core import plot_log` keeps working

        profile = StepProfile(out, cfg.profile_steps, cfg.log_every, d.device)
        hooks = [*hooks, profile]
    for h in hooks:
        h.on_start(model, resumed)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if d.world > 1 else model
    # --compile: only the forward the loss calls is compiled; checkpoints and hooks keep the plain module.
    forward = compiled(ddp, cfg) if cfg.compile else ddp
    move = to_device or default_to_device
    f0 = loader.collate.features[0]  # the feature whose frames and padding are logged
    # fill: the padded frames of the budget's feature (rows x T_max, what the budget counts) / the budget
    lf = length_feature or features[0]
    fill_key = f"{lf if lf in loader.collate.features else f0}_mask"  # crops collate under another name
    budget_frames = float(loader.sampler.budget.max_frames)
    clock, window = _Clock(d.device), _Window()
    guard = _NonFiniteGuard(cfg.skip_nonfinite, d, log_name, scaler_skips=scaler.is_enabled())
    last: dict[str, Any] = {}

    while step < cfg.max_steps:
        loader.set_epoch(epoch)
        # Every rank gets the same number of batches, so every rank stops here together, never one alone.
        batches = len(loader)
        if d.main and loader.mix is not None:  # what each corpus gives this epoch (hours, repeats, share)
            print(f"[{log_name}] {loader.mix_summary()}", flush=True)
        if batches < cfg.grad_accum and not resumed:  # a resumed pass may legitimately hold only a tail
            _fail(_no_step_message(loader, cfg, epoch, batches, log_name), d)
        it = guard.batches(iter(loader))
        opt.zero_grad(set_to_none=True)  # a partial accumulation at the end of an epoch is not carried over
        clock.start_pass()
        micro, steps_at_start = 0, step  # micro: batches of this pass, what the sampler's state_dict counts
        pending = _Window()  # this step's micro-batches: they join the log window only if the step is taken
        while step < cfg.max_steps:
            if micro % cfg.grad_accum == 0:  # a step begins: its draws depend on (seed, rank, step) alone
                seed_all(step_seed(cfg.seed, d.rank, step))
            clock.wait_begin()  # everything until the batch is in hand (and on the device) is data wait
            batch = next(it, None)
            if batch is None:
                break
            batch = move(batch, d.device)
            clock.wait_end()
            micro += 1
            sync = micro % cfg.grad_accum == 0
            ctx = ddp.no_sync() if (d.world > 1 and not sync) else nullcontext()
            with ctx:
                with autocast:
                    loss, logs = loss_fn(forward, batch)
                scaler.scale(loss / cfg.grad_accum).backward()
            pending.add(loss, logs, batch[f"{f0}_lengths"], batch["padding_ratio"][f0], cfg.grad_accum)
            if fill_key in batch:
                pending.fill += batch[fill_key].numel() / budget_frames
            guard.see(batch)
            if not sync:
                continue
            if guard.bad(pending.loss, step, opt):  # --skip-nonfinite: a NaN step's gradients are dropped
                pending = _Window()
                continue
            window.merge(pending)
            pending = _Window()
            lr = lr_of(step)
            for g in opt.param_groups:
                g["lr"] = lr * g.get("lr_scale", 1.0)
            scaler.unscale_(opt)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip) if cfg.clip > 0 else None
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            step += 1
            for h in hooks:
                h.after_step(step, model)
            clock.step_end()
            window.steps += 1
            if step % cfg.log_every == 0 or step % cfg.ckpt_every == 0 or step == cfg.max_steps:
                guard.check()  # a NaN/inf loss since the last check stops the run before it is logged or saved
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                last = _log(window, clock, step, lr, gnorm, d, log_path, log_name, epoch)
                if on_log:
                    on_log(last)
                window = _Window()
            if step % cfg.ckpt_every == 0 or step == cfg.max_steps:
                save_checkpoint(out, step, ddp, opt, scaler, loader, micro, epoch, d, hooks=hooks, name=log_name)
                if d.world > 1:
                    dist.barrier()
        # len(loader) promised a step; a loader that yields fewer batches than it announced must not spin forever.
        if step == steps_at_start and step < cfg.max_steps and not resumed:
            _fail(_no_step_message(loader, cfg, epoch, micro, log_name), d)
        resumed = False
        if step < cfg.max_steps:
            epoch += 1
    if profile is not None and not profile.done:
        print(f"[{log_name}] --profile-steps {cfg.profile_steps}: the run ended before the recorded steps did "
              f"(they follow this process's first {cfg.log_every} steps); nothing written", flush=True)
    if d.world > 1:
        dist.destroy_process_group()
    return last


def say_passes(loader: Loader, cfg: RunConfig, log_name: str) -> None:
    """One line when an epoch is several passes (a small corpus, repeat.auto_passes): how many, and the batches
    and fill they plan; or, with --passes 1 where --passes 0 would plan several, the one-pass fill and the flag.
    Other corpora say nothing here."""
    sampler = loader.sampler
    small = getattr(sampler, "small_corpus_passes", None)  # the bucket sampler's (not block windows')
    if loader.mix is not None or small is None:
        return
    # passes=None already chose by corpus size (sampler.passes is small()'s answer): no second one-pass plan
    if sampler.passes == 1 and (sampler.requested_passes is None or small() == 1):
        return
    diag = sampler.diagnostics  # the epoch's plan, which the first step builds anyway (a small corpus: cheap)
    n = sampler.lengths
    kept = n[(n > 0) & sampler.budget.fits_alone(n)]
    size = f"{kept.size} utterances, {kept.sum() / sampler.budget.max_frames:.1f} batches of frames"
    plan = f"{diag.batches_per_rank} batches per rank an epoch, planned fill {diag.fill_ratio:.0%} of the budget"
    cap = getattr(sampler.budget, "max_items", None)
    if cap:  # a batch is also full at the item cap: short items fill batches by count long before the frames
        size += f", {kept.size / cap:.1f} batches of {cap} items"
        plan += f" and {diag.kept / max(diag.num_batches, 1) / cap:.0%} of the {cap}-item cap"
    if sampler.passes > 1:
        how = "--passes 0: by corpus size" if cfg.passes == 0 else f"--passes {cfg.passes}"
        print(f"[{log_name}] {size}: an epoch is {sampler.passes} passes over them ({how}), {plan}", flush=True)
    else:
        print(f"[{log_name}] {size}, one pass an epoch: {plan}; --passes 0 (by corpus size) plans several passes "
              f"an epoch with full batches", flush=True)


def _make_loader(cfg: RunConfig, d: Dist, features: list[str], length_feature: str | None,
                 expect: dict[str, str] | None, loader_kw: dict[str, Any], out: Path) -> Loader:
    dirs = shard_dirs(cfg)
    # prefetch: the next batches are padded in a background thread (and, on CUDA, copied on a side stream) while
    # this step runs, so the step waits only for a batch that is truly late; the loader hands them on d.device.
    budget: Any = cfg.batch_frames
    if cfg.bucket_budget:  # a budget per length bucket instead of one global one; a bad file is a ValueError
        from audiopipe.sampler.bucket_budget import BucketBudget

        budget = BucketBudget.read(cfg.bucket_budget)
    # --prefetch 0 is off: given a device, make_loader would still build one batch ahead in a thread; without,
    # the batch is built when the step asks and moved by the loop.
    common = dict(max_frames=budget, length_feature=length_feature, quadratic=cfg.quadratic,
                  max_items=cfg.max_items, seed=cfg.seed, num_workers=cfg.num_workers, rank=d.rank,
                  world_size=d.world, expect=expect, prefetch=cfg.prefetch,
                  device=d.device if cfg.prefetch else None, passes=cfg.passes or None, **loader_kw)
    if cfg.reader == "files":  # the benchmark baseline: one .npy per utterance, exported once next to the run
        # Both checks before rank 0 starts an export the others would wait for.
        if len(dirs) > 1:
            raise ValueError("--reader files exports one local shard folder; a mix of several is read with "
                             "--reader mmap")
        if is_s3(cfg.shards):
            raise ValueError(f"--reader files exports a local shard folder; {cfg.shards} is read with --reader mmap")
        from audiopipe.bench.files_dataset import export_per_utterance, files_loader

        cache = out / "per_utterance"
        if d.main:
            export_per_utterance(cfg.shards, features, cache)
        if d.world > 1:
            dist.barrier()
        return files_loader(cfg.shards, features, cache, **common)
    common.update(min_efficiency=cfg.min_efficiency, pools=cfg.pools or None, shapes=cfg.shapes or None)
    if cfg.verify != "size" or cfg.check_finite:  # the shards' integrity checks, when asked (mmap reader)
        common.update(verify=cfg.verify, check_finite=cfg.check_finite)
    # Several folders: one plan over their union, each corpus's hours scaled by its weight (docs/loader.md).
    if len(dirs) > 1:
        common["weights"] = [float(w) for w in cfg.weights.split(",")] if cfg.weights else None
    return make_loader(dirs if len(dirs) > 1 else cfg.shards, features, on_corrupt=cfg.on_corrupt, **common)


def compiled(model: torch.nn.Module, cfg: RunConfig) -> Callable[..., Any]:
    """torch.compile(model) for --compile. Shapes that change are compiled again (a dimension seen to change
    becomes dynamic); with --shapes K a run meets at most K batch shapes, so the recompile limit is raised to
    hold them all rather than fall back to eager mode."""
    import torch._dynamo

    if cfg.shapes:
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * cfg.shapes)
    return torch.compile(model)


def _resume_state(model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler,
                  loader: Loader, out: Path, d: Dist, name: str) -> tuple[Path, dict[str, Any]]:
    """Load the latest readable checkpoint of `out` into model, optimizer, scaler and sampler (load_resume);
    what cannot be read or does not fit this model is one line on every rank, never a traceback."""
    try:
        found = load_resume(out, d.device, name)
        assert found is not None  # train() resumes only when latest_checkpoint found a file
        ck, state = found
        try:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state["scaler"])
            loader.load_state_dict(state["sampler"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CheckpointError(f"--resume: {ck.name} does not fit this model and run ({first}); resume with "
                                  f"the settings it was written with, or use a new --out") from None
    except CheckpointError as e:
        _fail(f"{name}: error: {e}", d)
    return ck, state


class _NonFiniteGuard:
    """Stops the run at a NaN/inf loss, naming the step's utterance ids, or skips up to --skip-nonfinite such
    steps (whose gradients are then dropped before the optimizer moves).

    Stopping costs no host sync of its own: each step's flag stays on the device and the flags are read where
    the loop reads the device anyway, at a log line or a checkpoint (`check`), so the run stops there, before
    anything of the bad steps is logged or saved. Skipping must decide before the optimizer steps, so with
    --skip-nonfinite the flag is read back every step. With several ranks the flags are all-reduced, so that
    every rank skips or stops together, and the ids named are those of every rank whose batch was bad."""

    def __init__(self, limit: int, d: Dist, name: str, scaler_skips: bool = False) -> None:
        # fp16: GradScaler already skips a step whose gradients overflow and backs its scale off (an inf loss is
        # how an overflow shows); stopping there would end every fp16 run at its first overflow. The weights stay
        # finite either way, and a non-finite checkpoint is still refused.
        self.scaler_skips = scaler_skips
        self.limit, self.d, self.name = limit, d, name
        self.skipped = 0
        self.ids: list[str] = []
        self.pending: list[tuple[int, torch.Tensor, list[str]]] = []  # (step, flag on the device, ids)

    def see(self, batch: dict[str, Any]) -> None:
        ids = batch.get("id")
        self.ids += [str(i) for i in ids] if isinstance(ids, (list, tuple)) else []

    def batches(self, it: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The pass's batches; a shard found damaged while reading (NaN under --check-finite, a file cut short
        after it was opened) ends the run with one line on this rank, the one that read it."""
        try:
            yield from it
        except ShardError as e:
            # The first line: the prefetch thread adds a second saying where it was raised.
            print(f"{self.name}: error: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
            raise SystemExit(1) from None

    def bad(self, loss: Any, step: int, opt: torch.optim.Optimizer) -> bool:
        """Whether this step (about to become step + 1) must be skipped: its summed loss is not finite and
        --skip-nonfinite allows it (its gradients are dropped). Without --skip-nonfinite the flag is kept for
        `check` and the step goes on."""
        ids, self.ids = self.ids, []
        if self.scaler_skips:
            return False
        flag = (~torch.isfinite(torch.as_tensor(loss).detach().float())).reshape(1)
        if self.limit == 0:
            self.pending.append((step + 1, flag, ids))
            return False
        flags, mine = self._agree(flag)
        if not flags[0]:
            return False
        opt.zero_grad(set_to_none=True)
        named = self._named([ids if mine[0] else []])
        self.skipped += 1
        if self.skipped > self.limit:
            self._stop(step + 1, named)
        if self.d.main:
            print(f"[{self.name}] skipped step {step + 1}: the loss is NaN or inf in the batch of utterance(s) "
                  f"{named} ({self.skipped} of --skip-nonfinite {self.limit})", flush=True)
        return True

    def check(self) -> None:
        """At a log line or a checkpoint: stop in one line when a step since the last check had a NaN/inf loss."""
        if not self.pending:
            return
        pending, self.pending = self.pending, []
        flags, mine = self._agree(torch.cat([f for _, f, _ in pending]))
        if any(flags):
            i = flags.index(True)
            self._stop(pending[i][0], self._named([pending[i][2] if mine[i] else []]))

    def _agree(self, flag: torch.Tensor) -> tuple[list[bool], list[bool]]:
        """(every rank's verdict, this rank's own) for each flag: one read back from the device."""
        local = flag.to(torch.float32)
        agreed = local.clone()
        if self.d.world > 1:
            agreed = agreed.to(self.d.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        both = torch.stack([agreed.to(local.device), local]).tolist()
        return [bool(x) for x in both[0]], [bool(x) for x in both[1]]

    def _named(self, ids: list[list[str]]) -> str:
        if self.d.world > 1:  # the bad batch may be another rank's
            every: list[Any] = [None] * self.d.world
            dist.all_gather_object(every, ids[0])
            ids = every
        flat = [i for part in ids for i in part]
        return ", ".join(flat[:8]) + (f" and {len(flat) - 8} more" if len(flat) > 8 else "")

    def _stop(self, step: int, named: str) -> None:
        _fail(f"{self.name}: error: the loss is NaN or inf at step {step}, in the batch of utterance(s) {named}: "
              f"stopped (no checkpoint of it is written; --skip-nonfinite N skips up to N such steps; "
              f"`audiopipe verify` or --check-finite finds damaged shards)", self.d)


def _fail(message: str, d: Dist) -> None:
    """End every rank with one line: rank 0 prints it, and no rank exits before it is printed (torchrun stops
    the others as soon as one rank dies)."""
    if d.world == 1:
        raise SystemExit(message)
    if d.main:
        print(message, file=sys.stderr, flush=True)
    dist.barrier()
    raise SystemExit(1)


def _no_step_message(loader: Loader, cfg: RunConfig, epoch: int, batches: int, name: str) -> str:
    """Why an epoch cannot give a single optimizer step, and what to change."""
    if batches == 0:
        lengths = np.asarray(loader.sampler.lengths)
        real = lengths[lengths > 0]
        if real.size == 0:
            return (f"{name}: error: epoch {epoch} has no batch: all {lengths.size} utterances are empty "
                    f"(0 frames); check the shards with `audiopipe inspect`")
        m = int(real.min())
        if cfg.bucket_budget:
            return (f"{name}: error: epoch {epoch} has no batch: every one of the {real.size} utterances (the "
                    f"shortest {m} frames) is longer than --bucket-budget {cfg.bucket_budget} allows alone "
                    f"({loader.sampler.budget.longest_alone()} frames); calibrate it for these lengths")
        need = int(math.ceil(m + cfg.quadratic * m * m))
        return (f"{name}: error: epoch {epoch} has no batch: every one of the {real.size} utterances is longer "
                f"than the --batch-frames budget of {cfg.batch_frames} (the shortest alone costs {need}); "
                f"raise --batch-frames to at least {need}")
    return (f"{name}: error: each rank gets only {batches} batch(es) in epoch {epoch} but --grad-accum is "
            f"{cfg.grad_accum}, so no optimizer step is ever taken (an accumulation left partial at the end of "
            f"an epoch is dropped); use --grad-accum {batches} or less, a smaller --batch-frames, or fewer ranks")


class _Window:
    """What a log window sums. Loss, frames and tensor log terms stay on the device until the log line.

    Only micro-batches of steps taken count: a partial accumulation dropped at the end of an epoch is neither
    trained on nor logged (nor timed, see _Clock.start_pass)."""

    def __init__(self) -> None:
        self.loss: Any = 0.0
        self.frames: Any = 0
        self.terms: dict[str, Any] = {}
        self.pad: list[Any] = []
        self.fill = 0.0  # sum over micro-batches of padded frames / budget
        self.micro = 0
        self.steps = 0

    def merge(self, other: "_Window") -> None:
        self.loss = self.loss + other.loss
        self.frames = self.frames + other.frames
        self.pad += other.pad
        self.fill += other.fill
        self.micro += other.micro
        for k, v in other.terms.items():
            self.terms[k] = self.terms.get(k, 0.0) + v

    def add(self, loss: torch.Tensor, logs: dict[str, Any], lengths: torch.Tensor, pad: Any, accum: int) -> None:
        self.loss = self.loss + loss.detach().float() / accum
        self.frames = self.frames + lengths.sum()
        self.pad.append(pad)
        self.micro += 1
        for k, v in logs.items():  # per-term numbers are averaged over the window's micro-batches
            self.terms[k] = self.terms.get(k, 0.0) + (v.detach().float() if torch.is_tensor(v) else float(v))


class _HostEvent:
    """torch.cuda.Event's timing interface on the host's clock: _Clock runs the same code on CPU as on CUDA, so a
    CPU run exercises every line of it but the event class."""

    __slots__ = ("t",)

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_HostEvent") -> float:
        return (end.t - self.t) * 1e3  # milliseconds, as torch.cuda.Event's


class _Clock:
    """Step time and data wait of a log window.

    Marks are events: on CUDA on the GPU's own timeline, read only when a log line is due (reading them waits for
    the GPU, so no other step synchronises); on CPU the wall clock (_HostEvent). On CUDA, the wait of a batch is
    the time between the GPU reaching an event recorded before the batch was asked for and one recorded once it
    was on the device: nearly 0 when the GPU still had queued work to run while the batch was built, the whole
    gap when the GPU sat idle waiting for it. That is the honest data wait: time the step waited for a batch that
    was not ready.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._event: Callable[[], Any] = (lambda: torch.cuda.Event(enable_timing=True)) if self.cuda else _HostEvent
        self.steps: list[tuple[Any, Any]] = []
        self.waits: list[tuple[Any, Any]] = []
        self._step_waits: list[tuple[Any, Any]] = []
        self._start: Any = None
        self._w0: Any = None

    def _mark(self) -> Any:
        e = self._event()
        e.record()
        return e

    def start_pass(self) -> None:
        # A pass's first wait and step count from here; a partial accumulation left by the last pass is not timed.
        self._start, self._step_waits = self._mark(), []

    def wait_begin(self) -> None:
        self._w0 = self._mark()

    def wait_end(self) -> None:
        self._step_waits.append((self._w0, self._mark()))

    def step_end(self) -> None:
        end = self._mark()
        self.steps.append((self._start, end))
        self.waits += self._step_waits
        self._start, self._step_waits = end, []

    def read(self) -> tuple[float, float]:
        """(step seconds, wait seconds) summed over the steps since the last read."""
        if self.steps:
            self.steps[-1][1].synchronize()  # the last mark is the latest: every earlier one has completed too
        step_s = sum(a.elapsed_time(b) for a, b in self.steps) / 1e3
        wait_s = sum(a.elapsed_time(b) for a, b in self.waits) / 1e3
        self.steps, self.waits = [], []
        return step_s, wait_s


def _log(w: _Window, clock: _Clock, step: int, lr: float, gnorm: torch.Tensor | None, d: Dist, path: Path,
         name: str, epoch: int) -> dict[str, Any]:
    # The only host sync of the loop: the window's sums come back from the device here.
    step_t, wait = clock.read()
    # Sums over ranks for work done; the slowest rank's times, since every rank waits for it at the all-reduce.
    sums = torch.tensor([float(w.frames), float(w.loss), float(w.steps), w.fill, float(w.micro)],
                        dtype=torch.float64, device=d.device)
    maxes = torch.tensor([wait, step_t], dtype=torch.float64, device=d.device)
    if d.world > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    frames, loss_sum, n_all, fill, micro = sums.tolist()
    wait, step_t = maxes.tolist()
    n = max(w.steps, 1)
    terms = {k: float(v) / max(w.micro, 1) for k, v in w.terms.items()}
    rec = {"step": step, "epoch": epoch, "loss": loss_sum / max(n_all, 1), "lr": lr,
           "grad_norm": float(gnorm) if gnorm is not None else 0.0,
           "step_time": step_t / n, "data_wait": wait / n, "data_wait_share": wait / step_t if step_t > 0 else 0.0,
           "frames_per_s": frames / step_t if step_t > 0 else 0.0,
           "padding_ratio": float(np.mean([float(p) for p in w.pad])) if w.pad else 0.0,
           "fill": fill / micro if micro else 0.0, "world": d.world,
           "device": str(d.device), **terms}
    if d.main:
        print(f"[{name}] step {step} loss {rec['loss']:.4f} lr {lr:.2e} step {rec['step_time'] * 1e3:.0f} ms "
              f"data-wait {rec['data_wait_share'] * 100:.1f}% pad {rec['padding_ratio'] * 100:.1f}% "
              f"fill {rec['fill'] * 100:.0f}% "
              f"{rec['frames_per_s']:.0f} frames/s", flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return rec


def default_to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Tensors to the device; tensors a prefetching loader already put there are passed through untouched."""
    nb = device.type == "cuda"
    return {k: (v.to(device, non_blocking=nb) if torch.is_tensor(v) and v.device != device else v)
            for k, v in batch.items()}


def plot_log(log_path: str | Path, png: str | Path, title: str, keys: tuple[str, ...] = ("loss",)) -> Path:
    """Loss curve(s) from a log.jsonl, for docs/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [json.loads(l) for l in Path(log_path).read_text().splitlines() if l.strip()]
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=110)
    for k in keys:
        ax.plot([r["step"] for r in recs if k in r], [r[k] for r in recs if k in r], label=k)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return Path(png)
