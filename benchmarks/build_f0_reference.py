"""Build the consensus F0 reference that bench_f0.py and tests/test_features_f0.py score trackers against.

    python benchmarks/build_f0_reference.py --pocketsphinx /path/to/pocketsphinx-5.1.1.tar.gz \
        --out tests/data/f0_reference.npz

(the sdist comes from `pip download pocketsphinx==5.1.1 --no-binary :all: --no-deps -d DIR`; its test/ folder
has read speech at 16 kHz). Needs torchcrepe (`pip install 'audiopipe[crepe]'`; it pulls a torchaudio wheel that may
not match your torch: `pip uninstall torchaudio` then, this script stands in for it), praat-parselmouth, espeak-ng
and asterisk-core-sounds-en-wav (`make sysdeps`). With --stride 3 CREPE costs ~4 min of CPU.

Material (every clip resampled to 24 kHz with soxr; frames at hop 320, i.e. t * 320 / 24000 s, the NS2 framing):
  * Asterisk prompts (one woman, 8 kHz telephone recordings);
  * pocketsphinx test audio (read speech from several recordings, 16 kHz);
  * espeak-ng sentences in eight voices, four male and four female, statements and questions.
Each clip is in split "in" (trackers may be tuned on it) or "out" (never tuned on); the two splits share no
espeak voice, no pocketsphinx file and no Asterisk prompt.

Reference, per frame: Praat autocorrelation 50-1100 Hz (the audiopipe "praat" backend) and CREPE `full` (torchcrepe,
Viterbi decoding, voiced where periodicity >= 0.21, a threshold commonly used with torchcrepe). Where both are
voiced and agree within 5 %, the frame is voiced with F0 = their geometric mean; where both are unvoiced, it is
unvoiced; every other frame is left out of the scoring (mask 0). CREPE runs on every third frame only (--stride 3;
~0.13 s of CPU per frame on the shared 2-core VM), so only those frames can be in the reference: a systematic
sample, every 40 ms.
Frames more than 60 dB below the clip's loudest frame are not sent to CREPE and count as CREPE-unvoiced (in the
spirit of torchcrepe's Silence(-60) threshold, which zeroes periodicity below -60 dB loudness). The raw Praat and
CREPE tracks are stored too, so the rule can be changed without running CREPE again, and --crepe-from OLD.npz
rebuilds a reference with a new Praat half (e.g. after a change to the "praat" backend) from the CREPE tracks stored
in OLD.npz, running CREPE only on the clips OLD.npz lacks (none: no torchcrepe needed). Both halves are framed on t * 320 / 24000 s exactly (the "praat" backend pads
so that Praat's own frame grid falls on those times).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tarfile
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))

SR, HOP = 24000, 320  # NaturalSpeech 2 framing
FMIN, FMAX = 50.0, 1100.0
AGREE = 0.05  # relative F0 agreement for a voiced consensus frame
CREPE_VOICED = 0.21  # periodicity threshold commonly used with torchcrepe (with a -60 dB silence gate)
CREPE_SILENCE_DB = -60.0

ASTERISK = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
ASTERISK_IN = ("auth-incorrect", "agent-loginok", "vm-next", "hello-world", "conf-getpin", "queue-thankyou")
ASTERISK_OUT = ("agent-pass", "conf-kicked", "vm-goodbye", "vm-savedto", "queue-callswaiting", "conf-placeintoconf")
PS_DIR = "pocketsphinx-5.1.1/test/"
# (member under PS_DIR, sample rate for headerless .raw, split)
POCKETSPHINX = (("data/goforward.raw", 16000, "in"), ("data/cards/002.wav", 0, "in"),
                ("data/librivox/sense_and_sensibility_01_austen_64kb-0880.wav", 0, "in"),
                ("data/something.raw", 16000, "out"), ("data/tidigits/dhd.2934z.raw", 16000, "out"),
                ("data/cards/005.wav", 0, "out"))
# (voice, wpm, pitch 0-99, sex, split)
ESPEAK_VOICES = (("en-us", 160, 40, "m", "in"), ("en-gb+m3", 140, 30, "m", "in"), ("en+f3", 170, 65, "f", "in"),
                 ("en-us+f2", 155, 75, "f", "in"),
                 ("en-us+m1", 150, 20, "m", "out"), ("en-gb-scotland", 150, 50, "m", "out"),
                 ("en-gb+f4", 175, 60, "f", "out"), ("en+f5", 160, 85, "f", "out"))
ESPEAK_TEXTS = ("Where did you put the keys? They were on the table.",
                "Seven green boxes stood beside the open door, waiting for the morning train.",
                "Is it really going to rain all weekend?")


@dataclass(frozen=True)
class Clip:
    source: str  # asterisk | pocketsphinx | espeak
    ident: str  # file stem / member path / espeak voice
    split: str  # in | out
    sex: str  # f | m | ?
    text: str = ""  # espeak only
    wpm: int = 0
    pitch: int = 0

    @property
    def name(self) -> str:
        return f"{self.source}:{self.ident}" + (f":{ESPEAK_TEXTS.index(self.text)}" if self.text else "")


def clips() -> list[Clip]:
    """Held-in clips first, then held-out (one espeak sentence per voice: CREPE on CPU is the cost)."""
    out = []
    for split in ("in", "out"):
        out += [Clip("asterisk", n, split, "f") for n in (ASTERISK_IN if split == "in" else ASTERISK_OUT)]
        out += [Clip("pocketsphinx", m, s, "?") for m, _, s in POCKETSPHINX if s == split]
        out += [Clip("espeak", v, s, sex, ESPEAK_TEXTS[0 if s == "in" else 2], wpm, pitch)
                for v, wpm, pitch, sex, s in ESPEAK_VOICES if s == split]
    return out


def load(clip: Clip, pocketsphinx: Path | None) -> np.ndarray:
    """The clip as float32 mono at 24 kHz."""
    if clip.source == "asterisk":
        x, sr = sf.read(ASTERISK / f"{clip.ident}.wav", dtype="float32")
    elif clip.source == "espeak":
        from audiopipe.corpus.demo import speak

        with tempfile.TemporaryDirectory() as d:
            speak(clip.text, clip.ident, clip.wpm, clip.pitch, Path(d) / "a.wav")
            x, sr = sf.read(Path(d) / "a.wav", dtype="float32")
    else:
        if pocketsphinx is None:
            raise FileNotFoundError("pocketsphinx clips need --pocketsphinx SDIST.tar.gz")
        rate = dict((m, r) for m, r, _ in POCKETSPHINX)[clip.ident]
        with tarfile.open(pocketsphinx) as tf:
            data = tf.extractfile(PS_DIR + clip.ident).read()
        if rate:  # headerless 16-bit little-endian mono
            x, sr = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0, rate
        else:
            import io

            x, sr = sf.read(io.BytesIO(data), dtype="float32")
    if x.ndim > 1:
        x = x.mean(axis=1)
    return soxr.resample(x, sr, SR).astype(np.float32) if sr != SR else x.astype(np.float32)


def audio_digest(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x, np.float32).tobytes()).hexdigest()[:16]


def _stub_torchaudio() -> None:
    # torchcrepe imports torchaudio at import time, only for its file loader (which we do not use); the torchaudio
    # wheels do not match this CPU torch build, so a stand-in module is enough.
    if "torchaudio" not in sys.modules:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")


def crepe_track(x24: np.ndarray, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(f0 Hz, periodicity) of CREPE full at the frame centres t * HOP / SR, for every stride-th frame (the others
    are NaN); silent frames get periodicity 0. Viterbi decoding runs over the analysed frames only."""
    _stub_torchaudio()
    import torch
    import torchcrepe

    torch.set_num_threads(1)
    x = soxr.resample(x24, SR, 16000).astype(np.float32)
    T_all = len(x24) // HOP + 1
    picked = np.arange(0, T_all, stride)
    T = len(picked)
    centres = np.rint(picked * HOP * 16000 / SR).astype(np.int64)
    xp = np.concatenate([np.zeros(512, np.float32), x, np.zeros(512, np.float32)])
    frames = np.stack([xp[c : c + 1024] for c in centres]).astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)
    rms = np.sqrt((frames**2).mean(axis=1))
    loud = 20 * np.log10(rms / max(rms.max(), 1e-12) + 1e-12) > CREPE_SILENCE_DB
    frames /= np.maximum(frames.std(axis=1, keepdims=True), 1e-10)
    probs = torch.zeros(T, 360)
    with torch.no_grad():
        idx = np.flatnonzero(loud)
        for i in range(0, len(idx), 256):
            sel = idx[i : i + 256]
            probs[sel] = torchcrepe.infer(torch.from_numpy(frames[sel]).float(), "full")
    pitch, periodicity = torchcrepe.postprocess(probs.T[None], FMIN, FMAX, torchcrepe.decode.viterbi,
                                                return_periodicity=True)
    per = periodicity[0].numpy().astype(np.float32)
    per[~loud] = 0.0
    f0_all = np.full(T_all, np.nan, np.float32)
    per_all = np.full(T_all, np.nan, np.float32)
    f0_all[picked], per_all[picked] = pitch[0].numpy(), per
    return f0_all, per_all


def praat_track(x24: np.ndarray) -> np.ndarray:
    from audiopipe.features.f0 import F0

    return F0(sample_rate=SR, hop_length=HOP, fmin=FMIN, fmax=FMAX, backend="praat")(x24)["f0"]


def consensus(praat: np.ndarray, crepe: np.ndarray, periodicity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ref_f0, mask): ref_f0 > 0 voiced, 0 unvoiced; mask 1 where Praat 50-1100 and CREPE agree."""
    ran = ~np.isnan(periodicity)
    pv, cv = praat > 0, ran & (np.nan_to_num(periodicity) >= CREPE_VOICED)
    agree_v = pv & cv & (np.abs(crepe / np.where(pv, praat, 1.0) - 1.0) <= AGREE)
    mask = ran & (agree_v | (~pv & ~cv))
    ref = np.where(agree_v, np.sqrt(np.abs(praat * crepe)), 0.0).astype(np.float32)
    return ref, mask.astype(np.uint8)


def _stored_crepe(path: Path, material: str, stride: int) -> dict:
    """{(clip name, audio digest): (crepe f0, periodicity)} from an earlier reference file of this material and
    stride."""
    z = np.load(path, allow_pickle=False)
    stored = str(z["material"]) if "material" in z.files else "prompts"  # the first files did not name it
    if stored != material or int(z["stride"]) != stride:
        sys.exit(f"build_f0_reference: {path} holds --material {stored} --stride {int(z['stride'])}, "
                 f"not {material} / {stride}")
    b = np.concatenate([[0], np.cumsum(z["frames"])])
    if material == "prompts":
        # Clip.name of the prompts set: source:ident, plus :text index for espeak sentences
        names = [f"{s}:{i}" + (f":{ESPEAK_TEXTS.index(str(t))}" if str(t) else "")
                 for s, i, t in zip(z["source"], z["ident"], z["text"])]
    else:
        names = [str(i) for i in z["ident"]]
    return {(n, str(d)): (z["crepe"][b[k] : b[k + 1]], z["periodicity"][b[k] : b[k + 1]])
            for k, (n, d) in enumerate(zip(names, z["digest"]))}


def read_clips() -> list:
    """The real read speech set (benchmarks/f0_speech.py), dev sources first, then test."""
    import f0_speech

    return sorted(f0_speech.CLIPS, key=lambda c: c.split != "dev")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--material", choices=("prompts", "read"), default="prompts",
                   help="prompts: Asterisk + pocketsphinx + espeak-ng (the first set); read: the real read speech of "
                        "benchmarks/f0_speech.py (15 sources, dev/test split by source)")
    p.add_argument("--pocketsphinx", type=Path, default=None, help="pocketsphinx-5.1.1.tar.gz (sdist; --material prompts)")
    p.add_argument("--speech-cache", type=Path, default=None,
                   help="folder of the PyPI archives of the read set (python benchmarks/f0_speech.py fetch --cache DIR)")
    p.add_argument("--out", type=Path, default=None,
                   help="default tests/data/f0_reference.npz (prompts) or tests/data/f0_reference_read.npz (read)")
    p.add_argument("--stride", type=int, default=3,
                   help="run CREPE on every STRIDE-th frame only; the others are left out of the reference (mask 0)")
    p.add_argument("--cache", type=Path, default=None,
                   help="folder for per-clip CREPE tracks (keyed by the audio's digest), so a rerun skips CREPE")
    p.add_argument("--crepe-from", type=Path, default=None,
                   help="an earlier reference .npz of the same material: reuse its stored CREPE tracks (clip by clip, "
                        "checked by the audio's digest and the stride) and recompute only the Praat half and the "
                        "consensus; CREPE runs only on clips it lacks (new material)")
    a = p.parse_args(argv)
    if a.out is None:
        a.out = Path("tests/data/f0_reference.npz" if a.material == "prompts" else "tests/data/f0_reference_read.npz")
    if a.material == "prompts" and a.pocketsphinx is None:
        p.error("--material prompts needs --pocketsphinx")
    stored = _stored_crepe(a.crepe_from, a.material, a.stride) if a.crepe_from else None
    cols: dict[str, list] = {k: [] for k in ("praat", "crepe", "periodicity", "ref", "mask")}
    if a.material == "prompts":
        keys = ("source", "ident", "split", "sex", "text", "wpm", "pitch")
        items = [(c, c.name, lambda c=c: load(c, a.pocketsphinx), {k: getattr(c, k) for k in keys}) for c in clips()]
    else:
        import f0_speech

        items = [(c, c.name, lambda c=c: f0_speech.load(c, a.speech_cache),
                  {"source": c.source.name, "ident": c.name, "split": c.split, "speakers": c.source.speakers,
                   "language": c.source.language, "condition": c.source.condition, "package": c.source.package,
                   "version": c.source.version, "path": c.path, "sha256": c.sha256, "start_s": c.start_s,
                   "dur_s": c.dur_s}) for c in read_clips()]
    meta: dict[str, list] = {k: [] for k in [*items[0][3], "digest", "frames"]}
    t0 = time.time()
    for _, name, loader, info in items:
        x = loader()
        praat = praat_track(x)
        cached = a.cache / f"{audio_digest(x)}-s{a.stride}.npz" if a.cache else None
        if stored is not None and (name, audio_digest(x)) in stored:
            crepe, per = stored[name, audio_digest(x)]
        elif cached is not None and cached.is_file():
            with np.load(cached) as z:
                crepe, per = z["crepe"], z["periodicity"]
        else:
            crepe, per = crepe_track(x, a.stride)
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                np.savez(cached, crepe=crepe, periodicity=per)
        ref, mask = consensus(praat, crepe, per)
        for k, v in zip(cols, (praat, crepe, per, ref, mask)):
            cols[k].append(v)
        for k, v in info.items():
            meta[k].append(v)
        meta["digest"].append(audio_digest(x))
        meta["frames"].append(len(praat))
        print(f"{name:70s} {len(x) / SR:5.2f} s  consensus {mask.mean():5.1%}  voiced {(ref > 0).mean():5.1%}"
              f"  [{time.time() - t0:5.0f} s]", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        a.out, **{k: np.concatenate(v) for k, v in cols.items()},
        **{k: np.array(v) for k, v in meta.items()},
        sample_rate=SR, hop_length=HOP, stride=a.stride, fmin=FMIN, fmax=FMAX, agree=AGREE, crepe_voiced=CREPE_VOICED,
        material=a.material,
    )
    print(f"wrote {a.out} ({a.out.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
