"""Per-phone BERT features for GPT-SoVITS stage 1 on Chinese text: float16 [1024, P], one column per phone.

What GPT-SoVITS's data preparation (`prepare_datasets/1-get-text.py`) computes for a Chinese line, and its
inference for each Chinese segment: the normalised text goes through chinese-roberta-wwm-ext-large
(`AutoTokenizer` + the BERT encoder); the hidden states of the third layer from the top
(`hidden_states[-3]`), without [CLS] and [SEP], give one 1024-d vector per character; each character's vector is
repeated once per phone of that character (`word2ph`: 2 for a syllable, initial + final; 1 for a punctuation
mark). Phones of English segments get zeros, as GPT-SoVITS gives every non-Chinese segment, so the model's
`bert_proj` adds only its bias there.

Weights come only from a local folder (`save_pretrained` layout: config.json, the tokenizer files and
*.safetensors or pytorch_model.bin, as GPT-SoVITS ships `pretrained_models/chinese-roberta-wwm-ext-large`);
nothing is fetched from a hub. A `.bin` is read by transformers with torch.load(weights_only=True).

A character the tokenizer does not map to exactly one token (so the vectors would not line up with the
characters) is an error naming the text, which the shard job turns into a reject record.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from audiopipe.errors import AudiopipeError
from audiopipe.features.base import FeatureSpec
from audiopipe.features.codec import checkpoint_identity
from audiopipe.text.symbols import PUNCTUATION

BERT_DIM = 1024
LAYER = -3  # GPT-SoVITS: torch.cat(res["hidden_states"][-3:-2], -1)
NAME = "bert"
KIND = "bert_phones"  # frames are phones: bert_frames == phones_frames in every row


class BertFeatureError(AudiopipeError, ValueError):
    """A BERT folder that cannot be used, or a text whose characters do not map one to one to tokens."""


def word2ph(norm_text: str) -> list[int]:
    """Phones per character of normalised Chinese text, as audiopipe.text.zh_phones spells them: a punctuation
    mark is one phone, a character two (its initial and toned final)."""
    return [1 if ch in PUNCTUATION else 2 for ch in norm_text]


def spread(char_features: np.ndarray, counts: Sequence[int]) -> np.ndarray:
    """[n_chars, D] -> [D, sum(counts)]: each character's vector repeated for each of its phones."""
    if len(counts) != len(char_features):
        raise BertFeatureError(f"{len(char_features)} character vectors for {len(counts)} characters")
    return np.repeat(char_features, np.asarray(counts, dtype=np.int64), axis=0).T


@dataclass
class BertPhoneFeatures:
    """Loads the BERT folder once; `char_features(texts)` runs it on a batch of normalised Chinese texts."""

    checkpoint: str | Path
    device: str = "auto"
    batch_size: int = 16
    _model: Any = field(default=None, repr=False)
    _tokenizer: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = Path(self.checkpoint)
        if not path.is_dir():
            raise BertFeatureError(f"bert_checkpoint='{path}': not a folder (give the save_pretrained folder of "
                                   f"chinese-roberta-wwm-ext-large)")
        if not (path / "config.json").is_file():
            raise BertFeatureError(f"bert_checkpoint='{path}': no config.json (not a save_pretrained folder)")
        try:
            self.identity = checkpoint_identity(path)
            self._tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            # The encoder alone: a BertForMaskedLM folder loads into it without its prediction head, whose
            # output GPT-SoVITS never reads; the pooler is not used either.
            self._model = AutoModel.from_pretrained(str(path), local_files_only=True, add_pooling_layer=False)
        except (OSError, ValueError) as e:
            first = next((s for s in str(e).splitlines() if s.strip()), type(e).__name__)
            raise BertFeatureError(f"bert_checkpoint='{path}': cannot load it ({first.strip()})") from None
        if int(self._model.config.hidden_size) != BERT_DIM:
            raise BertFeatureError(f"bert_checkpoint='{path}': hidden size {self._model.config.hidden_size}, but "
                                   f"GPT-SoVITS's bert_proj reads {BERT_DIM}-d features "
                                   f"(chinese-roberta-wwm-ext-large)")
        dev = self.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        self._device = torch.device(dev)
        self._model.to(self._device).eval()

    @property
    def spec(self) -> FeatureSpec:
        # Frames are phones, not time: sample_rate = hop_length = 1 keeps the spec well-formed for readers.
        return FeatureSpec(NAME, KIND, 1, "float16", BERT_DIM, 1,
                           {"checkpoint": self.identity, "layer": LAYER, "zeros_for": "non-Chinese phones"})

    def char_features(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One float32 [len(text), 1024] array per text (hidden_states[-3], [CLS] and [SEP] dropped)."""
        import torch

        out: list[np.ndarray] = []
        for i in range(0, len(texts), self.batch_size):
            part = list(texts[i:i + self.batch_size])
            enc = self._tokenizer(part, return_tensors="pt", padding=True)
            n_tokens = enc["attention_mask"].sum(1).tolist()
            for t, n in zip(part, n_tokens):
                if n != len(t) + 2:
                    raise BertFeatureError(f"BERT's tokenizer splits {t[:40]!r} into {n - 2} tokens for its "
                                           f"{len(t)} characters, so its vectors do not line up with the phones")
            with torch.no_grad():
                hidden = self._model(**{k: v.to(self._device) for k, v in enc.items()},
                                     output_hidden_states=True).hidden_states[LAYER]
            out += [hidden[j, 1:1 + len(t)].float().cpu().numpy() for j, t in enumerate(part)]
        return out

    def phone_features(self, segments: Sequence[tuple[str, list[str], str]]) -> np.ndarray:
        """float16 [1024, P] for one line given as GPT-SoVITS segments (language, phones, normalised text)."""
        return assemble(segments, self.char_features([s[2] for s in segments if s[0] == "zh" and s[2]]))


def assemble(segments: Sequence[tuple[str, list[str], str]], zh_features: Sequence[np.ndarray]) -> np.ndarray:
    """The [1024, P] float16 features of one line from its segments and the character features of its Chinese
    segments (in order): Chinese phones get their character's vector, other phones zeros."""
    parts, k = [], 0
    for lang, phones, norm in segments:
        if lang == "zh" and norm:
            counts = word2ph(norm)
            if sum(counts) != len(phones):
                raise BertFeatureError(f"{norm[:40]!r} has {len(phones)} phones, but its characters account for "
                                       f"{sum(counts)}")
            parts.append(spread(zh_features[k], counts))
            k += 1
        else:
            parts.append(np.zeros((BERT_DIM, len(phones)), dtype=np.float32))
    if not parts:
        return np.zeros((BERT_DIM, 0), dtype=np.float16)
    return np.concatenate(parts, axis=1).astype(np.float16)
