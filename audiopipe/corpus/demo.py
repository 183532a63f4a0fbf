"""Build a small corpus of real recorded speech for the demo and the benchmarks, from Debian packages only.

Three speakers, three languages: the Asterisk telephone prompts read by Allison (US English), Carlo (Italian)
and a Russian speaker (ivrvoice), 8 kHz, with their transcripts (the packages' core-sounds-<lang>.txt). By
default 140 prompts a voice, evenly spaced over each voice's list (about 0.37 h); `--per-voice 0` takes every
usable prompt (about 0.9 h). Nothing is synthesized. (June's Canadian French prompts are not used: their
transcripts' package, asterisk-core-sounds-fr, conflicts with asterisk-prompt-fr-armelle, which the F0 tests
read.)

    python -m audiopipe.corpus.demo ./demo/wavs [--per-voice 140] [--copy]

The layout is speaker/utt.wav + utt.txt, so `audiopipe shard --corpus ./demo/wavs` finds speakers and texts.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import soundfile as sf

# espeak-ng synthesis lives in audiopipe.corpus.synthetic (tests and benchmarks); these names stay importable here.
from audiopipe.corpus.synthetic import ESPEAK_SENTENCES, ESPEAK_VOICES, MissingSource, speak  # noqa: F401
from audiopipe.errors import InvalidValue

SOUNDS = Path("/usr/share/asterisk/sounds")
DOCS = Path("/usr/share/doc")


@dataclass(frozen=True)
class Voice:
    """One recorded Asterisk voice: its folder of WAV prompts and the Debian packages of audio and transcripts."""
    speaker: str  # folder name in the demo corpus
    folder: str  # under /usr/share/asterisk/sounds
    lang: str  # core-sounds-<lang>.txt

    @property
    def sounds(self) -> Path:
        return SOUNDS / self.folder

    @property
    def transcripts(self) -> Path:
        return DOCS / f"asterisk-core-sounds-{self.lang}" / f"core-sounds-{self.lang}.txt.gz"

    @property
    def packages(self) -> tuple[str, str]:
        return f"asterisk-core-sounds-{self.lang}-wav", f"asterisk-core-sounds-{self.lang}"


ALLISON = Voice("en_allison", "en_US_f_Allison", "en")
VOICES = (ALLISON, Voice("it_carlo", "it_IT_m_Carlo", "it"), Voice("ru_ivrvoice", "ru_RU_f_IvrvoiceRU", "ru"))
PER_VOICE = 140

ASTERISK_SOUNDS = ALLISON.sounds  # the English prompts, which most tests read
ASTERISK_TRANSCRIPTS = ALLISON.transcripts


def asterisk_transcripts(voice: Voice = ALLISON) -> dict[str, str]:
    """{prompt name: text} for a voice's top-level prompts; [bracketed] entries are tones and are left out."""
    if not voice.transcripts.is_file():
        raise MissingSource(f"{voice.packages[1]} is not installed (apt-get install {voice.packages[1]})")
    out: dict[str, str] = {}
    with gzip.open(voice.transcripts, "rt", encoding="utf-8-sig", errors="strict") as f:
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


def usable_asterisk_prompts(n: int | None = None, min_s: float = 0.3, max_s: float = 30.0,
                            voice: Voice = ALLISON) -> list[tuple[str, str]]:
    """[(name, text)] of a voice's spoken prompts within [min_s, max_s]; `n` picks that many, evenly spaced."""
    if not voice.sounds.is_dir():
        raise MissingSource(f"{voice.packages[0]} is not installed (apt-get install {voice.packages[0]})")
    texts = asterisk_transcripts(voice)
    usable = [(name, texts[name]) for name in sorted(texts)
              if (voice.sounds / f"{name}.wav").is_file()
              and min_s <= sf.info(str(voice.sounds / f"{name}.wav")).duration <= max_s]
    if n is not None:
        if n > len(usable):
            raise InvalidValue(f"asked for {n} prompts of {voice.folder}, only {len(usable)} are usable")
        usable = [usable[i * len(usable) // n] for i in range(n)]
    return usable


def place(src: Path, dst: Path, copy: bool) -> None:
    if dst.exists() or dst.is_symlink():
        return
    if copy:
        shutil.copyfile(src, dst)
    else:
        dst.symlink_to(src)


def place_prompts(voice: Voice, folder: Path, n: int | None = None, copy: bool = False) -> int:
    """A voice's usable prompts (n evenly spaced, or all) as folder/<prompt>.wav + .txt; returns how many."""
    prompts = usable_asterisk_prompts(n, voice=voice)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in prompts:
        place(voice.sounds / f"{name}.wav", folder / f"{name}.wav", copy)
        (folder / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    return len(prompts)


def build_demo_corpus(root: str | Path, per_voice: int | None = PER_VOICE, copy: bool = False,
                      voices: tuple[Voice, ...] = VOICES) -> int:
    """Write the demo corpus under root (one folder per speaker); returns the number of audio files. Idempotent.

    per_voice=None takes every usable prompt of each voice. Every voice's packages are checked first, so a missing
    one is named before anything is written.
    """
    root = Path(root)
    missing = [p for v in voices for p, path in zip(v.packages, (v.sounds, v.transcripts)) if not path.exists()]
    if missing:
        raise MissingSource(f"not installed: {' '.join(missing)} (apt-get install {' '.join(missing)}, "
                            "or `make sysdeps`)")
    return sum(place_prompts(v, root / v.speaker, per_voice, copy) for v in voices)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", help="folder to write (created if missing)")
    p.add_argument("--per-voice", type=int, default=PER_VOICE,
                   help=f"prompts per voice, evenly spaced (default {PER_VOICE}); 0 takes all of them")
    p.add_argument("--copy", action="store_true", help="copy the Asterisk files instead of symlinking them")
    a = p.parse_args(argv)
    if a.per_voice < 0:
        p.error(f"--per-voice must be 0 or more, got {a.per_voice}")
    return run_builder("demo corpus", a.root, lambda: build_demo_corpus(a.root, a.per_voice or None, a.copy))


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
