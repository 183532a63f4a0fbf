"""A large corpus of varied real speech, deterministic from a seed: the input of bench_scale.py.

Each utterance is cut from the Debian Asterisk prompts (one woman's voice, 8 kHz, the real speech the tests use):
one or more prompts joined end to end, a random window of 0.5-4 s taken from them, played at 0.9-1.1x speed,
scaled by -12..+3 dB and mixed with white noise at 15-40 dB SNR. Utterance i draws everything from its own
generator seeded by (seed, i), so the corpus is the same whatever the number of processes that write it.

Layout (LJSpeech folders): <root>/spkNNNN/metadata.csv (id|text|text) + <root>/spkNNNN/wavs/uNNNNNNN.wav, `per_speaker`
utterances per folder. The transcript is the text of the prompts the window was cut from (a window may clip the
first and last words; good enough for lengths and tokens, not for an ASR benchmark).

Every file's content hash goes into a set; a duplicate stops the build (the noise makes one vanishingly unlikely).
A rerun after an interruption keeps the speaker folders already written (their metadata.csv is written last) and
only hashes them.

    python benchmarks/scale_corpus.py /work/scale-data/corpus --utterances 500000 --processes 2
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

from audiopipe.corpus.demo import ASTERISK_SOUNDS, usable_asterisk_prompts

SR = 8000
MIN_S, MAX_S = 0.5, 4.0


def load_sources() -> tuple[list[np.ndarray], list[str]]:
    """The usable prompts as float32 arrays plus their texts, in a fixed (sorted) order."""
    audio, texts = [], []
    for name, text in usable_asterisk_prompts(max_s=10.0):
        x, sr = sf.read(str(ASTERISK_SOUNDS / f"{name}.wav"), dtype="float32")
        if sr != SR or x.ndim != 1:
            continue
        audio.append(x)
        texts.append(text)
    return audio, texts


def make_utterance(i: int, seed: int, audio: list[np.ndarray], texts: list[str]) -> tuple[np.ndarray, str]:
    """Utterance i: int16 samples and its transcript."""
    rng = np.random.default_rng([seed, i])
    target = int(rng.uniform(MIN_S, MAX_S) * SR)
    speed = rng.uniform(0.9, 1.1)
    need = int(target * speed) + 2
    parts, words, have = [], [], 0
    while have < need:  # join prompts until the window fits
        k = int(rng.integers(len(audio)))
        parts.append(audio[k])
        words.append(texts[k])
        have += len(audio[k])
    src = np.concatenate(parts) if len(parts) > 1 else parts[0]
    start = int(rng.integers(0, len(src) - need + 1))
    # speed change by linear interpolation: `target` samples read at steps of `speed`
    pos = start + np.arange(target) * speed
    y = np.interp(pos, np.arange(len(src)), src)
    y *= 10 ** (rng.uniform(-12.0, 3.0) / 20)
    rms = float(np.sqrt(np.mean(y * y))) or 1e-4
    y += rng.standard_normal(target) * rms * 10 ** (-rng.uniform(15.0, 40.0) / 20)
    return np.clip(np.round(y * 32767), -32768, 32767).astype(np.int16), " ".join(words)


def _speaker_range(args: tuple[Path, int, int, int, int]) -> tuple[int, int, list[bytes]]:
    """Write speakers [first, last) of the corpus; returns (files, bytes, content digests)."""
    root, seed, n, per_speaker, spk = args
    audio, texts = _SOURCES
    files = nbytes = 0
    digests = []
    d = root / f"spk{spk:04d}"
    if (d / "metadata.csv").is_file():  # written by an earlier, interrupted build: count and hash it only
        for i in range(spk * per_speaker, min(n, (spk + 1) * per_speaker)):
            data = (d / "wavs" / f"u{i:07d}.wav").read_bytes()
            digests.append(hashlib.blake2b(data, digest_size=16).digest())
            nbytes += len(data)
        return len(digests) + 1, nbytes + (d / "metadata.csv").stat().st_size, digests
    (d / "wavs").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(spk * per_speaker, min(n, (spk + 1) * per_speaker)):
        pcm, text = make_utterance(i, seed, audio, texts)
        buf = io.BytesIO()
        sf.write(buf, pcm, SR, subtype="PCM_16", format="WAV")
        data = buf.getvalue()
        (d / "wavs" / f"u{i:07d}.wav").write_bytes(data)
        digests.append(hashlib.blake2b(data, digest_size=16).digest())
        lines.append(f"u{i:07d}|{text}|{text}")
        files += 1
        nbytes += len(data)
    meta = ("\n".join(lines) + "\n").encode()
    (d / "metadata.csv").write_bytes(meta)
    return files + 1, nbytes + len(meta), digests


_SOURCES: tuple[list[np.ndarray], list[str]] = ([], [])


def _init() -> None:
    global _SOURCES
    _SOURCES = load_sources()


def build(root: Path, n: int, seed: int = 0, per_speaker: int = 250, processes: int = 1,
          progress: bool = True) -> dict:
    """Write the corpus; returns its statistics (files, bytes, seconds, unique contents)."""
    t0 = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    speakers = -(-n // per_speaker)
    jobs = [(root, seed, n, per_speaker, s) for s in range(speakers)]
    seen: set[bytes] = set()
    files = nbytes = done = 0
    ctx = mp.get_context("fork")
    with ctx.Pool(processes, initializer=_init) as pool:
        for f, b, digests in pool.imap(_speaker_range, jobs, chunksize=1):
            files += f
            nbytes += b
            for h in digests:
                if h in seen:
                    raise RuntimeError("two utterances came out byte-identical")
                seen.add(h)
            done += len(digests)
            if progress and (done % 10_000 < per_speaker or done == n):
                el = time.perf_counter() - t0
                print(f"\rcorpus {done:,}/{n:,} utterances, {nbytes / 1e9:.2f} GB, {el:.0f} s", end="",
                      file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return {"utterances": done, "unique_contents": len(seen), "speakers": speakers, "files": files,
            "bytes": nbytes, "seconds": round(time.perf_counter() - t0, 1), "seed": seed,
            "sample_rate": SR, "per_speaker": per_speaker}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--utterances", type=int, default=500_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-speaker", type=int, default=250)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the statistics here")
    a = p.parse_args(argv)
    stats = build(a.root, a.utterances, a.seed, a.per_speaker, a.processes)
    print(json.dumps(stats))
    if a.json:
        a.json.write_text(json.dumps(stats, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
