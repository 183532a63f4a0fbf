"""The codec as its own Ray stage: an actor holds EnCodec (on a GPU when it has one) and encodes batches.

Shard tasks stay CPU-only and cheap to retry; the model is loaded once per actor instead of once per task.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from audiopipe.features.base import FeatureSpec


def codec_spec_estimate() -> FeatureSpec:
    """Shape of EnCodec 24 kHz codes, for sizing shards before any model is loaded."""
    from audiopipe.features.codec import CODEBOOK_SIZE, HOP_LENGTH, SAMPLE_RATE

    return FeatureSpec("codes", "encodec_24khz", SAMPLE_RATE, "int16", 16, HOP_LENGTH,
                       {"codebook_size": CODEBOOK_SIZE})


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
