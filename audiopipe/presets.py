"""Named bundles of features and front-end steps, one per model family we feed.

A preset is data, not code: the shard job turns it into feature objects through the feature registry, and the
manifest records the exact parameters, so `--preset f5tts` today and in a year give the same config hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audiopipe.errors import InvalidValue


@dataclass(frozen=True)
class Preset:
    description: str
    features: tuple[tuple[str, dict[str, Any]], ...]  # (registry kind, params); params may include "name"
    trim: dict[str, Any] | None = None  # leading/trailing silence trimming before features (NS2)
    phones: bool = False  # offline G2P of the transcript into ARPAbet ids
    codec: bool = False  # EnCodec codec codes (needs --codec-checkpoint or --codec-random-init)
    align_to: str | None = None  # crop/pad same-hop features to this column's length (NS2: "codes")
    transcripts: bool = False  # a text-to-speech model: it trains on the transcript of every utterance


PRESETS: dict[str, Preset] = {
    "f5tts": Preset(
        "F5-TTS: vocos log-mel 100 bins @24 kHz hop 256, transcript.",
        features=(("vocos_mel", {}),),
        transcripts=True,
    ),
    "bigvgan": Preset(
        "BigVGAN/HiFi-GAN: slaney log-mel 80 bins @22.05 kHz hop 256.",
        features=(("slaney_mel", {"name": "mel_slaney"}),),
    ),
    "ns2": Preset(
        "NaturalSpeech2: trimmed audio, EnCodec 16x1024 codes @75 Hz, F0 (interpolated) + voiced + energy at hop 320, ARPAbet phones.",
        features=(
            ("f0", {"sample_rate": 24000, "hop_length": 320, "interpolate": True}),
            ("energy", {"sample_rate": 24000, "hop_length": 320, "n_fft": 1280, "win_length": 1280}),
        ),
        trim={"top_db": 35},
        phones=True,
        codec=True,
        align_to="codes",
        transcripts=True,
    ),
    "eres2net": Preset(
        "3D-Speaker ERes2Net: int16 PCM @16 kHz for random crops, Kaldi fbank 80 (dither 0).",
        features=(("pcm", {"sample_rate": 16000}), ("kaldi_fbank", {})),
    ),
    "campplus": Preset(
        "3D-Speaker CAM++: same data as eres2net.",
        features=(("pcm", {"sample_rate": 16000}), ("kaldi_fbank", {})),
    ),
    "gpt_sovits": Preset(
        "GPT-SoVITS stage 1: ARPAbet phones and int16 PCM @16 kHz (semantic tokens are added by `audiopipe tokens`).",
        features=(("pcm", {"sample_rate": 16000}),),
        phones=True,
        transcripts=True,
    ),
}


def resolve(names: list[str]) -> Preset:
    """Merge presets into one job.

    Identical feature requests collapse into one. Two requests for the same feature kind and column name with
    different parameters are an error (one column cannot hold both). Front-end steps apply to the whole job:
    a preset that trims silence (ns2) trims it before every feature, and its `align_to` crops every same-hop
    feature, so `f5tts,ns2` computes the f5tts mel on the trimmed audio.
    """
    unknown = [n for n in names if n not in PRESETS]
    if unknown:
        raise InvalidValue(f"unknown preset {', '.join(unknown)}; choose from {', '.join(sorted(PRESETS))}")
    feats: list[tuple[str, dict[str, Any]]] = []
    trim = None
    phones = codec = False
    align_to = None
    transcripts = False
    for n in names:
        p = PRESETS[n]
        for f in p.features:
            if f in feats:
                continue
            clash = [g for g in feats if g[0] == f[0] and g[1].get("name") == f[1].get("name")]
            if clash:
                raise InvalidValue(
                    f"presets {', '.join(names)} ask for feature {f[0]!r} twice with different parameters "
                    f"({clash[0][1]} and {f[1]}); shard them into separate folders"
                )
            feats.append(f)
        trim = trim or p.trim
        phones |= p.phones
        codec |= p.codec
        align_to = align_to or p.align_to
        transcripts |= p.transcripts
    return Preset("+".join(names), tuple(feats), trim, phones, codec, align_to, transcripts)
