"""Build a small corpus of real speech for the demo and the benchmarks, from Debian packages only.

- Asterisk's English prompts (asterisk-core-sounds-en-wav: one female speaker, 8 kHz, ~0.4 h) with their
  transcripts (asterisk-core-sounds-en);
- espeak-ng speaking fixed sentences in several voices (22.05 kHz), one folder per voice.

    python -m audiopipe.corpus.demo ./demo/wavs [--espeak-speakers 8] [--espeak-per-speaker 12]

The layout is speaker/utt.wav + utt.txt, so `audiopipe shard --corpus ./demo/wavs` finds speakers and texts.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import soundfile as sf

from audiopipe.errors import AudiopipeError

ASTERISK_SOUNDS = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
ASTERISK_TRANSCRIPTS = Path("/usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz")

# (voice, words per minute, pitch 0-99): different enough in pitch and rate to act as different speakers
ESPEAK_VOICES = (("en-us", 165, 45), ("en-gb", 140, 35), ("en+f3", 175, 70), ("en+m3", 130, 25),
                 ("en-gb-scotland", 150, 55), ("en+f2", 160, 80), ("en-us+m1", 145, 20), ("en-gb+f4", 185, 65))

ESPEAK_SENTENCES = (
    "The quick test sentence fits in a single breath.",
    "A small corpus is enough to check the whole pipeline.",
    "Seven green boxes stood beside the open door.",
    "She counted the boats as they crossed the bay.",
    "Every shard holds a few minutes of speech.",
    "The loader reads the index before anything else.",
    "Please keep the window closed when it rains.",
    "He found the old map under a pile of letters.",
    "Short words and long words share the same batch.",
    "A quiet room makes the recording much cleaner.",
    "The train left the station ten minutes late.",
    "Nine bright lamps lit the narrow street.",
)


class MissingSource(AudiopipeError, RuntimeError):
    pass


def asterisk_transcripts() -> dict[str, str]:
    """{prompt name: text} for the top-level English prompts; [bracketed] entries are tones and are left out."""
    if not ASTERISK_TRANSCRIPTS.is_file():
        raise MissingSource("asterisk-core-sounds-en is not installed (apt-get install asterisk-core-sounds-en)")
    out: dict[str, str] = {}
    with gzip.open(ASTERISK_TRANSCRIPTS, "rt", encoding="utf-8", errors="strict") as f:
        for line in f:
            if line.startswith(";") or ": " not in line:
                continue
            name, text = line.split(": ", 1)
            text = text.strip()
            if "/" in name or not text or text.startswith("["):
                continue
            text = " ".join(re.sub(r"\[[^\]]*\]", " ", text).split())  # "at [@]" -> "at"
            if text and "|" not in text:
                out[name.strip()] = text
    return out


def usable_asterisk_prompts(n: int | None = None, min_s: float = 0.3, max_s: float = 30.0) -> list[tuple[str, str]]:
    """[(name, text)] of spoken prompts within [min_s, max_s]; `n` picks that many, evenly spaced (deterministic)."""
    if not ASTERISK_SOUNDS.is_dir():
        raise MissingSource("asterisk-core-sounds-en-wav is not installed (apt-get install asterisk-core-sounds-en-wav)")
    texts = asterisk_transcripts()
    usable = [(name, texts[name]) for name in sorted(texts)
              if (ASTERISK_SOUNDS / f"{name}.wav").is_file()
              and min_s <= sf.info(str(ASTERISK_SOUNDS / f"{name}.wav")).duration <= max_s]
    if n is not None:
        if n > len(usable):
            raise ValueError(f"asked for {n} asterisk prompts, only {len(usable)} are usable")
        usable = [usable[i * len(usable) // n] for i in range(n)]
    return usable


def place(src: Path, dst: Path, copy: bool) -> None:
    if dst.exists() or dst.is_symlink():
        return
    if copy:
        shutil.copyfile(src, dst)
    else:
        dst.symlink_to(src)


def speak(text: str, voice: str, wpm: int, pitch: int, wav: Path) -> None:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingSource("espeak-ng is not installed (apt-get install espeak-ng)")
    subprocess.run([exe, "-v", voice, "-s", str(wpm), "-p", str(pitch), "-w", str(wav), text],
                   check=True, capture_output=True, timeout=60)


def build_demo_corpus(root: str | Path, espeak_speakers: int = 6, per_speaker: int = 12, copy: bool = False) -> int:
    """Write the demo corpus under root; returns the number of audio files. Idempotent."""
    root = Path(root)
    n = 0
    spk = root / "allison"
    spk.mkdir(parents=True, exist_ok=True)
    for name, text in usable_asterisk_prompts():
        place(ASTERISK_SOUNDS / f"{name}.wav", spk / f"{name}.wav", copy)
        (spk / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
        n += 1
    for k in range(min(espeak_speakers, len(ESPEAK_VOICES))):
        voice, wpm, pitch = ESPEAK_VOICES[k]
        d = root / f"espeak{k}"
        d.mkdir(exist_ok=True)
        for j in range(per_speaker):
            text = ESPEAK_SENTENCES[(k + j) % len(ESPEAK_SENTENCES)]
            wav = d / f"utt{j:03d}.wav"
            if not wav.exists():
                speak(text, voice, wpm, pitch, wav)
            (d / f"utt{j:03d}.txt").write_text(text + "\n", encoding="utf-8")
            n += 1
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="folder to write (created if missing)")
    p.add_argument("--espeak-speakers", type=int, default=6)
    p.add_argument("--espeak-per-speaker", type=int, default=12)
    p.add_argument("--copy", action="store_true", help="copy the Asterisk files instead of symlinking them")
    a = p.parse_args(argv)
    return run_builder("demo corpus", a.root, lambda: build_demo_corpus(a.root, a.espeak_speakers,
                                                                        a.espeak_per_speaker, a.copy))


def run_builder(label: str, root: str | Path, build: Callable[[], int]) -> int:
    """A corpus builder as a command: print how many files it wrote, or one line naming the missing package."""
    try:
        n = build()
    except MissingSource as e:
        print(f"{label}: {e}", file=sys.stderr)
        return 2
    print(f"{label}: {n} files under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
