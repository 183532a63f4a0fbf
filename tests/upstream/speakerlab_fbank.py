"""3D-Speaker's own FBank (speakerlab.process.processor.FBank(80, 16000, mean_nor=True)) as the oracle of
tests/test_gpu_proof.py: the features gpu_proof.SpeakerlabRule makes for a crop. Runs in the side venv.

    python speakerlab_fbank.py CROPS.npy OUT.npy

CROPS.npy: float32 [B, N] waveforms in [-1, 1]; OUT.npy gets float32 [B, T, 80], FBank's output per crop.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from speakerlab.process.processor import FBank

crops = np.load(sys.argv[1])
fbank = FBank(80, sample_rate=16000, mean_nor=True)  # the recipes' feature_extractor
np.save(sys.argv[2], np.stack([fbank(torch.from_numpy(c)).numpy() for c in crops]).astype(np.float32))
