"""A ~3.7 h speech corpus for the loader benchmark, from Debian packages only (no network): every English Asterisk
prompt (one real speaker, 8 kHz) and espeak-ng speakers (22.05 kHz) reading Asterisk transcripts joined up to a
log-normal length. Seeded, and a rerun only fills in the files that are missing. The commands (the default corpus
and one of short clips): docs/bench-loader.md.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from audiopipe.corpus.demo import ALLISON, asterisk_transcripts, place_prompts, run_builder, speak

BASE_VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-029", "en-us-nyc", "en-gb-x-rp")
VARIANTS = ("", "+f2", "+m3", "+f4", "+m1", "+f3", "+m7", "+f1")


def speakers(n: int) -> list[tuple[str, int, int]]:
    """n distinct (voice, words per minute, pitch) triples, spread over voices, variants, rates and pitches."""
    out = []
    for k in range(n):
        voice = BASE_VOICES[k % len(BASE_VOICES)] + VARIANTS[(k // len(BASE_VOICES) + k) % len(VARIANTS)]
        out.append((voice, 125 + (k * 37) % 70, 15 + (k * 29) % 75))
    return out


def _utterance_text(texts: list[str], rng: np.random.Generator, max_chars: int, median_chars: float,
                    sigma: float) -> str:
    # espeak-ng reads ~15 characters per second at these rates: 75 characters ~ 5 s, 40 ~ 2.7 s.
    target = min(float(np.exp(rng.normal(np.log(median_chars), sigma))), max_chars)
    parts: list[str] = []
    for i in rng.permutation(len(texts)):
        if sum(len(p) + 1 for p in parts) >= target:
            break
        if sum(len(p) + 1 for p in parts) + len(texts[i]) <= max_chars:
            parts.append(texts[i])
    return " ".join(parts)


def build(root: Path, n_speakers: int, per_speaker: int, median_chars: float, sigma: float, max_chars: int) -> int:
    place_prompts(ALLISON, root / "allison")  # every English Asterisk prompt (real speech)
    texts = sorted(t for t in set(asterisk_transcripts().values()) if len(t) <= min(200, max_chars))
    rng = np.random.default_rng(0)
    work = []
    for k, (voice, wpm, pitch) in enumerate(speakers(n_speakers)):
        d = root / f"voice{k:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for j in range(per_speaker):
            text = _utterance_text(texts, rng, max_chars, median_chars, sigma)
            wav = d / f"u{j:04d}.wav"
            (d / f"u{j:04d}.txt").write_text(text + "\n", encoding="utf-8")
            if not wav.exists():
                work.append((text, voice, wpm, pitch, wav))
    with ThreadPoolExecutor(2) as pool:  # espeak-ng runs as a subprocess: threads are enough
        list(pool.map(lambda w: speak(*w), work))
    return sum(1 for _ in root.rglob("*.wav"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="folder to write (created if missing)")
    p.add_argument("--speakers", type=int, default=24)
    p.add_argument("--per-speaker", type=int, default=64)
    p.add_argument("--median-chars", type=float, default=75.0,
                   help="median characters per espeak utterance (log-normal; ~15 characters per second)")
    p.add_argument("--sigma", type=float, default=0.7, help="spread of the log-normal length, in log space")
    p.add_argument("--max-chars", type=int, default=280, help="longest espeak utterance, in characters")
    a = p.parse_args()
    if a.median_chars <= 0 or a.sigma < 0 or a.max_chars < 1:
        p.error("--median-chars and --max-chars must be positive, --sigma >= 0")
    return run_builder("loader corpus", a.root, lambda: build(Path(a.root), a.speakers, a.per_speaker,
                                                              a.median_chars, a.sigma, a.max_chars))


if __name__ == "__main__":
    sys.exit(main())
