"""NaturalSpeech 2 on audiopipe ns2 shards: latent diffusion in EnCodec's latent space, with a speech prompt.

    torchrun --nproc_per_node=2 trainers/train_ns2.py --shards ./shards --config tiny --out runs/ns2 --max-steps 20 \
        --codec-checkpoint /models/encodec_24khz

Reads `codes` (EnCodec 24 kHz, 16 x 1024, 75 Hz), `f0` (interpolated, > 0, same frames) and `phones` (ids in
audiopipe.text.en_phones.PHONES) of the `ns2` preset. Amphion's model (models/tts/naturalspeech2), parameter
for parameter, so Amphion's checkpoints load (--init-from) and ours export to Amphion (audiopipe.checkpoints.ns2):
  - the latent: codes decoded by EnCodec's own frozen quantizer (the codebooks of the codec checkpoint the shards
    were made with), not renormalised, so EnCodec's decoder turns a predicted latent into audio;
  - the speech prompt: a prefix of each utterance (PromptSplit, the loader's batch_transform). `frames` rule:
    10-50 % of its frames, the rest is the target and the phone encoder reads all phones. `phones` rule
    (Amphion's): 10-50 % of its phones cut from the start, with their frames; the target keeps the other phones;
  - prompt encoder: a Transformer over the prompt latent; 32 learned query tokens attend to it (query_attn);
  - phone encoder: a Transformer (self-attention + conv FFN) whose layer norms are style-adaptive, conditioned
    on the prompt; duration and pitch predictors: conv stacks with cross-attention to the prompt every 3 layers;
  - the phone encodings are expanded to frames by the durations, plus an embedding of the bucketed pitch;
  - denoiser: a WaveNet (dilated convs, gated units, FiLM from cross-attention to the query tokens every 3
    layers) predicting x0 under Amphion's VP-SDE (beta 0.05..20, t ~ U(0, 1));
  - losses: L1 on log-pitch, L1 on log(1 + duration), L1 on x0, L1 on the noise implied by x0,
    0.5 x cross-entropy of the RVQ indices from the predicted latent (distances to each codebook, residual
    after each layer, as Amphion's latent_to_code);
  - attention: nn.MultiheadAttention called as Amphion calls it (need_weights left on), which takes PyTorch's
    explicit softmax path rather than scaled_dot_product_attention. Both compute the same function, but their
    float32 rounding differs, and layer norms over a few nearly equal features (a predictor position where
    ReLU leaves little variance) turn that rounding into gradients up to 1 % apart: the same path keeps a
    step equal to Amphion's (tests/test_step_parity_ns2.py).
Amphion's rules are the defaults (its prompt rule, phone table, forward and its trainer's LR schedule), so a new
run exports to Amphion with no difference; audiopipe's own are options:
  - `--forward audiopipe` masks padding everywhere (conv inputs, attention keys, style statistics), gives the
    Transformers one position per time step and takes the shards' codes as the cross-entropy's labels;
    `--prompt-rule frames` cuts the prompt at a frame; `--phone-table audiopipe` keeps the shards' phone ids;
    `--lr-schedule cosine` is trainers/core's schedule. A resumed run keeps the rules it was started with.
Where it always differs (docs/trainers/ns2.md says why):
  - durations: utterances whose shard row has MFA durations use them; the others learn them with monotonic
    alignment search (trainers/mas.py) between the phone encodings (projected to the latent) and the latent, with
    Glow-TTS's prior loss (`align`) to train that projection;
  - the prompt size is drawn from (seed, utterance indices), not from a global RNG, so --resume draws it again;
  - no inference sampler here (training only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.checkpoints.files import CheckpointError
from audiopipe.checkpoints.ns2 import (
    amphion_phone_map, from_codec, is_upstream_state, looks_upstream, read_upstream, rule_differences,
)
from audiopipe.index.lengths import LengthIndex
from audiopipe.shard.manifest import read_manifest
from audiopipe.text.en_phones import PHONES

from init_family import refuse_other_family
from core import (
    corpus_offsets,
    count_parameters,
    latest_checkpoint,
    load_model_config,
    parse_args,
    read_own_weights,
    setup_dist,
    shard_dirs,
    train,
)
from mas import mas_durations

# ----------------------------------------------------------------------------- config

@dataclass
class NS2Config:
    n_codebooks: int = 16  # codebooks that make the latent (EnCodec at 12 kbps)
    codebook_size: int = 1024
    codec_layers: int = 32  # quantizer layers kept, frozen (EnCodec 24 kHz has 32; Amphion's checkpoint holds all)
    latent_dim: int = 128  # EnCodec's codebook dimension
    vocab_size: int = 100  # phone ids (audiopipe's PHONES has 99, Amphion's table 89; Amphion's config says 100)
    hidden: int = 512  # encoders, predictors, WaveNet, query tokens
    heads: int = 8
    enc_layers: int = 6  # phone encoder
    prompt_layers: int = 6
    enc_filter: int = 2048  # conv FFN width
    enc_kernel: int = 9
    enc_dropout: float = 0.2
    dur_layers: int = 30
    dur_kernel: int = 3
    pitch_layers: int = 30
    pitch_kernel: int = 5
    pred_cross_attn_every: int = 3
    pred_dropout: float = 0.5
    pitch_min: float = 50.0
    pitch_max: float = 1100.0
    pitch_bins: int = 512
    query_tokens: int = 32
    wn_layers: int = 40
    wn_cross_attn_every: int = 3
    wn_dilation_cycle: int = 2
    beta_min: float = 0.05
    beta_max: float = 20.0
    sigma: float = 1.0
    noise_factor: float = 1.0
    noise_loss_weight: float = 1.0
    ce_loss_weight: float = 0.5
    align_loss_weight: float = 1.0
    prompt_min_frac: float = 0.1  # prompt share of the utterance's frames or phones (Amphion: 10-50 % of phones)
    prompt_max_frac: float = 0.5
    # The rules (Amphion's by default, so a run exports to Amphion with no difference; LEGACY_RULES: the others)
    prompt_rule: str = "phones"  # Amphion's: cut at a phone boundary, the target drops its phones; or "frames"
    phone_table: str = "amphion"  # ids of Amphion's 89-entry table; or "audiopipe": the shards' own ids
    positions: str = "batch"  # Amphion's sinusoid indexes the batch item, one position per item; or "time"
    mask_padding: bool = False  # Amphion's convs, encoder outputs and style means read padding; True: masked
    ce_labels: str = "requantized"  # Amphion's: the greedy RVQ of the target latent; or "codes": the shards'
    lr_schedule: str = "amphion"  # Amphion's trainer's (diffusers' cosine with warmup); or "cosine": core's


CHOICES = {"prompt_rule": ("frames", "phones"), "phone_table": ("audiopipe", "amphion"),
           "positions": ("time", "batch"), "ce_labels": ("codes", "requantized"),
           "lr_schedule": ("amphion", "cosine")}

CONFIGS = {
    "tiny": NS2Config(hidden=32, heads=2, enc_layers=1, prompt_layers=1, enc_filter=64, enc_kernel=3, dur_layers=3,
                      pitch_layers=3, query_tokens=4, wn_layers=4, pitch_bins=64),
    "small": NS2Config(hidden=128, heads=4, enc_layers=3, prompt_layers=2, enc_filter=256, enc_kernel=5,
                       dur_layers=6, pitch_layers=6, query_tokens=8, wn_layers=12),
    "default": NS2Config(),  # Amphion config/ns2.json
}
# Amphion's exp_config_base: max_tokens 7500 frames per GPU, lr 7.5e-5, 5000 warmup steps, grad clip 0.5.
RUN_DEFAULTS = dict(batch_frames=7500, lr=7.5e-5, warmup_steps=5000, clip=0.5)
FEATURES = ["codes", "f0", "phones"]
AMPHION_FORWARD = dict(positions="batch", mask_padding=False, ce_labels="requantized")
AUDIOPIPE_FORWARD = dict(positions="time", mask_padding=True, ce_labels="codes")
AMPHION_RULES = dict(prompt_rule="phones", phone_table="amphion", **AMPHION_FORWARD, lr_schedule="amphion")
# audiopipe's own rules, chosen by flag (--prompt-rule frames --phone-table audiopipe --forward audiopipe
# --lr-schedule cosine); also what a recorded run config without these fields was trained with.
LEGACY_RULES = dict(prompt_rule="frames", phone_table="audiopipe", **AUDIOPIPE_FORWARD, lr_schedule="cosine")


def check_config(cfg: NS2Config) -> NS2Config:
    for name, allowed in CHOICES.items():
        if getattr(cfg, name) not in allowed:
            raise SystemExit(f"config {name}={getattr(cfg, name)!r}: use one of {', '.join(allowed)}")
    if cfg.n_codebooks > cfg.codec_layers:
        raise SystemExit(f"config n_codebooks {cfg.n_codebooks} > codec_layers {cfg.codec_layers}")
    return cfg


# ----------------------------------------------------------------------------- data: phone table, prompt split

class Chain:
    """Batch transforms applied in order (picklable, for loader workers)."""

    def __init__(self, *steps):
        self.steps = [s for s in steps if s is not None]

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        for step in self.steps:
            batch = step(batch)
        return batch


class PhoneRemap:
    """Loader batch_transform: phone ids of the shards' vocabulary -> another table (Amphion's), dropping the
    tokens it has no entry for (the word boundary "|"); `phones`, its lengths and mask, and MFA `durations` are
    rewritten. A dropped token that holds frames of an MFA alignment is refused (its frames would be lost)."""

    def __init__(self, lut: list[int]):
        self.lut = torch.tensor([max(v, -1) for v in lut] + [-1], dtype=torch.long)  # the last: out-of-table

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        ids = batch["phones"].long().clamp(0, len(self.lut) - 1)
        mask = batch["phones_mask"]
        new = self.lut[ids]
        keep = mask & (new >= 0)
        d_lens = batch.get("durations_lengths")
        if d_lens is not None:  # collate pads durations to the longest row that has them (0 wide when none has)
            batch["durations"] = F.pad(batch["durations"], (0, ids.shape[1] - batch["durations"].shape[1]))
            lost = (batch["durations"].long() * (mask & ~keep)).sum(1) * (d_lens > 0)
            if lost.any():
                i = int(lost.nonzero()[0])
                raise ValueError(f"utterance {batch.get('id', ['?'] * len(lost))[i]!r}: a phone with no entry in "
                                 f"the phone table holds {int(lost[i])} frames of its MFA alignment")
        n = keep.sum(1)
        p = max(int(n.max()), 1)
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :p]  # kept tokens first, in order
        out_mask = torch.arange(p)[None] < n[:, None]
        batch["phones"] = torch.gather(new, 1, order).clamp(min=0).to(batch["phones"].dtype) * out_mask
        batch["phones_mask"], batch["phones_lengths"] = out_mask, n
        if d_lens is not None:
            dur = torch.gather(batch["durations"], 1, order) * out_mask
            batch["durations"] = dur
            batch["durations_lengths"] = torch.where(d_lens > 0, n, torch.zeros_like(n))
        return batch


class PromptSplit:
    """Loader batch_transform: checks each utterance, then draws its speech prompt.

    `frames` rule: a random prefix of 10-50 % of each utterance's frames is the prompt, the rest the target. Adds
    prompt_codes [B, Q, Tp] / prompt_mask / prompt_lengths, and target_codes [B, Q, Tt] / target_f0 / target_mask
    / target_lengths (both left-aligned; the target starts at frame prompt_lengths[b] of `codes`). The full
    `codes`, `phones` and their masks stay (the alignment needs the whole utterance).
    `phones` rule (Amphion's get_target_and_reference, clip_mode "start"): k = randint(int(0.1 n), int(0.5 n))
    of the n phones (at least 1) are the prompt; adds prompt_phones [B]. The model cuts there once it knows the
    durations (MFA, or MAS when the shards have none). For rows with MFA durations a k whose prompt would hold no
    frame grows until it holds one, and one that leaves the target no frame is refused.
    The draw is a pure function of (seed, the batch's utterance indices): a resumed run, with or without
    workers, draws what the uninterrupted one did. (A batch that recurs identically in a later epoch, only
    likely in a tiny corpus, gets the same split again.)
    """

    def __init__(self, min_frac: float = 0.1, max_frac: float = 0.5, seed: int = 0, vocab_size: int | None = None,
                 rule: str = "frames"):
        if not 0.0 < min_frac <= max_frac < 1.0:
            raise ValueError(f"need 0 < min_frac <= max_frac < 1, got {min_frac}, {max_frac}")
        if rule not in CHOICES["prompt_rule"]:
            raise ValueError(f"prompt rule {rule!r}: use frames or phones")
        self.min_frac, self.max_frac, self.seed, self.vocab_size, self.rule = min_frac, max_frac, seed, vocab_size, rule

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        lengths = batch["codes_lengths"]
        ids = batch.get("id", [str(i) for i in range(len(lengths))])
        p_lens = batch.get("phones_lengths")
        d_lens = batch.get("durations_lengths")
        for i, t in enumerate(lengths.tolist()):
            if t < 2:
                raise ValueError(f"utterance {ids[i]!r} has {t} codec frame(s): a prompt/target split needs >= 2")
            if p_lens is None:
                continue
            if self.rule == "phones" and int(p_lens[i]) < 2:
                raise ValueError(f"utterance {ids[i]!r} has {int(p_lens[i])} phone(s): the phones prompt rule "
                                 f"needs >= 2; leave it out")
            if d_lens is not None and int(d_lens[i]) > 0:  # MFA durations: checked, not searched
                dur = batch["durations"][i, :int(d_lens[i])]
                if int(d_lens[i]) != int(p_lens[i]) or int(dur.sum()) != t:
                    raise ValueError(f"utterance {ids[i]!r}: {int(d_lens[i])} durations summing to {int(dur.sum())} "
                                     f"for {int(p_lens[i])} phones and {t} frames; run `audiopipe verify`")
            elif t < int(p_lens[i]):
                raise ValueError(f"utterance {ids[i]!r} has {t} frames for {int(p_lens[i])} phones: the alignment "
                                 f"needs at least one frame per phone (wrong transcript?); leave it out")
        if self.vocab_size is not None and "phones" in batch:
            top = int(batch["phones"].max())
            if top >= self.vocab_size:
                raise ValueError(f"phone id {top} is outside the model's vocabulary of {self.vocab_size}")
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, *map(int, batch.get("index", []))]))
        if self.rule == "phones":
            return self._phones(batch, rng, ids)
        frac = rng.uniform(self.min_frac, self.max_frac, size=len(lengths))
        tp = torch.from_numpy(np.floor(frac * lengths.numpy()).astype(np.int64))
        return split_at(batch, torch.minimum(tp.clamp(min=1), lengths - 1))

    def _phones(self, batch: dict[str, Any], rng: np.random.Generator, ids: list[str]) -> dict[str, Any]:
        n = batch["phones_lengths"].tolist()
        k = [max(int(rng.integers(int(m * self.min_frac), int(m * self.max_frac) + 1)), 1) for m in n]
        d_lens = batch.get("durations_lengths")
        for i in range(len(n)):
            if d_lens is None or int(d_lens[i]) == 0:
                continue  # MAS: every phone gets >= 1 frame, so any 1 <= k < n leaves both sides frames
            dur = batch["durations"][i, :n[i]].long()
            while prompt_frames(dur, k[i]) == 0 and k[i] < n[i] - 1:
                k[i] += 1
            if not 0 < prompt_frames(dur, k[i]) < int(batch["codes_lengths"][i]):
                raise ValueError(f"utterance {ids[i]!r}: its MFA durations leave no frame for the prompt or the "
                                 f"target under the phones prompt rule; leave it out")
        batch["prompt_phones"] = torch.tensor(k, dtype=torch.long)
        return batch


def prompt_start(dur0: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Amphion's first prompt phone: 1 when the first phone has no frame and the prompt is one phone, else 0."""
    return ((dur0 == 0) & (k == 1)).long()


def prompt_frames(dur: torch.Tensor, k: int) -> int:
    """Frames of an utterance's prompt under the phones rule (dur: its phone durations)."""
    s = int(prompt_start(dur[0], torch.tensor(k)))
    return int(dur[:s + k].sum())


def split_at(batch: dict[str, Any], tp: torch.Tensor) -> dict[str, Any]:
    """The deterministic half of PromptSplit: frames [0, tp[b]) are item b's prompt, [tp[b], T_b) its target."""
    codes, lengths = batch["codes"], batch["codes_lengths"]
    if ((tp < 1) | (tp >= lengths)).any():
        raise ValueError(f"prompt lengths {tp.tolist()} must be in [1, T - 1] for lengths {lengths.tolist()}")
    tt = lengths - tp
    b, q, _ = codes.shape
    tp_max, tt_max = int(tp.max()), int(tt.max())
    dev = codes.device
    prompt_mask = torch.arange(tp_max, device=dev)[None] < tp[:, None]
    target_mask = torch.arange(tt_max, device=dev)[None] < tt[:, None]
    # New tensors (never views): the collated batch lives in a reused ring buffer.
    prompt = codes[..., :tp_max].long() * prompt_mask[:, None]
    idx = (tp[:, None] + torch.arange(tt_max, device=dev)[None]).clamp(max=codes.shape[-1] - 1)
    target = torch.gather(codes, 2, idx[:, None].expand(b, q, tt_max)).long() * target_mask[:, None]
    f0 = torch.gather(batch["f0"], 1, idx).masked_fill(~target_mask, 1.0)  # log-safe padding
    batch.update(prompt_codes=prompt, prompt_mask=prompt_mask, prompt_lengths=tp,
                 target_codes=target, target_f0=f0, target_mask=target_mask, target_lengths=tt)
    return batch


def usable_subset(shards: str | Path, min_phones: int = 1) -> tuple[np.ndarray, list[str], int]:
    """Utterances a prompt/target split and an alignment can use: >= 2 frames, >= min_phones phones, and either
    MFA durations or at least one frame per phone (for MAS). Returns (indices, ids left out, how many have
    durations)."""
    idx = LengthIndex.open(shards)
    frames, phones = idx.frames("codes").astype(np.int64), idx.frames("phones").astype(np.int64)
    cols = idx.table.column_names
    has_d = idx.frames("durations") > 0 if "durations_frames" in cols else np.zeros(len(frames), dtype=bool)
    ok = (frames >= 2) & (phones >= min_phones) & (has_d | (frames >= phones))
    ids = idx.table.column("id").to_pylist()
    return np.flatnonzero(ok), [ids[i] for i in np.flatnonzero(~ok)], int((has_d & ok).sum())


def shard_vocab(shards: str | Path) -> list[str]:
    return list(read_manifest(shards).get("phones", {}).get("vocab", PHONES))  # older shards: ours


def check_shards(shards: str | Path, cfg: NS2Config) -> bool:
    """Refuse shards this config cannot read; True when they have a `durations` column (MFA, maybe empty)."""
    m = read_manifest(shards)
    feats = m["features"]
    if "codes" not in feats or "f0" not in feats:
        raise SystemExit(f"{shards} has no codes/f0 columns ({sorted(feats)}): make it with `--preset ns2`")
    spec = feats["codes"]
    if spec["channels"] < cfg.n_codebooks or spec["params"].get("codebook_size") != cfg.codebook_size:
        raise SystemExit(f"{shards}: codes have {spec['channels']} codebooks of {spec['params'].get('codebook_size')}"
                         f", the config expects {cfg.n_codebooks} of {cfg.codebook_size}")
    if feats["f0"].get("hop_length") != spec.get("hop_length"):
        raise SystemExit(f"{shards}: f0 hop {feats['f0'].get('hop_length')} differs from the codes' "
                         f"{spec.get('hop_length')}; use the ns2 preset (align_to codes)")
    vocab = shard_vocab(shards)
    size = len(vocab) if cfg.phone_table == "audiopipe" else max(amphion_phone_map(vocab)) + 1
    if size > cfg.vocab_size:
        raise SystemExit(f"{shards}: the phone table ({cfg.phone_table}) has {size} entries, the config's "
                         f"vocab_size is {cfg.vocab_size}")
    if not feats["f0"].get("params", {}).get("interpolate"):
        raise SystemExit(f"{shards}: f0 was made without interpolate=True, so unvoiced frames hold 0 and log-pitch "
                         f"is undefined there; use the ns2 preset")
    return "durations_frames" in LengthIndex.open(shards).table.column_names


def codec_identity(dirs: list[str]) -> str:
    """The codec checkpoint every --shards folder's codes were made with (they must agree)."""
    ids = {str(read_manifest(s)["features"]["codes"]["params"].get("checkpoint")) for s in dirs}
    if len(ids) > 1:
        raise SystemExit(f"the --shards folders were made with different EnCodec checkpoints ({sorted(ids)}): their "
                         f"codes mean different latents; shard them with one codec")
    return ids.pop()


def codec_quantizer(identity: str, folder: str) -> dict[str, torch.Tensor] | None:
    """Our `quantizer.*` tensors from the codec the shards were made with: the --codec-checkpoint folder (checked
    against the shards' record of it), or the seeded random-init codec the shards record. None: not available."""
    from audiopipe.features.codec import CodecCheckpointError, checkpoint_identity, quantizer_state

    if folder:
        try:
            got = checkpoint_identity(folder)
            if got != identity:
                raise SystemExit(f"--codec-checkpoint {folder} is {got}, but the shards' codes were made with "
                                 f"{identity}: give the codec the shards were made with")
            return from_codec(quantizer_state(checkpoint=folder))
        except (CodecCheckpointError, CheckpointError) as e:
            raise SystemExit(f"--codec-checkpoint: {e}") from None
    if identity.startswith("random-init:"):
        return from_codec(quantizer_state(random_init_seed=int(identity.split(":", 1)[1])))
    return None


# ----------------------------------------------------------------------------- building blocks

def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x [B, T, d], mask bool [B, T] -> [B, 1, d]."""
    m = mask[..., None].to(x.dtype)
    return (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)


def sinusoid_positions(n: int, dim: int, device) -> torch.Tensor:
    """[n, dim]: the sinusoid table of Amphion's PositionalEncoding, row p for position p."""
    pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(n, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : dim // 2]
    return pe


class StyleAdaptiveLayerNorm(nn.Module):
    """LayerNorm whose gain and bias come from the mean of a condition sequence (over its real frames when
    masked, over all of them as Amphion when not)."""

    def __init__(self, dim: int, masked: bool = True):
        super().__init__()
        self.masked = masked
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.style = nn.Linear(dim, 2 * dim)
        nn.init.constant_(self.style.bias[:dim], 1.0)
        nn.init.zeros_(self.style.bias[dim:])

    def forward(self, x, cond, cond_mask):
        mean = masked_mean(cond, cond_mask) if self.masked else cond.mean(1, keepdim=True)
        gamma, beta = self.style(mean).chunk(2, dim=-1)
        return gamma * self.norm(x) + beta


class EncoderLayer(nn.Module):
    """Pre-norm self-attention + conv FFN (conv k, ReLU, linear), as Amphion's TransformerEncoderLayer."""

    def __init__(self, cfg: NS2Config, style: bool):
        super().__init__()
        h = cfg.hidden
        self.style, self.masked = style, cfg.mask_padding
        self.ln1 = StyleAdaptiveLayerNorm(h, cfg.mask_padding) if style else nn.LayerNorm(h)
        self.ln2 = StyleAdaptiveLayerNorm(h, cfg.mask_padding) if style else nn.LayerNorm(h)
        self.attn = nn.MultiheadAttention(h, cfg.heads, batch_first=True)
        self.ffn1 = nn.Conv1d(h, cfg.enc_filter, cfg.enc_kernel, padding=cfg.enc_kernel // 2)
        self.ffn2 = nn.Linear(cfg.enc_filter, h)
        self.drop = nn.Dropout(cfg.enc_dropout)
        for w in (self.ffn1.weight, self.ffn2.weight):
            nn.init.normal_(w, 0.0, 0.02)

    def _norm(self, ln, x, cond, cond_mask):
        return ln(x, cond, cond_mask) if self.style else ln(x)

    def forward(self, x, mask, cond=None, cond_mask=None):
        y = self._norm(self.ln1, x, cond, cond_mask)
        y, _ = self.attn(y, y, y, key_padding_mask=~mask, need_weights=True)  # Amphion's path (docstring)
        x = x + self.drop(y)
        y = self._norm(self.ln2, x, cond, cond_mask)
        if self.masked:
            y = y * mask[..., None]  # the conv must not read padding
        y = F.relu(self.ffn1(y.transpose(1, 2))).transpose(1, 2)
        return x + self.ffn2(self.drop(y))


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: NS2Config, layers: int, style: bool):
        super().__init__()
        self.style, self.masked, self.positions = style, cfg.mask_padding, cfg.positions
        self.layers = nn.ModuleList(EncoderLayer(cfg, style) for _ in range(layers))
        self.last_ln = StyleAdaptiveLayerNorm(cfg.hidden, cfg.mask_padding) if style else nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(cfg.enc_dropout)

    def forward(self, x, mask, cond=None, cond_mask=None):
        if self.positions == "batch":  # Amphion: its table is [max_len, 1, d] sliced by x.size(0), the batch
            pe = sinusoid_positions(x.shape[0], x.shape[2], x.device)[:, None]
        else:
            pe = sinusoid_positions(x.shape[1], x.shape[2], x.device)[None]
        x = self.drop(x + pe.to(x.dtype))
        for layer in self.layers:
            x = layer(x, mask, cond, cond_mask)
        x = self.last_ln(x, cond, cond_mask) if self.style else self.last_ln(x)
        return x * mask[..., None] if self.masked else x


class Predictor(nn.Module):
    """Conv stack (conv, ReLU, LayerNorm, dropout; residual after the first), with cross-attention to the prompt
    before every `every`-th layer; one value per position (log duration or log pitch).

    Unmasked (Amphion), only the duration predictor zeroes padding after each layer (`mask_layers`); its pitch
    predictor never does."""

    def __init__(self, cfg: NS2Config, layers: int, kernel: int, mask_layers: bool):
        super().__init__()
        h = cfg.hidden
        self.every, self.masked, self.mask_layers = cfg.pred_cross_attn_every, cfg.mask_padding, mask_layers
        self.convs = nn.ModuleList(nn.Conv1d(h, h, kernel, padding=kernel // 2) for _ in range(layers))
        self.lns = nn.ModuleList(nn.LayerNorm(h) for _ in range(layers))
        n_attn = (layers + self.every - 1) // self.every
        self.attns = nn.ModuleList(nn.MultiheadAttention(h, cfg.heads, batch_first=True) for _ in range(n_attn))
        self.attn_lns = nn.ModuleList(nn.LayerNorm(h) for _ in range(n_attn))
        self.drop = nn.Dropout(cfg.pred_dropout)
        self.attn_drop = nn.Dropout(0.2)
        self.out = nn.Linear(h, 1)
        nn.init.normal_(self.out.weight, 0.0, 0.02)

    def forward(self, x, mask, ref, ref_mask):
        m = mask[..., None].to(x.dtype)
        if self.masked:
            x = x * m
        for i, (conv, ln) in enumerate(zip(self.convs, self.lns)):
            res = x
            if i % self.every == 0:
                k = i // self.every
                # need_weights: Amphion's softmax path, so the rounding, and the gradient, are its own (docstring)
                y, _ = self.attns[k](self.attn_lns[k](x), ref, ref, key_padding_mask=~ref_mask, need_weights=True)
                x = (self.attn_drop(y) + x) / math.sqrt(2.0)
                if self.masked:
                    x = x * m
            x = self.drop(ln(F.relu(conv(x.transpose(1, 2)).transpose(1, 2))))
            if i > 0:
                x = x + res
            if self.masked or self.mask_layers:
                x = x * m
        return self.out(x).squeeze(-1)


class FiLM(nn.Module):
    def __init__(self, dim: int, cond_dim: int):
        super().__init__()
        self.gain, self.bias = nn.Linear(cond_dim, dim), nn.Linear(cond_dim, dim)
        for lin, b in ((self.gain, 1.0), (self.bias, 0.0)):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.constant_(lin.bias, b)

    def forward(self, x, cond):
        return x * self.gain(cond) + self.bias(cond)


class ResidualBlock(nn.Module):
    """WaveNet layer: (x + step) -> dilated conv + condition -> [FiLM from cross-attention to the query tokens]
    -> gated tanh -> residual and skip."""

    def __init__(self, h: int, heads: int, dilation: int, cross_attn: bool):
        super().__init__()
        self.dilated = nn.Conv1d(h, 2 * h, 3, padding=dilation, dilation=dilation)
        self.step_proj = nn.Linear(h, h)
        self.cond_proj = nn.Conv1d(h, 2 * h, 1)
        self.out_proj = nn.Conv1d(h, 2 * h, 1)
        for conv in (self.dilated, self.cond_proj, self.out_proj):
            nn.init.kaiming_normal_(conv.weight)
        nn.init.normal_(self.step_proj.weight, 0.0, 0.02)
        self.cross_attn = cross_attn
        if cross_attn:
            self.ln = nn.LayerNorm(h)
            self.attn = nn.MultiheadAttention(h, heads, dropout=0.1, batch_first=True)
            self.film = FiLM(2 * h, h)

    def forward(self, x, m, cond, step, query):
        # x [B, h, T]; m [B, 1, T] float mask; cond [B, h, T]; step [B, h]; query [B, Q, h]
        y = (x + self.step_proj(step)[..., None]) * m
        z = self.dilated(y) + self.cond_proj(cond)
        if self.cross_attn:
            a, _ = self.attn(self.ln(y.transpose(1, 2)), query, query, need_weights=True)  # Amphion's path
            z = self.film(z.transpose(1, 2), a).transpose(1, 2)
        gate, filt = z.chunk(2, dim=1)
        res, skip = self.out_proj(torch.sigmoid(gate) * torch.tanh(filt)).chunk(2, dim=1)
        return (x + res * m) / math.sqrt(2.0), skip * m


class WaveNet(nn.Module):
    """x0 estimator: (x_t [B, D, T], mask, condition [B, T, h], t [B], query tokens [B, Q, h]) -> x0 [B, D, T]."""

    def __init__(self, cfg: NS2Config):
        super().__init__()
        h = cfg.hidden
        self.h, self.masked = h, cfg.mask_padding
        self.in_proj = nn.Conv1d(cfg.latent_dim, h, 1)
        self.step_mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.Mish(), nn.Linear(4 * h, h))
        self.cond_ln = nn.LayerNorm(h)
        self.layers = nn.ModuleList(
            ResidualBlock(h, cfg.heads, 2 ** (i % cfg.wn_dilation_cycle), i % cfg.wn_cross_attn_every == 0)
            for i in range(cfg.wn_layers))
        self.skip_proj = nn.Conv1d(h, h, 1)
        self.out_proj = nn.Conv1d(h, cfg.latent_dim, 1)
        nn.init.kaiming_normal_(self.in_proj.weight)
        nn.init.kaiming_normal_(self.skip_proj.weight)
        nn.init.zeros_(self.out_proj.weight)

    def step_embedding(self, t: torch.Tensor) -> torch.Tensor:
        half = self.h // 2
        freqs = torch.exp(torch.arange(half, device=t.device) * -(math.log(10000) / (half - 1)))
        ang = t.float()[:, None] * freqs[None]  # t in (0, 1), unscaled, as Amphion
        return self.step_mlp(torch.cat([ang.sin(), ang.cos()], dim=-1).to(t.dtype))

    def forward(self, xt, mask, cond, t, query):
        m = mask[:, None].to(xt.dtype)
        cond = self.cond_ln(cond).transpose(1, 2)
        x = F.relu(self.in_proj(xt))
        step = self.step_embedding(t)
        skips = 0
        for layer in self.layers:
            x, skip = layer(x, m, cond, step, query)
            skips = skips + skip
        x = self.out_proj(F.relu(self.skip_proj(skips / math.sqrt(len(self.layers)))))
        return x * m if self.masked else x


class CodecQuantizer(nn.Module):
    """EnCodec's residual quantizer, frozen: its tensors as buffers (every layer the codec has, as Amphion's model
    keeps them), never trained. The latent of a frame is the sum of its codes' rows in the first n codebooks,
    exactly what EnCodec's own quantizer decodes before its decoder."""

    def __init__(self, layers: int, size: int, dim: int):
        super().__init__()
        self.register_buffer("embed", torch.zeros(layers, size, dim))
        self.register_buffer("embed_avg", torch.zeros(layers, size, dim))
        self.register_buffer("cluster_size", torch.zeros(layers, size))
        self.register_buffer("inited", torch.zeros(layers, 1))

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> latent [B, D, T]; summed layer by layer in order, as EnCodec does."""
        z = 0
        for q in range(codes.shape[1]):
            z = z + F.embedding(codes[:, q].long(), self.embed[q])
        return z.transpose(1, 2)


# ----------------------------------------------------------------------------- the model

def masked_l1(pred, target, mask) -> torch.Tensor:
    """Amphion's diff_loss: mean over channels, sum over real frames / their count. pred/target [B, D, T] or
    [B, T]; mask [B, T]."""
    err = (pred.float() - target.float()).abs()
    if err.dim() == 3:
        err = err.mean(1)
    m = mask.to(err.dtype)
    return (err * m).sum() / m.sum().clamp(min=1)


def durations_to_path(durations: torch.Tensor, n_frames: int) -> torch.Tensor:
    """durations [B, P] -> path [B, P, T]: phone p covers frames [cumsum_{p-1}, cumsum_p)."""
    end = durations.cumsum(-1)
    start = end - durations
    pos = torch.arange(n_frames, device=durations.device)[None, None]
    return ((pos >= start[..., None]) & (pos < end[..., None])).float()


class NaturalSpeech2(nn.Module):
    """forward(**batch tensors) -> {loss terms, accuracy, outputs}; amphion_forward(...) takes Amphion's inputs."""

    def __init__(self, cfg: NS2Config):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.latent_dim
        self.quantizer = CodecQuantizer(cfg.codec_layers, cfg.codebook_size, d)
        self.prompt_lin = nn.Linear(d, h) if d != h else None  # Amphion has it only when the sizes differ
        if self.prompt_lin is not None:
            nn.init.normal_(self.prompt_lin.weight, 0.0, 0.02)
        self.prompt_encoder = TransformerEncoder(cfg, cfg.prompt_layers, style=False)
        self.query_emb = nn.Embedding(cfg.query_tokens, h)
        self.query_attn = nn.MultiheadAttention(h, cfg.heads, batch_first=True)
        self.phone_emb = nn.Embedding(cfg.vocab_size, h, padding_idx=0)
        nn.init.normal_(self.phone_emb.weight, 0.0, 1e-5)  # Amphion: positions dominate at the start
        with torch.no_grad():
            self.phone_emb.weight[0].zero_()
        self.phone_encoder = TransformerEncoder(cfg, cfg.enc_layers, style=True)
        self.align_proj = nn.Linear(h, d)  # phone encoding -> Gaussian mean in latent space, for MAS
        self.duration_predictor = Predictor(cfg, cfg.dur_layers, cfg.dur_kernel, mask_layers=True)
        self.pitch_predictor = Predictor(cfg, cfg.pitch_layers, cfg.pitch_kernel, mask_layers=False)
        bins = torch.exp(torch.linspace(math.log(cfg.pitch_min), math.log(cfg.pitch_max), cfg.pitch_bins - 1))
        self.register_buffer("pitch_bin_edges", bins)
        self.pitch_emb = nn.Embedding(cfg.pitch_bins, h)
        self.wavenet = WaveNet(cfg)
        # Constants, identical on every rank (read from one file): DDP need not broadcast them every step.
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            self, [f"quantizer.{n}" for n, _ in self.quantizer.named_buffers()] + ["pitch_bin_edges"])

    # -- latent

    def set_codec(self, state: dict[str, torch.Tensor]) -> None:
        """Fill the frozen quantizer from our `quantizer.*` tensors (audiopipe.checkpoints.ns2.from_codec)."""
        for name, buf in self.quantizer.named_buffers():
            src = state[f"quantizer.{name}"]
            if tuple(src.shape) != tuple(buf.shape):
                raise SystemExit(f"the codec's quantizer {name} is {list(src.shape)}, the config expects "
                                 f"{list(buf.shape)} (codec_layers, codebook_size, latent_dim)")
            with torch.no_grad():
                buf.copy_(src)

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> EnCodec's latent [B, D, T] (its quantizer's decode of the first n_codebooks)."""
        return self.quantizer.decode(codes[:, : self.cfg.n_codebooks])

    def _logits(self, r: torch.Tensor, q: int) -> torch.Tensor:
        e = self.quantizer.embed[q].float()  # [K, D]
        # -|r - e|^2 without the -|r|^2 term, which is the same for every row: same softmax, same argmax.
        return F.linear(r, 2 * e, -(e * e).sum(-1))

    def requantize(self, latent: torch.Tensor) -> torch.Tensor:
        """latent [B, D, T] -> codes [B, Q, T] by greedy residual search (Amphion's latent_to_code)."""
        b, d, t = latent.shape
        r = latent.transpose(1, 2).reshape(-1, d).float()
        out = []
        for q in range(self.cfg.n_codebooks):
            pick = self._logits(r, q).argmax(-1)
            out.append(pick)
            r = r - F.embedding(pick, self.quantizer.embed[q].float())
        return torch.stack(out, 1).reshape(b, t, -1).transpose(1, 2)

    def code_ce(self, x0_pred: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor):
        """Cross-entropy of the codes given the predicted latent: logits are minus squared distances to codebook
        q's rows; the row picked is subtracted before codebook q + 1 (Amphion's latent_to_code)."""
        nq = self.cfg.n_codebooks
        keep = mask.reshape(-1)
        r = x0_pred.transpose(1, 2).reshape(-1, x0_pred.shape[1])[keep].float()  # real frames only: [N, D]
        target = codes[:, :nq].transpose(1, 2).reshape(-1, nq)[keep].long()  # [N, Q]
        ce, correct = 0.0, 0.0
        for q in range(nq):
            logits = self._logits(r, q)
            ce = ce + F.cross_entropy(logits, target[:, q], reduction="sum")
            pred = logits.argmax(-1)
            correct = correct + (pred == target[:, q]).sum().detach().float()
            r = r - F.embedding(pred, self.quantizer.embed[q].float())
        n = max(len(target), 1) * nq
        return ce / n, correct / n

    # -- conditioning

    def encode_prompt(self, prompt_codes, prompt_mask):
        ref = self.latent(prompt_codes).transpose(1, 2)
        if self.prompt_lin is not None:
            ref = self.prompt_lin(ref)
        ref = self.prompt_encoder(ref, prompt_mask)
        query = self.query_emb.weight[None].expand(ref.shape[0], -1, -1)
        query, _ = self.query_attn(query, ref, ref, key_padding_mask=~prompt_mask,
                                   need_weights=True)  # Amphion's path (module docstring)
        return ref, query

    def align(self, enc, phones_mask, z, frames_mask, durations=None, durations_lengths=None):
        """Hard phone-to-frame path [B, P, T] and Glow-TTS's prior loss of each frame under its phone's mean.

        Items with durations (durations_lengths > 0, from an MFA TextGrid) use them; the others get the
        monotonic alignment search (MAS) path on the Gaussian log-likelihood of the latent frames."""
        mu = self.align_proj(enc)  # [B, P, D]
        zt = z.transpose(1, 2).detach()  # [B, T, D]: a target, the frozen codec latent
        b, p, t = mu.shape[0], mu.shape[1], zt.shape[1]

        def searched(m, zm, pm, fm):  # the MAS path of these rows: the one read-back a step needs
            with torch.no_grad():
                m, zm = m.float(), zm.float()
                logp = -0.5 * ((m * m).sum(-1)[:, :, None] - 2 * m @ zm.transpose(1, 2)
                               + (zm * zm).sum(-1)[:, None, :])
            return mas_durations(logp, pm, fm)[0].float()

        if durations is None:  # shards without MFA durations: every row searched, no mask to read back first
            path = searched(mu, zt, phones_mask, frames_mask)
        else:
            given = (durations_lengths > 0) if durations_lengths is not None else \
                torch.ones(b, dtype=torch.bool, device=mu.device)
            path = torch.zeros(b, p, t, device=mu.device)
            if given.any():
                d = F.pad(durations[given].long(), (0, p - durations.shape[1]))
                path[given] = durations_to_path(d, t)
            if not given.all():
                path[~given] = searched(mu[~given], zt[~given], phones_mask[~given], frames_mask[~given])
        path = path.to(mu.dtype)
        mu_frames = path.transpose(1, 2) @ mu  # [B, T, D]
        fm = frames_mask[..., None].to(mu.dtype)
        loss = 0.5 * (((zt - mu_frames) ** 2) * fm).sum() / (fm.sum().clamp(min=1) * zt.shape[-1])
        return path, path.sum(-1).round().long(), loss

    def condition(self, enc, path, ref, ref_mask, mask, pitch):
        """Frame-level condition: phone encodings expanded by the path [B, P, T], the pitch predicted from them,
        plus the embedding of the true pitch's bucket. Returns (condition [B, T, h], log-pitch prediction)."""
        x = (path.transpose(1, 2).to(enc.dtype) @ enc) * mask[..., None]  # Amphion's length regulator
        pitch_log = self.pitch_predictor(x, mask, ref, ref_mask)
        x = (x + self.pitch_emb(torch.bucketize(pitch, self.pitch_bin_edges))) * mask[..., None]
        return x, pitch_log

    # -- diffusion (Amphion's VP-SDE)

    def cum_beta(self, t):
        return self.cfg.beta_min * t + 0.5 * (self.cfg.beta_max - self.cfg.beta_min) * t * t

    def diffuse(self, x0, cond, mask, query, t=None, noise=None) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        if t is None:
            t = torch.rand(x0.shape[0], device=x0.device, dtype=x0.dtype)
        t = t.clamp(1e-5, 1.0 - 1e-5)
        if noise is None:  # contiguous, as Amphion draws it (randn_like would follow the latent's transposed layout)
            noise = torch.randn(x0.shape, dtype=x0.dtype, device=x0.device)
        cb = self.cum_beta(t)[:, None, None]
        keep = torch.exp(-0.5 * cb / cfg.sigma ** 2)
        std = torch.sqrt(cfg.sigma ** 2 * (1.0 - torch.exp(-cb / cfg.sigma ** 2))) * cfg.noise_factor
        xt = x0 * keep + noise * std
        if cfg.mask_padding:
            xt = xt * mask[:, None]
        x0_pred = self.wavenet(xt, mask, cond, t, query)
        noise_pred = (xt - x0_pred * keep) / std
        return {"x0_pred": x0_pred, "noise_pred": noise_pred, "noise": noise,
                "x0": masked_l1(x0_pred, x0, mask), "noise_loss": masked_l1(noise_pred, noise, mask)}

    def _finish(self, out: dict[str, Any], x0, target_codes, mask, pitch_loss, dur_loss, align_loss, extra):
        cfg = self.cfg
        labels = self.requantize(x0) if cfg.ce_labels == "requantized" else target_codes
        ce_loss, acc = self.code_ce(out["x0_pred"], labels, mask)
        total = (pitch_loss + dur_loss + out["x0"] + cfg.noise_loss_weight * out["noise_loss"]
                 + cfg.ce_loss_weight * ce_loss + cfg.align_loss_weight * align_loss)
        return {"loss": total, "pitch": pitch_loss, "duration": dur_loss, "x0": out["x0"], "noise": out["noise_loss"],
                "ce": ce_loss, "align": align_loss, "code_acc": acc, "x0_pred": out["x0_pred"],
                "noise_pred": out["noise_pred"], **extra}

    def amphion_forward(self, code, pitch, duration, phone_id, ref_code, phone_mask, mask, ref_mask, t=None,
                        noise=None) -> dict[str, torch.Tensor]:
        """Amphion's NaturalSpeech2.forward and its trainer's losses on Amphion's inputs: target codes [B, Q, T],
        pitch [B, T], target phones [B, N] with durations [B, N], prompt codes [B, Q, T'], and the masks."""
        phone_mask, mask, ref_mask = phone_mask.bool(), mask.bool(), ref_mask.bool()
        ref, query = self.encode_prompt(ref_code, ref_mask)
        enc = self.phone_encoder(self.phone_emb(phone_id.long()), phone_mask, ref, ref_mask)
        dur_log = self.duration_predictor(enc, phone_mask, ref, ref_mask)
        dur_loss = masked_l1(dur_log, torch.log1p(duration.float()), phone_mask)
        x, pitch_log = self.condition(enc, durations_to_path(duration.long(), mask.shape[1]), ref, ref_mask, mask,
                                      pitch)
        pitch_loss = masked_l1(pitch_log, torch.log(pitch.float()), mask)
        x0 = self.latent(code).detach()
        out = self.diffuse(x0, x, mask, query, t, noise)
        align = sum(p.sum() for p in self.align_proj.parameters()) * 0.0  # unused here; DDP needs a gradient
        return self._finish(out, x0, code, mask, pitch_loss, dur_loss, align,
                            {"dur_log": dur_log, "pitch_log": pitch_log, "durations": duration.long()})

    def forward(self, codes, codes_mask, phones, phones_mask, f0, prompt_codes=None, prompt_mask=None,
                prompt_lengths=None, target_codes=None, target_mask=None, target_f0=None, durations=None,
                durations_lengths=None, prompt_phones=None, t=None, noise=None, **_: Any) -> dict[str, torch.Tensor]:
        if self.cfg.prompt_rule == "phones":
            return self._forward_phones(codes, codes_mask, phones, phones_mask, f0, prompt_phones, durations,
                                        durations_lengths, t, noise)
        ref, query = self.encode_prompt(prompt_codes, prompt_mask)
        enc = self.phone_encoder(self.phone_emb(phones.long()), phones_mask, ref, prompt_mask)  # [B, P, h]
        path, dur, align_loss = self.align(enc, phones_mask, self.latent(codes), codes_mask, durations,
                                           durations_lengths)
        dur_log = self.duration_predictor(enc, phones_mask, ref, prompt_mask)
        dur_loss = masked_l1(dur_log, torch.log1p(dur.to(dur_log.dtype)), phones_mask)
        # The target's frames of the whole utterance's path.
        b, p, tt = path.shape[0], path.shape[1], target_mask.shape[1]
        idx = (prompt_lengths[:, None] + torch.arange(tt, device=path.device)[None]).clamp(max=path.shape[2] - 1)
        path_t = torch.gather(path, 2, idx[:, None].expand(b, p, tt)) * target_mask[:, None]
        x, pitch_log = self.condition(enc, path_t, ref, prompt_mask, target_mask, target_f0)
        pitch_loss = masked_l1(pitch_log, torch.log(target_f0.float()), target_mask)
        x0 = self.latent(target_codes).detach()  # [B, D, Tt]
        out = self.diffuse(x0, x, target_mask, query, t, noise)
        return self._finish(out, x0, target_codes, target_mask, pitch_loss, dur_loss, align_loss,
                            {"dur_log": dur_log, "pitch_log": pitch_log, "durations": dur})

    def _forward_phones(self, codes, codes_mask, phones, phones_mask, f0, k, durations, durations_lengths, t, noise):
        """Amphion's prompt rule: the first k phones (k from PromptSplit) and their frames are the prompt; the
        target is the other phones and frames. Durations: MFA where given; for the other rows an alignment pass
        (the phone encoder over every phone, conditioned on the whole utterance) finds them by MAS first."""
        b, p = phones.shape
        # Shards without MFA durations give none: then there is nothing to read back from the device here
        if durations is not None and bool((durations_lengths > 0).all()):
            dur = F.pad(durations.long(), (0, p - durations.shape[1]))
            align = sum(q.sum() for q in self.align_proj.parameters()) * 0.0  # DDP needs a gradient everywhere
        else:
            ref_all, _ = self.encode_prompt(codes, codes_mask)
            enc_all = self.phone_encoder(self.phone_emb(phones.long()), phones_mask, ref_all, codes_mask)
            _, dur, align = self.align(enc_all, phones_mask, self.latent(codes), codes_mask, durations,
                                       durations_lengths)
        s = prompt_start(dur[:, 0], k)
        j = torch.arange(p, device=phones.device)[None]
        in_prompt = (j >= s[:, None]) & (j < (s + k)[:, None])
        fe = (dur * in_prompt).sum(1) + (dur * (j < s[:, None])).sum(1)  # frames before the prompt's end
        if ((fe < 1) | (fe >= codes_mask.sum(1))).any():
            raise ValueError(f"phones prompt rule: prompt frames {fe.tolist()} for utterances of "
                             f"{codes_mask.sum(1).tolist()} frames")
        cut = split_at({"codes": codes, "codes_lengths": codes_mask.sum(1), "f0": f0}, fe)
        keep = phones_mask & ~in_prompt
        n = keep.sum(1)
        pt = int(n.max())
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :pt]
        t_mask = torch.arange(pt, device=phones.device)[None] < n[:, None]
        t_phones = torch.gather(phones.long(), 1, order) * t_mask
        t_dur = torch.gather(dur, 1, order) * t_mask
        out = self.amphion_forward(cut["target_codes"], cut["target_f0"], t_dur, t_phones, cut["prompt_codes"],
                                   t_mask, cut["target_mask"], cut["prompt_mask"], t, noise)
        out["loss"] = out["loss"] + self.cfg.align_loss_weight * align  # amphion_forward's own align term is 0
        out["align"] = align
        return out


LOSS_TERMS = ("pitch", "duration", "x0", "noise", "ce", "align")


# ----------------------------------------------------------------------------- loss

MODEL_KEYS = ("codes", "codes_mask", "phones", "phones_mask", "f0", "prompt_codes", "prompt_mask", "prompt_lengths",
              "target_codes", "target_mask", "target_f0", "durations", "durations_lengths", "prompt_phones")


def loss_fn(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The summed loss and every term (left on the device for core to average). Dropout, t and noise come
    from the global RNG, which core reseeds every step from (seed, rank, step): --resume draws them again."""
    out = model(**{k: batch[k] for k in MODEL_KEYS if k in batch})
    return out["loss"], {k: out[k].detach() for k in (*LOSS_TERMS, "code_acc")}


# ----------------------------------------------------------------------------- training

def amphion_lr(step: int, lr: float, warmup: int, max_steps: int) -> float:
    """Amphion's NS2 schedule (its trainer's diffusers get_scheduler("cosine")): linear from 0 over `warmup`
    steps, then half a cosine to 0 at max_steps. step: the optimizer step about to be taken, from 0, which is
    how many times Amphion's trainer has stepped its scheduler (once per step, after the optimizer), so its first
    step takes LR 0 during warmup."""
    if step < warmup:
        return lr * step / max(1, warmup)
    progress = (step - warmup) / max(1, max_steps - warmup)
    return lr * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--codec-checkpoint", default="",
                   help="the EnCodec save_pretrained folder the shards' codes were made with: its frozen quantizer "
                        "makes the latent (checked against the shards' record of it). Not needed for shards made "
                        "with --codec-random-init, nor when --init-from brings the quantizer")
    auto = ("auto: with --resume the run's own; else the config's, Amphion's unless a --config JSON sets another "
            "(Amphion's with an Amphion --init-from)")
    p.add_argument("--prompt-rule", choices=("auto", "frames", "phones"), default="auto",
                   help=f"phones: Amphion's, 10-50%% of the phones cut from the start with their frames; frames: a "
                        f"prefix of 10-50%% of the frames is the prompt and the phone encoder reads every phone "
                        f"({auto})")
    p.add_argument("--phone-table", choices=("auto", "audiopipe", "amphion"), default="auto",
                   help=f"phone ids the model sees: Amphion's 89-entry table (amphion), or the shards' own "
                        f"(audiopipe) ({auto})")
    p.add_argument("--forward", choices=("auto", "audiopipe", "amphion"), default="auto",
                   help=f"amphion: Amphion's forward exactly (one position per batch item, convs and style means "
                        f"read padding, re-quantised code labels); audiopipe: padding masked everywhere, one "
                        f"position per time step, the shards' codes as labels ({auto})")
    p.add_argument("--lr-schedule", choices=("auto", "amphion", "cosine"), default="auto",
                   help=f"amphion: Amphion's trainer's, linear from 0 over --warmup-steps, then cosine to 0 at "
                        f"--max-steps; cosine: trainers/core's, warmup from --lr / --warmup-steps, then cosine to "
                        f"--min-lr-ratio ({auto})")


RULE_FLAGS = {"prompt_rule": "--prompt-rule", "phone_table": "--phone-table", "forward": "--forward",
              "lr_schedule": "--lr-schedule"}


def resolve_modes(mcfg: NS2Config, args: argparse.Namespace, upstream: bool,
                  recorded: dict[str, Any] | None = None) -> NS2Config:
    """The config with the rule flags applied. A flag given wins; `auto` takes the run's own rules when resuming
    (`recorded`, its ns2_config.json; a field it lacks was LEGACY_RULES' then), Amphion's for an Amphion
    --init-from, else the config's (Amphion's unless a --config JSON says otherwise)."""
    if recorded is not None:
        auto: dict[str, Any] = {k: {**LEGACY_RULES, **recorded}[k] for k in LEGACY_RULES}
    else:
        auto = dict(AMPHION_RULES) if upstream else {k: getattr(mcfg, k) for k in LEGACY_RULES}
    forward = {"amphion": AMPHION_FORWARD, "audiopipe": AUDIOPIPE_FORWARD}.get(args.forward)
    changes = {**auto, **(forward or {})}
    for key in ("prompt_rule", "phone_table", "lr_schedule"):
        if getattr(args, key) != "auto":
            changes[key] = getattr(args, key)
    return check_config(dataclasses.replace(mcfg, **changes))


INIT_HINTS = {
    "phone_emb.": "the phone tables differ in size: give a --config JSON with the checkpoint's vocab_size (an "
                  "Amphion checkpoint also needs --phone-table amphion, the default with it)",
    "quantizer.": "the checkpoint's codec quantizer has another shape: set codec_layers / codebook_size / "
                  "latent_dim in a --config JSON to the codec's",
    "pitch_emb.": "the checkpoint has another number of pitch bins: set pitch_bins in a --config JSON",
    "pitch_bin_edges": "the checkpoint has another number of pitch bins: set pitch_bins in a --config JSON",
    "query_emb.": "the checkpoint has another number of query tokens: set query_tokens in a --config JSON",
}


def make_init_reader(codec: dict[str, torch.Tensor] | None, n_codebooks: int):
    """--init-from: an Amphion checkpoint (folder or file, converted) or one of ours; its codec codebooks must be
    the shards' codec's when that is known."""

    def read(path: str) -> dict[str, torch.Tensor]:
        if looks_upstream(path):
            state = read_upstream(path)
        else:
            state = read_own_weights(path)
            if is_upstream_state(state):  # Amphion's tensors under another file name: its modes were not chosen
                raise CheckpointError(f"{path} holds Amphion's NS2 tensors: give its folder, or name the file "
                                      f"pytorch_model.bin or model.safetensors, so Amphion's prompt rule, phone "
                                      f"table and forward are selected with it")
        if codec is not None and "quantizer.embed" in state:
            theirs, ours = state["quantizer.embed"], codec["quantizer.embed"]
            if theirs.shape[1:] == ours.shape[1:] and len(theirs) >= n_codebooks:
                gap = float((theirs[:n_codebooks].float() - ours[:n_codebooks]).abs().max())
                if gap > 1e-6:
                    raise CheckpointError(f"{path}: its EnCodec codebooks differ from those of the codec the shards "
                                          f"were made with (max |difference| {gap:.3g}): shard with the codec the "
                                          f"checkpoint was trained on")
        return state

    return read


def main(argv: list[str] | None = None) -> int:
    # config
    cfg, args = parse_args("Train NaturalSpeech 2 on audiopipe ns2 shards.", defaults=RUN_DEFAULTS, extra=add_flags,
                           argv=argv, flag_help={
                               "warmup_steps": "linear warmup steps, then the cosine decay of --lr-schedule",
                               "min_lr_ratio": "with --lr-schedule cosine: final LR as a fraction of --lr"})
    refuse_other_family(cfg, "ns2", "ns2")
    d = setup_dist(cfg.seed)
    out = Path(cfg.out)
    resuming = cfg.resume and latest_checkpoint(out) is not None
    saved = out / "ns2_config.json"
    # A resumed run keeps the rules it was started with: its ns2_config.json says which.
    recorded = json.loads(saved.read_text()) if resuming and saved.is_file() else None
    if resuming and recorded is None and any(getattr(args, k) == "auto" for k in RULE_FLAGS):
        raise SystemExit(f"--resume: {saved} is missing, so the rules this run was started with are unknown; "
                         f"restore it, or give {', '.join(RULE_FLAGS.values())} as the run was started")
    upstream = bool(cfg.init_from) and looks_upstream(cfg.init_from)
    mcfg = resolve_modes(check_config(load_model_config(cfg.config, CONFIGS, NS2Config)), args, upstream,
                         recorded)
    if recorded is not None:
        old = {**LEGACY_RULES, **recorded}
        if diff := {k: (old.get(k), v) for k, v in asdict(mcfg).items() if old.get(k) != v}:
            raise SystemExit(f"--resume: this run was started with another model config ({diff}, as (then, "
                             f"now)); give the same --config and flags")
    # data: the utterances a prompt/target split and an alignment can use, and the split itself
    # Per --shards folder (several are mixed): durations are read only when every folder has the column.
    dirs = shard_dirs(cfg)
    try:
        has_column = all([check_shards(s, mcfg) for s in dirs])
        vocabs = [shard_vocab(s) for s in dirs]
        if any(v != vocabs[0] for v in vocabs):
            raise SystemExit("the --shards folders use different phone vocabularies; shard them alike")
        remap = PhoneRemap(amphion_phone_map(vocabs[0])) if mcfg.phone_table == "amphion" else None
    except CheckpointError as e:
        raise SystemExit(f"ns2: error: {e}") from None
    parts = [usable_subset(s, 2 if mcfg.prompt_rule == "phones" else 1) for s in dirs]
    subset = np.concatenate([p[0] + off for p, off in zip(parts, corpus_offsets(cfg))])
    dropped = [x for p in parts for x in p[1]]
    n_durations = sum(p[2] for p in parts) if has_column else 0
    if len(subset) == 0:
        raise SystemExit(f"{cfg.shards}: no utterance has >= 2 frames and at least one frame per phone")
    features = FEATURES + (["durations"] if has_column else [])
    split = PromptSplit(mcfg.prompt_min_frac, mcfg.prompt_max_frac, seed=cfg.seed, vocab_size=mcfg.vocab_size,
                        rule=mcfg.prompt_rule)
    # the codec whose quantizer makes the latent
    identity = codec_identity(dirs)
    codec = codec_quantizer(identity, args.codec_checkpoint)
    if codec is None and not cfg.init_from and not resuming:
        raise SystemExit(f"the shards' codes were made with the EnCodec checkpoint {identity}; give that folder with "
                         f"--codec-checkpoint DIR (its frozen quantizer turns codes into the latent)")
    if d.main:
        print(f"[ns2] prompt rule {mcfg.prompt_rule}, phone table {mcfg.phone_table}, forward: positions per "
              f"{'batch item' if mcfg.positions == 'batch' else 'time step'}, padding "
              f"{'masked' if mcfg.mask_padding else 'read (Amphion)'}, code labels {mcfg.ce_labels}, lr schedule "
              f"{mcfg.lr_schedule}", flush=True)
        if differs := rule_differences(asdict(mcfg)):
            print(f"[ns2] not Amphion's rules ({', '.join(f'{x.what} {x.ours}' for x in differs)}): Amphion would "
                  f"compute something else with these weights, so export-checkpoint refuses this run without "
                  f"--allow-different; for a model meant for Amphion, leave --prompt-rule, --phone-table and "
                  f"--forward at their defaults (Amphion's)", flush=True)
        if dropped:
            print(f"[ns2] leaving out {len(dropped)} utterance(s) with < 2 frames or fewer frames than phones: "
                  f"{', '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''}", flush=True)
        if n_durations < len(subset):
            print(f"[ns2] {len(subset) - n_durations} of {len(subset)} utterances have no phone durations in the "
                  f"shards: learning them with monotonic alignment search (MAS) between phone encodings and the "
                  f"latent, as Glow-TTS/VITS", flush=True)
        if n_durations:
            print(f"[ns2] {n_durations} of {len(subset)} utterances use the shards' MFA durations", flush=True)
        if codec is None and not resuming:
            print(f"[ns2] EnCodec codebooks from --init-from {cfg.init_from} (not checked against the shards' codec "
                  f"{identity}: give --codec-checkpoint to check)", flush=True)
        out.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(asdict(mcfg), indent=1) + "\n")
    # model
    model = NaturalSpeech2(mcfg)
    if codec is not None:
        model.set_codec(codec)
    if d.main:
        print(f"[ns2] config {cfg.config}: {count_parameters(model) / 1e6:.2f} M parameters", flush=True)
    # loss and training
    train(model, loss_fn, cfg, d, features=features, length_feature="codes",
          loader_kw={"batch_transform": Chain(remap, split), "subset": subset}, log_name="ns2",
          init_weights=make_init_reader(codec, mcfg.n_codebooks), init_hints=INIT_HINTS,
          lr_fn=(lambda s: amphion_lr(s, cfg.lr, cfg.warmup_steps, cfg.max_steps)) if mcfg.lr_schedule == "amphion"
          else None)  # None: core's warmup + cosine
    return 0


if __name__ == "__main__":
    sys.exit(main())
