"""Synthetic speech by espeak-ng: fixed English sentences in several voices (22.05 kHz), for tests and benchmarks.

It is not recorded speech and is not part of the demo corpus (`audiopipe.corpus.demo`, real voices only).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from audiopipe.errors import AudiopipeError

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
    """A Debian package the corpus needs is not installed (the message names it)."""


def speak(text: str, voice: str, wpm: int, pitch: int, wav: Path) -> None:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingSource("espeak-ng is not installed (apt-get install espeak-ng)")
    subprocess.run([exe, "-v", voice, "-s", str(wpm), "-p", str(pitch), "-w", str(wav), text],
                   check=True, capture_output=True, timeout=60)
