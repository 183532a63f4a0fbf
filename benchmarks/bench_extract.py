"""Extraction speed of `audiopipe shard` next to a hand-written multiprocessing.Pool loop and the decode floor.

    python benchmarks/bench_extract.py --wav-corpus /tmp/extractbench/wav --ogg-corpus /tmp/extractbench/ogg \
        --files 400 --workers 1,2 --rounds 2 --json benchmarks/results/extract.json --plot docs/img/extract.png

(`python benchmarks/make_loader_corpus.py /tmp/extractbench/wav --speakers 12 --per-speaker 48` builds the WAV
corpus from Debian packages; `--make-ogg DIR` converts it to OGG Vorbis with soundfile.)

Per corpus (a WAV one and a compressed one) and per round, side by side and in rotating order:

- floor: in ONE process, per file, decode (soundfile -> mono) + resample (soxr HQ to 24 kHz) + the feature
  audiopipe stores (vocos mel, `VocosMel`), timed piece by piece; its inverse is the most one core can do;
- hand-written: `multiprocessing.Pool(workers)`, per file soundfile -> mono -> soxr -> torch STFT (float32)
  + the same 100-bin HTK mel -> np.save, what a user writes by hand (`handwritten_mel`);
- audiopipe: `audiopipe shard --preset f5tts --workers N`, tars on and `--no-tar`, each in a fresh process
  with a fresh local Ray; its summary gives extraction time and start-up (Ray start, discovery) apart.

audiopipe's runs write `--timings`, from which each run's extraction phase is split into the shard tasks' own
time, idle workers, and what comes before the first task and after the last (a table of its own).
`--corpora OGG` runs one corpus.

Throughput is audio seconds per wall second (x real time). Ratios are taken within a round (the machine is
shared: other processes come and go between rounds) and reported with their range over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from results_io import pyplot, save, spread  # benchmarks/ (the script's own folder is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MEL_RATE = 24000
AUDIO_EXTS = (".wav", ".ogg", ".flac", ".mp3")

# ------------------------------------------------------------------ the hand-written baseline

_WINDOW = None
_FBANK = None


def _baseline_init() -> None:
    """Pool initializer: one torch thread per process (parallelism from processes, as audiopipe's workers)."""
    global _WINDOW, _FBANK
    import torch

    from audiopipe.features.mel import mel_filterbank

    torch.set_num_threads(1)
    _WINDOW = torch.hann_window(1024)
    _FBANK = torch.from_numpy(np.array(mel_filterbank(MEL_RATE, 1024, 100, 0.0, 12000.0, "htk", None))).float()


def handwritten_mel(job: tuple[str, str]) -> float:
    """soundfile -> mono -> soxr -> torch STFT + 100-bin HTK mel -> np.save; returns the audio seconds."""
    import torch

    path, out = job
    if _WINDOW is None:
        _baseline_init()
    data, sr = sf.read(path, dtype="float32", always_2d=True)
    wav = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)
    wav = soxr.resample(wav, sr, MEL_RATE) if sr != MEL_RATE else wav
    spec = torch.stft(torch.from_numpy(np.ascontiguousarray(wav)), 1024, hop_length=256, win_length=1024,
                      window=_WINDOW, center=True, pad_mode="reflect", return_complex=True)
    mel = torch.log(torch.clamp(_FBANK @ spec.abs(), min=1e-5))
    np.save(out, mel.numpy())
    return len(data) / sr


def run_handwritten(files: list[Path], out: Path, workers: int) -> float:
    """Wall seconds of the Pool loop over `files`, one .npy per utterance under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(f), str(out / f"{i:06d}.npy")) for i, f in enumerate(files)]
    t0 = time.perf_counter()
    with Pool(workers, initializer=_baseline_init) as pool:
        for _ in pool.imap_unordered(handwritten_mel, jobs, chunksize=4):
            pass
    return time.perf_counter() - t0


# ------------------------------------------------------------------ the floor

def measure_floor(files: list[Path]) -> dict[str, float]:
    """Seconds spent decoding, resampling and computing the stored mel, file by file in this one process."""
    import torch

    from audiopipe.features.mel import VocosMel

    torch.set_num_threads(1)
    mel = VocosMel()
    mel(np.random.default_rng(0).uniform(-0.5, 0.5, 4000).astype(np.float32))  # compile the kernels first
    t = {"decode": 0.0, "resample": 0.0, "feature": 0.0}
    for f in files:
        t0 = time.perf_counter()
        data, sr = sf.read(str(f), dtype="float32", always_2d=True)
        wav = data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)
        t1 = time.perf_counter()
        x = soxr.resample(wav, sr, MEL_RATE) if sr != MEL_RATE else wav
        t2 = time.perf_counter()
        mel(np.ascontiguousarray(x, dtype=np.float32))
        t3 = time.perf_counter()
        t["decode"] += t1 - t0
        t["resample"] += t2 - t1
        t["feature"] += t3 - t2
    return t


# ------------------------------------------------------------------ audiopipe

_SUMMARY_MARK = "BENCH-SUMMARY "
# `audiopipe shard` as the command line runs it, printing its Summary's unrounded figures too (the summary
# line rounds to 0.1 s, too coarse for an extraction phase of a few seconds).
_EXACT_SUMMARY = f"""
import dataclasses, json, sys
import audiopipe.cli, audiopipe.shard.run as run
real = run.run_job
def run_job(*a, **k):
    s = real(*a, **k)
    print({_SUMMARY_MARK!r} + json.dumps({{k: v for k, v in dataclasses.asdict(s).items() if isinstance(v, float)}}))
    return s
run.run_job = run_job
sys.exit(audiopipe.cli.main())  # as the program: it ends the process itself
"""


def run_audiopipe(corpus: Path, out: Path, workers: int, tar: bool, shard_size: str = "4MB",
                  engine: str | None = None) -> dict[str, float]:
    """One `audiopipe shard` run of this checkout in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-c", _EXACT_SUMMARY, "shard", "--corpus", str(corpus), "--out", str(out),
           "--preset", "f5tts", "--workers", str(workers), "--shard-size", shard_size, "--no-progress",
           "--nice", "0"]
    if not tar:
        cmd.append("--no-tar")
    if engine:
        cmd += ["--engine", engine]
    timings = out.parent / "timings.json"
    cmd += ["--timings", str(timings)]
    launched = time.time()
    t0 = time.perf_counter()
    # cwd: `python -c` puts the working folder first on sys.path, and Ray gives its workers the driver's folder
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"audiopipe shard failed:\n{r.stderr}")
    exact = json.loads(r.stdout.split(_SUMMARY_MARK)[1].splitlines()[0])
    total, startup = exact["seconds"], exact["startup_s"]
    disc, ray_s, warm = exact["discovery_s"], exact["ray_start_s"], exact["warmup_s"]
    shutil.rmtree(out, ignore_errors=True)
    # Extraction: the job's own time less its start-up (Ray start and worker warm-up, side by side with
    # discovery); the index and the manifest stay in, they are part of the job.
    res = {"wall_s": wall, "job_s": total, "startup_s": startup, "discovery_s": disc, "ray_start_s": ray_s,
           "warmup_s": warm, "extract_s": total - startup}
    tl = json.loads(timings.read_text())
    res.update(extraction_breakdown(tl, workers))
    if "clock" in tl and tl["tasks"]:  # from the launch of the command to its first shard's first decode
        res["first_decode_s"] = tl["clock"] + min(t["start"] for t in tl["tasks"]) - launched
    timings.unlink()
    return res


def extraction_breakdown(timeline: dict, workers: int) -> dict[str, float]:
    """Where the extraction phase (from `started` to `manifest`) of one run went, from its --timings file:
    - tasks_busy_s: the shard tasks' own time, summed over workers (what the in-process profile measures);
    - idle_s: worker-seconds with no task, between the first task start and the last task end (dispatch gaps,
      and the last shards running alone while the other workers have nothing left);
    - lead_in_s / tail_s: from `started` to the first task start, and from the last task end to the manifest
      (collecting the done records, folder fsyncs, index, rejects, manifest)."""
    ph, tasks = timeline["phases"], timeline["tasks"]
    if not tasks:
        return {}
    first = min(t["start"] for t in tasks)
    last = max(t["end"] for t in tasks)
    busy = sum(t["end"] - t["start"] for t in tasks)
    return {"tasks": len(tasks), "tasks_busy_s": busy, "idle_s": workers * (last - first) - busy,
            "lead_in_s": first - ph["started"], "tail_s": ph["manifest"] - last,
            "extract_phase_s": ph["manifest"] - ph["started"]}


# ------------------------------------------------------------------ whole runs, start-up included

_HANDWRITTEN_SCRIPT = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, sys.argv[4])
import numpy, soundfile, soxr, torch  # what the script imports at its top, as a user's script would
import audiopipe.features.mel  # the mel filterbank the loop uses
from pathlib import Path
from bench_extract import corpus_files, run_handwritten
files = corpus_files(Path(sys.argv[1]))
pool_s = run_handwritten(files, Path(sys.argv[2]), int(sys.argv[3]))
print("POOL", pool_s, time.perf_counter() - t0)
"""


def run_handwritten_process(root: Path, out: Path, workers: int) -> dict[str, float]:
    """The hand-written loop as a user runs it: a fresh `python` that imports its libraries, lists the files and
    runs the Pool (fork: its processes inherit the imports). Wall time from launch to exit, and the Pool's part."""
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", _HANDWRITTEN_SCRIPT, str(root), str(out), str(workers),
                        str(Path(__file__).resolve().parent)], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"the hand-written loop failed:\n{r.stderr}")
    pool_s = float(r.stdout.split("POOL ")[1].split()[0])
    shutil.rmtree(out, ignore_errors=True)
    return {"wall_s": wall, "pool_s": pool_s}


def whole_run(corpora: dict[str, Path], audio_s: dict[str, float], workers: list[int], rounds: int,
              engines: list[str], tmp: Path) -> list[dict]:
    """Per round and corpus, side by side in rotating order: the hand-written loop in a fresh process, and
    `audiopipe shard` (tars on and off) on each engine; every figure from launch to exit."""
    out: list[dict] = []
    for rnd in range(rounds):
        res: dict = {}
        for c, root in corpora.items():
            steps = [(kind, w, tar, eng) for w in workers for kind, tar, eng in
                     [("handwritten", None, None)] + [("audiopipe", t, e) for e in engines for t in (True, False)]]
            k = rnd % len(steps)
            r: dict = {}
            for kind, w, tar, eng in steps[k:] + steps[:k]:
                if kind == "handwritten":
                    key = f"handwritten_w{w}"
                    r[key] = run_handwritten_process(root, tmp / "npy", w)
                else:
                    key = f"{eng}_w{w}_{'tar' if tar else 'notar'}"
                    r[key] = run_audiopipe(root, tmp / "out", w, tar, engine=eng)
                r[key]["x_rt"] = audio_s[c] / r[key]["wall_s"]
                print(f"round {rnd} {c} {key}: " + json.dumps({k2: round(v, 3) for k2, v in r[key].items()
                                                                if isinstance(v, float)}), flush=True)
            r["load_1m"] = os.getloadavg()[0]
            res[c] = r
        out.append(res)
    return out


def summarise_whole(rounds: list[dict], workers: list[int], engines: list[str]) -> dict:
    out: dict = {}
    for c in rounds[0]:
        rs = [r[c] for r in rounds]
        d: dict = {}
        for w in workers:
            hw = [r[f"handwritten_w{w}"] for r in rs]
            for eng in engines:
                for tar in ("tar", "notar"):
                    ap = [r[f"{eng}_w{w}_{tar}"] for r in rs]
                    d[f"{eng}_w{w}_{tar}"] = {
                        "whole_run_vs_handwritten": spread([h["wall_s"] / a["wall_s"] for h, a in zip(hw, ap)]),
                        "extraction_vs_handwritten_pool": spread(
                            [h["pool_s"] / a["extract_s"] for h, a in zip(hw, ap)]),
                        "audiopipe_wall_s": spread([a["wall_s"] for a in ap]),
                        "handwritten_wall_s": spread([h["wall_s"] for h in hw]),
                        "first_decode_s": spread([a.get("first_decode_s", float("nan")) for a in ap]),
                        "startup_s": spread([a["startup_s"] for a in ap]),
                    }
        d["load_1m"] = spread([r["load_1m"] for r in rs])
        out[c] = d
    return out


def whole_table(summary: dict, workers: list[int], engines: list[str]) -> str:
    lines = ["| corpus | workers | engine | tars | whole run: hand-written / audiopipe | extraction only: "
             "hand-written Pool / audiopipe | audiopipe launch to first decode (s) | audiopipe wall (s) | "
             "hand-written wall (s) |", "|---|---|---|---|---|---|---|---|---|"]
    for c, d in summary.items():
        for w in workers:
            for eng in engines:
                for tar in ("tar", "notar"):
                    e = d[f"{eng}_w{w}_{tar}"]
                    lines.append(f"| {c} | {w} | {eng} | {'on' if tar == 'tar' else 'off'} | "
                                 f"{_cell(e['whole_run_vs_handwritten'])} | {_cell(e['extraction_vs_handwritten_pool'])}"
                                 f" | {_cell(e['first_decode_s'])} | {_cell(e['audiopipe_wall_s'], '.1f')} | "
                                 f"{_cell(e['handwritten_wall_s'], '.1f')} |")
    return "\n".join(lines)


def plot_whole(summary: dict, workers: list[int], engines: list[str], path: Path, machine: str) -> None:
    """Bars: the whole run's ratio hand-written / audiopipe (median, whiskers min-max over rounds), one bar per
    worker count, engine and tars on/off; the dashed line is 1 (as fast as the hand-written loop)."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(summary), figsize=(7 * len(summary), 4.4), squeeze=False)
    for ax, (c, d) in zip(axes[0], summary.items()):
        labels, med, lo, hi = [], [], [], []
        for w in workers:
            for eng in engines:
                for tar in ("tar", "notar"):
                    e = d[f"{eng}_w{w}_{tar}"]["whole_run_vs_handwritten"]
                    labels.append(f"{w}w {eng}\ntars {'on' if tar == 'tar' else 'off'}")
                    med.append(e["median"]), lo.append(e["median"] - e["min"]), hi.append(e["max"] - e["median"])
        ax.bar(range(len(med)), med, yerr=[lo, hi], capsize=4, color="#4c72b0")
        ax.axhline(1.0, ls="--", c="k", lw=1)
        ax.set_xticks(range(len(med)), labels, fontsize=8)
        ax.set_ylabel("hand-written wall / audiopipe wall (higher: audiopipe faster)")
        ax.set_title(f"{c}: whole run, launch to exit (load {d['load_1m']['median']:.1f})", fontsize=10)
    fig.suptitle(machine, fontsize=8)
    save(fig, path)


# ------------------------------------------------------------------ where a worker's time goes

PROFILE_PARTS = ("decode", "resample", "STFT + magnitude", "mel (filterbank + log)", "Arrow file", "tar file",
                 "fsync + rename wait", "done record")


def profile_worker(corpus: Path, tar: bool, rounds: int = 2) -> dict:
    """`build_shard` (what one Ray task runs) on the whole of `corpus` as one shard, in this process, with each
    stage of the hot path timed by a wrapper; "glue" is the rest (checks, row building, the loop itself).
    Each round then runs the hand-written loop's per-file work (`handwritten_mel`) and the floor on the same
    files in the same process: per-core ratios without Ray's or the Pool's start-up, under the same load.

    Arrow and tar include building the members, writing and hashing (sha256 while writing); "fsync + rename
    wait" is what is left of their background fsyncs when the shard is finished (in a Ray task a group hides it
    behind the next shard's compute, audiopipe.shard.groups; here nothing follows, so it is all waited for).
    Ray's own part is not here: a task receives its unit's utterance list and returns the done record (a few
    KB)."""
    from dataclasses import asdict

    import torch

    import audiopipe.decode.segments as segments
    import audiopipe.features.mel as mel
    import audiopipe.shard.build as build
    import audiopipe.storage.atomic as atomic
    from audiopipe.corpus.discover import discover
    from audiopipe.decode.audio import DecodeLimits
    from audiopipe.presets import resolve
    from audiopipe.shard.heap import keep_freed_memory
    from audiopipe.shard.job import Job
    from audiopipe.shard.plan import PlannedUtt, WorkUnit

    torch.set_num_threads(1)  # as in a Ray worker (one CPU per task)
    # As in a Ray worker too; the hand-written loop's work and the floor, run after in this process, get it as
    # well (a stricter floor; the real Pool's processes do not).
    keep_freed_memory()
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(corpus).utterances]
    unit = WorkUnit("shard-000000", 0, utts)
    audio = sum(u.duration for u in utts)
    spent: dict[str, float] = {}

    def timed(part: str, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[part] = spent.get(part, 0.0) + time.perf_counter() - t0
        return wrapper

    patches = [(segments.RecordingCache, "load", "decode"), (build, "resample_to", "resample"),
               (build, "stft_magnitude", "STFT + magnitude"), (mel._LogMel, "from_magnitude", "mel (filterbank + log)"),
               (build, "write_arrow", "Arrow file"), (build, "write_tar", "tar file"),
               (atomic.AtomicBatch, "commit", "fsync + rename wait"),
               (build, "write_done_record", "done record")]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    out = []
    try:
        for obj, name, part in patches:
            setattr(obj, name, timed(part, getattr(obj, name)))
        preset = resolve(["f5tts"])
        with tempfile.TemporaryDirectory() as d:  # warm-up: compile the kernels, fill the page cache
            job = Job(corpus=str(corpus), out=d, presets=["f5tts"], features=list(preset.features),
                      limits=asdict(DecodeLimits()), write_tar=tar)
            build.build_shard(WorkUnit("warm", 0, utts[:4]), job)
        paths = [Path(u.path) for u in utts]
        _baseline_init()
        torch.set_num_threads(1)
        for _ in range(rounds):
            spent.clear()
            with tempfile.TemporaryDirectory() as d:
                job = Job(corpus=str(corpus), out=d, presets=["f5tts"], features=list(preset.features),
                          limits=asdict(DecodeLimits()), write_tar=tar)
                t0 = time.perf_counter()
                rec = build.build_shard(unit, job)
                total = time.perf_counter() - t0
                parts = {p: spent.get(p, 0.0) for p in PROFILE_PARTS}  # before the floor calls the mel too
                # Right after, in the same process: the hand-written loop's per-file work and the floor, so
                # the per-core ratios see the same load (the machine is shared).
                t0 = time.perf_counter()
                for i, f in enumerate(paths):
                    handwritten_mel((str(f), f"{d}/{i:06d}.npy"))
                hand = time.perf_counter() - t0
            floor = sum(measure_floor(paths).values())
            assert rec["rows"] == len(utts), rec["rejects"][:3]
            parts["glue"] = total - sum(parts.values())
            out.append({"total_s": total, "x_rt": audio / total, "parts_s": parts, "handwritten_s": hand,
                        "floor_s": floor, "vs_handwritten": hand / total, "vs_floor": floor / total})
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    return {"utterances": len(utts), "audio_s": audio, "tar": tar, "rounds": out}


_TOGETHER_CHILD = (
    "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[4]); "
    "from bench_extract import profile_worker; "
    "print(json.dumps(profile_worker(Path(sys.argv[1]), sys.argv[2] == '1', rounds=int(sys.argv[3]))))")


def profile_together(corpus: Path, tar: bool, procs: int, rounds: int, inner: int = 3) -> dict[str, list[dict]]:
    """The profile of `profile_worker` in one process alone, then in `procs` processes at once (each its own
    temp folder, same files), `rounds` times in turn: how much each stage costs more when every core runs a
    worker. That is contention for what the cores share (caches, memory, the disk's journal), not waiting;
    the hand-written loop's work and the floor, which each process runs after its shard, show what the same
    contention does to code that writes nothing. Each process runs `inner` rounds so that the copies overlap
    once their start-up is behind them."""
    runs: dict[str, list[dict]] = {"alone": [], "together": []}
    for _ in range(rounds):
        for label, n in (("alone", 1), ("together", procs)):
            ps = [subprocess.Popen([sys.executable, "-c", _TOGETHER_CHILD, str(corpus), "1" if tar else "0",
                                    str(inner), str(Path(__file__).resolve().parent)], stdout=subprocess.PIPE,
                                   text=True) for _ in range(n)]
            outs = [proc.communicate()[0] for proc in ps]
            if any(proc.returncode for proc in ps):
                raise SystemExit(f"a profile process failed ({[proc.returncode for proc in ps]})")
            for o in outs:
                runs[label] += json.loads(o.splitlines()[-1])["rounds"]
    return runs


def together_table(results: dict[str, dict[str, list[dict]]], procs: int) -> str:
    """Markdown: per stage, seconds per shard (median over every round of every process) alone and with
    `procs` at once, and their ratio; one column group per corpus and tar setting."""
    cols = list(results)
    lines = ["| part | " + " | ".join(f"{c}: alone | {procs} at once | ratio" for c in cols) + " |",
             "|---|" + "---|---|---|" * len(cols)]

    def med(rounds: list[dict], key: str) -> float:
        v = sorted(r["parts_s"][key] if key in r["parts_s"] else r[key] for r in rounds)
        return v[len(v) // 2]

    for key in PROFILE_PARTS + ("glue", "total_s", "handwritten_s", "floor_s"):
        label = {"total_s": "**audiopipe total**", "handwritten_s": "hand-written loop", "floor_s": "floor"}.get(key, key)
        cells = []
        for c in cols:
            a, b = med(results[c]["alone"], key), med(results[c]["together"], key)
            cells.append(f"{a:.3f} s | {b:.3f} s | " + (f"{b / a:.2f}" if a else "-"))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile_table(profiles: dict) -> str:
    """Markdown: per corpus and tar setting, ms per utterance and share of the worker's time (median round)."""
    cols = list(profiles)
    lines = ["| part | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    med = {}
    for c, p in profiles.items():
        med[c] = sorted(p["rounds"], key=lambda r: r["total_s"])[len(p["rounds"]) // 2]
    for part in PROFILE_PARTS + ("glue",):
        cells = []
        for c, p in profiles.items():
            v = med[c]["parts_s"][part]
            cells.append(f"{1000 * v / p['utterances']:.2f} ms ({100 * v / med[c]['total_s']:.0f} %)")
        lines.append(f"| {part} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(
        f"{1000 * med[c]['total_s'] / p['utterances']:.2f} ms, {med[c]['x_rt']:.0f}x RT" for c, p in profiles.items())
        + " |")
    for key, label in (("vs_handwritten", "hand-written time / audiopipe time"), ("vs_floor", "floor / audiopipe")):
        cells = []
        for p in profiles.values():
            v = sorted(r[key] for r in p["rounds"])
            cells.append(f"{v[len(v) // 2]:.2f} ({v[0]:.2f}-{v[-1]:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------ corpora

def corpus_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_EXTS)


def subset(root: Path, n: int, dest: Path) -> Path:
    """Every k-th file of `root` (with its .txt), linked into dest: a smaller corpus of the same mix."""
    files = corpus_files(root)
    step = max(1, len(files) // n) if n else 1
    for f in files[::step][:n or None]:
        rel = f.relative_to(root)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(f.resolve(), dest / rel)
        txt = f.with_suffix(".txt")
        if txt.exists():
            os.symlink(txt.resolve(), (dest / rel).with_suffix(".txt"))
    return dest


def make_ogg(src: Path, dst: Path) -> None:
    for f in corpus_files(src):
        q = (dst / f.relative_to(src)).with_suffix(".ogg")
        q.parent.mkdir(parents=True, exist_ok=True)
        data, sr = sf.read(str(f), dtype="float32")
        sf.write(str(q), data, sr, format="OGG", subtype="VORBIS")
        txt = f.with_suffix(".txt")
        if txt.exists():
            shutil.copy(txt, q.with_suffix(".txt"))


# ------------------------------------------------------------------ report

def summarise(rounds: list[dict], corpora: list[str], workers: list[int]) -> dict:
    out: dict = {}
    for c in corpora:
        rs = [r[c] for r in rounds]
        d: dict = {"floor_x_rt": spread([r["floor"]["x_rt"] for r in rs])}
        for w in workers:
            for tar in ("tar", "notar"):
                key = f"w{w}_{tar}"
                ap = [r[f"audiopipe_{key}"]["x_rt"] for r in rs]
                base = [r[f"handwritten_w{w}"]["x_rt"] for r in rs]
                d[key] = {
                    "audiopipe_x_rt": spread(ap),
                    "handwritten_x_rt": spread(base),
                    "vs_handwritten": spread([a / b for a, b in zip(ap, base)]),
                    "vs_floor_per_core": spread([a / w / r["floor"]["x_rt"] for a, r in zip(ap, rs)]),
                }
                parts = [r[f"audiopipe_{key}"] for r in rs if "tasks_busy_s" in r[f"audiopipe_{key}"]]
                if parts:
                    d[key]["extraction_s"] = {k: spread([p[k] for p in parts]) for k in
                                              ("extract_phase_s", "tasks_busy_s", "idle_s", "lead_in_s", "tail_s")}
        for tar in ("tar", "notar"):
            if 1 in workers and 2 in workers:
                d[f"scaling_1_to_2_{tar}"] = spread(
                    [r[f"audiopipe_w2_{tar}"]["x_rt"] / (2 * r[f"audiopipe_w1_{tar}"]["x_rt"]) for r in rs])
        if 1 in workers and 2 in workers:
            d["scaling_1_to_2_handwritten"] = spread(
                [r["handwritten_w2"]["x_rt"] / (2 * r["handwritten_w1"]["x_rt"]) for r in rs])
        d["startup_s"] = spread([r[f"audiopipe_w{w}_{t}"]["startup_s"]
                                       for r in rs for w in workers for t in ("tar", "notar")])
        d["discovery_s"] = spread([r[f"audiopipe_w{w}_{t}"]["discovery_s"]
                                         for r in rs for w in workers for t in ("tar", "notar")])
        out[c] = d
    return out


def _cell(s: dict, fmt: str = ".2f") -> str:
    return f"{s['median']:{fmt}} ({s['min']:{fmt}}-{s['max']:{fmt}})"


def _cases(summary: dict, workers: list[int]):
    """Each corpus, worker count and tar setting: the row's first three cells and the summary's entry."""
    for c, d in summary.items():
        for w in workers:
            for tar in ("tar", "notar"):
                yield f"| {c} | {w} | {'on' if tar == 'tar' else 'off'} | ", d[f"w{w}_{tar}"]


def table(summary: dict, workers: list[int]) -> str:
    return "\n".join(["| corpus | workers | tars | audiopipe x RT | hand-written x RT | audiopipe / hand-written "
                      "| audiopipe per core / floor |", "|---|---|---|---|---|---|---|"]
                     + [f"{row}{e['audiopipe_x_rt']['median']:.0f} | {e['handwritten_x_rt']['median']:.0f} | "
                        f"{_cell(e['vs_handwritten'])} | {_cell(e['vs_floor_per_core'])} |"
                        for row, e in _cases(summary, workers)])


def breakdown_table(summary: dict, workers: list[int]) -> str:
    """Where audiopipe's extraction phase went (medians over rounds, seconds; from --timings)."""
    parts = ("extract_phase_s", "tasks_busy_s", "idle_s", "lead_in_s", "tail_s")
    return "\n".join(["| corpus | workers | tars | extraction phase | tasks busy (worker-s) | workers idle (worker-s) "
                      "| before the first task | after the last task |", "|---|---|---|---|---|---|---|---|"]
                     + [row + " | ".join(f"{e['extraction_s'][k]['median']:.2f}" for k in parts) + " |"
                        for row, e in _cases(summary, workers) if e.get("extraction_s")])


def plot(summary: dict, workers: list[int], path: Path, machine: str) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(summary), figsize=(6 * len(summary), 4.8), squeeze=False)
    for ax, (c, d) in zip(axes[0], summary.items()):
        labels, vals, lo, hi, colors = [], [], [], [], []
        for w in workers:
            bars = [("hand-written", "handwritten_x_rt", "#999999"), ("audiopipe, tars", "audiopipe_x_rt", "#1f77b4"),
                    ("audiopipe, no tar", "audiopipe_x_rt", "#6baed6")]
            for name, field, color in bars:
                e = d[f"w{w}_{'notar' if 'no tar' in name else 'tar'}"]
                s = e[field]
                colors.append(color)
                labels.append(f"{name}\n{w} worker{'s' if w > 1 else ''}")
                vals.append(s["median"])
                lo.append(s["median"] - s["min"])
                hi.append(s["max"] - s["median"])
        labels.append("floor\n(1 core)")
        vals.append(d["floor_x_rt"]["median"])
        lo.append(d["floor_x_rt"]["median"] - d["floor_x_rt"]["min"])
        hi.append(d["floor_x_rt"]["max"] - d["floor_x_rt"]["median"])
        ax.bar(range(len(vals)), vals, yerr=[lo, hi], capsize=3, color=colors + ["#2ca02c"])
        ax.set_xticks(range(len(vals)), labels, fontsize=7, rotation=35, ha="right")
        ax.set_ylabel("x real time (median, bars: range over rounds)")
        ax.set_title(f"{c} corpus, f5tts mel", fontsize=9)
    fig.suptitle(f"audiopipe shard vs a hand-written Pool loop vs the decode+resample+mel floor\n{machine}",
                 fontsize=9)
    save(fig, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wav-corpus", type=Path, default=Path("/tmp/extractbench/wav"))
    p.add_argument("--ogg-corpus", type=Path, default=Path("/tmp/extractbench/ogg"))
    p.add_argument("--make-ogg", action="store_true", help="(re)build --ogg-corpus from --wav-corpus first")
    p.add_argument("--files", type=int, default=400, help="files taken from each corpus (every k-th; 0: all)")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default="benchmarks/results/extract.json")
    p.add_argument("--plot", default="docs/img/extract.png")
    p.add_argument("--profile", action="store_true",
                   help="only time the parts of one worker's build_shard (decode, resample, STFT, mel, Arrow, tar, "
                        "glue) on --files files of each corpus, tars on and off")
    p.add_argument("--together", type=int, default=0, metavar="N",
                   help="with --profile: run the profile alone and in N processes at once, in turn, and compare "
                        "each stage (what contention for the shared cores costs)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run in under 2 minutes: 40 files, 1 round (figures are indicative only)")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers used the CPU at the same time")
    p.add_argument("--corpora", default="WAV,OGG", help="which corpora to run (WAV, OGG or both)")
    p.add_argument("--shard-size", default="4MB", help="audiopipe's --shard-size (default 4MB)")
    p.add_argument("--whole-run", action="store_true",
                   help="whole runs from launch to exit, start-up included: the hand-written loop in a fresh "
                        "process against `audiopipe shard` (tars on and off) on each of --engines")
    p.add_argument("--engines", default="local", help="with --whole-run: local, ray or local,ray")
    a = p.parse_args()
    if a.quick:
        a.files, a.rounds = 40, 1
    workers = [int(w) for w in a.workers.split(",")]
    machine = f"{a.machine} ({os.cpu_count()} CPUs, {platform.platform()})"
    chosen = [c.strip().upper() for c in a.corpora.split(",") if c.strip()]
    chosen = {n: r for n, r in (("WAV", a.wav_corpus), ("OGG", a.ogg_corpus)) if n in chosen}

    def dump(doc: dict) -> None:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps({"machine": machine, "command": " ".join(sys.argv),
                                            "load_average": os.getloadavg(), **doc}, indent=1))
    if a.make_ogg:
        make_ogg(a.wav_corpus, a.ogg_corpus)
    if a.profile:
        tmp = Path(tempfile.mkdtemp(prefix="audiopipe-bench-profile-"))
        try:
            profiles = {}
            for name, root in chosen.items():
                sub = subset(root, a.files, tmp / f"corpus-{name}")
                for tar in (True, False):
                    label = f"{name}, tars {'on' if tar else 'off'}"
                    if a.together:
                        profiles[label] = profile_together(sub, tar, a.together, a.rounds)
                    else:
                        profiles[label] = profile_worker(sub, tar, a.rounds)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        print(together_table(profiles, a.together) if a.together else profile_table(profiles))
        dump({"together": a.together, "profiles": profiles})
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="audiopipe-bench-extract-"))
    corpora = {}
    for name, root in chosen.items():
        if not root.is_dir():
            raise SystemExit(f"corpus folder not found: {root} (see the module docstring)")
        corpora[name] = subset(root, a.files, tmp / f"corpus-{name}")
    audio_s = {c: sum(sf.info(str(f)).duration for f in corpus_files(r)) for c, r in corpora.items()}
    if a.whole_run:
        engines = [e.strip() for e in a.engines.split(",") if e.strip()]
        try:
            rounds_w = whole_run(corpora, audio_s, workers, a.rounds, engines, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        summary = summarise_whole(rounds_w, workers, engines)
        dump({"files_per_corpus": a.files, "engines": engines,
              "audio_hours": {c: s / 3600 for c, s in audio_s.items()}, "summary": summary, "rounds": rounds_w})
        print(whole_table(summary, workers, engines))
        if a.plot != p.get_default("plot"):
            plot_whole(summary, workers, engines, Path(a.plot), machine)
        return 0
    rounds: list[dict] = []
    try:
        for rnd in range(a.rounds):
            res: dict = {}
            for c, root in corpora.items():
                files = corpus_files(root)
                kinds = [("handwritten", None), ("audiopipe", True), ("audiopipe", False)]
                steps = [("floor", 1, None)] + [(kind, w, tar) for w in workers for kind, tar in kinds]
                k = rnd % len(steps)
                steps = steps[k:] + steps[:k]  # rotate the order from round to round
                r: dict = {}
                for kind, w, tar in steps:
                    if kind == "floor":
                        t = measure_floor(files)
                        r["floor"] = {**t, "x_rt": audio_s[c] / sum(t.values()),
                                      "decode_x_rt": audio_s[c] / t["decode"]}
                    elif kind == "handwritten":
                        wall = run_handwritten(files, tmp / "npy", w)
                        shutil.rmtree(tmp / "npy", ignore_errors=True)
                        r[f"handwritten_w{w}"] = {"wall_s": wall, "x_rt": audio_s[c] / wall}
                    else:
                        t = run_audiopipe(root, tmp / "out", w, tar, shard_size=a.shard_size)
                        r[f"{kind}_w{w}_{'tar' if tar else 'notar'}"] = {**t, "x_rt": audio_s[c] / t["extract_s"]}
                    print(f"round {rnd} {c} {kind} w{w} {'' if tar is None else ('tar' if tar else 'notar')}: "
                          f"{json.dumps({k2: round(v, 3) for k2, v in list(r.values())[-1].items()})}", flush=True)
                res[c] = r
            rounds.append(res)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = summarise(rounds, list(corpora), workers)
    dump({"files_per_corpus": a.files, 
          "audio_hours": {c: s / 3600 for c, s in audio_s.items()}, "summary": summary, "rounds": rounds})
    print(table(summary, workers))
    print(breakdown_table(summary, workers))
    for c, d in summary.items():
        print(f"{c}: floor {d['floor_x_rt']['median']:.0f}x RT per core; start-up {d['startup_s']['median']:.1f} s "
              f"(discovery {d['discovery_s']['median']:.2f} s); scaling 1->2 "
              + ", ".join(f"{k[len('scaling_1_to_2_'):]} {v['median']:.2f}" for k, v in d.items()
                          if k.startswith("scaling")))
    if a.plot:
        plot(summary, workers, Path(a.plot), machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
