"""Small English corpora of real speech in the exact layouts other tools release or write: LibriTTS, VCTK 0.92 and
0.80, Common Voice, long recordings cut by segments (NeMo, lhotse), an ESPnet recipe.

The speech is espeak-ng (several voices, known sentences) and Debian's Asterisk prompts (a human speaker),
resampled once to 24 kHz and written as 16-bit audio, so that a shard's `pcm` feature (24 kHz) must equal the
expected int16 samples exactly: every builder returns, per utterance, the samples the shards must hold.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

from audiopipe.corpus.demo import ASTERISK_SOUNDS, ESPEAK_SENTENCES, ESPEAK_VOICES, speak, usable_asterisk_prompts
from audiopipe.features.pcm import float_to_int16

SR = 24000  # LibriTTS's rate, and the rate of `--features pcm` (no resampling between them)


@dataclass(frozen=True)
class Clip:
    voice: str
    text: str
    pcm: np.ndarray  # int16 at 24 kHz


@dataclass
class Expect:
    speaker: str
    text: str
    pcm: np.ndarray  # int16 at 24 kHz: what the shard's pcm column must hold
    extra: dict
    # Largest sample difference allowed: 0, but 1 LSB for MP3, whose float decode by libmpg123 differs in the
    # last bit at a few samples between one whole read and the workers' block-by-block reads.
    tol: int = 0


def _require_espeak() -> None:
    from sysdeps import require

    require("espeak-ng", present=shutil.which("espeak-ng") is not None)


def _pool_pcm(x: np.ndarray, sr: int) -> np.ndarray:
    y = soxr.resample(x.astype(np.float32), sr, SR, "HQ") if sr != SR else x
    return float_to_int16(np.clip(y, -0.99, 0.99))


def speech_pool(tmp: str, voices: int = 3, per_voice: int = 4) -> tuple[tuple[Clip, ...], ...]:
    """[voice][k] clips: espeak-ng voices saying fixed sentences, and one human voice (Asterisk prompts)."""
    _require_espeak()
    out = []
    for v in range(voices):
        voice, wpm, pitch = ESPEAK_VOICES[v]
        clips = []
        for k in range(per_voice):
            text = ESPEAK_SENTENCES[(v * per_voice + k) % len(ESPEAK_SENTENCES)]
            wav = Path(tmp) / f"pool_{v}_{k}.wav"
            speak(text, voice, wpm, pitch, wav)
            x, sr = sf.read(str(wav), dtype="float32")
            clips.append(Clip(voice, text, _pool_pcm(x, sr)))
        out.append(tuple(clips))
    if ASTERISK_SOUNDS.is_dir():
        human = []
        for name, text in usable_asterisk_prompts(per_voice):
            x, sr = sf.read(str(ASTERISK_SOUNDS / f"{name}.wav"), dtype="float32")
            human.append(Clip("allison", text, _pool_pcm(x, sr)))
        out.append(tuple(human))
    return tuple(out)


def write(path: Path, pcm: np.ndarray, fmt: str = "WAV") -> np.ndarray:
    """Write int16 samples at 24 kHz; return the int16 samples a decoder gets back (lossy MP3: its decode)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "MP3":
        sf.write(str(path), pcm.astype(np.float32) / 32768, SR, format="MP3")
        return float_to_int16(sf.read(str(path), dtype="float32")[0])
    sf.write(str(path), pcm, SR, format=fmt, subtype="PCM_16")
    return pcm


# ------------------------------------------------------------------------------------------------ LibriTTS

LIBRITTS_SPEAKERS = (("84", "F", "dev-clean", "121123"), ("174", "M", "dev-clean", "50561"),
                     ("251", "M", "test-clean", "136532"))


def make_libritts(root: Path, pool) -> dict[str, Expect]:
    """LibriTTS's top folder: SPEAKERS.txt and two splits; per chapter the .wav + .normalized.txt +
    .original.txt files, trans.tsv and book.tsv. Ids are the paths from the top folder without extension."""
    lines = [";ID  |SEX| SUBSET           |MINUTES| NAME"]
    out: dict[str, Expect] = {}
    for v, (spk, sex, split, chapter) in enumerate(LIBRITTS_SPEAKERS):
        lines.append(f"{spk:<5}| {sex} | {split:<16} | 25.03 | Reader {spk}")
        folder = root / split / spk / chapter
        trans, book = [], []
        for k, clip in enumerate(pool[v % len(pool)][:3]):
            uid = f"{spk}_{chapter}_{k:06d}_000000"
            pcm = write(folder / f"{uid}.wav", clip.pcm)
            original = f"\u201c{clip.text.upper()}\u201d"
            (folder / f"{uid}.normalized.txt").write_text(clip.text, encoding="utf-8")
            (folder / f"{uid}.original.txt").write_text(original, encoding="utf-8")
            trans.append(f"{uid}\t{original}\t{clip.text}")
            snr = 20.0 + v + k / 10
            book.append(f"{uid}\t{original}\t{clip.text}\ttrue\t{snr}")
            out[f"{split}/{spk}/{chapter}/{uid}"] = Expect(spk, clip.text, pcm, {
                "original_text": original, "gender": sex, "snr": snr})
        (folder / f"{spk}_{chapter}.trans.tsv").write_text("\n".join(trans) + "\n", encoding="utf-8")
        (folder / f"{spk}_{chapter}.book.tsv").write_text("\n".join(book) + "\n", encoding="utf-8")
        (folder / f"._{spk}_{chapter}_000000_000000.wav").write_bytes(b"\x00\x05\x16\x07 mac resource fork")
    (root / "SPEAKERS.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------ VCTK

def make_vctk(root: Path, pool, version: str = "0.92") -> dict[str, dict[str, Expect]]:
    """VCTK 0.92 (FLAC, mic1 and mic2: mic2 holds the same speech at half the level, so the samples tell them
    apart) or 0.80 (wav48/, WAV). p315 has audio but no transcripts, as in 0.92. Returns {mic: {id: Expect}}."""
    speakers = (("p225", "23", "F", "English", "Southern England"), ("p226", "22", "M", "English", "Surrey"),
                ("p315", "23", "M", "American", "Connecticut"))
    info = ["ID  AGE  GENDER  ACCENTS  REGION COMMENTS "]
    out: dict[str, dict[str, Expect]] = {"mic1": {}, "mic2": {}}
    for v, (spk, age, gender, accent, region) in enumerate(speakers):
        sid = spk if version == "0.92" else spk[1:]
        info.append(f"{sid}  {age}  {gender}    {accent}    {region}")
        for k, clip in enumerate(pool[v % len(pool)][:3]):
            sentence = f"{spk}_{k + 1:03d}"
            if spk != "p315":
                (root / "txt" / spk).mkdir(parents=True, exist_ok=True)
                (root / "txt" / spk / f"{sentence}.txt").write_text(clip.text + "\n", encoding="utf-8")
            text = clip.text if spk != "p315" else ""
            extra = {"gender": gender, "age": int(age), "accent": accent, "region": region}
            if version == "0.92":
                for mic, scale in (("mic1", 1.0), ("mic2", 0.5)):
                    pcm = (clip.pcm.astype(np.int32) * scale).astype(np.int16)
                    got = write(root / "wav48_silence_trimmed" / spk / f"{sentence}_{mic}.flac", pcm, "FLAC")
                    out[mic][f"{spk}/{sentence}_{mic}"] = Expect(spk, text, got, extra)
            else:
                got = write(root / "wav48" / spk / f"{sentence}.wav", clip.pcm)
                out["mic1"][f"{spk}/{sentence}"] = Expect(spk, text, got, extra)
    (root / "speaker-info.txt").write_text("\n".join(info) + "\n", encoding="utf-8")
    return out


# ------------------------------------------------------------------------------------------------ Common Voice

CV_COLUMNS = ("client_id", "path", "sentence_id", "sentence", "sentence_domain", "up_votes", "down_votes", "age",
              "gender", "accents", "variant", "locale", "segment")


def make_commonvoice(root: Path, pool) -> dict[str, Expect]:
    """cv-corpus/en/{validated.tsv, clips/*.mp3}: `path` relative to clips/, `sentence`, `client_id`; one
    sentence holds an unbalanced double quote, as Common Voice sentences do."""
    rows, out = [], {}
    n = 0
    for v, clips in enumerate(pool):
        client = f"{v:02d}" + "ab" * 31
        for k, clip in enumerate(clips[:2]):
            name = f"common_voice_en_{1000 + n}.mp3"
            sentence = clip.text if n != 1 else f'He said "{clip.text}'
            pcm = write(root / "clips" / name, clip.pcm, "MP3")
            rows.append([client, name, f"s{n}", sentence, "", "2", "0", "twenties", "female_feminine", "", "",
                         "en", ""])
            out[name[:-4]] = Expect(client, sentence, pcm, {"language": "en", "up_votes": "2"}, tol=1)
            n += 1
    with open(root / "validated.tsv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, escapechar=None, quotechar=None)
        w.writerow(CV_COLUMNS)
        w.writerows(rows)
    return out


# ------------------------------------------------------------------------------------------------ long recordings

@dataclass
class Segment:
    id: str
    recording: str  # recording id
    path: Path
    start: float  # seconds (exact: a multiple of 1 ms)
    duration: float
    text: str
    speaker: str
    pcm: np.ndarray


def make_long(root: Path, pool, recordings: int = 2, gap_s: float = 0.4) -> tuple[dict[str, Path], list[Segment]]:
    """Recordings of three sentences by one voice with gaps between them, and the segments that cut them."""
    gap = np.zeros(int(gap_s * SR), np.int16)
    paths: dict[str, Path] = {}
    segs: list[Segment] = []
    for r in range(recordings):
        clips = pool[r % len(pool)][:3]
        pieces, pos = [gap], len(gap)
        rec = f"rec{r}"
        for j, clip in enumerate(clips):
            pcm = np.concatenate([clip.pcm, np.zeros((-len(clip.pcm)) % (SR // 1000), np.int16)])  # whole milliseconds
            segs.append(Segment(f"{rec}-{j}", rec, root / "long" / f"{rec}.wav", pos / SR, len(pcm) / SR,
                                clip.text, f"voice{r}", pcm))
            pieces += [pcm, gap]
            pos += len(pcm) + len(gap)
        paths[rec] = root / "long" / f"{rec}.wav"
        write(paths[rec], np.concatenate(pieces))
    return paths, segs


def write_nemo(path: Path, segs: list[Segment], base: Path) -> None:
    """A NeMo manifest of the segments (audio_filepath relative to the manifest's folder)."""
    with open(path, "w", encoding="utf-8") as f:
        for s in segs:
            f.write(json.dumps({"audio_filepath": str(s.path.relative_to(base)), "offset": round(s.start, 3),
                                "duration": round(s.duration, 3), "text": s.text, "speaker": s.speaker,
                                "lang": "en", "pnc": "yes"}) + "\n")


# ------------------------------------------------------------------------------------------------ ESPnet

def make_espnet(recipe: Path, pool) -> dict[str, Expect]:
    """egs2/<corpus>/tts1: downloads/ holds the audio, data/train/wav.scp lists it relative to the recipe
    folder (as ESPnet's data prep scripts write it), with text and utt2spk."""
    scp, text, utt2spk, out = [], [], [], {}
    for v, clips in enumerate(pool[:2]):
        for k, clip in enumerate(clips[:2]):
            utt = f"spk{v}_{k:03d}"
            rel = f"downloads/corpus/spk{v}/{utt}.wav"
            pcm = write(recipe / rel, clip.pcm)
            scp.append(f"{utt} {rel}")
            text.append(f"{utt} {clip.text}")
            utt2spk.append(f"{utt} spk{v}")
            out[utt] = Expect(f"spk{v}", clip.text, pcm, {})
    data = recipe / "data" / "train"
    data.mkdir(parents=True, exist_ok=True)
    for name, rows in (("wav.scp", scp), ("text", text), ("utt2spk", utt2spk)):
        (data / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out
