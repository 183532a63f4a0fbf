"""The trainer core every trainers/train_*.py stands on: DDP, autocast, accumulation, clipping, LR schedule,
exact checkpoints, and the one number this project exists for, the share of each step spent waiting on data.

A trainer file defines a config, a model and `loss_fn(model, batch) -> (loss, {name: float})`, then calls
`train(...)`. Run under torchrun; a plain `python trainers/train_x.py` is a world of one.
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
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from audiopipe.reader.loader import Loader, make_loader  # noqa: E402


# ----------------------------------------------------------------------------- config and command line

@dataclass
class RunConfig:
    """What every trainer shares. Model sizes live in each trainer's own config."""

    shards: str = "./shards"
    out: str = "./runs/run"
    config: str = "default"
    max_steps: int = 100_000
    batch_frames: int = 38_400  # padded frames per batch per rank
    quadratic: float = 0.0  # attention cost term of the batch budget (see BucketBatchSampler)
    max_items: int | None = None
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 1000
    min_lr_ratio: float = 0.1
    clip: float = 1.0
    precision: str = "auto"  # auto: bf16 on CUDA, fp32 on CPU; or fp32 / bf16 / fp16
    num_workers: int = 0
    reader: str = "mmap"  # or "files": one .npy per utterance and feature (the baseline layout), for comparison
    on_corrupt: str = "fail"  # or "skip": train without the rows of shards found corrupt at open
    seed: int = 1234
    log_every: int = 10
    ckpt_every: int = 500
    resume: bool = False


FLAG_HELP = {
    "quadratic": "attention term of the batch budget: cost = n*m + quadratic*n*m^2 (0 = padded frames only)",
    "max_items": "at most this many utterances per batch",
    "grad_accum": "micro-batches per optimizer step",
    "lr": "peak learning rate",
    "weight_decay": "AdamW weight decay",
    "warmup_steps": "linear warmup steps, then cosine decay",
    "min_lr_ratio": "final LR as a fraction of --lr",
    "clip": "gradient norm clipping (0 = off)",
    "precision": "auto (bf16 on CUDA, fp32 on CPU), fp32, bf16 or fp16 (with a GradScaler)",
    "num_workers": "DataLoader workers (0 is usually fastest: reading is a slice of an mmap)",
    "reader": "mmap (the shards) or files (one .npy per utterance: the baseline, to compare data wait)",
    "on_corrupt": "fail (stop at open, naming the corrupt shard) or skip (train without its rows, logged)",
    "seed": "seed for model init, batch plan and per-rank randomness",
    "log_every": "log every N steps (rank 0 prints; log.jsonl in --out)",
    "ckpt_every": "checkpoint every N steps (model, optimizer, scaler, sampler, RNG of every rank)",
}


def parse_args(description: str, defaults: dict[str, Any] | None = None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None,
               argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    p = argparse.ArgumentParser(description=description)
    base = RunConfig(**(defaults or {}))
    p.add_argument("--shards", default=base.shards, help=f"shard folder (default {base.shards})")
    p.add_argument("--config", default=base.config, help="model config: a name (tiny, default, ...) or a JSON file")
    p.add_argument("--out", default=base.out, help="checkpoints and logs (default %(default)s)")
    p.add_argument("--max-steps", type=int, default=base.max_steps, help="optimizer steps to train (default %(default)s)")
    p.add_argument("--batch-frames", type=int, default=base.batch_frames,
                   help="padded frames per batch per rank (default %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    for f in fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("shards", "config", "out", "max_steps", "batch_frames", "resume"):
            continue
        typ = type(getattr(base, f.name)) if getattr(base, f.name) is not None else int
        p.add_argument(flag, type=typ, default=getattr(base, f.name),
                       help=f"{FLAG_HELP.get(f.name, '')} (default %(default)s)".strip())
    if extra:
        extra(p)
    a = p.parse_args(argv)
    cfg = RunConfig(**{f.name: getattr(a, f.name) for f in fields(RunConfig)})
    return cfg, a


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
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


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
        # Share the cores among ranks instead of every rank spawning one thread per core.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world)))))
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


def optimizer_step(opt: torch.optim.Optimizer) -> int:
    """Updates taken so far, read from the optimizer state (restored by --resume with everything else)."""
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p)
            if st and "step" in st:
                return int(st["step"])
    return 0


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
                    extra: dict[str, Any] | None = None) -> Path | None:
    """Called on every rank (it gathers each rank's RNG state); rank 0 writes."""
    rng = [_rng_state()]
    if d.world > 1:  # each rank draws its own dropout masks and crops: keep every rank's stream
        rng = [None] * d.world
        dist.all_gather_object(rng, _rng_state())
    if not d.main:
        return None
    raw = model.module if hasattr(model, "module") else model
    ckpt = {"step": step, "model": raw.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
            "sampler": loader.state_dict(consumed_batches=consumed), "epoch": epoch, "rng": rng,
            "extra": extra or {}}
    path = out / f"ckpt-{step:08d}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)  # a crash while saving never leaves a half checkpoint as the latest
    return path


def latest_checkpoint(out: Path) -> Path | None:
    cks = sorted(out.glob("ckpt-*.pt"))
    return cks[-1] if cks else None


# ----------------------------------------------------------------------------- the loop

LossFn = Callable[[torch.nn.Module, dict[str, Any]], tuple[torch.Tensor, dict[str, float]]]


def train(model: torch.nn.Module, loss_fn: LossFn, cfg: RunConfig, d: Dist, *, features: list[str],
          length_feature: str | None = None, expect: dict[str, str] | None = None,
          loader_kw: dict[str, Any] | None = None,
          to_device: Callable[[dict[str, Any], torch.device], dict[str, Any]] | None = None,
          optimizer: torch.optim.Optimizer | None = None, on_log: Callable[[dict[str, Any]], None] | None = None,
          log_name: str = "train") -> dict[str, Any]:
    """Train until cfg.max_steps optimizer steps; returns the last logged record.

    loader_kw: passed to make_loader (item_transform, batch_transform, subset, lengths, collate_features, ...).
    loss_fn(model, batch) gets the batch on the device; it returns the loss and extra numbers to log.
    """
    out = Path(cfg.out)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
    seed_all(cfg.seed + 1000 * (d.rank + 1))  # per-rank streams for dropout, crops, masks
    model.to(d.device)
    files_cache = None
    if cfg.reader == "files":  # export the baseline layout once, on rank 0, next to the run
        from audiopipe.reader.files_dataset import export_per_utterance

        files_cache = out / "per_utterance"
        if d.main:
            export_per_utterance(cfg.shards, features, files_cache)
        if d.world > 1:
            dist.barrier()
    loader = make_loader(cfg.shards, features, max_frames=cfg.batch_frames, length_feature=length_feature,
                         quadratic=cfg.quadratic, max_items=cfg.max_items, seed=cfg.seed,
                         num_workers=cfg.num_workers, rank=d.rank, world_size=d.world, expect=expect,
                         pin_memory=d.device.type == "cuda", reader=cfg.reader, files_cache=files_cache,
                         on_corrupt=cfg.on_corrupt,
                         **(loader_kw or {}))
    opt = optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    precision, autocast = autocast_for(cfg.precision, d.device)
    scaler = torch.amp.GradScaler(d.device.type, enabled=precision == "fp16")
    step, epoch = 0, 0
    if cfg.resume and (ck := latest_checkpoint(out)) is not None:
        state = torch.load(ck, map_location=d.device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        loader.load_state_dict(state["sampler"])
        rng = state["rng"]
        # Same world size: each rank continues its own stream; another world size: fresh per-rank streams.
        if len(rng) == d.world:
            _set_rng_state(rng[d.rank])
        else:
            seed_all(cfg.seed + 1000 * (d.rank + 1) + step)
        step, epoch = state["step"], state["epoch"]
        if d.main:
            print(f"[{log_name}] resumed from {ck.name} at step {step} (epoch {epoch}); the sampler continues "
                  f"with the next unseen batch", flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if d.world > 1 else model
    move = to_device or default_to_device
    log_path = out / "log.jsonl"
    fresh = lambda: {"wait": 0.0, "step": 0.0, "frames": 0, "pad": [], "n": 0, "loss": 0.0, "terms": {}, "micro": 0}
    window = fresh()
    last: dict[str, Any] = {}

    while step < cfg.max_steps:
        loader.set_epoch(epoch)
        it = iter(loader)
        opt.zero_grad(set_to_none=True)  # a partial accumulation at the end of an epoch is not carried over
        micro = 0
        t_step = time.perf_counter()
        wait = 0.0
        while step < cfg.max_steps:
            t0 = time.perf_counter()
            batch = next(it, None)  # everything until the batch is in hand counts as waiting on data
            if batch is None:
                break
            batch = move(batch, d.device)
            wait += time.perf_counter() - t0
            micro += 1  # batches of this pass: what the sampler's state_dict counts
            sync = micro % cfg.grad_accum == 0
            ctx = ddp.no_sync() if (d.world > 1 and not sync) else nullcontext()
            with ctx:
                with autocast:
                    loss, logs = loss_fn(ddp, batch)
                scaler.scale(loss / cfg.grad_accum).backward()
            f0 = loader.collate.features[0]
            window["frames"] += int(batch[f"{f0}_lengths"].sum())
            window["pad"].append(float(batch["padding_ratio"][f0]))
            window["loss"] += float(loss.detach()) / cfg.grad_accum
            window["micro"] += 1
            for k, v in logs.items():  # per-term numbers are averaged over the window like the loss
                window["terms"][k] = window["terms"].get(k, 0.0) + float(v)
            if not sync:
                continue
            for g in opt.param_groups:
                g["lr"] = lr_at(step, cfg)
            scaler.unscale_(opt)
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip) if cfg.clip > 0 else torch.tensor(0.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            if d.device.type == "cuda":
                torch.cuda.synchronize()  # so step time is the GPU's, not the launch queue's
            step += 1
            now = time.perf_counter()
            window["step"] += now - t_step
            window["wait"] += wait
            window["n"] += 1
            t_step, wait = now, 0.0
            if step % cfg.log_every == 0 or step == cfg.max_steps:
                terms = {k: v / max(window["micro"], 1) for k, v in window["terms"].items()}
                last = _log(window, step, lr_at(step - 1, cfg), float(gnorm), terms, d, log_path, log_name, epoch)
                if on_log:
                    on_log(last)
                window = fresh()
            if step % cfg.ckpt_every == 0 or step == cfg.max_steps:
                save_checkpoint(out, step, ddp, opt, scaler, loader, micro, epoch, d)
                if d.world > 1:
                    dist.barrier()
        else:
            break
        if step < cfg.max_steps:
            epoch += 1
    if d.world > 1:
        dist.destroy_process_group()
    return last


def _log(w: dict[str, Any], step: int, lr: float, gnorm: float, logs: dict[str, float], d: Dist, path: Path,
         name: str, epoch: int) -> dict[str, Any]:
    # Sums over ranks for work done; the slowest rank's times, since every rank waits for it at the all-reduce.
    sums = torch.tensor([float(w["frames"]), w["loss"], float(w["n"])], dtype=torch.float64)
    maxes = torch.tensor([w["wait"], w["step"]], dtype=torch.float64)
    if d.world > 1:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
    frames, loss_sum, n_all = sums.tolist()
    wait, step_t = maxes.tolist()
    n = max(w["n"], 1)
    rec = {"step": step, "epoch": epoch, "loss": loss_sum / max(n_all, 1), "lr": lr, "grad_norm": gnorm,
           "step_time": step_t / n, "data_wait": wait / n, "data_wait_share": wait / step_t if step_t > 0 else 0.0,
           "frames_per_s": frames / step_t if step_t > 0 else 0.0,
           "padding_ratio": float(np.mean(w["pad"])) if w["pad"] else 0.0, "world": d.world,
           "device": str(d.device), **{k: float(v) for k, v in logs.items()}}
    if d.main:
        print(f"[{name}] step {step} loss {rec['loss']:.4f} lr {lr:.2e} step {rec['step_time'] * 1e3:.0f} ms "
              f"data-wait {rec['data_wait_share'] * 100:.1f}% pad {rec['padding_ratio'] * 100:.1f}% "
              f"{rec['frames_per_s']:.0f} frames/s", flush=True)
        with open(path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    return rec


def default_to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    nb = device.type == "cuda"
    return {k: (v.to(device, non_blocking=nb) if torch.is_tensor(v) else v) for k, v in batch.items()}


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
