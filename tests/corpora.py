"""Builders of small test corpora. Plain functions: each writes files under `dir` and returns what to expect.

Used through the session fixtures in tests/conftest.py (`synthetic_corpus`, `broken_corpus`, `asterisk_corpus`,
`espeak_corpus`); call them directly to build a corpus somewhere else (benchmarks, demos).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from audiopipe.corpus.demo import (ASTERISK_SOUNDS, ESPEAK_SENTENCES, ESPEAK_VOICES, place, speak,
                                   usable_asterisk_prompts)


@dataclass(frozen=True)
class ExpectedUtt:
    """What discovery should report for one built file, plus what is known about its signal.

    f0/f0_end: fundamental frequency in Hz at onset/offset (equal for a steady tone, linear in between for a
    chirp, None for speech). onset/offset: seconds where the tone starts/ends (digital silence outside).
    """

    id: str
    speaker: str
    text: str
    sample_rate: int
    num_samples: int
    kind: str  # "tone", "chirp", "speech"
    f0: float | None = None
    f0_end: float | None = None
    onset: float | None = None
    offset: float | None = None
    voice: str | None = None  # espeak-ng voice for "speech" from make_espeak_corpus

    @property
    def duration(self) -> float:
        return self.num_samples / self.sample_rate


@dataclass(frozen=True)
class BuiltCorpus:
    """A corpus on disk: its root and the expected utterances, sorted by id."""

    root: Path
    utterances: list[ExpectedUtt]

    def by_id(self) -> dict[str, ExpectedUtt]:
        return {u.id: u for u in self.utterances}


@dataclass(frozen=True)
class BrokenCorpus:
    """A folder of odd files: {file name: expected reject reason, or None for a file that must decode}."""

    root: Path
    expected: dict[str, str | None]


# ---------------------------------------------------------------------------------------------------------------
# synthetic tones and chirps

_PAD = 0.15  # seconds of digital silence before and after each signal, so that trimming has work to do
_FADE = 0.01


def harmonic_tone(f0: float, seconds: float, sr: int, harmonics: int = 5, peak: float = 0.5) -> np.ndarray:
    """A voice-like steady tone: f0 plus harmonics at 1/k amplitude, 10 ms fades, padded with silence."""
    t = np.arange(int(round(seconds * sr))) / sr
    x = sum((1.0 / k) * np.sin(2 * np.pi * k * f0 * t) for k in range(1, harmonics + 1)
            if k * f0 < sr / 2)
    return _finish(np.asarray(x), sr, peak)


def linear_chirp(f_start: float, f_end: float, seconds: float, sr: int, peak: float = 0.5) -> np.ndarray:
    """A sine whose frequency moves linearly from f_start to f_end, padded like harmonic_tone."""
    t = np.arange(int(round(seconds * sr))) / sr
    phase = 2 * np.pi * (f_start * t + 0.5 * (f_end - f_start) / seconds * t**2)
    return _finish(np.sin(phase), sr, peak)


def _finish(x: np.ndarray, sr: int, peak: float) -> np.ndarray:
    n_fade = int(_FADE * sr)
    ramp = np.linspace(0.0, 1.0, n_fade)
    x = x.copy()
    x[:n_fade] *= ramp
    x[-n_fade:] *= ramp[::-1]
    x = x / np.max(np.abs(x)) * peak
    pad = np.zeros(int(round(_PAD * sr)))
    return np.concatenate([pad, x, pad]).astype(np.float32)


# (speaker folder, sample rate, tone F0s); each speaker is an LJSpeech-style folder with its own metadata.csv
_SYNTH_SPEAKERS = (("spk_a", 16000, (100.0, 120.0, 140.0)),
                   ("spk_b", 22050, (180.0, 200.0, 220.0)),
                   ("spk_c", 24000, (250.0, 280.0, 310.0)))
_CHIRPS = ((16000, 100.0, 300.0), (16000, 300.0, 150.0), (48000, 120.0, 480.0))


def make_synthetic_corpus(dir: str | os.PathLike[str]) -> list[ExpectedUtt]:
    """Tones of known F0 for three speakers (LJSpeech folders) and chirps with sidecar .txt transcripts.

    Layout: <dir>/spk_x/metadata.csv (id|text|normalized) + <dir>/spk_x/wavs/tone_<f0>.wav, and
    <dir>/chirps/chirp_<a>_<b>.wav + .txt. Ids are e.g. "spk_a/wavs/tone_100", speaker "spk_a"; the expected
    text is the normalized column. Returns the expected utterances sorted by id.
    """
    root = Path(dir)
    out: list[ExpectedUtt] = []
    for i, (spk, sr, f0s) in enumerate(_SYNTH_SPEAKERS):
        wavs = root / spk / "wavs"
        wavs.mkdir(parents=True, exist_ok=True)
        lines = []
        for j, f0 in enumerate(f0s):
            seconds = 0.8 + 0.25 * ((i + j) % 3)  # a few different lengths for bucketing
            name = f"tone_{int(f0)}"
            x = harmonic_tone(f0, seconds, sr)
            sf.write(wavs / f"{name}.wav", x, sr, subtype="PCM_16")
            text = f"tone {int(f0)} hertz"
            lines.append(f"{name}|Tone {int(f0)} Hz.|{text}")
            out.append(ExpectedUtt(f"{spk}/wavs/{name}", spk, text, sr, len(x), "tone", f0, f0,
                                   _PAD, _PAD + seconds))
        (root / spk / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    chirps = root / "chirps"
    chirps.mkdir(parents=True, exist_ok=True)
    for sr, a, b in _CHIRPS:
        name = f"chirp_{int(a)}_{int(b)}_{sr // 1000}k"
        seconds = 1.2
        x = linear_chirp(a, b, seconds, sr)
        sf.write(chirps / f"{name}.wav", x, sr, subtype="PCM_16")
        text = f"a chirp from {int(a)} to {int(b)} hertz"
        (chirps / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
        out.append(ExpectedUtt(f"chirps/{name}", "chirps", text, sr, len(x), "chirp", a, b, _PAD, _PAD + seconds))
    return sorted(out, key=lambda u: u.id)


# ---------------------------------------------------------------------------------------------------------------
# broken and odd files


def make_broken_files(dir: str | os.PathLike[str]) -> dict[str, str | None]:
    """Files that must each be refused with a known reason (or, for None, decoded fine) under DecodeLimits().

    The reason is the first refusal met along discover() -> check_header(utt) -> load_audio(path). Every file
    stem is distinct, so no file is a duplicate_id of another. Valid files hold a 1 s 200 Hz tone (1.3 s in all).
    """
    root = Path(dir)
    root.mkdir(parents=True, exist_ok=True)
    sr = 16000
    tone = harmonic_tone(200.0, 1.0, sr)  # 1.3 s with padding
    expected: dict[str, str | None] = {}

    def wav(name: str, data: np.ndarray, rate: int = sr, reason: str | None = None, **kw) -> None:
        sf.write(root / name, data, rate, **kw)
        expected[name] = reason

    (root / "empty.wav").write_bytes(b"")
    expected["empty.wav"] = "empty"
    wav("no_frames.wav", np.zeros(0, np.float32), reason="empty", subtype="PCM_16")
    (root / "not_audio.wav").write_bytes(b"this is a text file pretending to be a wave file\n" * 20)
    expected["not_audio.wav"] = "unreadable"
    (root / "random_bytes.flac").write_bytes(np.random.default_rng(0).integers(0, 256, 4096, np.uint8).tobytes())
    expected["random_bytes.flac"] = "unreadable"
    (root / "riff_only.wav").write_bytes(b"RIFF")
    expected["riff_only.wav"] = "unreadable"

    # Truncated: the header declares 1.3 s of frames, the file holds about half of them.
    sf.write(root / "full.tmp.wav", tone, sr, subtype="PCM_16")
    data = (root / "full.tmp.wav").read_bytes()
    (root / "truncated_wav.wav").write_bytes(data[: len(data) // 2])
    expected["truncated_wav.wav"] = "truncated"
    (root / "full.tmp.wav").unlink()
    sf.write(root / "full.tmp.flac", tone, sr)
    data = (root / "full.tmp.flac").read_bytes()
    (root / "truncated_flac.flac").write_bytes(data[: len(data) // 2])
    expected["truncated_flac.flac"] = "truncated"
    (root / "full.tmp.flac").unlink()

    bad = tone.copy()
    bad[1000] = np.nan
    wav("nan.wav", bad, reason="nan_inf", subtype="FLOAT")
    bad = tone.copy()
    bad[2000] = np.inf
    wav("inf.wav", bad, reason="nan_inf", subtype="FLOAT")
    wav("silent.wav", np.zeros(sr, np.float32), reason="silent", subtype="PCM_16")
    wav("quiet_-70dBFS.wav", (tone / 0.5 * 10 ** (-70 / 20)).astype(np.float32), reason="silent", subtype="FLOAT")
    wav("too_short.wav", tone[int(0.3 * sr): int(0.4 * sr)], reason="too_short", subtype="PCM_16")
    wav("too_long.wav", np.tile(harmonic_tone(200.0, 1.0, 4000), 25), rate=4000, reason="too_long",
        subtype="PCM_16")  # 32.5 s at 4 kHz: refused from the header, never decoded
    wav("sample_rate_1hz.wav", tone[:100], rate=1, reason="bad_sample_rate", subtype="PCM_16")
    wav("sample_rate_400khz.wav", tone, rate=400000, reason="bad_sample_rate", subtype="PCM_16")
    wav("six_channels.wav", np.stack([tone] * 6, axis=1), reason="too_many_channels", subtype="PCM_16")

    wav("valid_wav.wav", tone, subtype="PCM_16")
    wav("valid_stereo.wav", np.stack([tone, 0.5 * tone], axis=1), subtype="PCM_16")
    wav("valid_float.wav", tone, subtype="FLOAT")
    wav("valid_flac.flac", tone)
    wav("valid_vorbis.ogg", tone, format="OGG", subtype="VORBIS")
    wav("valid_opus.opus", harmonic_tone(200.0, 1.0, 48000), rate=48000, format="OGG", subtype="OPUS")
    try:
        wav("valid_mp3.mp3", tone, format="MP3", subtype="MPEG_LAYER_III")
    except (RuntimeError, TypeError, ValueError):  # this libsndfile cannot write MP3: leave it out
        (root / "valid_mp3.mp3").unlink(missing_ok=True)
        expected.pop("valid_mp3.mp3", None)
    wav("valid_aiff.aiff", tone, format="AIFF", subtype="PCM_16")
    (root / "notes.txt").write_text("not audio and not a sidecar of anything: discovery ignores it\n")
    return expected


# ---------------------------------------------------------------------------------------------------------------
# real speech: Asterisk prompts (one female speaker, 8 kHz)


def make_asterisk_corpus(dir: str | os.PathLike[str], n: int | None = None,
                         copy: bool = False) -> list[ExpectedUtt]:
    """Real speech in an LJSpeech layout: <dir>/metadata.csv (name|text) and <dir>/wavs/<name>.wav symlinks.

    Only prompts with a spoken transcript and a duration inside DecodeLimits() (0.3-30 s) are used; `n` picks
    that many, evenly spaced over the sorted names (deterministic). Ids are "wavs/<name>", speaker "".
    copy=True copies the files instead of linking them (for a corpus that must travel to another machine).
    """
    from sysdeps import require

    require("asterisk-core-sounds-en-wav", "asterisk-core-sounds-en")
    usable = [(name, text, sf.info(str(ASTERISK_SOUNDS / f"{name}.wav"))) for name, text in usable_asterisk_prompts(n)]
    root = Path(dir)
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    out = []
    lines = []
    for name, text, info in usable:
        place(ASTERISK_SOUNDS / f"{name}.wav", root / "wavs" / f"{name}.wav", copy)
        lines.append(f"{name}|{text}")
        out.append(ExpectedUtt(f"wavs/{name}", "", text, info.samplerate, info.frames, "speech"))
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------------------------------
# multi-speaker synthetic speech: espeak-ng voices (22.05 kHz)

def make_espeak_corpus(dir: str | os.PathLike[str], speakers: int = 4, per_speaker: int = 6) -> list[ExpectedUtt]:
    """Speech by espeak-ng: <dir>/<speaker>/<utt>.wav with a sidecar <utt>.txt (skips if espeak-ng is missing).

    Speaker k uses ESPEAK_VOICES[k] (rate and pitch vary too) and sentences starting at offset k, so texts differ
    between speakers. Ids are "spk<k>/utt<j>", speakers "spk<k>". Returns the expected utterances by id.
    """
    from sysdeps import require

    require("espeak-ng", present=shutil.which("espeak-ng") is not None)
    if not 1 <= speakers <= len(ESPEAK_VOICES):
        raise ValueError(f"speakers must be in 1..{len(ESPEAK_VOICES)}, got {speakers}")
    root = Path(dir)
    out = []
    for k in range(speakers):
        voice, wpm, pitch = ESPEAK_VOICES[k]
        spk = f"spk{k}"
        (root / spk).mkdir(parents=True, exist_ok=True)
        for j in range(per_speaker):
            text = ESPEAK_SENTENCES[(k + j) % len(ESPEAK_SENTENCES)]
            wav = root / spk / f"utt{j:03d}.wav"
            speak(text, voice, wpm, pitch, wav)
            (root / spk / f"utt{j:03d}.txt").write_text(text + "\n", encoding="utf-8")
            info = sf.info(str(wav))
            out.append(ExpectedUtt(f"{spk}/utt{j:03d}", spk, text, info.samplerate, info.frames, "speech",
                                   voice=voice))
    return sorted(out, key=lambda u: u.id)
