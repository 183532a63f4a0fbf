"""Scoring speaker embeddings, for the two 3D-Speaker trainers: during training, the AAM-softmax head that
scores them against the training speakers' class weights (its margin follows speaker.EpochSchedule); after
training, the equal error rate of cosine scores over all trial pairs among the held-out speakers' utterances.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.features.pcm import INT16_SCALE
from audiopipe.reader.open_dataset import open_dataset

from speaker_data import SpeakerSplit, fbank_batch

# ----------------------------------------------------------------------------- AAM-softmax

def aam_logits(cosine: torch.Tensor, labels: torch.Tensor, margin: float, scale: float) -> torch.Tensor:
    """scale * cos(theta + m) for the true class, scale * cos(theta) for the others.

    Past theta = pi - m the true-class logit continues as cos(theta) - (1 - cos m) (3D-Speaker's non-easy
    margin), which meets cos(theta + m) = -1 there, so the logit stays continuous and monotonic.
    """
    c = cosine.clamp(-1 + 1e-7, 1 - 1e-7)  # sqrt(1 - c^2) has an infinite slope at |c| = 1
    sine = torch.sqrt(1.0 - torch.pow(c, 2))  # pow, as speakerlab's: its backward rounds unlike c * c's
    phi = c * math.cos(margin) - sine * math.sin(margin)
    phi = torch.where(c > math.cos(math.pi - margin), phi, c - (1.0 + math.cos(math.pi - margin)))
    target = F.one_hot(labels, cosine.shape[1]).bool()
    return scale * torch.where(target, phi, cosine)


class AAMSoftmax(nn.Module):
    """Cosine classifier (L2-normalised embeddings and class weights) + additive angular margin softmax."""

    def __init__(self, embedding_dim: int, num_classes: int, scale: float = 32.0):
        super().__init__()
        if num_classes < 1:
            raise ValueError(f"AAM-softmax needs at least one class, got {num_classes}")
        self.scale = float(scale)
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim))
        nn.init.xavier_uniform_(self.weight)

    def cosine(self, emb: torch.Tensor) -> torch.Tensor:
        with torch.autocast(emb.device.type, enabled=False):  # the margin needs cosines finer than bf16's
            return F.linear(F.normalize(emb.float()), F.normalize(self.weight.float()))

    def forward(self, emb: torch.Tensor, labels: torch.Tensor, margin: float) -> tuple[torch.Tensor, torch.Tensor]:
        cos = self.cosine(emb)
        return F.cross_entropy(aam_logits(cos, labels, margin, self.scale), labels), cos


# ----------------------------------------------------------------------------- EER on held-out speakers

def equal_error_rate(scores: np.ndarray, is_target: np.ndarray) -> tuple[float, float]:
    """(EER, threshold): where the false-accept and false-reject rates meet, linearly interpolated.

    A trial is accepted when its score is >= the threshold; tied scores are accepted or rejected together.
    """
    scores = np.asarray(scores, dtype=np.float64)
    is_target = np.asarray(is_target, dtype=bool)
    n_tar, n_non = int(is_target.sum()), int((~is_target).sum())
    if n_tar == 0 or n_non == 0:
        raise ValueError(f"EER needs target and non-target trials, got {n_tar} and {n_non}")
    order = np.argsort(-scores, kind="stable")
    s, t = scores[order], is_target[order]
    cut = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # last position of each run of equal scores
    far = np.r_[0.0, np.cumsum(~t)[cut] / n_non]
    frr = np.r_[1.0, 1.0 - np.cumsum(t)[cut] / n_tar]
    thr = np.r_[np.inf, s[cut]]
    k = int(np.argmax(far >= frr))  # far rises and frr falls with k; k = 0 never qualifies
    d0, d1 = frr[k - 1] - far[k - 1], frr[k] - far[k]
    a = d0 / (d0 - d1) if d0 != d1 else 1.0
    eer = far[k - 1] + a * (far[k] - far[k - 1])
    threshold = thr[k] if not np.isfinite(thr[k - 1]) else thr[k - 1] + a * (thr[k] - thr[k - 1])
    return float(eer), float(threshold)


@torch.no_grad()
def embed_utterances(encoder: nn.Module, shards: str | Path | Sequence[str], indices: np.ndarray, device: torch.device,
                     max_samples: int = 0) -> torch.Tensor:
    """L2-normalised embeddings [N, D] of whole utterances (the middle max_samples when set), one at a time."""
    ds = open_dataset(shards, ["pcm"])  # a list of folders (a mix): global indices over their union
    was_training = encoder.training
    encoder.eval()
    out = []
    for i in indices:
        pcm = ds[int(i)]["pcm"]
        if max_samples and len(pcm) > max_samples:
            start = (len(pcm) - max_samples) // 2
            pcm = pcm[start:start + max_samples]
        wav = torch.from_numpy(pcm.astype(np.float32) / np.float32(INT16_SCALE))[None].to(device)
        out.append(encoder(fbank_batch(wav))[0].float())
    encoder.train(was_training)
    return F.normalize(torch.stack(out), dim=1)


def trial_pairs(speakers: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every unordered pair of utterances: (first, second, is_target)."""
    i, j = np.triu_indices(len(speakers), k=1)
    spk = np.asarray(speakers, dtype=object)
    return i, j, (spk[i] == spk[j]).astype(bool)


def evaluate_eer(encoder: nn.Module, shards: str | Path | Sequence[str], split: SpeakerSplit, device: torch.device,
                 speakers: Sequence[str], max_samples: int = 0) -> dict[str, Any]:
    """EER of cosine scores over all target / non-target pairs of the held-out utterances."""
    emb = embed_utterances(encoder, shards, split.heldout, device, max_samples).cpu().numpy()
    spk = [speakers[int(k)] for k in split.heldout]
    i, j, target = trial_pairs(spk)
    scores = (emb @ emb.T)[i, j]  # an N x N matrix, not N^2 / 2 copies of the embeddings
    eer, thr = equal_error_rate(scores, target)
    return {"eer": eer, "threshold": thr, "target_trials": int(target.sum()),
            "nontarget_trials": int((~target).sum()), "utterances": len(spk),
            "speakers": split.heldout_speakers, "mean_target_score": float(scores[target].mean()),
            "mean_nontarget_score": float(scores[~target].mean())}
