"""The codec as its own Ray stage: an actor holds EnCodec (on a GPU when it has one) and encodes batches.

Shard tasks stay CPU-only and cheap to retry; the model is loaded once per actor instead of once per task.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from audiopipe.features.base import FeatureSpec


def codec_spec_estimate() -> FeatureSpec:
    """Shape of EnCodec 24 kHz codes, for sizing shards before any model is loaded."""
    from audiopipe.features.codec import CODEBOOK_SIZE, HOP_LENGTH, SAMPLE_RATE

    return FeatureSpec("codes", "encodec_24khz", SAMPLE_RATE, "int16", 16, HOP_LENGTH,
                       {"codebook_size": CODEBOOK_SIZE})


def in_length_order(wavs: list[np.ndarray], size: int, submit: Callable[[list[np.ndarray]], Any],
                    gather: Callable[[list[Any]], list[list[np.ndarray]]]) -> list[np.ndarray]:
    """Codes of `wavs`, in their order, encoded in chunks of `size` cut from the wavs sorted longest first.

    A shard's utterances come in plan order, which is random in length; chunks cut in that order would each be
    padded to their longest clip. Sorted first, each chunk holds near-equal lengths (the codes are the same either
    way: encode_batch masks the padding). submit sends one chunk (returns its result or a future), gather
    resolves the submitted ones in order."""
    order = sorted(range(len(wavs)), key=lambda i: -len(wavs[i]))
    chunks = [order[i:i + size] for i in range(0, len(order), size)]
    done = gather([submit([wavs[i] for i in c]) for c in chunks])
    out: list[Any] = [None] * len(wavs)
    for c, codes in zip(chunks, done):
        for i, x in zip(c, codes):
            out[i] = x
    return out


class CodecWorker:
    def __init__(self, settings: dict[str, Any]):
        import torch

        from audiopipe.features.codec import EncodecEncoder

        if not torch.cuda.is_available():
            torch.set_num_threads(1)
        self.encoder = EncodecEncoder(checkpoint=settings.get("checkpoint"),
                                      random_init=settings.get("random_init", False),
                                      seed=settings.get("seed", 0), device=settings.get("device", "auto"))

    def spec(self) -> FeatureSpec:
        return self.encoder.spec

    def encode(self, wavs: list[np.ndarray]) -> list[np.ndarray]:
        return self.encoder.encode_batch(wavs)
