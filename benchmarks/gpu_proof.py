"""The GPU proof: what only a GPU can show, measured in one call that a machine with one NVIDIA GPU runs in under
8 minutes of device time, everything prepared here. docs/gpu-proof.md gives the exact calls and, part by part, what
each runs, what it shows and what it does not.

    make gpu-bundle                                                     # here, once: data, wheels (.gpu-bundle/)
    python3 benchmarks/gpu_proof.py --bundle .gpu-bundle --out $OUT     # there: the default parts
    python benchmarks/gpu_proof.py --bundle B --out R --device cpu --quick --parts all   # every code path on a CPU

Parts, in order of value (* the default call's): cuda_tests (pytest -m cuda tests/test_cuda.py), full_batches *,
cores *, speaker_cores *, features * (bench_gpu_features), calibrate * (calibrate_batches), speakers *, trainers
(every trainer's own main()) and shapes (a call of its own). Each runs in its own process group under its own cap,
so a failing or hanging part never stops the others, and all of them together stay inside --budget-s. Writes to
--out (a device call brings back at most 8 files): gpu_proof.json (everything, rewritten after every part),
gpu_proof.log (device, versions, each part's seconds and headline) and the calibrated bucket budgets.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.util
import json
import os
import platform
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(p) for p in (ROOT, ROOT / "trainers", ROOT / "benchmarks") if str(p) not in sys.path]

PARTS = ("cuda_tests", "full_batches", "cores", "speaker_cores", "features", "calibrate", "speakers", "trainers",
         "profile", "shapes")
# cuda_tests and trainers back the first call's figures (benchmarks/results/gpu_proof_h200*.json); shapes compiles
# two models, more than the default budget leaves: a second call runs it (--parts cuda_tests,profile,shapes
# --budget-s 300).
DEFAULT_PARTS = ("full_batches", "cores", "speaker_cores", "features", "calibrate", "speakers")
# Seconds per part: (cap, floor) on one H200 (F5 default at 38,400 frames: ~0.4 s a step), then (cap, floor) with
# --quick on a CPU, where the caps are only a safety net. Default budget 420 s: with the machine's start-up and the
# device read (~50 s), under 8 minutes.
CAPS = {"cuda_tests": (60, 25, 180, 10), "full_batches": (115, 60, 150, 10), "cores": (95, 50, 200, 10),
        "speaker_cores": (60, 25, 200, 10), "features": (40, 15, 150, 8), "calibrate": (90, 30, 200, 8),
        "speakers": (35, 20, 150, 8), "trainers": (300, 60, 300, 20), "profile": (75, 30, 150, 8),
        "shapes": (290, 200, 250, 8)}
# Each trainer: its script, the bundle folder it reads, its share of the trainers part (s), --quick flags that fit
# the tiny bundle, and (trainers part) the times one epoch reads its small corpus, so that an epoch holds tens of
# batches as on a real corpus (else nearly every step would be a pass's first, whose batch no prefetch builds ahead).
QUICK_SPEAKER_FLAGS = ["--batch-frames", str(4 * 16000), "--crop-seconds", "1"]  # ERes2Net is slow on a CPU
TRAINERS = {"f5tts": ("train_f5tts", "shards/f5tts", 60, ["--batch-frames", "2000"], 8),
            "eres2net": ("train_eres2net", "shards/speakers", 45, QUICK_SPEAKER_FLAGS, 20),
            "campplus": ("train_campplus", "shards/speakers", 45, QUICK_SPEAKER_FLAGS, 20),
            "gpt_sovits": ("train_gpt_sovits", "tokens/gpt_sovits", 50, ["--batch-frames", "1500"], 6),
            "ns2": ("train_ns2", "shards/ns2", 100, ["--batch-frames", "500"], 4)}
# (warm-up, timed) steps, full then --quick; a trainer's warm-up is one log window
TRAINER_STEPS = ((10, 60), (1, 2))
NS2_STEPS = (5, 20)  # NaturalSpeech 2 default: ~1 s a step on an H200 (alignment search)
SPEAKER_STEPS = ((5, 30), (1, 2))
STEPS = ((10, 200), (1, 2))  # full_batches: mid-epoch
BOUNDARY = (5, 1)  # full_batches: steps timed on each side of the epoch's end
CORE_STEPS = ((3, 12), (1, 2))  # cores, speaker_cores: per feed, the same batches
CORES = (1, 2, 4, 8)  # and all the process may use: F5's rule then takes min(16, all) workers, as F5's configs do
WITHIN = 0.03  # a loader keeps up when its step is within 3 % of the on-device step
PROFILE_STEPS = ((3, 3), (1, 2))  # profile: a warm-up window, then the steps recorded
PROFILE_ORDER = ("ns2", "f5tts", "gpt_sovits", "eres2net", "campplus")  # the slowest step for its size first
SHAPES = 8  # shapes: --shapes K
SHAPE_STEPS = (60, 4)
GPT_STEPS = ((20, 60), (1, 2))
SPEAKER_COPIES = 20  # speakers: the five voices listed as 20 corpora: tens of batches an epoch
HOLD_ROUNDS, HOLD_S = (3, 1), (30.0, 0.0)  # calibrate: rounds over every bucket's largest shapes, seconds kept
PEAK_SHARE = 0.92  # calibrate: the peak reserved memory the budget may reach, of the device's total


def q(a: argparse.Namespace, pair: tuple) -> Any:
    """The --quick or the full value of a (full, quick) pair."""
    return pair[1] if a.quick else pair[0]


def ensure(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def save_partial(a: argparse.Namespace, body: dict[str, Any]) -> None:
    """What a child has so far, where its parent looks: a part stopped at its cap keeps what it measured."""
    (a.work / f"{child_name(a.child, a.trainer)}.json").write_text(json.dumps(body, indent=1, default=str))


def child_name(part: str, trainer: str | None) -> str:
    return part + (f"-{trainer}" if trainer else "")


# ----------------------------------------------------------------------------- the machine


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
        for n in [n for n in sys.modules if n.split(".")[0] in wanted]:
            del sys.modules[n]
        sys.meta_path.insert(0, _Without(wanted))


def _output(cmd: list[str]) -> str | None:
    """A command's output, or None where it is missing or fails (a bare GPU image may lack git)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def device_info(a: argparse.Namespace) -> dict[str, Any]:
    """The machine, and the device the parts use: --device, else cuda where torch sees one."""
    import torch

    cuda = torch.cuda.is_available()
    device = a.device or ("cuda" if cuda else "cpu")
    info: dict[str, Any] = {"device": device, "cuda_available": cuda, "python": platform.python_version(),
                            "torch": torch.__version__, "cuda": torch.version.cuda, "cpu_count": os.cpu_count(),
                            "platform": platform.platform(),
                            "commit": _output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])}
    if device.startswith("cuda") and cuda:
        p = torch.cuda.get_device_properties(0)
        info.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                    cudnn=torch.backends.cudnn.version(), nvidia_smi=_output(
                        ["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit", "--format=csv,noheader"]))
    else:
        info["name"] = platform.processor() or platform.machine()
    for m in ("torchaudio", "transformers"):
        try:
            info[m] = importlib.import_module(m).__version__
        except Exception:  # noqa: BLE001 - absent, or its wheel does not load with this torch
            info[m] = None
    return info


def install_wheels(bundle: Path, site: Path) -> dict[str, Any]:
    """pip-install the bundle's wheels into `site` when the modules they carry do not import here."""
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    missing = [m for m in ("soundfile", "soxr", "julius") if importlib.util.find_spec(m) is None]
    out: dict[str, Any] = {"installed": [], "missing_before": missing, "wheels": [w.name for w in wheels]}
    if wheels and missing:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                            "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)],
                           capture_output=True, text=True)
        out.update({"error": r.stderr.strip()[-800:]} if r.returncode else
                   {"installed": out["wheels"], "site": str(site)})
    return out


# ----------------------------------------------------------------------------- parts as processes


def run_child(a: argparse.Namespace, part: str, cap: float, extra: list[str] | None = None) -> dict[str, Any]:
    """One part in a child process (its own session: on a timeout its whole group goes, DataLoader workers and
    all) under a time cap: its result, status and, when not ok, its output's tail."""
    name = child_name(part, extra[1] if extra else None)
    result = a.work / f"{name}.json"
    result.unlink(missing_ok=True)
    argv = ["--child", part, "--bundle", str(a.bundle), "--out", str(a.out), "--work", str(a.work), "--device",
            a.device or "", "--without", a.without, "--trainers", a.trainers, "--deadline", str(time.time() + cap - 3),
            "--cap", str(cap), *(extra or []), *(["--quick"] * a.quick)]
    t0 = time.perf_counter()
    log = a.work / f"{name}.out"
    pid = fork_part(a, argv, log)
    with open(a.work / "process_groups", "a") as g:  # every group started: all are ended on a timeout
        g.write(f"{pid}\n")
    pidfd = os.pidfd_open(pid)
    if select.select([pidfd], [], [], cap)[0]:
        rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        status = "ok" if rc == 0 else "failed"
        _forget_group(a.work, pid)  # ended: its number may be reused, never signal it again
    else:
        kill_groups(a.work, since=pid)
        os.waitpid(pid, 0)
        rc, status = None, "timeout"
    os.close(pidfd)
    res: dict[str, Any] = {"status": status, "seconds": round(time.perf_counter() - t0, 1), "cap_s": round(cap, 1),
                           "exit": rc, "pid": pid}
    if result.exists():
        body = json.loads(result.read_text())
        if body.get("error"):
            res["error"] = body.pop("error")
            res["status"] = "failed" if status == "ok" else status
        res.update(body)
    if res["status"] != "ok":
        res["output_tail"] = tail(log.read_text(errors="replace"), 40)
    return res


def fork_part(a: argparse.Namespace, argv: list[str], log: Path) -> int:
    """A child that runs `gpu_proof.py ARGV` in a session of its own, its output to `log`: forked, so that what
    this process imported (torch, the trainers' core: seconds a process) is not imported again. This process never
    touches CUDA, which a forked child could not then use."""
    torch = sys.modules.get("torch")
    ensure(torch is None or not torch.cuda.is_initialized(), "a part cannot fork from a process that used CUDA")
    sys.stdout.flush()
    sys.stderr.flush()
    # Python 3.12 warns of a fork with threads: here only native ones (torch's, pyarrow's jemalloc) that hold no
    # Python lock, as in every process a DataLoader forks its workers from.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid:
        return pid
    rc = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        # Line-buffered: a part stopped at its cap keeps its output to the last line.
        sys.stdout, sys.stderr = (open(n, "w", buffering=1, closefd=False) for n in (1, 2))
        os.chdir(ROOT)
        sys.argv = [str(Path(__file__).resolve()), *argv]
        rc = main(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child's output says what went wrong; its exit code that it did
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def _forget_group(work: Path, pid: int) -> None:
    path = work / "process_groups"
    if path.exists():
        path.write_text("".join(f"{x}\n" for x in path.read_text().split() if int(x) != pid))


def kill_groups(work: Path, since: int | None = None) -> None:
    """End the running process groups parts started: the group `since` and every group started after it (a
    trainer a part runs, their DataLoader workers), or all of them; never those of the parts that started it."""
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
    a.deadline = float(a.deadline)
    path = a.work / f"{child_name(a.child, a.trainer)}.json"
    try:
        body = CHILDREN[a.child](a)
        ok = body.get("ok", True)
    except BaseException as e:  # noqa: BLE001 - written down for the parent, then the exit code says it
        body = json.loads(path.read_text()) if path.exists() else {}  # what it measured before failing stays
        body.update(error=f"{type(e).__name__}: {e}", traceback=tail(traceback.format_exc(), 20))
        ok = False
        traceback.print_exc()
    path.write_text(json.dumps(body, indent=1, default=str))
    return 0 if ok else 1


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
    rc = int(pytest.main(["-m", "cuda", "tests/test_cuda.py", "-q", "-rA", "--noconftest", "-p", "no:cacheprovider",
                          f"--junitxml={junit}", f"--basetemp={a.work / 'pytest'}"]))
    tests = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            if (el := case.find(tag)) is not None:
                outcome, message = ("skipped" if tag == "skipped" else "failed"), (el.get("message") or "")[:400]
        tests.append({"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)),
                      "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "skipped")}
    ensure(tests != [], "pytest collected no test")
    ensure(rc in (0, 1), f"pytest exited {rc}")
    return {"pytest_exit": rc, "counts": counts, "tests": tests, "ok": counts["failed"] == 0}


# ----------------------------------------------------------------------------- trainers through their own main()


def window_stats(records: list[dict], warm: int) -> dict[str, Any]:
    """Sums over the timed log windows (those after the warm-up steps) of a trainer's log.jsonl."""
    timed = [r for r in records if r["step"] > warm]
    if not timed:
        return {"timed_steps": 0}
    steps = [r["step"] - p for r, p in zip(timed, [warm] + [r["step"] for r in timed])]
    seconds = [r["step_time"] * n for r, n in zip(timed, steps)]
    total = sum(seconds)
    return {"timed_steps": sum(steps), "step_ms": 1e3 * total / sum(steps),
            "data_wait_share": sum(r["data_wait"] * n for r, n in zip(timed, steps)) / total if total else None,
            "frames_per_s": sum(r["frames_per_s"] * s for r, s in zip(timed, seconds)) / total if total else None,
            "padding_share": sum(r["padding_ratio"] * n for r, n in zip(timed, steps)) / sum(steps),
            "loss_first_last": [timed[0]["loss"], timed[-1]["loss"]], "epochs": timed[-1]["epoch"] + 1}


def run_main(a: argparse.Namespace, name: str, shards: list[str], out: Path, steps: tuple[int, int], prefetch: int,
             extra: list[str]) -> dict[str, Any]:
    """A trainer's own main() as from the command line, its figures from its own log: the first log window is the
    warm-up. Its output folder goes afterwards (the final checkpoint of an upstream-size model: gigabytes)."""
    import torch

    warm, timed = steps
    shutil.rmtree(out, ignore_errors=True)
    argv = [*shards, "--config", "tiny" if a.quick else "default", "--out", str(out), "--max-steps", str(warm + timed),
            "--log-every", str(warm), "--ckpt-every", str(10 ** 9), "--prefetch", str(prefetch), "--seed", "0",
            *extra, *(TRAINERS[name][3] if a.quick else [])]
    cuda = a.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        importlib.import_module(TRAINERS[name][0]).main(argv)
    finally:
        log, cfg = out / "log.jsonl", out / "model_config.json"
        run = {"argv": argv, "wall_s": round(time.perf_counter() - t0, 1),
               **window_stats([json.loads(x) for x in log.read_text().splitlines()] if log.exists() else [], warm)}
        if cuda:
            run.update(peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                       peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2))
        if cfg.exists() and json.loads(cfg.read_text()).get("parameters"):
            run["parameters_m"] = round(json.loads(cfg.read_text())["parameters"] / 1e6, 2)
        if (out / "profile.json").exists():
            run["profile"] = json.loads((out / "profile.json").read_text())
        shutil.rmtree(out, ignore_errors=True)
    ensure(run["timed_steps"] == timed, f"{name}: {run['timed_steps']} timed steps, expected {timed}")
    return run


def repeated(a: argparse.Namespace, folder: Path, copies: int) -> list[str]:
    """--shards and --weights that read `folder` `copies` times an epoch (the first call's way, kept so that its
    figures reproduce): the folder and a link to it as two corpora, each weighted copies / 2."""
    return ["--shards", ",".join(map(str, grown(a, folder, 2))), "--weights", f"{copies / 2:g},{copies / 2:g}"]


def part_trainer(a: argparse.Namespace) -> dict[str, Any]:
    """One trainer at prefetch 2, then 0 (each batch built on the training thread when the step asks)."""
    _, folder, _, _, copies = TRAINERS[a.trainer]
    steps = TRAINER_STEPS[1] if a.quick else NS2_STEPS if a.trainer == "ns2" else TRAINER_STEPS[0]
    shm = Path("/dev/shm")
    scratch = shm if a.device.startswith("cuda") and shm.is_dir() and shutil.disk_usage(shm).free > 32 << 30 else a.work
    shards = repeated(a, a.bundle / folder, 2 if a.quick else copies)
    res: dict[str, Any] = {"trainer": a.trainer, "warmup_steps": steps[0], "timed_steps": steps[1]}
    for prefetch in (2, 0):
        res[f"prefetch_{prefetch}"] = run_main(a, a.trainer, shards, scratch / "gpu_proof_runs" / a.trainer,
                                               steps, prefetch, [])
        save_partial(a, res)
    return res


def part_trainers(a: argparse.Namespace) -> dict[str, Any]:
    """Each trainer in its own process under its own share of the part's cap, plus what those before it left."""
    names = [n for n in TRAINERS if n in a.trainers.split(",")]
    scale = a.cap / sum(TRAINERS[n][2] for n in names)
    results = {}
    for i, name in enumerate(names):
        cap = a.deadline - time.time() - scale * sum(TRAINERS[n][2] for n in names[i + 1:])
        results[name] = run_child(a, "trainer", cap, extra=["--trainer", name]) if cap >= 10 else \
            {"status": "not started: the part's time was used up"}
    failed = [k for k, v in results.items() if v.get("status") != "ok"]
    return {"trainers": results, "ok": not failed, "failed": failed}


def part_profile(a: argparse.Namespace) -> dict[str, Any]:
    """Each trainer's own main() with --profile-steps (trainers/step_profile.py): where a step's time goes, the
    share its kernels fill, the calls that make the host wait for the device."""
    warm, timed = q(a, PROFILE_STEPS)
    res: dict[str, Any] = {"warmup_steps": warm, "profiled_steps": timed, "trainers": {}}
    for name in [n for n in PROFILE_ORDER if n in a.trainers.split(",")]:
        _, folder, _, _, copies = TRAINERS[name]
        res["trainers"][name] = run_main(a, name, repeated(a, a.bundle / folder, 2 if a.quick else copies),
                                         a.work / f"profile-{name}", (warm, timed), 2, ["--profile-steps", str(timed)])
        save_partial(a, res)
    return res


def part_speakers(a: argparse.Namespace) -> dict[str, Any]:
    """ERes2Net and CAM++ as they train, crops finished on the device (their default) and on the CPU (--augment-on
    cpu). On a CPU, CAM++ its default path only: both trainers share the data path."""
    steps = q(a, SPEAKER_STEPS)
    dirs = grown(a, a.bundle / "shards" / "speakers", 2 if a.quick else SPEAKER_COPIES)
    res: dict[str, Any] = {"warmup_steps": steps[0], "timed_steps": steps[1], "copies": len(dirs)}
    for name in ("eres2net", "campplus"):
        for path in ("device", "cpu") if not (a.quick and name == "campplus") else ("device",):
            res.setdefault(name, {})[path] = run_main(a, name, ["--shards", ",".join(map(str, dirs))],
                                                      a.work / f"speakers-{name}-{path}", steps, 2,
                                                      ["--augment-on", path])
            save_partial(a, res)
    return res


# ----------------------------------------------------------------------------- F5-TTS fed through core's clock


def grown(a: argparse.Namespace, folder: Path, copies: int) -> list[Path]:
    """`folder` and copies - 1 links to it, each a corpus of its own name: one epoch plans every copy's items as
    distinct items, so batches pack full (a weight on one folder does not: docs/gpu-proof.md)."""
    links = a.work / "grown"
    links.mkdir(parents=True, exist_ok=True)
    out = [folder]
    for i in range(1, copies):
        out.append(links / f"{folder.name}_{i:03d}")
        if not out[-1].is_symlink():
            out[-1].symlink_to(folder, target_is_directory=True)
    return out


def f5_setup(a: argparse.Namespace, batches: int) -> dict[str, Any]:
    """F5-TTS as its trainer builds it (calibrate_batches' F5Target: model, AdamW, precision, the step) and the run
    config over as many corpora of the bundle's F5 shards as make one epoch at least `batches` batches."""
    import calibrate_batches as cb
    import core
    import numpy as np
    import torch
    import train_f5tts as f5
    from audiopipe.reader.arrow_dataset import ShardDataset

    t = cb.F5Target(torch.device(a.device), "tiny" if a.quick else "default")
    shards = a.bundle / "shards" / "f5tts"
    budget, items = 2000 if a.quick else f5.RUN_DEFAULTS["batch_frames"], f5.RUN_DEFAULTS["max_items"]
    lengths = ShardDataset(str(shards), ["mel"]).lengths("mel").astype(np.int64)
    per_copy = max(lengths.sum() / budget, len(lengths) / items)  # batches, if every one were full
    copies = 2 if a.quick else max(2, int(np.ceil(1.02 * batches / per_copy)))  # --quick: as few as will do
    s = {"t": t, "dev": t.device, "shards": shards, "features": ["mel"], "hashes": {"mel": f5.MEL_HASH},
         "kw": {"batch_transform": f5.AddTextIds(t.tok)}}
    while True:
        s["cfg"] = core.RunConfig(shards=",".join(map(str, grown(a, shards, copies))), out=str(a.work / "f5"),
                                  batch_frames=budget, max_items=items, prefetch=2, seed=0)
        s["copies"], s["batches"] = copies, len(trainer_loader(s, 0, torch.device("cpu")))
        if s["batches"] >= batches:
            return s
        copies += max(1, copies // 20)  # packing filled fewer batches than the frames promised


def trainer_loader(s: dict[str, Any], prefetch: int, device: Any, epoch: int | None = None):
    """audiopipe's loader exactly as core.train builds it for the trainer `s` sets up, with the given hand-over;
    at `epoch` when given, as core.train sets it (the speaker crops' draws too)."""
    import core

    cfg = replace(s["cfg"], prefetch=prefetch)
    loader = core._make_loader(cfg, core.Dist(device=device), s["features"], None, s["hashes"], s["kw"], Path(cfg.out))
    if epoch is not None:
        loader.set_epoch(epoch)
        if "data" in s:
            s["data"].crops.set_epoch(epoch)
    return loader


def clocked(dev, feed, n: int, step: Callable[[dict[str, Any]], Any],
            describe: Callable[[dict[str, Any], Any], dict[str, Any]]) -> tuple[list, list]:
    """n training steps fed by `feed` (batches, or (batch, where) pairs) through core's clock: each step's (ms,
    wait ms) and `describe(batch, where)` of each batch (none is kept: they stay on the device)."""
    import core
    import torch

    clock = core._Clock(dev)
    it, info = iter(feed), []
    clock.start_pass()
    for _ in range(n):
        clock.wait_begin()
        item = next(it)
        batch, where = item if isinstance(item, tuple) else (item, None)
        batch = core.default_to_device(batch, dev)
        clock.wait_end()
        loss = step(batch)
        clock.step_end()
        info.append(describe(batch, where))
    ensure(bool(torch.isfinite(loss)), "the loss is not finite")
    if clock.steps:
        clock.steps[-1][1].synchronize()  # one synchronisation, at the end of a call
    return [(a.elapsed_time(b), w0.elapsed_time(w1)) for (a, b), (w0, w1) in zip(clock.steps, clock.waits)], info


def train_steps(s: dict[str, Any], feed, n: int) -> tuple[list, list]:
    """n F5 training steps fed by `feed`: each step's (ms, wait ms) and its batch's size and shape."""
    def describe(b: dict[str, Any], where: Any) -> dict[str, Any]:
        return {"where": where, "shape": tuple(b["mel"].shape), "items": int(b["mel"].shape[0]),
                "frames": int(b["mel_lengths"].sum()), "padded": int(b["mel"].shape[0] * b["mel"].shape[-1])}

    return clocked(s["dev"], feed, n, s["t"].step, describe)


def summary(steps: list[tuple[float, float]], info: list[dict[str, Any]]) -> dict[str, Any]:
    step_ms, frames = sum(x for x, _ in steps), sum(i["frames"] for i in info)
    return {"steps": len(steps), "step_ms": step_ms / len(steps), "data_wait_share": sum(w for _, w in steps) / step_ms,
            "max_wait_ms": max(w for _, w in steps), "frames_per_s": 1e3 * frames / step_ms,
            "mean_frames": frames / len(info), "mean_items": sum(i["items"] for i in info) / len(info),
            "padding_share": 1 - frames / sum(i["padded"] for i in info)}


def with_epochs(loader):
    """(batch, (epoch, index in epoch)) over epochs, as core.train walks them (set_epoch, then a pass)."""
    e = 0
    while True:
        loader.set_epoch(e)
        for i, b in enumerate(loader):
            yield b, (e, i)
        e += 1


def part_full_batches(a: argparse.Namespace) -> dict[str, Any]:
    (warm, timed), edge = q(a, STEPS), q(a, BOUNDARY)
    s = f5_setup(a, warm + timed + 2 * edge)
    per_epoch = s["batches"]
    res: dict[str, Any] = {"model": s["t"].config, "precision": s["t"].precision, "batch_frames": s["cfg"].batch_frames,
                           "max_items": s["cfg"].max_items, "copies": s["copies"], "batches_per_epoch": per_epoch,
                           "prefetch": 2}
    feed = with_epochs(trainer_loader(s, 2, s["dev"]))
    t0 = time.perf_counter()
    steps, info = train_steps(s, feed, warm + timed)
    res["mid_epoch"] = {"first_step": warm, **summary(steps[warm:], info[warm:])}
    save_partial(a, res)
    more, more_info = train_steps(s, feed, per_epoch + edge - warm - timed)
    steps, info = steps + more, info + more_info
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    around = slice(per_epoch - edge, per_epoch + edge)
    res["boundary"] = {"steps_each_side": edge, **summary(steps[around], info[around]),
                       "per_step": [{"epoch_index": list(i["where"]), "step_ms": round(x, 2), "wait_ms": round(w, 3)}
                                    for (x, w), i in zip(steps[around], info[around])],
                       "first_of_next_epoch_wait_ms": steps[per_epoch][1]}
    if warm + timed < per_epoch - edge:
        res["rest_of_epoch"] = summary(steps[warm + timed:per_epoch - edge], info[warm + timed:per_epoch - edge])
    return res


# ----------------------------------------------------------------------------- parts: cores, speaker_cores


def pin(cores: int, allowed: list[int]) -> list[int]:
    """This process's threads (and what they start from now on) on the first `cores` of `allowed` (the CPUs it
    was given, read once before any pinning: the affinity read later is the pinned one)."""
    import torch

    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), allowed[:cores])
        except OSError:  # a thread that ended meanwhile
            pass
    torch.set_num_threads(cores)
    return allowed[:cores]


def core_counts(a: argparse.Namespace, allowed: list[int]) -> list[int]:
    """1, 2, 4, 8 and all the cores (unpinned: F5's rule at F5's 16 workers on a 16-core machine); on a CPU
    rehearsal one count runs every line of the sweep (more only oversubscribe a shared 2-core machine)."""
    return [1] if a.quick else sorted({c for c in CORES if c < len(allowed)} | {len(allowed)})


def sweep(a: argparse.Namespace, res: dict[str, Any], feeds: dict[str, tuple[Callable[[int], tuple], str]],
          key: str, want: list) -> None:
    """Each feed `name: (run, ref)` at each core count (`run(cores)` trains the timed steps), checked to train on
    the on-device reference's batches (each batch's `key` as in `want`), its step against `res[ref]`'s."""
    warm = res["warmup_steps"]
    allowed = sorted(os.sched_getaffinity(0))
    for c in core_counts(a, allowed):
        row: dict[str, Any] = {"cpus": pin(c, allowed)}
        for feed, (run, ref) in feeds.items():
            steps, info = run(c)
            ensure([i[key] for i in info] == want, f"{feed}'s batches differ from the on-device ones")
            row[feed] = summary(steps[warm:], info[warm:])
            row[feed]["vs_on_device"] = row[feed]["step_ms"] / res[ref]["step_ms"]
        res["by_cores"][str(c)] = row
        save_partial(a, res)
        print(f"[{a.child}] {c} cores: " + ", ".join(f"{f} {row[f]['vs_on_device']:.3f}x" for f in feeds), flush=True)
    pin(len(allowed), allowed)
    res["fewest_cores_within"] = {f: next((int(c) for c, r in res["by_cores"].items()
                                           if r[f]["vs_on_device"] <= 1 + WITHIN), None) for f in feeds}


def on_device(batches, dev, k: int) -> list[dict[str, Any]]:
    """The first k batches moved to the device (copied: the loader reuses its collate buffers; on a CPU, no move)."""
    import core
    import torch

    return [core.default_to_device({x: v.clone() if torch.is_tensor(v) else v for x, v in b.items()}, dev)
            for b, _ in zip(batches, range(k))]


def part_cores(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    import train_f5tts as f5
    from audiopipe.bench.loaders import OnTheFlyMel  # soundfile + soxr: the bundle's wheels on the GPU image
    from audiopipe.collate.pad import PadCollator
    from audiopipe.reader.loader import _Collate

    warm, timed = q(a, CORE_STEPS)
    k = warm + timed
    s = f5_setup(a, k + 2)
    dev = s["dev"]
    res: dict[str, Any] = {"model": s["t"].config, "precision": s["t"].precision, "batch_frames": s["cfg"].batch_frames,
                           "cores_available": len(os.sched_getaffinity(0)), "warmup_steps": warm, "timed_steps": timed,
                           "within": WITHIN, "by_cores": {}}
    # The k batches every feed trains on: the loader's first k of epoch 0, every shape seen once before timing.
    ready = on_device(trainer_loader(s, 0, torch.device("cpu"), epoch=0), dev, k)
    for b in ready:
        s["t"].step(b)
    steps, info = train_steps(s, iter(ready), k)
    res["on_device"] = summary(steps[warm:], info[warm:])
    save_partial(a, res)
    # F5's own rule over the same rows: the shards' items map to the files they were made from.
    ds = OnTheFlyMel(str(s["shards"]), "mel", str(a.bundle / "wavs" / "en"))
    plan = [[int(i) % len(ds) for i in b["index"]] for b in ready]  # copy c's item i is c * len + i (one folder)
    del ready

    def f5_rule(c: int) -> tuple[list, list]:
        dl = torch.utils.data.DataLoader(ds, batch_sampler=plan, num_workers=min(c, 16), pin_memory=dev.type == "cuda",
                                         collate_fn=_Collate(PadCollator(["mel"]), f5.AddTextIds(s["t"].tok)))
        return train_steps(s, iter(dl), k)

    sweep(a, res, {"audiopipe": (lambda c: train_steps(s, iter(trainer_loader(s, 2, dev, epoch=0)), k), "on_device"),
                   "f5_own_rule": (f5_rule, "on_device")}, "frames", [i["frames"] for i in info])
    return res


def kaldi_fbank_cpu() -> tuple[str, Callable[[Any], Any]]:
    """3D-Speaker's FBank(80, mean_nor=True) for one crop on the CPU: (which code, wav [N] -> [T, 80]). speakerlab's
    own call where torchaudio imports, else audiopipe's kaldi_fbank_torch (tests hold it to kaldi-native-fbank)."""
    try:
        import torchaudio.compliance.kaldi as kaldi

        code = "torchaudio.compliance.kaldi.fbank"
        fbank = lambda wav: kaldi.fbank(wav[None], num_mel_bins=80, sample_frequency=16000, dither=0.0)  # noqa: E731
    except ImportError:
        from audiopipe.features.fbank import kaldi_fbank_torch

        code = "audiopipe.features.fbank.kaldi_fbank_torch"
        fbank = lambda wav: kaldi_fbank_torch(wav[None], sample_rate=16000, num_mel_bins=80)[0]  # noqa: E731
    return code, lambda wav: (f := fbank(wav)) - f.mean(0, keepdim=True)


class SpeakerlabRule:
    """3D-Speaker's training item as speakerlab's WavSVDataset builds it, per item in DataLoader workers: read the
    whole file; speed-perturb it whole (1.0, 0.9 or 1.1: sox's `speed` then `rate`, here soxr); a random 3 s crop
    (a shorter one zero-padded); Kaldi fbank 80 minus its mean; class speaker + speakers * speed (docs/gpu-proof.md
    says why it is written out). The draws follow SpeakerCrops' (np.random.default_rng([seed, 0, index])), so each
    item gets audiopipe's speed for it. Items are the grown corpus's indices (copy c's item i is c * len(files) + i);
    each counts the samples it decoded and speed-perturbed for its crop."""

    def __init__(self, files: list[str], speaker: Any, num_speakers: int, *, seed: int = 0, crop: int = 48000):
        self.files, self.speaker, self.num_speakers = list(files), speaker, int(num_speakers)
        self.seed, self.crop, self.speeds = int(seed), int(crop), (1.0, 0.9, 1.1)
        self.fbank_code, self.fbank = kaldi_fbank_cpu()

    def __len__(self) -> int:
        return len(self.speaker)

    def __getitem__(self, g: int) -> dict[str, Any]:
        import numpy as np
        import soundfile as sf
        import soxr
        import torch

        wav, sr = sf.read(self.files[g % len(self.files)], dtype="float32", always_2d=True)
        wav = wav[:, 0]  # the first channel, as speakerlab's wav[0]
        decoded = len(wav)
        rng = np.random.default_rng([self.seed, 0, g])
        k = int(rng.integers(len(self.speeds)))
        if self.speeds[k] != 1.0:  # the whole file, as sox's effects chain runs over the whole tensor
            wav = soxr.resample(wav, self.speeds[k] * sr, sr)
        perturbed = len(wav)
        if len(wav) >= self.crop:
            start = int(rng.integers(0, len(wav) - self.crop + 1))
            wav = wav[start:start + self.crop]
        else:
            wav = np.pad(wav, (0, self.crop - len(wav)))
        return {"fbank": self.fbank(torch.from_numpy(np.ascontiguousarray(wav))), "index": g, "decoded": decoded,
                "label": int(self.speaker[g]) + self.num_speakers * k, "perturbed": perturbed}


def speakerlab_collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """DataLoader's default collate of speakerlab's (feat, spkid) pairs: [B, T, 80] and [B]; the counts summed."""
    import torch

    return {"fbank": torch.stack([i["fbank"] for i in items]), "index": [i["index"] for i in items],
            "label": torch.tensor([i["label"] for i in items], dtype=torch.int64),
            "decoded": sum(i["decoded"] for i in items), "perturbed": sum(i["perturbed"] for i in items)}


def speaker_setup(a: argparse.Namespace, copies: int) -> dict[str, Any]:
    """ERes2Net as train_eres2net builds it (its flags' defaults, speaker_data's crops and loader arguments, the
    AAM head, SGD), over `copies` corpora of the speaker shards, every speaker training (no EER hold-out)."""
    import torch

    import core
    import speaker
    import train_eres2net as er
    from speaker_data import speaker_data

    dev = torch.device(a.device)
    dirs = grown(a, a.bundle / "shards" / "speakers", copies)
    argv = ["--shards", ",".join(map(str, dirs)), "--config", "tiny" if a.quick else "default",
            "--out", str(a.work / "speaker_cores"), "--seed", "0", "--heldout-speakers", "0",
            *(QUICK_SPEAKER_FLAGS if a.quick else [])]
    cfg, args = core.parse_args("speaker_cores", defaults=speaker.run_defaults(er.RECIPE),
                                extra=lambda p: speaker.add_speaker_args(p, er.RECIPE), argv=argv,
                                flag_help=speaker.FLAG_HELP)
    data = speaker_data(cfg, args, core.Dist(device=dev), "eres2net")
    core.seed_all(0)
    mcfg = er.CONFIGS[cfg.config]
    model = speaker.SpeakerModel(er.ERes2Net(mcfg), mcfg.embedding_size, data.num_classes,
                                 lambda step: er.RECIPE.margin, scale=args.scale).to(dev)
    precision, autocast = core.autocast_for(cfg.precision, dev)
    return {"dev": dev, "cfg": cfg, "data": data, "model": model, "opt": speaker.sgd(model, cfg),
            "precision": precision, "autocast": autocast, "dirs": dirs, "crop": data.crops.crop_samples,
            "features": ["pcm"], "hashes": None, "kw": data.loader_kw}


def speaker_steps(s: dict[str, Any], feed, n: int, fn) -> tuple[list, list]:
    """n ERes2Net steps (3D-Speaker's: SGD, no clipping) fed by `feed`, `fn(model, batch)` the loss."""
    def step(batch: dict[str, Any]) -> Any:
        with s["autocast"]:
            loss, _ = fn(s["model"], batch)
        loss.backward()
        s["opt"].step()
        s["opt"].zero_grad(set_to_none=True)
        return loss

    def describe(b: dict[str, Any], where: Any) -> dict[str, Any]:
        m = len(b["label"])
        return {"items": m, "frames": m * s["crop"], "padded": m * s["crop"], "rows": [int(i) for i in b["index"]]}

    return clocked(s["dev"], feed, n, step, describe)


def speakerlab_loss(model, batch: dict[str, Any]):  # noqa: ANN001, ANN201 - torch objects
    """The step 3D-Speaker's trainer takes on its loader's batch: fbank already made, ERes2Net and the AAM head."""
    loss, _ = model.head(model.encoder(batch["fbank"]), batch["label"], model.margin(0))
    return loss, {}


def export_wavs(a: argparse.Namespace, folder: Path) -> list[str]:
    """The speaker shards' utterances as 16 kHz 16-bit WAV files (what 3D-Speaker's recipes read), in row order:
    the very samples audiopipe's feed crops. Not timed."""
    import soundfile as sf

    from audiopipe.reader.arrow_dataset import ShardDataset

    ds = ShardDataset(str(folder), ["pcm"])
    (a.work / "speaker_wavs").mkdir(parents=True, exist_ok=True)
    files = [str(a.work / "speaker_wavs" / f"{i:06d}.wav") for i in range(len(ds))]
    for i, path in enumerate(files):
        sf.write(path, ds[i]["pcm"].reshape(-1), 16000, subtype="PCM_16")
    return files


def part_speaker_cores(a: argparse.Namespace) -> dict[str, Any]:
    """ERes2Net `default` fed two ways on the same rows, each against its own batches already on the device:
    audiopipe (the crops' speed perturbation and fbank in the step, on the device) and 3D-Speaker's rule."""
    import numpy as np
    import torch

    import core
    import speaker
    from audiopipe.reader.arrow_dataset import ShardDataset

    warm, timed = q(a, CORE_STEPS)
    k = warm + timed
    folder = a.bundle / "shards" / "speakers"
    pcm = ShardDataset(str(folder), ["pcm"]).lengths("pcm")
    s = speaker_setup(a, max(2, int(np.ceil((k + 2) * (4 if a.quick else 64) / len(pcm))) + 1))
    dev = s["dev"]
    res: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"],
                           "batch_frames": s["cfg"].batch_frames, "crop_samples": s["crop"], "copies": len(s["dirs"]),
                           "cores_available": len(os.sched_getaffinity(0)), "warmup_steps": warm, "timed_steps": timed,
                           "within": WITHIN, "by_cores": {}}
    ready = on_device(trainer_loader(s, 0, torch.device("cpu"), epoch=0), dev, k)
    rows = [[int(i) for i in b["index"]] for b in ready]
    split = s["data"].split
    rule = SpeakerlabRule(export_wavs(a, folder), split.label_of, len(split.train_speakers), seed=0, crop=s["crop"])
    res["fbank_code"] = rule.fbank_code
    features = [core.default_to_device(speakerlab_collate([rule[g] for g in r]), dev) for r in rows]
    ensure([b["decoded"] for b in features] == [int(sum(pcm[g % len(pcm)] for g in r)) for r in rows],
           "3D-Speaker's rule read other files than the rows audiopipe's batches hold")
    ours = speaker.loss_for(s["data"])
    for fn, batches in ((ours, ready), (speakerlab_loss, features)):
        speaker_steps(s, iter(batches), len(batches), fn)  # every kernel and shape seen once before any timing
    steps, info = speaker_steps(s, iter(ready), k, ours)
    res["on_device"] = summary(steps[warm:], info[warm:])
    steps, _ = speaker_steps(s, iter(features), k, speakerlab_loss)
    res["on_device_features"] = summary(steps[warm:], info[warm:])
    items = sum(map(len, rows))
    res["rule_per_item"] = {"decoded_s": sum(b["decoded"] for b in features) / items / 16000,
                            "perturbed_s": sum(b["perturbed"] for b in features) / items / 16000,
                            "crop_s": s["crop"] / 16000}
    del ready, features
    save_partial(a, res)

    def rule_feed(c: int) -> tuple[list, list]:
        dl = torch.utils.data.DataLoader(rule, batch_sampler=rows, num_workers=c, pin_memory=dev.type == "cuda",
                                         collate_fn=speakerlab_collate)
        return speaker_steps(s, iter(dl), k, speakerlab_loss)

    sweep(a, res, {"audiopipe": (lambda c: speaker_steps(s, iter(trainer_loader(s, 2, dev, epoch=0)), k, ours),
                                 "on_device"), "speakerlab_rule": (rule_feed, "on_device_features")}, "rows", rows)
    return res


# ----------------------------------------------------------------------------- parts: features, calibrate, shapes


def part_features(a: argparse.Namespace) -> dict[str, Any]:
    """bench_gpu_features on the bundle's re-sliced speech (on a CPU, three half-second pieces)."""
    import bench_gpu_features as bgf

    clips = bgf.load_clips(a.bundle / "wavs", 1.5 if a.quick else 240.0, piece_s=0.5 if a.quick else None)
    doc = bgf.run(clips, a.device, [1, 2] if a.quick else [1, 16, 64], 1 if a.quick else 3, equal=True)
    summary = {f"{r['feature']} {r['method']}": {"x_rt": round(r["x_rt"]["median"]), "parity": r["parity"],
                                                   "vs_one_at_a_time": round(r["vs_one_at_a_time"]["median"], 2),
                                                   "padding_efficiency": round(r["padding_efficiency"], 3)}
               for res in doc["results"] for r in res["rows"]}
    return {"summary": summary, "bench": doc}


def part_calibrate(a: argparse.Namespace) -> dict[str, Any]:
    """ERes2Net's budget (a few seconds), then F5-TTS's with its comparison against one global budget and, in the
    last HOLD_S seconds, whether it holds. Both budget files go to --out."""
    import calibrate_batches as cb

    res: dict[str, Any] = {}
    try:  # its failure is written down and F5's still runs
        res["eres2net"] = cb.calibrate("eres2net", a.device, a.quick, a.out / "bucket_budget_eres2net.json",
                                       deadline=time.time() + (a.deadline - time.time()) / 4)
    except Exception as e:  # noqa: BLE001
        res["eres2net"] = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
    save_partial(a, res)
    if a.device.startswith("cuda"):  # ERes2Net's model and what its probes cached leave the device to F5
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    f5 = res["f5tts"] = cb.calibrate("f5tts", a.device, a.quick, a.out / "bucket_budget_f5tts.json", a.deadline - 2,
                                     compare=True, hold_rounds=q(a, HOLD_ROUNDS), hold_s=q(a, HOLD_S))
    h, c = f5.get("hold", {}), f5.get("compare", {})
    share = h.get("peak_reserved_share")
    res["holds"] = {"no_out_of_memory": bool(h.get("complete")), "peak_reserved_share": share,
                    "peak_within": share is not None and share <= PEAK_SHARE, "frames_per_s_gain": c.get("gain"),
                    "not_slower": bool(c.get("gain")) and c["gain"] >= 1.0, "margin": f5["margin"], "limit": PEAK_SHARE}
    ensure(res["eres2net"]["status"] == "ok", f"ERes2Net's calibration: {res['eres2net'].get('error')}")
    return res


def first_seen(steps: list[tuple[float, float]], info: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time at a batch shape met for the first time in the run against one met before (step 0 left out: the
    first step of a process pays for more than its shape)."""
    seen, new, old = set(), [], []
    for i, ((ms, _), b) in enumerate(zip(steps, info)):
        if i:
            (old if b["shape"] in seen else new).append(ms)
        seen.add(b["shape"])
    mean = (lambda x: sum(x) / len(x) if x else None)
    return {"shapes_met": len(seen), "first_seen_steps": len(new), "first_seen_ms": mean(new),
            "repeated_steps": len(old), "repeated_ms": mean(old),
            "first_seen_vs_repeated": mean(new) / mean(old) if new and old else None}


def part_shapes(a: argparse.Namespace) -> dict[str, Any]:
    """Few batch shapes and torch.compile on the device (the trainers' --shapes and --compile)."""
    import torch

    import core

    n = q(a, SHAPE_STEPS)
    res: dict[str, Any] = {"shapes": SHAPES, "steps": n, "f5tts": {}, "gpt_sovits": {}}
    for key, shapes, compile_ in (("eager", 0, False), ("eager_shapes", SHAPES, False), ("compiled_shapes", SHAPES, True)):
        s = f5_setup(a, n + 2)
        s["cfg"] = replace(s["cfg"], shapes=shapes, compile=compile_)
        if compile_:  # what --compile runs; on a CPU rehearsal dynamo traces once (dynamic shapes) and runs eagerly
            s["t"].model = torch.compile(s["t"].model, backend="eager", dynamic=True) if a.quick else \
                core.compiled(s["t"].model, s["cfg"])
        t0 = time.perf_counter()
        steps, info = train_steps(s, with_epochs(trainer_loader(s, 2, s["dev"])), n)
        res["f5tts"][key] = {**summary(steps[1:], info[1:]), **first_seen(steps, info),
                             "wall_s": round(time.perf_counter() - t0, 1)}
        save_partial(a, res)
        del s
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    f5 = res["f5tts"]
    f5["compiled_vs_eager_shapes"] = f5["compiled_shapes"]["step_ms"] / f5["eager_shapes"]["step_ms"]
    # GPT-SoVITS compiled is left to the GPU: inductor on a CPU takes minutes (the trainer's tests cover --compile)
    for key, extra in (("eager_shapes", []), ("compiled_shapes", ["--compile"]))[: 1 if a.quick else 2]:
        res["gpt_sovits"][key] = run_main(a, "gpt_sovits", ["--shards", str(a.bundle / "tokens" / "gpt_sovits")],
                                          a.work / f"shapes-gpt-{key}", q(a, GPT_STEPS), 2,
                                          ["--shapes", str(SHAPES), *extra])
        save_partial(a, res)
    gs = res["gpt_sovits"]
    if "compiled_shapes" in gs:
        gs["compiled_vs_eager"] = gs["compiled_shapes"]["step_ms"] / gs["eager_shapes"]["step_ms"]
    return res


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "cuda_tests": part_cuda_tests, "full_batches": part_full_batches, "cores": part_cores,
    "speaker_cores": part_speaker_cores, "features": part_features, "calibrate": part_calibrate,
    "speakers": part_speakers, "trainers": part_trainers, "trainer": part_trainer, "profile": part_profile,
    "shapes": part_shapes,
    "info": device_info}


# ----------------------------------------------------------------------------- headline, report, main


def headline(part: str, r: dict[str, Any]) -> list[str]:
    """The figures a reader looks for first, a line each (the JSON has the rest)."""
    run = lambda x: f"{x['step_ms']:.1f} ms/step, data wait {100 * x['data_wait_share']:.3f} %"  # noqa: E731
    try:
        lines = {"cuda_tests": lambda: [str(r["counts"])] + [f"FAILED {t['test']}: {t['message'][:200]}"
                                                             for t in r["tests"] if t["outcome"] == "failed"],
                 "full_batches": lambda: [f"mid-epoch {run(r['mid_epoch'])}; epoch boundary {run(r['boundary'])}"],
                 "cores": lambda: [f"fewest cores within {WITHIN:.0%}: {r['fewest_cores_within']}"],
                 "features": lambda: [f"{k}: {v['x_rt']}x real time" for k, v in r["summary"].items()],
                 "calibrate": lambda: [str(r["holds"])],
                 "speakers": lambda: [f"{n} {k}: {run(x)}" for n, t in r.get("trainers", r).items()
                                      if isinstance(t, dict) for k, x in t.items() if isinstance(x, dict)
                                      and x.get("timed_steps")],
                 "shapes": lambda: [f"{m} {k}: {x['step_ms']:.1f} ms/step" for m in ("f5tts", "gpt_sovits")
                                    for k, x in r[m].items() if isinstance(x, dict)],
                 "profile": lambda: [f"{n}: {x['wall_ms']} ms a step, kernels {x['kernel_share']} of it, "
                                     f"{x['host_waits']} host waits, {x['ops']} ops"
                                     for n, x in ((n, t["profile"]) for n, t in r["trainers"].items())]}
        lines.update(speaker_cores=lines["cores"], trainers=lines["speakers"])
        return ["  " + line for line in lines[part]()]
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return [f"  (figures incomplete: {e!r})"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=ROOT / ".gpu-bundle", help="what `make gpu-bundle` made")
    ap.add_argument("--out", type=Path, required=True, help="the folder for gpu_proof.json, gpu_proof.log, the budgets")
    ap.add_argument("--work", type=Path, help="scratch (default: a folder in the system temp dir)")
    ap.add_argument("--device", help="cuda (default where torch sees one) or cpu")
    ap.add_argument("--quick", action="store_true", help="tiny models and few steps: the same code paths, fast")
    ap.add_argument("--parts", default=",".join(DEFAULT_PARTS),
                    help=f"comma-separated, of {','.join(PARTS)}, or all (default: {','.join(DEFAULT_PARTS)})")
    ap.add_argument("--trainers", default=",".join(TRAINERS), help="the trainers the trainers part runs")
    ap.add_argument("--budget-s", type=float, help="wall-clock budget of all parts (default 420; 1200 with --quick)")
    ap.add_argument("--without", default="", help="comma-separated modules made unimportable in every part "
                                                  "(rehearses the GPU image on a machine that has them)")
    for hidden in ("--child", "--trainer", "--deadline", "--cap"):  # what a child gets from its parent
        ap.add_argument(hidden, help=argparse.SUPPRESS, type=float if hidden == "--cap" else str)
    a = ap.parse_args(argv)
    a.bundle, a.out = a.bundle.resolve(), a.out.resolve()
    a.work = (a.work or Path(tempfile.gettempdir()) / "gpu_proof_work").resolve()
    if a.child:
        return child_main(a)
    wanted = PARTS if a.parts == "all" else [p.strip() for p in a.parts.split(",") if p.strip()]
    for kind, asked, known in (("part", wanted, PARTS), ("trainer", a.trainers.split(","), TRAINERS)):
        if unknown := sorted(set(asked) - set(known)):
            ap.error(f"unknown {kind}(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    if not (a.bundle / "bundle.json").is_file():
        ap.error(f"--bundle {a.bundle} has no bundle.json: make it with `make gpu-bundle`")
    shutil.rmtree(a.work, ignore_errors=True)
    a.work.mkdir(parents=True)
    started = time.time()
    budget = a.budget_s or (1200.0 if a.quick else 420.0)
    wheels = install_wheels(a.bundle, a.work / "site")
    # What the parts inherit: the wheels on the path (and on PYTHONPATH, for any process that starts Python anew).
    path = [*([wheels["site"]] if wheels.get("site") else []), str(ROOT), str(ROOT / "trainers")]
    sys.path[:0] = path
    os.environ.update(PYTHONUNBUFFERED="1", RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false",
                      PYTHONPATH=os.pathsep.join([*path, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    # Every part forks from this process (fork_part), which imports torch and the trainers' core once for all of
    # them. It never touches CUDA (a forked child could not use it, and GPU memory would be held all run long):
    # the device is read in a child. A failure to read it is written down, not fatal: each part records its own.
    block_modules(a.without)
    try:
        import core  # noqa: F401
    except ImportError:  # (--without torch) each part fails with its own reason
        pass
    info = run_child(a, "info", 120)
    if info["status"] == "ok":
        if (a.device or "").startswith("cuda") and not info["cuda_available"]:
            ap.error("--device cuda: torch sees no CUDA device here")
        info = {k: v for k, v in info.items() if k not in ("status", "seconds", "cap_s", "exit", "pid")}
        a.device = info["device"]
    else:
        a.device = a.device or ("cuda" if Path("/dev/nvidiactl").exists() else "cpu")
        info = {"device": a.device, "error": info.get("error") or tail(info.get("output_tail", ""), 5)}
    a.out.mkdir(parents=True, exist_ok=True)  # once the device is known: a refused --device writes nothing
    doc: dict[str, Any] = {"format": "audiopipe.gpu_proof/2", "quick": a.quick, "device": info,
                           "bundle": json.loads((a.bundle / "bundle.json").read_text()), "wheels": wheels,
                           "without": a.without, "budget_s": budget, "command": " ".join(sys.argv),
                           "loadavg": os.getloadavg(), "parts": {}}
    lines: list[str] = []

    def say(line: str) -> None:  # the JSON and the log rewritten at every line: a call cut short keeps what it had
        print(line, flush=True)
        lines.append(line)
        (a.out / "gpu_proof.json").write_text(json.dumps(doc, indent=1, default=str))
        (a.out / "gpu_proof.log").write_text("\n".join(lines) + "\n")

    say(f"gpu_proof: {info.get('name')} ({a.device}), torch {info.get('torch')}, CUDA {info.get('cuda')}, python "
        f"{info.get('python')}, torchaudio {info.get('torchaudio')}, transformers {info.get('transformers')}, commit "
        f"{info.get('commit')}" + (f"; device not read: {info['error']}" if info.get("error") else ""))
    if wheels.get("installed") or wheels.get("error"):
        say(f"wheels: {', '.join(wheels['installed']) or 'FAILED ' + wheels.get('error', '')[:300]}")
    order = [p for p in PARTS if p in wanted]
    for i, part in enumerate(order):
        left = budget - (time.time() - started)
        cap = min(q(a, CAPS[part][::2]), left - sum(q(a, CAPS[p][1::2]) for p in order[i + 1:]))
        if cap < q(a, CAPS[part][1::2]):  # below its floor: not worth starting
            doc["parts"][part] = {"status": "skipped", "reason": f"{left:.0f} s of the budget left"}
            say(f"part {part}: skipped, {left:.0f} s of the budget left")
            continue
        say(f"part {part}: started (cap {cap:.0f} s)")
        res = doc["parts"][part] = run_child(a, part, cap)
        say(f"part {part}: {res['status']} in {res['seconds']:.1f} s")
        for line in headline(part, res) + ([] if res["status"] == "ok" else [
                "  " + (res.get("error") or tail(res.get("output_tail", ""), 3)).replace("\n", "\n  ")[:1500]]):
            say(line)
    kill_groups(a.work)  # nothing a part started outlives the run
    doc["total_s"] = round(time.time() - started, 1)
    statuses = {p: r["status"] for p, r in doc["parts"].items()}
    say(f"gpu_proof: {sum(s == 'ok' for s in statuses.values())}/{len(statuses)} parts ok in {doc['total_s']:.0f} s: "
        f"{statuses}")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
