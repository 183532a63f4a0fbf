"""Small Mandarin corpora in the AISHELL-3, Kaldi and Emilia layouts, spoken by espeak-ng's `cmn` voice.

espeak-ng reads the given Chinese text, so every file has a known transcript. Speakers differ by pitch and rate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import soundfile as sf

from audiopipe.corpus.demo import speak

# (characters, tone-numbered pinyin as AISHELL-3 annotates it: one syllable per character)
ZH_SENTENCES = [
    ("今天天气很好", "jin1 tian1 tian1 qi4 hen3 hao3"),
    ("我们去北京", "wo3 men5 qu4 bei3 jing1"),
    ("他不喜欢喝茶", "ta1 bu4 xi3 huan1 he1 cha2"),
    ("一个人在家", "yi2 ge4 ren2 zai4 jia1"),
    ("你好世界", "ni3 hao3 shi4 jie4"),
    ("银行行长来了", "yin2 hang2 hang2 zhang3 lai2 le5"),
]
SPEAKERS = [("SSB0005", 160, 40), ("SSB0011", 190, 70)]  # (id, words per minute, pitch)


def _require_espeak() -> None:
    from sysdeps import require

    require("espeak-ng", present=shutil.which("espeak-ng") is not None)


def say(text: str, wav: Path, wpm: int = 170, pitch: int = 50) -> np.ndarray:
    wav.parent.mkdir(parents=True, exist_ok=True)
    speak(text, "cmn", wpm, pitch, wav)
    return sf.read(str(wav), dtype="float32")[0]


def make_aishell3(root: Path, per_speaker: int = 3) -> dict[str, tuple[str, str, str]]:
    """root/train/{content.txt, wav/<spk>/<spk><nnnn>.wav}; returns {id: (speaker, text, pinyin)}."""
    _require_espeak()
    lines, out = [], {}
    for k, (spk, wpm, pitch) in enumerate(SPEAKERS):
        for j in range(per_speaker):
            text, pinyin = ZH_SENTENCES[(k * per_speaker + j) % len(ZH_SENTENCES)]
            name = f"{spk}{j + 1:04d}.wav"
            say(text, root / "train" / "wav" / spk / name, wpm, pitch)
            lines.append(name + "\t" + " ".join(f"{c} {p}" for c, p in zip(text, pinyin.split())))
            out[f"train/wav/{spk}/{name[:-4]}"] = (spk, text, pinyin)
    (root / "train" / "content.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def make_kaldi(root: Path, sr: int = 22050) -> dict[str, tuple[str, str, int, int]]:
    """Two long recordings of three sentences each (0.5 s of silence between), cut by `segments`.

    Returns {utterance: (recording, text, start frame, end frame)}. wav.scp also lists a command pipe and an
    archive offset (both must be refused), and `segments` one cut of an unlisted recording and one past the end.
    """
    _require_espeak()
    tmp = root / ".parts"
    gap = np.zeros(sr // 2, dtype=np.float32)
    expected = {}
    scp, segs, text, utt2spk = [], [], [], []
    for r, (spk, wpm, pitch) in enumerate(SPEAKERS):
        rec = f"{spk}-rec{r}"
        pieces, pos = [gap], len(gap)
        for j in range(3):
            sentence = ZH_SENTENCES[(r * 3 + j) % len(ZH_SENTENCES)][0]
            wav = say(sentence, tmp / f"{rec}-{j}.wav", wpm, pitch)
            utt = f"{spk}-{rec}-{j}"
            expected[utt] = (rec, sentence, pos, pos + len(wav))
            segs.append(f"{utt} {rec} {pos / sr:.6f} {(pos + len(wav)) / sr:.6f}")
            text.append(f"{utt} {sentence}")
            utt2spk.append(f"{utt} {spk}")
            pieces += [wav, gap]
            pos += len(wav) + len(gap)
        (root / "audio").mkdir(parents=True, exist_ok=True)
        sf.write(str(root / "audio" / f"{rec}.wav"), np.concatenate(pieces), sr, subtype="PCM_16")
        scp.append(f"{rec} audio/{rec}.wav")
    shutil.rmtree(tmp)
    scp += ["piped sox audio/x.flac -t wav - |", "archived data/raw.ark:1234"]
    segs += ["ghost-0 ghost 0.0 1.0", f"late-0 {SPEAKERS[0][0]}-rec0 100.0 101.0"]
    for name, rows in (("wav.scp", scp), ("segments", segs), ("text", text), ("utt2spk", utt2spk)):
        (root / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    return expected


def make_emilia(root: Path) -> dict[str, tuple[str, str, str]]:
    """root/ZH/ZH_B00000.jsonl + MP3s (one English line among them); returns {id: (speaker, text, language)}."""
    _require_espeak()
    batch = root / "ZH" / "ZH_B00000"
    rows, out = [], {}
    items = [(t, "zh") for t, _ in ZH_SENTENCES[:3]] + [("Hello world.", "en")]
    for j, (text, lang) in enumerate(items):
        spk = f"ZH_B00000_S{j % 2:05d}"
        uid = f"{spk}_W{j:06d}"
        wav = say(text, root / ".tmp.wav", 170, 50) if lang == "zh" else None
        if wav is None:
            speak(text, "en-us", 170, 50, root / ".tmp.wav")
            wav = sf.read(str(root / ".tmp.wav"), dtype="float32")[0]
        rel = f"ZH_B00000/{spk}/mp3/{uid}.mp3"
        (root / "ZH" / rel).parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(root / "ZH" / rel), wav, 22050, format="MP3")
        rows.append(json.dumps({"id": uid, "wav": rel, "text": text, "duration": round(len(wav) / 22050, 3),
                                "speaker": spk, "language": lang, "dnsmos": 3.2}, ensure_ascii=False))
        out[uid] = (spk, text, lang)
    (root / ".tmp.wav").unlink()
    rows.append(json.dumps({"id": "ZH_B00000_S00009_W000099", "wav": "ZH_B00000/gone.mp3", "text": "没有",
                            "speaker": "ZH_B00000_S00009", "language": "zh"}, ensure_ascii=False))
    (root / "ZH" / "ZH_B00000.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return out
