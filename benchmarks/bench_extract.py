"""Extraction speed of `audiopipe shard` against a hand-written multiprocessing.Pool loop and the decode floor;
where a worker's time goes (--profile, --together N); how far the cores themselves scale (--ceiling). The corpora,
the commands and what each ratio covers: docs/extraction.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr
from results_io import (ROOT, bars, child_env, child_result, host, output_args, pyplot, rotated, save, spread,
                        write_results)

sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent  # a child's working folder: `python -c` imports this script from it

MEL_RATE = 24000
AUDIO_EXTS = (".wav", ".ogg", ".flac", ".mp3")
TARS = ("tar", "notar")

# ------------------------------------------------------------------ the hand-written baseline and the floor

_WINDOW = _FBANK = None  # set in each process by _baseline_init


def _baseline_init() -> None:
    """Pool initializer: one torch thread per process (parallelism from processes, as audiopipe's workers)."""
    global _WINDOW, _FBANK
    import torch

    from audiopipe.features.mel import mel_filterbank

    torch.set_num_threads(1)
    _WINDOW = torch.hann_window(1024)
    _FBANK = torch.from_numpy(np.array(mel_filterbank(MEL_RATE, 1024, 100, 0.0, 12000.0, "htk", None))).float()


def _decode(path: str | Path) -> tuple[np.ndarray, int]:
    data, sr = sf.read(str(path), dtype="float32", always_2d=True)
    return (data[:, 0] if data.shape[1] == 1 else data.mean(axis=1)), sr


def handwritten_mel(job: tuple[str, str]) -> float:
    """soundfile -> mono -> soxr -> torch STFT + 100-bin HTK mel -> np.save; returns the audio seconds."""
    import torch

    path, out = job
    wav, sr = _decode(path)
    x = soxr.resample(wav, sr, MEL_RATE) if sr != MEL_RATE else wav
    spec = torch.stft(torch.from_numpy(np.ascontiguousarray(x)), 1024, hop_length=256, win_length=1024,
                      window=_WINDOW, center=True, pad_mode="reflect", return_complex=True)
    np.save(out, torch.log(torch.clamp(_FBANK @ spec.abs(), min=1e-5)).numpy())
    return len(wav) / sr


def run_handwritten(files: list[Path], out: Path, workers: int) -> float:
    """Wall seconds of the Pool loop over `files`, one .npy per utterance under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(str(f), str(out / f"{i:06d}.npy")) for i, f in enumerate(files)]
    t0 = time.perf_counter()
    with mp.Pool(workers, initializer=_baseline_init) as pool:
        for _ in pool.imap_unordered(handwritten_mel, jobs, chunksize=4):
            pass
    return time.perf_counter() - t0


_HANDWRITTEN_SCRIPT = """
import json, sys
import numpy, soundfile, soxr, torch  # what the script imports at its top, as a user's script would
import audiopipe.features.mel  # the mel filterbank the loop uses
from pathlib import Path
from bench_extract import corpus_files, run_handwritten
pool_s = run_handwritten(corpus_files(Path(sys.argv[1])), Path(sys.argv[2]), int(sys.argv[3]))
print("RESULT " + json.dumps({"pool_s": pool_s}))
"""


def run_handwritten_process(root: Path, out: Path, workers: int) -> dict[str, float]:
    """The loop as a user runs it: a fresh `python` that imports its libraries, lists the files and runs the Pool
    (fork: its processes inherit the imports). Wall time from launch to exit, and the Pool's part."""
    t0 = time.perf_counter()
    r = child_result([sys.executable, "-c", _HANDWRITTEN_SCRIPT, str(root), str(out), str(workers)],
                     what="the hand-written loop", env=child_env(), cwd=HERE)
    r["wall_s"] = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return r


def measure_floor(files: list[Path]) -> float:
    """Seconds to decode, resample and compute the stored mel of every file, one after another in this process."""
    import torch

    from audiopipe.features.mel import VocosMel

    torch.set_num_threads(1)
    mel = VocosMel()
    mel(np.random.default_rng(0).uniform(-0.5, 0.5, 4000).astype(np.float32))  # compile the kernels first
    t0 = time.perf_counter()
    for f in files:
        wav, sr = _decode(f)
        mel(np.ascontiguousarray(soxr.resample(wav, sr, MEL_RATE) if sr != MEL_RATE else wav, dtype=np.float32))
    return time.perf_counter() - t0


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


def run_audiopipe(corpus: Path, out: Path, workers: int, tar: bool, engine: str) -> dict[str, float]:
    """One `audiopipe shard` run of this checkout in a fresh process."""
    timings = out.parent / "timings.json"
    cmd = [sys.executable, "-c", _EXACT_SUMMARY, "shard", "--corpus", str(corpus), "--out", str(out),
           "--preset", "f5tts", "--workers", str(workers), "--shard-size", "4MB", "--no-progress", "--nice", "0",
           "--timings", str(timings), "--engine", engine] + ([] if tar else ["--no-tar"])
    launched = time.time()
    t0 = time.perf_counter()
    # cwd: `python -c` puts the working folder first on sys.path, and Ray gives its workers the driver's folder
    s = child_result(cmd, tag=_SUMMARY_MARK, what="audiopipe shard", env=child_env(), cwd=ROOT)
    wall = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    # Extraction: the job's own time less its start-up (Ray start and worker warm-up, side by side with
    # discovery); the index and the manifest stay in, they are part of the job.
    res = {"wall_s": wall, "job_s": s["seconds"], "startup_s": s["startup_s"], "discovery_s": s["discovery_s"],
           "ray_start_s": s["ray_start_s"], "warmup_s": s["warmup_s"], "extract_s": s["seconds"] - s["startup_s"]}
    tl = json.loads(timings.read_text())
    timings.unlink()
    if tl.get("tasks"):  # from the launch of the command to its first shard's first decode
        res["first_decode_s"] = tl["clock"] + min(t["start"] for t in tl["tasks"]) - launched
    return res


# ------------------------------------------------------------------ rounds and their summary

def run_rounds(corpora: dict[str, Path], workers: list[int], engines: list[str], rounds: int, tmp: Path) -> list:
    """Per round and corpus, in rotating order: the floor, then per worker count the hand-written loop and
    `audiopipe shard` (each engine, tars on and off); and the 1-minute load."""
    out = []
    for rnd in range(rounds):
        res = {}
        for c, root in corpora.items():
            files = corpus_files(root)
            steps = [("floor", lambda: {"floor_s": measure_floor(files)})]
            for w in workers:
                steps.append((f"handwritten_w{w}", lambda w=w: run_handwritten_process(root, tmp / "npy", w)))
                steps += [(f"{e}_w{w}_{t}", lambda w=w, e=e, t=t: run_audiopipe(root, tmp / "out", w, t == "tar", e))
                          for e in engines for t in TARS]
            res[c] = {key: fn() for key, fn in rotated(steps, rnd)}
            res[c]["load_1m"] = os.getloadavg()[0]
            print(f"round {rnd + 1}/{rounds} {c} done", file=sys.stderr, flush=True)
        out.append(res)
    return out


def summarise(rounds: list[dict], audio_s: dict[str, float], workers: list[int], engines: list[str]) -> dict:
    """Per corpus, the figures and the within-round ratios of docs/extraction.md (median and range)."""
    out: dict = {}
    for c in rounds[0]:
        rs, x = [r[c] for r in rounds], audio_s[c]
        d: dict = {"floor_x_rt": spread([x / r["floor"]["floor_s"] for r in rs]),
                   "load_1m": spread([r["load_1m"] for r in rs])}
        for w in workers:
            hw = [r[f"handwritten_w{w}"] for r in rs]
            for key in (f"{e}_w{w}_{t}" for e in engines for t in TARS):
                ap = [r[key] for r in rs]
                d[key] = {"audiopipe_x_rt": spread([x / a["extract_s"] for a in ap]),
                          "handwritten_x_rt": spread([x / h["pool_s"] for h in hw]),
                          "vs_handwritten": spread([h["pool_s"] / a["extract_s"] for h, a in zip(hw, ap)]),
                          "vs_floor_per_core": spread([r["floor"]["floor_s"] / a["extract_s"] / w
                                                       for a, r in zip(ap, rs)]),
                          "whole_run_vs_handwritten": spread([h["wall_s"] / a["wall_s"] for h, a in zip(hw, ap)]),
                          **{k: spread([a.get(k, float("nan")) for a in ap]) for k in (
                              "wall_s", "startup_s", "discovery_s", "first_decode_s")},
                          "handwritten_wall_s": spread([h["wall_s"] for h in hw])}
        if 1 in workers and 2 in workers:  # x real time with 2 workers / twice that with 1
            phase = lambda run: run.get("extract_s", run.get("pool_s"))  # noqa: E731
            for name in [f"{e}_w{{}}_{t}" for e in engines for t in TARS] + ["handwritten_w{}"]:
                d["scaling_1_to_2_" + name.replace("_w{}", "")] = spread(
                    [phase(r[name.format(1)]) / (2 * phase(r[name.format(2)])) for r in rs])
        out[c] = d
    return out


def plot(summary: dict, workers: list[int], engines: list[str], path: Path, machine: str) -> None:
    """Per corpus: x real time of each contender, and the whole run's ratio hand-written / audiopipe wall."""
    fig, axes = pyplot().subplots(2, len(summary), figsize=(6.5 * len(summary), 9), squeeze=False)
    cases = [(w, e, t) for w in workers for e in engines for t in TARS]
    keys = [f"{e}_w{w}_{t}" for w, e, t in cases]
    names = [f"{e}, {w} w\ntars {'on' if t == 'tar' else 'off'}" for w, e, t in cases]
    for (top, bottom), (c, d) in zip(axes.T, summary.items()):
        bars(top, [d[f"{engines[0]}_w{w}_tar"]["handwritten_x_rt"] for w in workers]
             + [d[k]["audiopipe_x_rt"] for k in keys] + [d["floor_x_rt"]],
             [f"hand-written\n{w} w" for w in workers] + names + ["floor\n1 core"],
             color=["#999999"] * len(workers) + ["#1f77b4"] * len(keys) + ["#2ca02c"])
        top.set(ylabel="x real time, extraction phase", title=f"{c} corpus, f5tts mel")
        bars(bottom, [d[k]["whole_run_vs_handwritten"] for k in keys], names, color="#4c72b0")
        bottom.axhline(1.0, ls="--", c="k", lw=1)
        bottom.set(ylabel="hand-written wall / audiopipe wall", title=f"{c}: whole run, launch to exit "
                   f"(load {d['load_1m']['median']:.1f})")
    fig.suptitle(f"audiopipe shard against a hand-written Pool loop (median, whiskers: range)\n{machine}", fontsize=9)
    save(fig, path)


# ------------------------------------------------------------------ where a worker's time goes

PROFILE_PARTS = ("decode", "resample", "STFT + magnitude", "mel (filterbank + log)", "Arrow file", "tar file",
                 "fsync + rename wait", "done record")


def profile_worker(corpus: Path, tar: bool, rounds: int) -> dict:
    """`build_shard` (what one shard task runs) on all of `corpus` as one shard in this process, each stage of the
    hot path timed by a wrapper ("glue": the rest); each round then times the hand-written loop's per-file work and
    the floor on the same files, under the same load (docs/extraction.md, "Where a worker's time goes")."""
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

    torch.set_num_threads(1)  # as in a worker (one CPU per task)
    keep_freed_memory()  # as in a worker too (the loop's work and the floor, run after, get it as well)
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(corpus).utterances]
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

    patches = [(segments.RecordingCache, "load"), (build, "resample_to"), (build, "stft_magnitude"),
               (mel._LogMel, "from_magnitude"), (build, "write_arrow"), (build, "write_tar"),
               (atomic.AtomicBatch, "commit"), (build, "write_done_record")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in patches]
    features = list(resolve(["f5tts"]).features)

    def shard(unit: WorkUnit, out: str) -> dict:
        job = Job(corpus=str(corpus), out=out, presets=["f5tts"], features=features,
                  limits=asdict(DecodeLimits()), write_tar=tar)
        return build.build_shard(unit, job)

    out = []
    try:
        for (obj, name), part in zip(patches, PROFILE_PARTS):
            setattr(obj, name, timed(part, getattr(obj, name)))
        with tempfile.TemporaryDirectory() as d:  # warm-up: compile the kernels, fill the page cache
            shard(WorkUnit("warm", 0, utts[:4]), d)
        paths = [Path(u.path) for u in utts]
        _baseline_init()
        for _ in range(rounds):
            spent.clear()
            with tempfile.TemporaryDirectory() as d:
                t0 = time.perf_counter()
                rec = shard(WorkUnit("shard-000000", 0, utts), d)
                total = time.perf_counter() - t0
                parts = {p: spent.get(p, 0.0) for p in PROFILE_PARTS}  # before the floor calls the mel too
                t0 = time.perf_counter()
                for i, f in enumerate(paths):
                    handwritten_mel((str(f), f"{d}/{i:06d}.npy"))
                hand = time.perf_counter() - t0
            floor = measure_floor(paths)
            assert rec["rows"] == len(utts), rec["rejects"][:3]
            parts["glue"] = total - sum(parts.values())
            out.append({"total_s": total, "x_rt": audio / total, "parts_s": parts, "handwritten_s": hand,
                        "floor_s": floor, "vs_handwritten": hand / total, "vs_floor": floor / total})
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    return {"utterances": len(utts), "audio_s": audio, "tar": tar, "rounds": out}


_PROFILE_CHILD = """
import json, sys
from pathlib import Path
from bench_extract import profile_worker
print(json.dumps(profile_worker(Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]))))
"""


def profile_together(corpus: Path, tar: bool, procs: int, rounds: int, inner: int = 3) -> dict[str, list[dict]]:
    """`profile_worker` in one process alone, then in `procs` processes at once (same files), `rounds` times in
    turn; each process runs `inner` rounds, so that the copies overlap once their start-up is behind them."""
    runs: dict[str, list[dict]] = {"alone": [], "together": []}
    for _ in range(rounds):
        for label, n in (("alone", 1), ("together", procs)):
            ps = [subprocess.Popen([sys.executable, "-c", _PROFILE_CHILD, str(corpus), str(int(tar)), str(inner)],
                                   stdout=subprocess.PIPE, text=True, env=child_env(), cwd=HERE) for _ in range(n)]
            outs = [proc.communicate()[0] for proc in ps]
            if any(proc.returncode for proc in ps):
                raise SystemExit(f"a profile process failed ({[proc.returncode for proc in ps]})")
            for o in outs:
                runs[label] += json.loads(o.splitlines()[-1])["rounds"]
    return runs


# ------------------------------------------------------------------ the machine's own ceiling

def _ceiling_child(files: list[Path], ready, out) -> None:
    measure_floor(files[:3])  # imports, kernels and first-touch costs before the clock
    ready.wait()  # every process past its warm-up: they start together
    t0 = time.perf_counter()
    floor_s = measure_floor(files)
    out.put((time.perf_counter() - t0, os.getpid(), len(files), floor_s))


def ceiling_run(files: list[Path], procs: int) -> tuple[float, list[dict]]:
    """Wall seconds of `procs` fresh processes each running the floor over every file at once (no pool, no
    queue, nothing written), and what each reports (pid, files, seconds inside the floor's stages)."""
    ctx = mp.get_context("spawn")  # a clean interpreter each, as a worker or a Pool child is
    ready, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_ceiling_child, args=(files, ready, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [out.get(timeout=1800) for _ in ps]
    for p in ps:
        p.join()
    return max(g[0] for g in got), [{"pid": g[1], "files": g[2], "floor_s": g[3]} for g in got]


def ceiling(files: list[Path], procs: int, rounds: int) -> dict:
    out = []
    for _ in range(rounds):
        t1, one = ceiling_run(files, 1)
        tn, many = ceiling_run(files, procs)
        out.append({"t1_s": t1, f"t{procs}_s": tn, "scaling": t1 / tn, "processes": one + many})
    return {"files": len(files), "procs": procs, "scaling": spread([r["scaling"] for r in out]), "rounds": out}


# ------------------------------------------------------------------ corpora

def corpus_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in AUDIO_EXTS)


def subset(root: Path, n: int, dest: Path) -> Path:
    """Every k-th file of `root` (with its .txt), linked into dest: a smaller corpus of the same mix."""
    files = corpus_files(root)
    for f in files[::max(1, len(files) // n) if n else 1][:n or None]:
        for src in (f, f.with_suffix(".txt")):
            if src.exists():
                (dest / src.relative_to(root)).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(src.resolve(), dest / src.relative_to(root))
    return dest


def make_ogg(src: Path, dst: Path) -> None:
    for f in corpus_files(src):
        q = (dst / f.relative_to(src)).with_suffix(".ogg")
        q.parent.mkdir(parents=True, exist_ok=True)
        data, sr = sf.read(str(f), dtype="float32")
        sf.write(str(q), data, sr, format="OGG", subtype="VORBIS")
        if f.with_suffix(".txt").exists():
            shutil.copy(f.with_suffix(".txt"), q.with_suffix(".txt"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wav-corpus", type=Path, default=Path("/tmp/extractbench/wav"))
    p.add_argument("--ogg-corpus", type=Path, default=Path("/tmp/extractbench/ogg"))
    p.add_argument("--make-ogg", action="store_true", help="(re)build --ogg-corpus from --wav-corpus first")
    p.add_argument("--corpora", default="WAV,OGG", help="which corpora to run (WAV, OGG or both)")
    p.add_argument("--files", type=int, default=400, help="files taken from each corpus (every k-th; 0: all)")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a smoke run: 40 files, 1 round (figures indicative only)")
    p.add_argument("--engines", default="local", help="audiopipe's engines: local, ray or local,ray")
    p.add_argument("--profile", action="store_true", help="only time the stages of one worker's build_shard")
    p.add_argument("--together", type=int, default=0, metavar="N",
                   help="with --profile: the profile alone and in N processes at once, in turn")
    p.add_argument("--ceiling", action="store_true",
                   help="only the floor in 1 process, then in max(--workers) processes at once")
    output_args(p, json_required=True)
    a = p.parse_args()
    if a.quick:
        a.files, a.rounds = 40, 1
    workers = [int(w) for w in a.workers.split(",")]
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    if a.make_ogg:
        make_ogg(a.wav_corpus, a.ogg_corpus)
    result: dict = {"command": " ".join(["python", "benchmarks/bench_extract.py", *sys.argv[1:]]),
                    "machine": host(a.machine), "files_per_corpus": a.files}
    with tempfile.TemporaryDirectory(prefix="audiopipe-bench-extract-", ignore_cleanup_errors=True) as d:
        tmp, corpora = Path(d), {}
        for name, root in (("WAV", a.wav_corpus), ("OGG", a.ogg_corpus)):
            if name in a.corpora.upper():
                if not root.is_dir():
                    raise SystemExit(f"corpus folder not found: {root} (how to make it: docs/extraction.md)")
                corpora[name] = subset(root, a.files, tmp / f"corpus-{name}")
        if a.profile:
            result.update(together=a.together, profiles={
                f"{c}, tars {'on' if tar else 'off'}": (profile_together(root, tar, a.together, a.rounds)
                                                        if a.together else profile_worker(root, tar, a.rounds))
                for c, root in corpora.items() for tar in (True, False)})
        elif a.ceiling:
            result["ceiling"] = {c: ceiling(corpus_files(root), max(workers), a.rounds) for c, root in corpora.items()}
        else:
            audio_s = {c: sum(sf.info(str(f)).duration for f in corpus_files(r)) for c, r in corpora.items()}
            rounds = run_rounds(corpora, workers, engines, a.rounds, tmp)
            result.update(engines=engines, audio_hours={c: s / 3600 for c, s in audio_s.items()},
                          summary=summarise(rounds, audio_s, workers, engines), rounds=rounds)
    write_results(result, a.json, lambda path: plot(result["summary"], workers, engines, path, a.machine),
                  a.plot if "summary" in result else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
