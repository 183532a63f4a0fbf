"""Memory-calibrated batches: per length bucket, the largest batch of a model that fits this GPU with a margin,
written as a bucket budget the sampler reads (audiopipe/sampler/bucket_budget.py; a trainer's --bucket-budget).

    python trainers/calibrate_batches.py --model f5tts --out f5_budget.json --compare
    python trainers/calibrate_batches.py --model eres2net --out eres2net_budget.json

In the spirit of NeMo's OOMptimizer: a training step (forward, backward, optimizer step, in the trainer's
precision) on random batches of one length, its peak memory read from the allocator. Two small batches give a line
(peak = fixed + per item x items); the batch that line says fills `1 - margin` of the card is run for real, and the
search narrows between what fitted and what did not to within 10 %. Both ends of every bucket are measured (one
bucket's top is the next one's bottom). A bucket then allows the items that fit at its bottom (max_items) and the
padded frames that fit at both of its ends (max_frames): with memory = fixed + items x f(length) and f convex
(per-item, per-frame and attention terms), no batch in the bucket needs more than one of its ends did.

Lengths: F5-TTS's buckets are quantiles of a LibriTTS-like length distribution (1-20 s, median 5.5 s; the
batching benchmark's); ERes2Net trains on 3 s crops, one bucket. Batches are random tensors: memory and time
depend on shapes only. --compare then times F5-TTS on batches drawn from two plans of that distribution: one
global frame budget (the largest that fits every bucket, as one would set it) and the per-bucket budget, both
calibrated to the same memory, and reports frames/s and the peak memory of each.

On a CPU (--device cpu, for tests) there is no allocator peak to read: the probe counts the bytes of weights,
gradients, optimizer state and tensors saved for backward, against 96 MiB (32 with --quick). Everything else runs
the same code.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from audiopipe.bench.synthetic_lengths import synthetic_lengths
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.bucket_budget import Bucket, BucketBudget

import core

CROP = 3 * 16000  # the speaker trainers' 3 s crops, in samples (their sampler's length unit)
VOXCELEB2_CLASSES = 5994 * 3  # 3D-Speaker's VoxCeleb2 recipe: 5,994 speakers x 3 speeds


class CudaProbe:
    """Peak allocated bytes of one call, from the caching allocator; None when it runs out of memory."""

    def __init__(self, device: torch.device, margin: float):
        self.device = device
        total = torch.cuda.get_device_properties(device).total_memory
        self.capacity = int(total * (1 - margin))
        self.total = total

    def __call__(self, step: Callable[[], None]) -> int | None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        failed = False
        try:
            step()
            torch.cuda.synchronize(self.device)
        except torch.cuda.OutOfMemoryError:
            failed = True
        if failed:  # outside the except block: its traceback no longer holds the step's tensors
            gc.collect()
            torch.cuda.empty_cache()
            return None
        return int(torch.cuda.max_memory_allocated(self.device))


class CpuProbe:
    """The bytes of weights, gradients and optimizer state after the step, plus every tensor saved for backward
    during it (storages counted once): an estimate of a step's peak, for CPU rehearsals of the calibration."""

    def __init__(self, model: torch.nn.Module, opt: torch.optim.Optimizer, capacity: int):
        self.model, self.opt, self.capacity, self.total = model, opt, capacity, capacity

    def __call__(self, step: Callable[[], None]) -> int | None:
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
        state = sum(p.numel() * p.element_size() * 2 for p in self.model.parameters())  # weights + gradients
        state += sum(v.numel() * v.element_size() for s in self.opt.state.values() for v in s.values()
                     if torch.is_tensor(v))
        peak = state + sum(seen.values())
        return None if peak > self.capacity else peak


class _Steps:
    """One training step as the model's trainer takes it (gradients clipped where it clips); returns the loss."""

    clip: float | None = None

    def step(self, batch: dict[str, Any]) -> torch.Tensor:
        try:
            with self.autocast:
                loss, _ = self.loss_fn(self.model, batch)
            loss.backward()
            if self.clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            self.opt.step()
            return loss
        finally:  # also after running out of memory half-way: no gradient is left behind
            self.opt.zero_grad(set_to_none=True)


class F5Target(_Steps):
    """F5-TTS as its trainer builds it (model, AdamW, precision, clipping at 1.0); the GPU proof trains it."""

    clip, unit = 1.0, "mel frames (24 kHz, hop 256)"

    def __init__(self, device: torch.device, config: str):
        import train_f5tts as f5

        self.loss_fn, self.device, self.config, self.tok = f5.loss_fn, device, config, f5.Tokenizer()
        core.seed_all(0)
        self.model = f5.F5TTS(replace(f5.CONFIGS[config], text_num_embeds=self.tok.size)).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=7.5e-5, weight_decay=0.01)
        self.precision, self.autocast = core.autocast_for("auto", device)
        self.name = f"F5-TTS {config}"

    def batch(self, lengths: np.ndarray) -> dict[str, Any]:
        n, t = len(lengths), int(lengths.max())
        return {"mel": torch.randn(n, 100, t, device=self.device),  # drawn on the device: no host copy
                "mel_lengths": torch.as_tensor(lengths, dtype=torch.int64).to(self.device),
                # ~12 characters a second of speech: about one per 8 mel frames
                "text_ids": torch.randint(0, 256, (n, max(1, t // 8)), device=self.device)}


class ERes2NetTarget(_Steps):
    unit = "samples of 3 s crops at 16 kHz (the speaker trainers' budget unit)"

    def __init__(self, device: torch.device, config: str, classes: int):
        import speaker
        import train_eres2net as er

        self.device, self.loss_fn = device, speaker.loss_fn
        core.seed_all(0)
        cfg = er.CONFIGS[config]
        self.model = speaker.SpeakerModel(er.ERes2Net(cfg), cfg.embedding_size, classes, lambda step: 0.2).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4)
        self.precision, self.autocast = core.autocast_for("auto", device)
        self.classes = classes
        self.name = f"ERes2Net {config} ({classes} classes)"

    def batch(self, lengths: np.ndarray) -> dict[str, Any]:
        n, t = len(lengths), int(lengths.max())
        return {"wav": 0.1 * torch.randn(n, t, device=self.device),
                "label": torch.randint(0, self.classes, (n,), device=self.device)}



def largest_batch(target: Any, probe: Callable, length: int, guess: int, deadline: float) -> dict[str, Any]:
    """The most items of `length` whose step fits probe.capacity: two measured points give a line (peak = fixed
    + per item x items), the batch it predicts is run for real, and the search narrows between what fitted and
    what did not until they are within 10 %."""
    tried: list[tuple[int, int | None]] = []

    def fits(n: int) -> int | None:
        if time.time() > deadline:
            raise TimeoutError(f"out of time calibrating length {length}")
        batch = target.batch(np.full(n, length, dtype=np.int64))
        peak = probe(lambda: target.step(batch))
        del batch
        ok = peak if peak is not None and peak <= probe.capacity else None
        tried.append((n, peak))
        return ok

    lo, hi = 0, None  # largest batch known to fit, smallest known not to
    n = max(1, guess)
    p1 = fits(n)
    while p1 is None:
        hi = n
        if n == 1:
            return {"length": length, "items": 0, "tried": tried}
        n = max(1, n // 4)
        p1 = fits(n)
    lo, peak_lo = n, p1
    if hi is None:
        n2 = n * 4
        p2 = fits(n2)
        if p2 is None:
            hi = n2
        else:
            lo, peak_lo = n2, p2
            per_item = (p2 - p1) / (n2 - n)
            guess = int(n2 + (probe.capacity - p2) / per_item) if per_item > 0 else n2 * 2
            p3 = fits(guess) if guess > n2 else None
            if p3 is not None:
                lo, peak_lo = guess, p3
            else:
                hi = max(guess, n2 + 1)
    while hi is not None and hi - lo > max(1, lo // 10):
        mid = (lo + hi) // 2
        p = fits(mid)
        if p is None:
            hi = mid
        else:
            lo, peak_lo = mid, p
    return {"length": length, "items": int(lo), "peak_bytes": peak_lo, "tried": tried}


def bucket_edges(lengths: np.ndarray, buckets: int) -> list[int]:
    """Upper edges at equal-count quantiles, rising strictly; the last is the longest length."""
    qs = np.quantile(lengths, np.linspace(0, 1, buckets + 1)[1:])
    edges = sorted({int(math.ceil(q)) for q in qs})
    edges[-1] = int(lengths.max())
    return edges


def make_target(model: str, device: torch.device, config: str) -> tuple[Any, np.ndarray, int]:
    """The model, the lengths it is calibrated for, and the buckets."""
    if model == "f5tts":
        return F5Target(device, config), synthetic_lengths("libritts_like", 20_000, seed=0), 4
    if model == "eres2net":
        classes = VOXCELEB2_CLASSES if config == "default" else 30
        return ERes2NetTarget(device, config, classes), np.full(1000, CROP, dtype=np.int64), 1
    raise ValueError(f"unknown model {model!r}: f5tts or eres2net")


def compare_budgets(target: Any, lengths: np.ndarray, budget: BucketBudget, samples: int, deadline: float
                    ) -> dict[str, Any]:
    """F5 steps on batches drawn from a global-budget plan and from the per-bucket plan, interleaved."""
    cuda = target.device.type == "cuda"
    edges = [b.max_len for b in budget.buckets]
    glob = min(b.max_frames for b in budget.buckets)  # the largest single budget that fits every bucket
    plans = {"global": BucketBatchSampler(lengths, glob, seed=0), "per_bucket": BucketBatchSampler(lengths, budget, seed=0)}
    rng = np.random.default_rng(0)
    drawn = {}
    for k, s in plans.items():
        batches = list(s)
        pick = rng.choice(len(batches), size=min(samples, len(batches)), replace=False)
        drawn[k] = [np.asarray(lengths[batches[i]]) for i in sorted(pick)]
    event = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else core._HostEvent
    stats = {k: {"seconds": 0.0, "frames": 0, "padded": 0, "peak": 0, "steps": 0} for k in plans}
    # Warm-up on each side's largest batch (allocator, kernels), not counted.
    for k in plans:
        big = max(drawn[k], key=lambda x: len(x) * x.max())
        target.step(target.batch(big))
    for j in range(max(len(v) for v in drawn.values())):
        for k in plans:
            if j >= len(drawn[k]) or time.time() > deadline:
                continue
            lens = drawn[k][j]
            batch = target.batch(lens)
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            a, b = event(), event()
            a.record()
            target.step(batch)
            b.record()
            b.synchronize()
            st = stats[k]
            st["seconds"] += a.elapsed_time(b) / 1e3
            st["frames"] += int(lens.sum())
            st["padded"] += int(len(lens) * lens.max())
            st["steps"] += 1
            if cuda:
                st["peak"] = max(st["peak"], int(torch.cuda.max_memory_allocated()))
            del batch
    out: dict[str, Any] = {"lengths": "libritts_like, 20,000 utterances", "global_max_frames": int(glob),
                           "bucket_edges": edges, "batches_timed_per_side": samples}
    for k, st in stats.items():
        d = plans[k].diagnostics
        out[k] = {"steps": st["steps"], "frames_per_s": st["frames"] / st["seconds"] if st["seconds"] else None,
                  "padded_frames_per_s": st["padded"] / st["seconds"] if st["seconds"] else None,
                  "ms_per_step": 1e3 * st["seconds"] / max(st["steps"], 1),
                  "peak_gib": round(st["peak"] / 2**30, 2) if cuda else None,
                  "epoch_batches": d.num_batches, "padding_efficiency": round(d.padding_efficiency, 4)}
    g, p = out["global"]["frames_per_s"], out["per_bucket"]["frames_per_s"]
    out["gain"] = p / g if g and p else None
    return out


def hold(target: Any, budget: BucketBudget, probe: Any, rounds: int, deadline: float) -> dict[str, Any]:
    """Whether the budget holds over time: every bucket's largest shapes (its bottom length with its item cap, its
    top length with the items its frames allow) trained in turn, `rounds` times, as an epoch that meets every
    bucket would, with the allocator's fragmentation carried from step to step (nothing is freed between them).
    Records each shape's steps, any out-of-memory error, and the peak allocated and reserved memory against the
    device's total (on a CPU, the probe's estimate against its capacity)."""
    cuda = target.device.type == "cuda"
    shapes, bottom = [], int(budget.source.get("measured", [[1]])[0][0])  # the shortest length calibrated
    for b in budget.buckets:
        for length in (bottom, b.max_len):
            items = max(1, min(b.max_items, b.max_frames // length))
            shapes.append((b.max_len, int(length), int(items)))
        bottom = b.max_len + 1
    if cuda:  # what the search's probes left cached is released: the peak reserved is this loop's own
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    done: dict[str, int] = {}
    oom, peak_cpu, t0 = None, 0, time.time()
    for r in range(rounds):
        for bucket, length, items in shapes:
            if time.time() > deadline:
                break
            lens = np.full(items, length, dtype=np.int64)
            if cuda:
                try:
                    target.step(target.batch(lens))
                except torch.cuda.OutOfMemoryError:
                    oom = {"round": r, "length": length, "items": items}
            else:
                got = probe(lambda: target.step(target.batch(lens)))
                peak_cpu = max(peak_cpu, got or probe.capacity + 1)
                if got is None:
                    oom = {"round": r, "length": length, "items": items}
            if oom:
                break
            key = f"{length}x{items}"
            done[key] = done.get(key, 0) + 1
        if oom or time.time() > deadline:
            break
    total = probe.total
    peak = int(torch.cuda.max_memory_allocated()) if cuda else peak_cpu
    reserved = int(torch.cuda.max_memory_reserved()) if cuda else peak_cpu
    return {"shapes": [{"bucket": b, "length": n, "items": i} for b, n, i in shapes], "rounds": rounds,
            "steps": done, "complete": not oom and all(done.get(f"{n}x{i}", 0) == rounds for _, n, i in shapes),
            "out_of_memory": oom, "peak_allocated_share": round(peak / total, 4),
            "peak_reserved_share": round(reserved / total, 4), "seconds": round(time.time() - t0, 1)}


def calibrate(model: str, device: str, quick: bool, out: str | Path | None, deadline: float, compare: bool = False,
              margin: float = 0.1, hold_rounds: int = 0, hold_s: float = 0.0) -> dict[str, Any]:
    """The budget (written to `out`); with `compare`, F5's frames/s against one global budget; with hold_rounds,
    whether the budget holds (hold()) for that many rounds, in the last hold_s seconds before the deadline (the
    search and the comparison stop that much earlier)."""
    t0 = time.time()
    end, deadline = deadline, deadline - (hold_s if hold_rounds else 0.0)
    dev = torch.device(device)
    config = "tiny" if quick else "default"
    target, lengths, buckets = make_target(model, dev, config)
    if quick and model == "f5tts":
        lengths, buckets = lengths[:2000], 2
    elif quick:  # ERes2Net is slow on a CPU: 1 s crops there
        lengths = lengths // 3
    probe = CudaProbe(dev, margin) if dev.type == "cuda" else CpuProbe(target.model, target.opt,
                                                                       (32 if quick else 96) << 20)
    # One small step first: optimizer state exists from then on, as in training.
    target.step(target.batch(np.full(2, int(np.median(lengths)), dtype=np.int64)))
    # Both ends of every bucket are measured (the top of one bucket is the bottom of the next): a bucket then gets
    # the items that fit at its bottom and the frames that fit at both ends, so any batch in it holds at most what
    # fitted at one of its ends (with memory = fixed + items x f(length) and f convex, the worst case is an end).
    edges = bucket_edges(lengths, buckets)
    points = sorted({int(lengths.min()), *edges})
    found: dict[int, dict[str, Any]] = {}
    frames = (4 if quick else 16) * int(np.median(lengths))  # the first guess (on a CPU, small steps are cheap)
    for m in points:
        found[m] = largest_batch(target, probe, m, max(1, frames // m), deadline)
        if found[m]["items"] < 1:
            raise RuntimeError(f"{target.name}: a batch of one item of {m} does not fit in "
                               f"{probe.capacity / 2**30:.2f} GiB")
        frames = found[m]["items"] * m
    rows, bottom = [], points[0]
    for edge in edges:
        lo, hi = found[bottom], found[edge]
        rows.append(Bucket(edge, min(lo["items"] * lo["length"], hi["items"] * hi["length"]), lo["items"]))
        bottom = edge
    budget = BucketBudget(tuple(rows),
                          source={"model": target.name, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                                  else "cpu (estimate: weights, gradients, optimizer state, saved tensors)",
                                  "precision": target.precision, "margin": margin,
                                  "capacity_gib": round(probe.capacity / 2**30, 3), "unit": target.unit,
                                  "lengths": "LibriTTS-like quantiles" if model == "f5tts" else "3 s crops",
                                  "measured": [[m, f["items"]] for m, f in found.items()]})
    result: dict[str, Any] = {"status": "ok", "model": target.name, "margin": margin, "unit": target.unit,
                              "capacity_gib": round(probe.capacity / 2**30, 3),
                              "budget": budget.to_dict()["buckets"],
                              "measured": [{"length": m, "items": f["items"], "probes": len(f["tried"]),
                                            "peak_gib": round(f["peak_bytes"] / 2**30, 3) if f.get("peak_bytes")
                                            else None} for m, f in found.items()]}
    if out is not None:
        budget.write(out)
        result["budget_file"] = str(out)
    if compare:
        result["compare"] = compare_budgets(target, lengths, budget, 1 if quick else 6, deadline)
    if hold_rounds:
        result["hold"] = hold(target, budget, probe, hold_rounds, end)
    result["seconds"] = round(time.time() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    head, _, rest = __doc__.partition("\n\n")
    ap = argparse.ArgumentParser(description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("f5tts", "eres2net"), default="f5tts",
                    help="the trainer whose step is measured (default f5tts)")
    ap.add_argument("--out", type=Path, required=True, help="the bucket budget file to write (a trainer's "
                    "--bucket-budget)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="the GPU to calibrate for (default cuda when there is one; cpu only rehearses the code)")
    ap.add_argument("--margin", type=float, default=0.1, help="share of the card's memory left free (default 0.1)")
    ap.add_argument("--compare", action="store_true", help="F5-TTS: frames/s per-bucket vs one global budget")
    ap.add_argument("--quick", action="store_true", help="tiny config, fewer buckets and batches (tests)")
    ap.add_argument("--seconds", type=float, default=90.0, help="stop after this long (default 90)")
    a = ap.parse_args(argv)
    if not 0 <= a.margin < 1:
        ap.error(f"--margin must be in [0, 1), got {a.margin}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here")
    res = calibrate(a.model, a.device, a.quick, a.out, time.time() + a.seconds, a.compare, a.margin)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
