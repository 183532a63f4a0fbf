"""The GPU proof: one command that a machine with one NVIDIA GPU runs in about 7 minutes, everything prepared here.

    make gpu-bundle                                               # here, once: data, wheels (.gpu-bundle/)
    python3 benchmarks/gpu_proof.py --bundle .gpu-bundle --out $OUT      # there (docs/gpu-proof.md: the exact call)
    python benchmarks/gpu_proof.py --bundle B --out R --device cpu --quick   # the same code paths on a CPU

Parts, in order of value; each runs in its own process under its own time cap, so a failing or hanging part
never stops the others, and all of them together stay inside --budget-s:
  cuda_tests  pytest -m cuda tests/test_cuda.py: bf16 autocast and an fp16 GradScaler step through
              trainers/core.py, the pinned side-stream prefetch, core's CUDA-event clock against an injected
              delay, mel/fbank against torchaudio, batched EnCodec against one at a time
  trainers    every trainer at its `default` (upstream-size) config, bf16, on the bundle's real-speech shards:
              10 warm-up steps then 60 timed ones, with prefetch on and again off; step time, data-wait share,
              padding share, frames/s, peak GPU memory (from the trainers' own log lines)
  f5_feeds    F5-TTS (same model, same frame budget, same loop) fed three ways side by side: batches already
              on the GPU, audiopipe's loader, and F5's own rule (decode + resample + mel per item in workers)
  prefetch_probe  F5-TTS fed the same batches five ways (built on the training thread, in a prefetch thread
              with and without its device copy, in worker processes, a shorter GIL switch interval): where a
              prefetching loader's cost goes
  features    benchmarks/bench_gpu_features.py: mel, fbank and codec x real time, batched vs one at a time
  calibrate   benchmarks/calibrate_batches.py: per length bucket the largest batch that fits F5-TTS and
              ERes2Net with a margin, written as budget files the sampler reads, and F5's frames/s with them
              against one global budget at the same peak memory

Writes to --out (at most 8 files, what a device call brings back): gpu_proof.json (everything), gpu_proof.log
(device, versions, each part's seconds and headline figures) and the calibrated bucket budgets. Scratch goes to
--work. `--parts a,b` reruns only those parts.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "trainers", ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

PARTS = ("cuda_tests", "trainers", "f5_feeds", "prefetch_probe", "features", "calibrate")
# Seconds per part: (cap, floor) on one H100 - what it may take, and the least it needs to be worth starting -
# then (cap, floor) with --quick on a CPU, where the caps are only a safety net (a loaded 2-core machine runs it
# 3x slower than an idle one).
CAPS = {"cuda_tests": (60, 25, 180, 10), "trainers": (300, 60, 300, 20), "f5_feeds": (60, 25, 120, 8),
        "prefetch_probe": (70, 50, 120, 8), "features": (35, 15, 120, 8), "calibrate": (90, 30, 150, 10)}

# Each trainer: its script, the bundle folder it reads, its share of the trainers part (s), and --quick flags
# that fit the tiny bundle. Steps: `warm` untimed, then `timed`; the log window is `warm` steps long.
TRAINERS = {
    "f5tts": ("train_f5tts", "shards/f5tts", 60, ["--batch-frames", "2000"]),
    "eres2net": ("train_eres2net", "shards/speakers", 45, ["--batch-frames", str(4 * 16000), "--crop-seconds", "1"]),
    "campplus": ("train_campplus", "shards/speakers", 45, ["--batch-frames", str(4 * 16000), "--crop-seconds", "1"]),
    "gpt_sovits": ("train_gpt_sovits", "tokens/gpt_sovits", 50, ["--batch-frames", "1500"]),
    "ns2": ("train_ns2", "shards/ns2", 100, ["--batch-frames", "500"]),
}
STEPS = {"full": (10, 60), "quick": (1, 2)}
# NaturalSpeech 2 default takes ~1.3 s a step on an H200 (it learns phone durations by alignment search): 5 + 20.
FULL_STEPS = {"ns2": (5, 20)}
# Each epoch reads a trainer's small corpus this many times (--weights over the folder and a second name for it),
# so that an epoch holds tens of batches as on a real corpus instead of one to four: otherwise nearly every step
# would be a pass's first, whose batch no prefetch can build ahead.
COPIES = {"f5tts": 8, "eres2net": 20, "campplus": 20, "gpt_sovits": 6, "ns2": 4}
MAX_OUT_FILES = 8  # a device call brings back at most 8 files


# ----------------------------------------------------------------------------- small helpers


class _Without(importlib.abc.MetaPathFinder):
    """Makes the named top-level modules unimportable: rehearses, on a machine that has them, the GPU image."""

    def __init__(self, names: set[str]):
        self.names = names

    def find_spec(self, name, path, target=None):  # noqa: ANN001 - importlib's protocol
        if name.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {name!r} (left out by --without)", name=name)
        return None


def block_modules(names: str) -> None:
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    if wanted:
        for n in list(sys.modules):
            if n.split(".")[0] in wanted:
                del sys.modules[n]
        sys.meta_path.insert(0, _Without(wanted))


def device_info(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": device, "python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda, "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", multiprocessors=props.multi_processor_count,
                    cudnn=torch.backends.cudnn.version())
        info["nvidia_smi"] = _run_quietly(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                                           "--format=csv,noheader"])
    else:
        info["name"] = platform.processor() or platform.machine()
    try:
        import torchaudio

        info["torchaudio"] = torchaudio.__version__
    except Exception:  # noqa: BLE001 - absent, or its wheel does not load with this torch
        info["torchaudio"] = None
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        info["transformers"] = None
    info["commit"] = _run_quietly(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return info


def _run_quietly(cmd: list[str]) -> str | None:
    """A command's output, or None where it is missing or fails (a bare GPU image may lack git)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def install_wheels(bundle: Path, site: Path) -> dict[str, Any]:
    """pip-install the bundle's wheels into `site` when the modules they carry do not import here."""
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    missing = [m for m in ("soundfile", "soxr", "julius") if importlib.util.find_spec(m) is None]
    if not wheels or not missing:
        return {"installed": [], "missing_before": missing, "wheels": [w.name for w in wheels]}
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
           "--upgrade", "--target", str(site), *map(str, wheels)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return {"installed": [], "missing_before": missing, "error": r.stderr.strip()[-800:]}
    return {"installed": [w.name for w in wheels], "missing_before": missing, "site": str(site)}


def save_partial(a: argparse.Namespace, body: dict[str, Any]) -> None:
    """Write what a child has so far where its parent looks: a part stopped at its cap keeps what it measured."""
    name = a.child + (f"-{a.trainer}" if a.trainer else "")
    (a.work / f"{name}.json").write_text(json.dumps(body, indent=1, default=str))


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def ensure(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


# ----------------------------------------------------------------------------- part: cuda_tests


def part_cuda_tests(a: argparse.Namespace) -> dict[str, Any]:
    import xml.etree.ElementTree as ET

    import pytest

    os.environ["AUDIOPIPE_SPEECH_DIR"] = str(a.bundle / "wavs")
    if a.device == "cpu":
        os.environ["AUDIOPIPE_CUDA_TESTS_ON"] = "cpu"
    junit = a.work / "cuda_tests.xml"
    os.chdir(ROOT)
    # --noconftest: test_cuda.py stands alone, so a conftest import (corpus builders) cannot stop it.
    rc = pytest.main(["-m", "cuda", "tests/test_cuda.py", "-q", "-rA", "--noconftest", "-p", "no:cacheprovider",
                      f"--junitxml={junit}", f"--basetemp={a.work / 'pytest'}"])
    tests = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome, message = ("failed" if tag != "skipped" else "skipped"), (el.get("message") or "")[:400]
        tests.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)),
                      "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    ensure(tests != [], "pytest collected no test")
    ensure(int(rc) in (0, 1), f"pytest exited {int(rc)}")
    return {"pytest_exit": int(rc), "counts": counts, "tests": tests, "ok": counts["failed"] == 0}


# ----------------------------------------------------------------------------- part: trainers


def _window_stats(records: list[dict], warm: int) -> dict[str, Any]:
    """Sums over the timed log windows (those after the warm-up steps) of a trainer's log.jsonl."""
    timed = [r for r in records if r["step"] > warm]
    if not timed:
        return {"timed_steps": 0}
    steps, prev = [], warm
    for r in timed:
        steps.append(r["step"] - prev)
        prev = r["step"]
    seconds = [r["step_time"] * n for r, n in zip(timed, steps)]
    total = sum(seconds)
    return {"timed_steps": sum(steps), "step_ms": 1e3 * total / sum(steps),
            "data_wait_share": sum(r["data_wait"] * n for r, n in zip(timed, steps)) / total if total else None,
            "frames_per_s": sum(r["frames_per_s"] * s for r, s in zip(timed, seconds)) / total if total else None,
            "padding_share": sum(r["padding_ratio"] * n for r, n in zip(timed, steps)) / sum(steps),
            "loss_first_last": [timed[0]["loss"], timed[-1]["loss"]], "epochs": timed[-1]["epoch"] + 1}


def read_log(out: Path) -> list[dict[str, Any]]:
    """A trainer run's log.jsonl records (none when it stopped before its first log line)."""
    log = out / "log.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def repeated(a: argparse.Namespace, folder: Path, copies: int) -> list[str]:
    """--shards and --weights that read `folder` `copies` times an epoch: the folder and a link to it as two
    corpora (a corpus is listed once per name), each weighted copies / 2."""
    alias = a.work / "again" / f"{folder.name}_again"
    alias.parent.mkdir(parents=True, exist_ok=True)
    if not alias.is_symlink():
        alias.symlink_to(folder, target_is_directory=True)
    return ["--shards", f"{folder},{alias}", "--weights", f"{copies / 2:g},{copies / 2:g}"]


def part_trainer(a: argparse.Namespace) -> dict[str, Any]:
    """One trainer, its own main(), run twice in this process: prefetch on (2 batches) and off."""
    import torch

    script, folder, _, quick_flags = TRAINERS[a.trainer]
    mod = importlib.import_module(script)
    warm, timed = STEPS["quick"] if a.quick else FULL_STEPS.get(a.trainer, STEPS["full"])
    cuda = a.device.startswith("cuda")
    runs: dict[str, Any] = {}
    scratch = Path("/dev/shm") if cuda and Path("/dev/shm").is_dir() and shutil.disk_usage("/dev/shm").free > 32 << 30 \
        else a.work
    for prefetch in (2, 0):
        out = scratch / "gpu_proof_runs" / f"{a.trainer}-prefetch{prefetch}"
        shutil.rmtree(out, ignore_errors=True)
        argv = [*repeated(a, a.bundle / folder, 2 if a.quick else COPIES[a.trainer]),
                "--config", "tiny" if a.quick else "default", "--out", str(out),
                "--max-steps", str(warm + timed), "--log-every", str(warm), "--ckpt-every", str(10 ** 9),
                "--prefetch", str(prefetch), "--seed", "0", *(quick_flags if a.quick else [])]
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            mod.main(argv)
        finally:
            wall = time.perf_counter() - t0
            run = {"argv": argv, "wall_s": round(wall, 1), **_window_stats(read_log(out), warm)}
            if cuda:
                run["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                run["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
            cfg = out / "model_config.json"
            if cfg.exists():
                params = json.loads(cfg.read_text()).get("parameters")
                run["parameters_m"] = round(params / 1e6, 2) if params else None
            runs[f"prefetch_{prefetch}"] = run
            shutil.rmtree(out, ignore_errors=True)  # checkpoints of an upstream-size model: gigabytes
            save_partial(a, {"trainer": a.trainer, **runs})
    on, off = runs["prefetch_2"], runs["prefetch_0"]
    ensure(on.get("timed_steps", 0) == timed and off.get("timed_steps", 0) == timed,
           f"expected {timed} timed steps per run, got {on.get('timed_steps')} and {off.get('timed_steps')}")
    return {"trainer": a.trainer, "config": "tiny" if a.quick else "default", "warmup_steps": warm,
            "timed_steps": timed, **runs}


def part_trainers(a: argparse.Namespace) -> dict[str, Any]:
    """Each trainer in its own process under its own cap (its share of this part's)."""
    names = [n for n in TRAINERS if n in a.trainers.split(",")]
    results, shares = {}, {k: TRAINERS[k][2] for k in names}
    scale = a.cap / sum(shares.values())
    for i, name in enumerate(names):
        left = a.deadline - time.time()
        # Its share of the part, plus whatever the trainers before it left unused.
        cap = left - scale * sum(shares[n] for n in names[i + 1:])
        if cap < 10:
            results[name] = {"status": "not started: the part's time was used up"}
            continue
        results[name] = run_child(a, "trainer", cap, extra=["--trainer", name])
    failed = [k for k, v in results.items() if v.get("status") != "ok"]
    return {"trainers": results, "ok": not failed, "failed": failed}


# ----------------------------------------------------------------------------- part: f5_feeds


def _f5_setup(a: argparse.Namespace) -> dict[str, Any]:
    """The F5-TTS model, optimizer, precision and run config that f5_feeds and prefetch_probe feed."""
    from dataclasses import replace

    import torch

    import core
    import train_f5tts as f5

    dev = torch.device(a.device)
    frames = 2000 if a.quick else f5.RUN_DEFAULTS["batch_frames"]
    tok = f5.Tokenizer()
    core.seed_all(0)
    model = f5.F5TTS(replace(f5.CONFIGS["tiny" if a.quick else "default"], text_num_embeds=tok.size)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=7.5e-5, weight_decay=0.01)
    precision, autocast = core.autocast_for("auto", dev)
    shards = a.bundle / "shards" / "f5tts"
    flags = repeated(a, shards, 2 if a.quick else COPIES["f5tts"])
    cfg = core.RunConfig(shards=flags[1], weights=flags[3], out=str(a.work / "f5_feeds"), batch_frames=frames,
                         max_items=f5.RUN_DEFAULTS["max_items"], prefetch=2, seed=0)
    return {"dev": dev, "model": model, "opt": opt, "precision": precision, "autocast": autocast, "cfg": cfg,
            "tok": tok, "shards": shards, "kw": {"batch_transform": f5.AddTextIds(tok)},
            "warm": 1 if a.quick else 5, "timed": 2 if a.quick else 30}


def _f5_loader(s: dict[str, Any], prefetch: int, device: Any, num_workers: int = 0):
    """audiopipe's loader over the F5 shards exactly as core.train builds it, with the given hand-over."""
    from dataclasses import replace

    import core
    import train_f5tts as f5

    cfg = replace(s["cfg"], prefetch=prefetch, num_workers=num_workers)
    return core._make_loader(cfg, core.Dist(device=device), ["mel"], None, {"mel": f5.MEL_HASH}, s["kw"],
                             Path(cfg.out))


def _epochs(loader):
    e = 0
    while True:
        loader.set_epoch(e) if hasattr(loader, "set_epoch") else loader.batch_sampler.set_epoch(e)
        yield from loader
        e += 1


def f5_step(model, opt, autocast, batch: dict[str, Any]):  # noqa: ANN001, ANN201 - torch objects
    """One F5-TTS training step as its trainer takes it (gradients clipped at 1.0); returns the loss."""
    import torch

    import train_f5tts as f5

    with autocast:
        loss, _ = f5.loss_fn(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _timed_feed(s: dict[str, Any], name: str, feed) -> dict[str, Any]:
    """`warm` then `timed` F5 training steps fed by `feed`: the GPU's step time and data wait (core's clock), and
    the training thread's own CPU time per step (time.thread_time: what it spent running, not waiting)."""
    import torch

    import core

    dev, model, opt, autocast, warm, timed = s["dev"], s["model"], s["opt"], s["autocast"], s["warm"], s["timed"]
    cuda = dev.type == "cuda"
    clock = core._Clock(dev)
    it = iter(feed)
    total = torch.zeros((), dtype=torch.int64, device=dev)
    pads, sizes = [], []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    clock.start_pass()
    t0, c0 = time.perf_counter(), time.thread_time()
    for i in range(warm + timed):
        if i == warm:
            clock.read()  # the warm-up steps are not counted
            t0, c0 = time.perf_counter(), time.thread_time()
        clock.wait_begin()
        batch = core.default_to_device(next(it), dev)
        clock.wait_end()
        loss = f5_step(model, opt, autocast, batch)
        if i >= warm:
            total += batch["mel_lengths"].sum()
            pads.append(float(batch["padding_ratio"]["mel"]))
            sizes.append(int(batch["mel"].shape[0]))
        clock.step_end()
    step_s, wait_s = clock.read()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    out = {"feed": name, "timed_steps": timed, "step_ms": 1e3 * step_s / timed,
           "data_wait_share": wait_s / step_s if step_s else None,
           "frames_per_s": float(total) / step_s if step_s else None, "wall_s": round(wall, 2),
           "thread_cpu_ms_per_step": round(1e3 * cpu / timed, 2), "frames": int(total),
           "padding_share": sum(pads) / len(pads), "mean_batch_items": sum(sizes) / len(sizes),
           "loss_finite": bool(torch.isfinite(loss))}
    if cuda:
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(f"[f5] {name}: {out['step_ms']:.1f} ms/step, data wait {100 * (out['data_wait_share'] or 0):.2f} %, "
          f"training thread CPU {out['thread_cpu_ms_per_step']:.1f} ms/step", flush=True)
    return out


def _warm_up(s: dict[str, Any], batches: list) -> None:
    """A few steps first (allocator, kernels, autotuning), so that the first feed timed pays nothing extra."""
    import train_f5tts as f5

    for b in batches:
        with s["autocast"]:
            loss, _ = f5.loss_fn(s["model"], b)
        loss.backward()
        s["opt"].step()
        s["opt"].zero_grad(set_to_none=True)


def part_f5_feeds(a: argparse.Namespace) -> dict[str, Any]:
    """F5-TTS fed three ways through one loop: the batch already on the device, audiopipe, F5's own rule."""
    import torch

    import core
    import train_f5tts as f5
    from audiopipe.collate.pad import PadCollator
    from audiopipe.reader.loader import _Collate
    from audiopipe.sampler.bucket import BucketBatchSampler

    s = _f5_setup(a)
    dev, cfg = s["dev"], s["cfg"]
    cuda = dev.type == "cuda"
    workers = 1 if a.quick else min(16, os.cpu_count() or 1)  # F5's configs use 16 DataLoader workers
    results: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"],
                               "batch_frames": cfg.batch_frames, "max_items": cfg.max_items,
                               "workers_f5_rule": workers}
    # 1. the ceiling: a few batches put on the device once and cycled (no loader in the loop)
    on_device = []
    for b, _ in zip(_epochs(_f5_loader(s, 0, torch.device("cpu"))), range(8)):  # the collator's ring reuses
        on_device.append(core.default_to_device({k: v.clone() if torch.is_tensor(v) else v  # its buffers
                                                 for k, v in b.items()}, dev))
    _warm_up(s, on_device[:3])
    results["on_device"] = _timed_feed(s, "batch already on the device",
                                       (on_device[i % len(on_device)] for i in range(10 ** 9)))
    save_partial(a, results)
    # 2. audiopipe, as the trainer feeds itself: prefetch 2, pinned, side-stream copy on CUDA
    loader = _f5_loader(s, 2, dev)
    results["audiopipe"] = _timed_feed(s, "audiopipe (prefetch 2)", _epochs(loader))
    results["audiopipe"]["batches_per_epoch"] = len(loader)
    save_partial(a, results)
    # 3. F5's own rule: decode, resample, mel per item in DataLoader workers (the on_the_fly baseline)
    from audiopipe.bench.loaders import OnTheFlyMel  # soundfile + soxr: from the bundle's wheels on the GPU image

    ds = OnTheFlyMel(str(s["shards"]), "mel", str(a.bundle / "wavs" / "en"))
    sampler = BucketBatchSampler(ds.lengths(), cfg.batch_frames, max_items=cfg.max_items, seed=0)
    # One endless pass: the workers never restart at an epoch's end, which on this small corpus comes every few
    # batches (audiopipe's loader above restarts its prefetch at every epoch, as in training).
    dl = torch.utils.data.DataLoader(ds, batch_sampler=_Endless(sampler), num_workers=workers, pin_memory=cuda,
                                     collate_fn=_Collate(PadCollator(["mel"]), f5.AddTextIds(s["tok"])))
    results["f5_own_rule"] = _timed_feed(s, f"F5's own rule ({workers} workers)", iter(dl))
    results["f5_own_rule"]["batches_per_epoch"] = len(sampler)
    base = results["on_device"]["step_ms"]
    results["step_vs_on_device"] = {k: results[k]["step_ms"] / base for k in ("audiopipe", "f5_own_rule")}
    return results


def part_prefetch_probe(a: argparse.Namespace) -> dict[str, Any]:
    """Where a prefetching loader's cost goes: F5-TTS fed the same batches, in the same order, five ways.

    The trainers part measured F5-TTS default on an H200 at 170 ms a step with prefetch 2 against 134 ms with
    prefetch 0, the same batches, while the data wait stayed under 2.1 % in both: the cost is not a late batch but
    a slower step. But the prefetch-2 run came first in its process: it also met every batch shape for the first
    time (allocator growth, cuDNN plans per shape), the second run met none. So the first feed here is a cold pass
    over the very batches every later feed trains on, and each later feed changes one thing: the difference
    between two rows is that thing's cost.
    """
    import sys as _sys

    import torch

    import core

    s = _f5_setup(a)
    dev, cpu = s["dev"], torch.device("cpu")
    for b, _ in zip(_epochs(_f5_loader(s, 0, cpu)), range(3)):
        _warm_up(s, [core.default_to_device(b, dev)])
    feeds = [
        ("cold", "prefetch 0, every batch shape seen for the first time", lambda: _f5_loader(s, 0, dev)),
        ("off", "prefetch 0: built on the training thread when asked, then copied", lambda: _f5_loader(s, 0, dev)),
        ("thread_copy", "prefetch 2: built and copied (side stream) in a thread", lambda: _f5_loader(s, 2, dev)),
        ("thread_build", "prefetch 2: built in a thread, copied on the training thread", lambda: _f5_loader(s, 2, cpu)),
        ("workers", "2 worker processes build, prefetch 0", lambda: _f5_loader(s, 0, dev, num_workers=2)),
    ]
    results: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"]}
    for key, name, make in feeds:
        results[key] = _timed_feed(s, name, _epochs(make()))
        save_partial(a, results)
    # The GIL hand-over: Python lets a thread that wants the GIL take it after 5 ms; 0.5 ms shortens how long the
    # training thread can be kept from launching kernels by the prefetch thread's Python.
    old = _sys.getswitchinterval()
    _sys.setswitchinterval(0.0005)
    try:
        results["thread_copy_switch"] = _timed_feed(s, "prefetch 2 (thread copy), GIL switch interval 0.5 ms",
                                                    _epochs(_f5_loader(s, 2, dev)))
    finally:
        _sys.setswitchinterval(old)
    frames = {results[k]["frames"] for k, _, _ in feeds}
    results["same_batches"] = len(frames) == 1  # every feed trained on the same frames: the rows compare
    base = results["off"]["step_ms"]
    results["step_vs_off"] = {k: results[k]["step_ms"] / base for k in results
                              if isinstance(results[k], dict) and "step_ms" in results[k]}
    return results


class _Endless:
    """A batch sampler that runs epoch after epoch in one pass (for a DataLoader that should never restart)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        epoch = 0
        while True:
            self.sampler.set_epoch(epoch)
            yield from self.sampler
            epoch += 1


# ----------------------------------------------------------------------------- part: features


def part_features(a: argparse.Namespace) -> dict[str, Any]:
    return features(a, 2.0 if a.quick else 240.0, None, "1,4" if a.quick else "1,16,64", [])


def features(a: argparse.Namespace, seconds: float, piece_s: float | None, sizes: str, flags: list[str]
             ) -> dict[str, Any]:
    """bench_gpu_features on `seconds` of clips made from the bundle's speech (cut into pieces of piece_s), batch
    sizes `sizes`, its own `flags`; the figures per feature and method."""
    import torch

    import bench_gpu_features as bgf

    clips = a.work / "gpu_clips"
    shutil.rmtree(clips, ignore_errors=True)
    info = bgf.make_clips(a.bundle / "wavs", clips, seconds, piece_s=piece_s)
    out = a.work / "gpu_features.json"
    name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    sys.argv = ["bench_gpu_features.py", "--clips", str(clips), "--device", a.device, "--batch", sizes,
                "--rounds", "1" if a.quick else "3", "--json", str(out), "--machine", name, *flags]
    rc = bgf.main()
    ensure(rc == 0 and out.exists(), f"bench_gpu_features exited {rc}")
    doc = json.loads(out.read_text())
    summary = {}
    for res in doc["results"]:
        for row in res["rows"]:
            summary[f"{row['feature']} {row['method']}"] = {
                "x_rt": round(row["x_rt"]["median"]), "vs_one_at_a_time": round(row["vs_one_at_a_time"]["median"], 2),
                "padding_efficiency": round(row["padding_efficiency"], 3), "parity": row["parity"]}
    return {"clips": info, "summary": summary, "bench": doc}


# ----------------------------------------------------------------------------- part: calibrate


def part_calibrate(a: argparse.Namespace) -> dict[str, Any]:
    import calibrate_batches as cb

    results: dict[str, Any] = {}
    for model, share in (("f5tts", 0.8), ("eres2net", 1.0)):  # F5 gets 4/5 of the time, ERes2Net the rest
        try:
            results[model] = cb.calibrate(model=model, device=a.device, quick=a.quick,
                                          out=a.out / f"bucket_budget_{model}.json", compare=model == "f5tts",
                                          deadline=time.time() + max(5.0, (a.deadline - time.time()) * share))
            save_partial(a, results)
        except Exception as e:  # noqa: BLE001 - one model's failure is reported, the other still runs
            results[model] = {"status": "failed", "error": f"{type(e).__name__}: {e}",
                              "traceback": tail(traceback.format_exc(), 12)}
    failed = [k for k, v in results.items() if v.get("status") == "failed"]
    ensure(not failed, f"calibration failed for {', '.join(failed)}: "
                       + "; ".join(results[k]["error"] for k in failed))
    return results


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "cuda_tests": part_cuda_tests, "trainers": part_trainers, "trainer": part_trainer, "f5_feeds": part_f5_feeds,
    "prefetch_probe": part_prefetch_probe,
    "features": part_features, "calibrate": part_calibrate, "info": lambda a: device_info(a.device)}


# ----------------------------------------------------------------------------- running parts as processes


def run_child(a: argparse.Namespace, part: str, cap: float, extra: list[str] | None = None,
              script: Path | None = None, flags: list[str] | None = None) -> dict[str, Any]:
    """Run one part in a child process under a time cap; its result, status and output tail. `script`: the
    script whose `--child` runs it (this one by default; gpu_proof2.py runs its own parts), with its own
    `flags`."""
    name = part + (f"-{extra[1]}" if extra else "")
    result_path = a.work / f"{name}.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(script or Path(__file__).resolve()), "--child", part, "--bundle", str(a.bundle), "--out",
           str(a.out), "--work", str(a.work), "--device", a.device, "--without", a.without, "--trainers", a.trainers,
           "--deadline", str(time.time() + cap - 3), "--cap", str(cap), *(extra or []), *(flags or [])]
    if a.quick:
        cmd.append("--quick")
    t0 = time.perf_counter()
    log_path = a.work / f"{name}.out"
    with open(log_path, "w") as logf:
        # A new session: on a timeout the whole group (DataLoader workers, a grandchild) goes with it.
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=a.env, cwd=ROOT,
                                start_new_session=True)
        with open(a.work / "process_groups", "a") as f:  # every group started: all are ended on a timeout
            f.write(f"{proc.pid}\n")
        try:
            rc = proc.wait(timeout=cap)
            status = "ok" if rc == 0 else "failed"
            _forget_group(a.work, proc.pid)  # ended: its number may be reused, never signal it again
        except subprocess.TimeoutExpired:
            kill_groups(a.work, since=proc.pid)
            proc.wait()
            rc, status = None, "timeout"
    seconds = round(time.perf_counter() - t0, 1)
    output = log_path.read_text(errors="replace")
    res: dict[str, Any] = {"status": status, "seconds": seconds, "cap_s": round(cap, 1), "exit": rc}
    if result_path.exists():
        body = json.loads(result_path.read_text())
        if body.get("error"):
            res["error"] = body.pop("error")
            res["status"] = "failed" if status == "ok" else status
        res.update(body)
    if res["status"] != "ok":
        res["output_tail"] = tail(output, 40)
    return res


def _forget_group(work: Path, pid: int) -> None:
    path = work / "process_groups"
    if path.exists():
        path.write_text("".join(f"{x}\n" for x in path.read_text().split() if int(x) != pid))


def kill_groups(work: Path, since: int | None = None) -> None:
    """End the process groups parts started that are still running: the group `since` and every group started
    after it (a trainer a part runs, their DataLoader workers), or all of them; never the groups of the parts
    that started it."""
    path = work / "process_groups"
    pids = [int(x) for x in path.read_text().split()] if path.exists() else []
    if since is not None and since not in pids:
        pids.append(since)
    keep = pids[: pids.index(since)] if since is not None else []
    for pid in pids[len(keep):]:
        try:
            os.killpg(pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
    path.write_text("".join(f"{x}\n" for x in keep))


def child_main(a: argparse.Namespace) -> int:
    block_modules(a.without)
    a.env = dict(os.environ)  # the parent's: PYTHONPATH with the wheels' folder, for a grandchild
    a.deadline = float(a.deadline)
    name = a.child + (f"-{a.trainer}" if a.trainer else "")
    path = a.work / f"{name}.json"
    try:
        body = CHILDREN[a.child](a)
        ok = body.get("ok", True)
    except BaseException as e:  # noqa: BLE001 - written down for the parent, then the exit code says it
        # What the part measured before it failed (save_partial) stays, beside the error.
        body = json.loads(path.read_text()) if path.exists() else {}
        body.update(error=f"{type(e).__name__}: {e}", traceback=tail(traceback.format_exc(), 20))
        ok = False
        traceback.print_exc()
    path.write_text(json.dumps(body, indent=1, default=str))
    return 0 if ok else 1


# ----------------------------------------------------------------------------- headline figures, log


def headline(part: str, res: dict[str, Any]) -> list[str]:
    """The figures a reader looks for first, one line each."""
    lines = []
    try:
        if part == "cuda_tests" and "counts" in res:
            c = res["counts"]
            lines.append(f"  {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
            lines += [f"  FAILED {t['test']}: {t['message'][:200]}" for t in res["tests"] if t["outcome"] == "failed"]
        elif part == "trainers":
            for name, r in res.get("trainers", {}).items():
                on, off = r.get("prefetch_2", {}), r.get("prefetch_0", {})
                if on.get("timed_steps"):
                    lines.append(f"  {name}: {on['step_ms']:.1f} ms/step, data wait {100 * on['data_wait_share']:.3f} % "
                                 f"(prefetch off {100 * off.get('data_wait_share', float('nan')):.3f} %), padding "
                                 f"{100 * on['padding_share']:.1f} %, {on['frames_per_s']:.0f} frames/s, peak "
                                 f"{on.get('peak_gib', 'n/a')} GiB [{r['status']}]")
                else:
                    lines.append(f"  {name}: {r.get('status')} {r.get('error', '')[:200]}")
        elif part == "f5_feeds" and "on_device" in res:
            for k in ("on_device", "audiopipe", "f5_own_rule"):
                if k in res:
                    r = res[k]
                    lines.append(f"  {r['feed']}: {r['step_ms']:.1f} ms/step, data wait "
                                 f"{100 * r['data_wait_share']:.3f} %, {r['frames_per_s']:.0f} frames/s")
        elif part == "prefetch_probe" and "off" in res:
            for k, r in res.items():
                if isinstance(r, dict) and "step_ms" in r:
                    lines.append(f"  {r['feed']}: {r['step_ms']:.1f} ms/step, data wait {100 * r['data_wait_share']:.2f} "
                                 f"%, training thread CPU {r['thread_cpu_ms_per_step']:.1f} ms/step")
            lines.append(f"  same batches in every feed: {res.get('same_batches')}")
        elif part == "features" and "summary" in res:
            lines += [f"  {k}: {v['x_rt']} x real time" for k, v in res["summary"].items()]
        elif part == "calibrate":
            for model, r in res.items():
                if isinstance(r, dict) and "budget" in r:
                    lines.append(f"  {model}: " + ", ".join(f"<={b['max_len']}: {b['max_items']} items/"
                                                            f"{b['max_frames']} frames" for b in r["budget"]))
                if isinstance(r, dict) and r.get("compare"):
                    c = r["compare"]
                    lines.append(f"  {model}: per-bucket {c['per_bucket']['frames_per_s']:.0f} vs global "
                                 f"{c['global']['frames_per_s']:.0f} frames/s = {c['gain']:.2f}x")
    except (KeyError, TypeError, ValueError) as e:
        lines.append(f"  (figures incomplete: {e!r})")
    return lines


def tables(doc: dict[str, Any]) -> str:
    """Markdown for the pages each figure lands on (docs/gpu-proof.md says where), every one naming its machine."""
    dv = doc["device"]
    machine = (f"{dv.get('name')}, {dv.get('memory_gib', '?')} GiB, torch {dv.get('torch')}, CUDA {dv.get('cuda')}"
               + (" (CPU rehearsal, --quick: not a GPU figure)" if doc.get("quick") else ""))
    parts, out = doc["parts"], [f"Machine: {machine}; commit {dv.get('commit')}.", ""]
    tr = parts.get("trainers", {}).get("trainers", {})
    if tr:
        out += ["### docs/trainers/<trainer>.md: the default config on this GPU (bf16, 10 warm-up + 60 timed steps)", "",
                "| trainer | machine | step | data wait, prefetch on | data wait, prefetch off | padding | frames/s "
                "| peak memory |", "|---|---|---|---|---|---|---|---|"]
        for name, r in tr.items():
            on, off = r.get("prefetch_2", {}), r.get("prefetch_0", {})
            if not on.get("timed_steps"):
                out.append(f"| {name} | {dv.get('name')} | {r.get('status')} | | | | | |")
                continue
            off_wait = f"{100 * off['data_wait_share']:.3f} %" if off.get("timed_steps") else f"not measured ({r.get('status')})"
            out.append(f"| {name} | {dv.get('name')} | {on['step_ms']:.1f} ms | {100 * on['data_wait_share']:.3f} % "
                       f"| {off_wait} | {100 * on['padding_share']:.1f} % "
                       f"| {on['frames_per_s']:,.0f} | {on.get('peak_gib', 'n/a')} GiB |")
        out.append("")
    f5 = parts.get("f5_feeds", {})
    if "on_device" in f5:
        out += [f"### docs/trainers/f5tts.md: F5-TTS {f5['model']} fed three ways ({f5['batch_frames']} frames, "
                f"{f5['precision']})", "", "| feed | machine | step | data wait | frames/s | vs batch on the device |",
                "|---|---|---|---|---|---|"]
        base = f5["on_device"]["step_ms"]
        for k in ("on_device", "audiopipe", "f5_own_rule"):
            if k in f5:
                r = f5[k]
                out.append(f"| {r['feed']} | {dv.get('name')} | {r['step_ms']:.1f} ms | "
                           f"{100 * r['data_wait_share']:.3f} % | {r['frames_per_s']:,.0f} | {r['step_ms'] / base:.3f}x |")
        out.append("")
    probe = parts.get("prefetch_probe", {})
    if "off" in probe:
        out += [f"### docs/gpu-proof.md: F5-TTS {probe['model']} fed the same batches five ways, after a cold pass "
                f"({probe['precision']}; same batches: {probe.get('same_batches')})", "",
                "| feed | machine | step | vs prefetch 0 | data wait | training thread CPU per step |",
                "|---|---|---|---|---|---|"]
        for k, r in probe.items():
            if isinstance(r, dict) and "step_ms" in r:
                out.append(f"| {r['feed']} | {dv.get('name')} | {r['step_ms']:.1f} ms | "
                           f"{r['step_ms'] / probe['off']['step_ms']:.2f}x | {100 * r['data_wait_share']:.2f} % | "
                           f"{r['thread_cpu_ms_per_step']:.1f} ms |")
        out.append("")
    feat = parts.get("features", {})
    if "bench" in feat:
        import bench_gpu_features as bgf

        out += ["### docs/extraction.md: features on this GPU (bench_gpu_features)", "",
                bgf.table(feat["bench"]["results"]), ""]
    cal = parts.get("calibrate", {})
    for model, r in cal.items():
        if isinstance(r, dict) and "budget" in r:
            out += [f"### docs/sampler.md: {r['model']}, per-bucket budget ({r['unit']}, margin {r['margin']})", "",
                    "| longest item up to | max items | max padded frames |", "|---|---|---|"]
            out += [f"| {b['max_len']} | {b['max_items']} | {b['max_frames']:,} |" for b in r["budget"]]
            c = r.get("compare")
            if c and c.get("gain"):
                g, p = c["global"], c["per_bucket"]
                out += ["", f"Frames/s on {dv.get('name')}: per-bucket {p['frames_per_s']:,.0f} (peak {p['peak_gib']} GiB) "
                            f"against one global budget of {c['global_max_frames']:,} frames {g['frames_per_s']:,.0f} "
                            f"(peak {g['peak_gib']} GiB): {c['gain']:.2f}x."]
            out.append("")
    return "\n".join(out)


class Report:
    """gpu_proof.json and gpu_proof.log in --out, rewritten after every part: a run cut short keeps what it had."""

    def __init__(self, out: Path, doc: dict[str, Any]):
        self.out, self.doc = out, doc
        self.lines: list[str] = []

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.flush()

    def flush(self) -> None:
        (self.out / "gpu_proof.json").write_text(json.dumps(self.doc, indent=1, default=str))
        (self.out / "gpu_proof.log").write_text("\n".join(self.lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, PARTS, "gpu_proof.json, gpu_proof.log, budgets", "420; 600")
    ap.add_argument("--trainers", default=",".join(TRAINERS),
                    help=f"comma-separated trainers the trainers part runs, of {','.join(TRAINERS)}")
    ap.add_argument("--tables", type=Path, metavar="GPU_PROOF_JSON",
                    help="print the markdown tables of a finished run for the docs (docs/gpu-proof.md) and stop")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--trainer", choices=sorted(TRAINERS), help=argparse.SUPPRESS)  # the one a child runs
    a = ap.parse_args(argv)
    if a.tables is not None:
        print(tables(json.loads(a.tables.read_text())))
        return 0
    if a.out is None:
        ap.error("--out is required: the folder for gpu_proof.json, gpu_proof.log and the budgets")
    bad = sorted(set(a.trainers.split(",")) - set(TRAINERS))
    if bad and not a.child:
        ap.error(f"unknown trainer(s) {', '.join(bad)}: choose from {', '.join(TRAINERS)}")
    order = prepare(ap, a, PARTS, "gpu_proof_work")
    if a.child:
        return child_main(a)
    started = time.time()
    budget = a.budget_s if a.budget_s is not None else (600.0 if a.quick else 420.0)
    wheels, info = start(a)
    doc: dict[str, Any] = {"format": "audiopipe.gpu_proof/1", "quick": a.quick, "device": info,
                           "bundle": json.loads((a.bundle / "bundle.json").read_text()), "wheels": wheels,
                           "without": a.without, "budget_s": budget, "command": " ".join(sys.argv), "parts": {}}
    report = Report(a.out, doc)
    dv = doc["device"]
    report.say(f"gpu_proof: {dv.get('name')} ({a.device}), torch {dv.get('torch')}, CUDA {dv.get('cuda')}, "
               f"python {dv.get('python')}, torchaudio {dv.get('torchaudio')}, transformers {dv.get('transformers')}, "
               f"commit {dv.get('commit')}" + (f"; device not read: {dv['error']}" if dv.get("error") else ""))
    if wheels.get("installed") or wheels.get("error"):
        report.say(f"wheels: {', '.join(wheels.get('installed', [])) or 'FAILED ' + wheels.get('error', '')[:300]}")
    statuses = run_parts(a, report, order, CAPS, budget, started, headline, run_child, "gpu_proof")
    files = [p for p in a.out.iterdir() if p.is_file()]
    if len(files) > MAX_OUT_FILES:
        report.say(f"warning: {len(files)} files in {a.out}; a device call brings back only {MAX_OUT_FILES}")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


def common_args(ap: argparse.ArgumentParser, parts: tuple[str, ...], results: str, budgets: str) -> None:
    """The flags every round of the proof takes (and the hidden ones a child gets)."""
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu-bundle", help="what `make gpu-bundle` made")
    ap.add_argument("--out", type=Path, help=f"results: {results} (required to run)")
    ap.add_argument("--work", type=Path, default=None, help="scratch (default: a folder in the system temp dir)")
    ap.add_argument("--device", default=None, help="cuda (default where torch sees one) or cpu")
    ap.add_argument("--quick", action="store_true", help="tiny models and few steps: the same code paths, fast")
    ap.add_argument("--parts", default=",".join(parts), help=f"comma-separated, of {','.join(parts)}")
    ap.add_argument("--budget-s", type=float, default=None,
                    help=f"wall-clock budget of all parts together (default {budgets} with --quick)")
    ap.add_argument("--without", default="", help="comma-separated modules to make unimportable in every part "
                                                  "(rehearses the GPU image on a machine that has them)")
    ap.add_argument("--deadline", default="0", help=argparse.SUPPRESS)
    ap.add_argument("--cap", type=float, default=0.0, help=argparse.SUPPRESS)


def prepare(ap: argparse.ArgumentParser, a: argparse.Namespace, known: tuple[str, ...], work: str) -> list[str]:
    """What every round does before its parts: resolve the folders, pick the device, refuse unknown parts and a
    missing bundle (one line each), make --out and a fresh --work. Returns the parts to run, in the order of
    value. A child only resolves the folders (its parent checked the rest)."""
    a.bundle, a.out = a.bundle.resolve(), a.out.resolve()
    a.work = (a.work or Path(__import__("tempfile").gettempdir()) / work).resolve()
    if a.child:
        return []
    import torch

    if a.device is None:
        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here")
    parts = [p.strip() for p in a.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(known))
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    if not (a.bundle / "bundle.json").is_file():
        ap.error(f"--bundle {a.bundle} has no bundle.json: make it with `make gpu-bundle`")
    a.out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    return [p for p in known if p in parts]


def start(a: argparse.Namespace, script: Path | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The bundle's wheels where missing, the children's environment (a.env), and the device as a child reads it:
    (wheels, device info)."""
    wheels = install_wheels(a.bundle, a.work / "site")
    paths = [wheels["site"]] if wheels.get("site") else []
    a.env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT), str(ROOT / "trainers"),
                                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
             "PYTHONUNBUFFERED": "1", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
    # Read in a child: this process never creates a CUDA context, which would hold GPU memory all run long.
    # A failure here is written down, not fatal: each part then records its own failure.
    info = run_child(a, "info", 120, script=script)
    if info["status"] == "ok":
        info = {k: v for k, v in info.items() if k not in ("status", "seconds", "cap_s", "exit")}
    else:
        info = {"device": a.device, "error": info.get("error") or tail(info.get("output_tail", ""), 5)}
    return wheels, info


def run_parts(a: argparse.Namespace, report: Report, order: list[str], table: dict[str, tuple[float, ...]],
              budget: float, started: float, headline_of: Callable[..., list[str]],
              run: Callable[..., dict[str, Any]], name: str) -> dict[str, str]:
    """Each part in `order` as a child under its cap (what the budget leaves after the floors of the parts still
    to come; skipped below its own floor), its result and headline in the report; then every process group
    ended. `table`: each part's (cap, floor, quick cap, quick floor). Returns each part's status."""
    doc = report.doc
    caps = {p: v[2 if a.quick else 0] for p, v in table.items()}
    floors = {p: v[3 if a.quick else 1] for p, v in table.items()}
    for i, part in enumerate(order):
        later = order[i + 1:]
        left = budget - (time.time() - started)
        cap = min(caps[part], left - sum(floors[q] for q in later))
        if cap < floors[part]:
            doc["parts"][part] = {"status": "skipped", "reason": f"{left:.0f} s of the budget left"}
            report.say(f"part {part}: skipped, {left:.0f} s of the budget left")
            continue
        report.say(f"part {part}: started (cap {cap:.0f} s)")
        res = run(a, part, cap)
        doc["parts"][part] = res
        report.say(f"part {part}: {res['status']} in {res['seconds']:.1f} s")
        for line in headline_of(part, res):
            report.say(line)
        if res["status"] != "ok":
            report.say("  " + (res.get("error") or tail(res.get("output_tail", ""), 3)).replace("\n", "\n  ")[:1500])
    kill_groups(a.work)  # nothing a part started outlives the run
    doc["total_s"] = round(time.time() - started, 1)
    statuses = {p: r["status"] for p, r in doc["parts"].items()}
    report.say(f"{name}: {sum(s == 'ok' for s in statuses.values())}/{len(statuses)} parts ok in "
               f"{doc['total_s']:.0f} s: {statuses}")
    return statuses


if __name__ == "__main__":
    sys.exit(main())
