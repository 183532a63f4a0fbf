"""Prepare everything benchmarks/gpu_proof.py needs on a GPU machine, in one folder that travels with the repository.

    make gpu-bundle                       # = python benchmarks/gpu_bundle.py --out .gpu-bundle
    python benchmarks/gpu_bundle.py --out .gpu-bundle --quick --no-wheels     # tiny, for the tests

What it writes and what each folder is for: docs/gpu-proof.md, section 1. Needs the Debian packages of `make sysdeps`
(Asterisk prompts in en, fr, it, ru) and, for the wheels, pip with access to its index.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOUNDS = Path("/usr/share/asterisk/sounds")
# Five distinct real voices that ship as WAV (es_MX_f_Allison is the en_US voice again, so it is left out).
VOICES = ("en_US_f_Allison", "fr_CA_f_June", "it_IT_f_Menardi", "it_IT_m_Carlo", "ru_RU_f_IvrvoiceRU")
# The wheels the GPU image lacks, at the versions installed here (the ones the tests ran with).
WHEELS = ("soundfile", "cffi", "pycparser", "soxr", "julius")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")

MAX_MIB = 48  # the largest bundle accepted: with the repository (~6 MiB), inside the 64 MiB a device call carries
SIZES = {  # seconds of audio per part: (default, --quick)
    "f5": (600.0, 30.0),
    "ns2": (1200.0, 4.0),  # --quick: one or two prompts (the codec's set-up, not its audio, is what the tests need)
    "gpt_sovits": (0.0, 40.0),  # 0: every usable English prompt (~0.7 h)
    "speaker": (60.0, 12.0),  # per voice
}
# The speakers' target median (default, --quick): cut at prompt ends, the items average 8.0 s, as VoxCeleb's
SPEAKER_MEDIAN_S = (5.0, 2.5)


def wav_seconds(path: Path) -> float:
    with wave.open(str(path), "rb") as w:
        return w.getnframes() / w.getframerate()


def pick(items: list[tuple[Path, str]], seconds: float, seed: int = 0) -> list[tuple[Path, str]]:
    """A seeded random choice of (wav, text) until `seconds` of audio (0: all of them), returned in name order."""
    import numpy as np

    if seconds <= 0:
        return sorted(items)
    order = np.random.default_rng(seed).permutation(len(items))
    out, total = [], 0.0
    for i in order.tolist():
        out.append(items[i])
        total += wav_seconds(items[i][0])
        if total >= seconds:
            break
    return sorted(out)


def reslice(dest: Path, speaker: str, items: list[tuple[Path, str]], seed: int = 0, median_s: float = 5.5
            ) -> tuple[int, float]:
    """Join the prompts end to end (a seeded order) and cut the stream into items of LibriTTS-like length
    (log-normal, median `median_s`, within 1-20 s), each cut at a prompt's end: dest/speaker/slice_NNNNN.wav + .txt;
    returns (items, seconds). Every sample once, only the joins are new: why, docs/gpu-proof.md. (--quick takes a
    median of 2.5 s, so that its few seconds still make several items of the CUDA tests' lengths: 0.6-6 s.)"""
    import numpy as np

    rng = np.random.default_rng(seed)
    d = dest / speaker
    d.mkdir(parents=True, exist_ok=True)
    order = [items[i] for i in rng.permutation(len(items)).tolist()]
    count, total, frames, texts, params = 0, 0.0, [], [], None

    def flush() -> None:
        nonlocal count, total, frames, texts
        with wave.open(str(d / f"slice_{count:05d}.wav"), "wb") as w:
            w.setparams(params)
            w.writeframes(b"".join(frames))
        if any(texts):  # the speakers' items have no transcripts
            (d / f"slice_{count:05d}.txt").write_text(" ".join(texts) + "\n", encoding="utf-8")
        total += sum(len(f) for f in frames) / (params.sampwidth * params.nchannels) / params.framerate
        count, frames, texts = count + 1, [], []

    target = float(np.clip(rng.lognormal(np.log(median_s), 0.6), 1.0, 20.0))
    have = 0.0
    for wav, text in order:
        with wave.open(str(wav), "rb") as r:
            p = r.getparams()
            if params is None:
                params = p
            if (p.nchannels, p.sampwidth, p.framerate) != (params.nchannels, params.sampwidth, params.framerate):
                raise SystemExit(f"gpu_bundle: {wav} is not {params.framerate} Hz mono like the others")
            frames.append(r.readframes(r.getnframes()))
        texts.append(text)
        have += p.nframes / p.framerate
        if have >= target:
            flush()
            target, have = float(np.clip(rng.lognormal(np.log(median_s), 0.6), 1.0, 20.0)), 0.0
    if frames:
        flush()
    return count, total


def link_corpus(dest: Path, speaker: str, items: list[tuple[Path, str]]) -> float:
    """dest/speaker/NAME.wav (a link: shards are made of it here, it does not travel) + NAME.txt; the seconds."""
    d = dest / speaker
    d.mkdir(parents=True, exist_ok=True)
    for wav, text in items:
        (d / wav.name).symlink_to(wav)
        (d / f"{wav.stem}.txt").write_text(text + "\n", encoding="utf-8")
    return sum(wav_seconds(wav) for wav, _ in items)


def cli(*argv: str) -> None:
    """`audiopipe ...` in this process: every shard job shares one Ray session."""
    from audiopipe.cli import main

    t0 = time.monotonic()
    rc = main(list(argv))
    if rc:
        raise SystemExit(f"gpu_bundle: `audiopipe {' '.join(argv)}` failed (exit {rc})")
    print(f"  audiopipe {argv[0]} -> {argv[argv.index('--out') + 1]}: {time.monotonic() - t0:.0f} s", flush=True)


def shard(corpus: Path, out: Path, *options: str, workers: int) -> None:
    cli("shard", "--corpus", str(corpus), "--out", str(out), "--no-tar", "--no-progress", "--workers", str(workers),
        *options)


def shard_pcm16k(corpus: Path, out: Path, workers: int) -> None:
    """PCM at 16 kHz alone (the eres2net preset without its fbank, which the speaker trainers compute on the
    device): a feature parameter the command line does not take, so the job is built here."""
    from dataclasses import asdict

    from audiopipe.decode.audio import DecodeLimits
    from audiopipe.shard.job import Job
    from audiopipe.shard.run import run_job

    t0 = time.monotonic()
    job = Job(corpus=str(corpus), out=str(out), presets=["custom"], features=[("pcm", {"sample_rate": 16000})],
              limits=asdict(DecodeLimits()), write_tar=False)
    summary = run_job(job, workers=workers, show_progress=False)
    if summary.written == 0:
        raise SystemExit(f"gpu_bundle: no utterance of {corpus} was written")
    print(f"  shard pcm 16 kHz -> {out}: {summary.written} rows, {time.monotonic() - t0:.0f} s", flush=True)


def download_wheels(dest: Path) -> list[str]:
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version(name)}" for name in WHEELS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           "3.12", "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest), *pins]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"gpu_bundle: pip download of {', '.join(pins)} failed: {r.stderr.strip().splitlines()[-1:]}")
    names = sorted(p.name for p in dest.glob("*.whl"))
    if len(names) != len(WHEELS):
        raise SystemExit(f"gpu_bundle: expected one wheel each of {', '.join(WHEELS)}, got {names}")
    return names


def tracked_mib() -> float | None:
    """Size of what a device call sends besides the bundle: the repository's tracked and untracked-not-ignored
    files (None outside a git checkout)."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True)
    if r.returncode:
        return None
    files = [ROOT / f for f in r.stdout.decode().split("\0") if f]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def build(out: Path, quick: bool, wheels: bool, workers: int) -> dict:
    from audiopipe.corpus.demo import ASTERISK_SOUNDS, MissingSource, usable_asterisk_prompts

    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"gpu_bundle: {out} is not empty; remove it first (a bundle is built whole)")
    out.mkdir(parents=True, exist_ok=True)
    scratch = out.parent / f"{out.name}.scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    size = {k: v[1 if quick else 0] for k, v in SIZES.items()}
    doc: dict = {"format": "audiopipe.gpu_bundle/1", "quick": quick, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "python": platform.python_version(), "parts": {}}
    try:
        prompts = [(ASTERISK_SOUNDS / f"{name}.wav", text) for name, text in usable_asterisk_prompts()]
    except MissingSource as e:
        raise SystemExit(f"gpu_bundle: {e} (make sysdeps installs it)") from None
    t0 = time.monotonic()
    try:
        # F5-TTS: the re-sliced files travel (F5's own loading rule decodes them) with the shards made of them.
        en = pick(prompts, size["f5"], seed=0)
        n, secs = reslice(out / "wavs" / "en", "allison", en, seed=0, median_s=2.5 if quick else 5.5)
        shard(out / "wavs" / "en", out / "shards" / "f5tts", "--preset", "f5tts", workers=workers)
        doc["parts"]["f5tts"] = {"files": n, "prompts": len(en), "audio_s": round(secs, 1), "shards": "shards/f5tts",
                                 "corpus": "wavs/en", "preset": "f5tts",
                                 "resliced": "prompts joined in a seeded order, cut at prompt ends into 1-20 s "
                                             f"items (log-normal, median {2.5 if quick else 5.5} s)"}
        # NaturalSpeech 2: codes of random-init EnCodec weights (no download), F0, energy, phones.
        ns2 = pick(prompts, size["ns2"], seed=1)
        secs = link_corpus(scratch / "ns2", "allison", ns2)
        shard(scratch / "ns2", out / "shards" / "ns2", "--preset", "ns2", "--codec-random-init", workers=workers)
        doc["parts"]["ns2"] = {"files": len(ns2), "audio_s": round(secs, 1), "shards": "shards/ns2", "preset": "ns2"}
        # GPT-SoVITS stage 1: its token folder holds phones and tokens; the fbank shards they came from stay here.
        gs = pick(prompts, size["gpt_sovits"], seed=2)
        secs = link_corpus(scratch / "gpt", "allison", gs)
        shard(scratch / "gpt", scratch / "gpt_shards", "--preset", "gpt_sovits", "--features", "kaldi_fbank",
              workers=workers)
        k = 64 if quick else 512
        cli("tokens", "--shards", str(scratch / "gpt_shards"), "--out", str(out / "tokens" / "gpt_sovits"),
            "--kmeans", str(k))
        doc["parts"]["gpt_sovits"] = {"files": len(gs), "audio_s": round(secs, 1), "shards": "tokens/gpt_sovits",
                                      "tokens": f"k-means of fbank, {k} units"}
        # ERes2Net / CAM++: five real voices, PCM only (the trainers crop it and compute fbank on the device),
        # re-sliced per voice to VoxCeleb-like lengths: 3D-Speaker's rule pays per file (docs/gpu-proof.md).
        total, files, median = 0.0, 0, SPEAKER_MEDIAN_S[1 if quick else 0]
        for voice in VOICES:
            wavs = sorted((SOUNDS / voice).glob("*.wav"))
            if not wavs:
                raise SystemExit(f"gpu_bundle: no WAV prompts in {SOUNDS / voice} (make sysdeps installs them)")
            chosen = pick([(w, "") for w in wavs if 0.5 <= wav_seconds(w) <= 30], size["speaker"], seed=3)
            n, secs = reslice(scratch / "speakers", voice, chosen, seed=3, median_s=median)
            total, files = total + secs, files + n
        shard_pcm16k(scratch / "speakers", out / "shards" / "speakers", workers)
        doc["parts"]["speakers"] = {"voices": list(VOICES), "files": files, "audio_s": round(total, 1),
                                    "shards": "shards/speakers", "features": "pcm",
                                    "resliced": "each voice's prompts joined in a seeded order, cut at prompt ends "
                                                f"into 1-20 s items (log-normal, target median {median} s)"}
    finally:
        ray = sys.modules.get("ray")  # a job with workers started it; --workers 0 never imports it
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    if wheels:
        doc["wheels"] = download_wheels(out / "wheels")
    doc["build_s"] = round(time.monotonic() - t0, 1)
    files = [p for p in out.rglob("*") if p.is_file() and not p.is_symlink()]
    doc["bundle_mib"] = round(sum(p.stat().st_size for p in files) / 2**20, 2)
    repo = tracked_mib()
    doc["repository_mib"] = round(repo, 2) if repo is not None else None
    (out / "bundle.json").write_text(json.dumps(doc, indent=1) + "\n")
    if doc["bundle_mib"] > MAX_MIB:
        raise SystemExit(f"gpu_bundle: the bundle is {doc['bundle_mib']:.1f} MiB, over {MAX_MIB} MiB; "
                         f"take fewer seconds (a device call carries 64 MiB with the repository)")
    if repo is not None and repo + doc["bundle_mib"] > 62:
        raise SystemExit(f"gpu_bundle: repository {repo:.1f} MiB + bundle {doc['bundle_mib']:.1f} MiB leave less "
                         f"than 2 MiB of the 64 MiB a device call carries; take fewer seconds")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu-bundle", help="folder to write (default .gpu-bundle)")
    ap.add_argument("--quick", action="store_true", help="a few seconds of audio per part (for the tests)")
    ap.add_argument("--no-wheels", action="store_true", help="do not download the cp312 wheels")
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                    help="shard worker processes (default: up to 4)")
    a = ap.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    doc = build(a.out.resolve(), a.quick, not a.no_wheels, a.workers)
    for name, part in doc["parts"].items():
        print(f"{name}: {part['files']} files, {part['audio_s']:.0f} s of audio -> {part['shards']}")
    print(f"bundle {a.out}: {doc['bundle_mib']:.1f} MiB (repository {doc['repository_mib']} MiB), "
          f"built in {doc['build_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
