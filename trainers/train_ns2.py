"""NaturalSpeech 2 on audiopipe ns2 shards: latent diffusion over codec codes, with a speech prompt.

    torchrun --nproc_per_node=2 trainers/train_ns2.py --shards ./shards --config tiny --out runs/ns2 --max-steps 20

Reads `codes` (EnCodec 24 kHz, 16 x 1024, 75 Hz), `f0` (interpolated, > 0, same frames) and `phones` (ids in
audiopipe.text.en_phones.PHONES) of the `ns2` preset. Follows Amphion's recipe (models/tts/naturalspeech2):
  - a random prefix of each utterance (10-50 % of its frames) is the speech prompt, the rest the target
    (PromptSplit, the loader's batch_transform);
  - prompt encoder: a Transformer over the prompt latent; 32 learned query tokens attend to it (query_attn);
  - phone encoder: a Transformer (self-attention + conv FFN) whose layer norms are style-adaptive, conditioned
    on the prompt; duration and pitch predictors: conv stacks with cross-attention to the prompt every 3 layers;
  - the phone encodings are expanded to frames by the durations, plus an embedding of the bucketed pitch;
  - denoiser: a WaveNet (dilated convs, gated units, FiLM from cross-attention to the query tokens every 3
    layers) predicting x0 under Amphion's VP-SDE (beta 0.05..20, t ~ U(0, 1));
  - losses: L1 on log-pitch, L1 on log(1 + duration), L1 on x0, L1 on the noise implied by x0,
    0.5 x cross-entropy of the RVQ indices from the predicted latent (distances to each codebook, residual
    after each layer, as Amphion's latent_to_code).
Simplified or changed:
  - the latent: Amphion decodes codes with the frozen EnCodec quantizer. With codes only (no codec checkpoint in
    the trainer) each codebook gets a learned embedding table and the latent is their sum; rows are kept at a
    fixed norm (sqrt(latent_dim / 16), so the latent has unit scale per channel, as the VP-SDE expects) and the
    diffusion target is that latent without gradient (the frozen quantizer's role): the tables learn through
    the prompt path and the cross-entropy, which reads codes back from the denoised latent by distance to them;
  - durations: Amphion reads MFA durations. Utterances whose shard row has them (a TextGrid beside the audio)
    use them; the others (our corpora: no TextGrids) learn them with monotonic alignment search (trainers/mas.py)
    between the phone encodings (projected to the latent) and the utterance's latent, as Glow-TTS/VITS do, with
    Glow-TTS's Gaussian prior loss (`align`) to train that projection. The alignment covers the whole utterance
    (prompt + target, since the phones do), and the target's frames take their part of it; Amphion instead cuts
    the prompt at a phone boundary and drops its phones;
  - padding is masked everywhere (conv inputs, attention keys, the style statistics), so padded frames change
    nothing for real ones; the transformer positions are per time step (Amphion's index the batch axis);
  - no inference/sampler here (training only); trainers/core's warmup + cosine schedule.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.index.lengths import LengthIndex
from audiopipe.shard.manifest import read_manifest
from audiopipe.text.en_phones import PHONES

from core import (
    corpus_offsets,
    count_parameters,
    load_model_config,
    parse_args,
    setup_dist,
    shard_dirs,
    train,
)
from mas import mas_durations

# ----------------------------------------------------------------------------- config

@dataclass
class NS2Config:
    n_codebooks: int = 16
    codebook_size: int = 1024
    latent_dim: int = 128
    vocab_size: int = 100  # phone ids (audiopipe's PHONES has 99)
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
    prompt_min_frac: float = 0.1  # prompt length as a fraction of the utterance (Amphion: 10-50 % of phones)
    prompt_max_frac: float = 0.5


CONFIGS = {
    "tiny": NS2Config(latent_dim=16, hidden=32, heads=2, enc_layers=1, prompt_layers=1, enc_filter=64,
                      enc_kernel=3, dur_layers=3, pitch_layers=3, query_tokens=4, wn_layers=4, pitch_bins=64),
    "small": NS2Config(latent_dim=64, hidden=128, heads=4, enc_layers=3, prompt_layers=2, enc_filter=256,
                       enc_kernel=5, dur_layers=6, pitch_layers=6, query_tokens=8, wn_layers=12),
    "default": NS2Config(),  # Amphion config/ns2.json
}
# Amphion's exp_config_base: max_tokens 7500 frames per GPU, lr 7.5e-5, 5000 warmup steps, grad clip 0.5.
RUN_DEFAULTS = dict(batch_frames=7500, lr=7.5e-5, warmup_steps=5000, clip=0.5)
FEATURES = ["codes", "f0", "phones"]


# ----------------------------------------------------------------------------- data: usable utterances, prompt split

class PromptSplit:
    """Loader batch_transform: a random prefix of each utterance is the prompt, the rest the target.

    Adds prompt_codes [B, Q, Tp] / prompt_mask / prompt_lengths, and target_codes [B, Q, Tt] / target_f0 /
    target_mask / target_lengths (both left-aligned; the target starts at frame prompt_lengths[b] of `codes`).
    The full `codes`, `phones` and their masks stay (the alignment needs the whole utterance).
    The draw is a pure function of (seed, the batch's utterance indices): a resumed run, with or without
    workers, draws what the uninterrupted one did. (A batch that recurs identically in a later epoch, only
    likely in a tiny corpus, gets the same split again.)
    """

    def __init__(self, min_frac: float = 0.1, max_frac: float = 0.5, seed: int = 0, vocab_size: int | None = None):
        if not 0.0 < min_frac <= max_frac < 1.0:
            raise ValueError(f"need 0 < min_frac <= max_frac < 1, got {min_frac}, {max_frac}")
        self.min_frac, self.max_frac, self.seed, self.vocab_size = min_frac, max_frac, seed, vocab_size

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
        frac = rng.uniform(self.min_frac, self.max_frac, size=len(lengths))
        tp = torch.from_numpy(np.floor(frac * lengths.numpy()).astype(np.int64))
        return split_at(batch, torch.minimum(tp.clamp(min=1), lengths - 1))


def split_at(batch: dict[str, Any], tp: torch.Tensor) -> dict[str, Any]:
    """The deterministic half of PromptSplit: frames [0, tp[b]) are item b's prompt, [tp[b], T_b) its target."""
    codes, lengths = batch["codes"], batch["codes_lengths"]
    if ((tp < 1) | (tp >= lengths)).any():
        raise ValueError(f"prompt lengths {tp.tolist()} must be in [1, T - 1] for lengths {lengths.tolist()}")
    tt = lengths - tp
    b, q, _ = codes.shape
    tp_max, tt_max = int(tp.max()), int(tt.max())
    prompt_mask = torch.arange(tp_max)[None] < tp[:, None]
    target_mask = torch.arange(tt_max)[None] < tt[:, None]
    # New tensors (never views): the collated batch lives in a reused ring buffer.
    prompt = codes[..., :tp_max].long() * prompt_mask[:, None]
    idx = (tp[:, None] + torch.arange(tt_max)[None]).clamp(max=codes.shape[-1] - 1)
    target = torch.gather(codes, 2, idx[:, None].expand(b, q, tt_max)).long() * target_mask[:, None]
    f0 = torch.gather(batch["f0"], 1, idx).masked_fill(~target_mask, 1.0)  # log-safe padding
    batch.update(prompt_codes=prompt, prompt_mask=prompt_mask, prompt_lengths=tp,
                 target_codes=target, target_f0=f0, target_mask=target_mask, target_lengths=tt)
    return batch


def usable_subset(shards: str | Path) -> tuple[np.ndarray, list[str], int]:
    """Utterances a prompt/target split and an alignment can use: >= 2 frames, >= 1 phone, and either MFA
    durations or at least one frame per phone (for MAS). Returns (indices, ids left out, how many have durations)."""
    idx = LengthIndex.open(shards)
    frames, phones = idx.frames("codes").astype(np.int64), idx.frames("phones").astype(np.int64)
    cols = idx.table.column_names
    has_d = idx.frames("durations") > 0 if "durations_frames" in cols else np.zeros(len(frames), dtype=bool)
    ok = (frames >= 2) & (phones >= 1) & (has_d | (frames >= phones))
    ids = idx.table.column("id").to_pylist()
    return np.flatnonzero(ok), [ids[i] for i in np.flatnonzero(~ok)], int((has_d & ok).sum())


def check_shards(shards: str | Path, cfg: NS2Config) -> bool:
    """Refuse shards this config cannot read; True when they have a `durations` column (MFA, maybe empty)."""
    m = read_manifest(shards)
    feats = m["features"]
    if "codes" not in feats or "f0" not in feats:
        raise SystemExit(f"{shards} has no codes/f0 columns ({sorted(feats)}): make it with `--preset ns2`")
    spec = feats["codes"]
    if spec["channels"] != cfg.n_codebooks or spec["params"].get("codebook_size") != cfg.codebook_size:
        raise SystemExit(f"{shards}: codes have {spec['channels']} codebooks of {spec['params'].get('codebook_size')}"
                         f", the config expects {cfg.n_codebooks} of {cfg.codebook_size}")
    if feats["f0"].get("hop_length") != spec.get("hop_length"):
        raise SystemExit(f"{shards}: f0 hop {feats['f0'].get('hop_length')} differs from the codes' "
                         f"{spec.get('hop_length')}; use the ns2 preset (align_to codes)")
    vocab = m.get("phones", {}).get("vocab", PHONES)  # older shards do not record it: ours then
    if len(vocab) > cfg.vocab_size:
        raise SystemExit(f"{shards}: the phone vocabulary has {len(vocab)} entries, the config's vocab_size is "
                         f"{cfg.vocab_size}")
    if not feats["f0"].get("params", {}).get("interpolate"):
        raise SystemExit(f"{shards}: f0 was made without interpolate=True, so unvoiced frames hold 0 and log-pitch "
                         f"is undefined there; use the ns2 preset")
    return "durations_frames" in LengthIndex.open(shards).table.column_names



# ----------------------------------------------------------------------------- building blocks

def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x [B, T, d], mask bool [B, T] -> [B, 1, d]."""
    m = mask[..., None].to(x.dtype)
    return (x * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)


def sinusoid_positions(n: int, dim: int, device) -> torch.Tensor:
    pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, device=device, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(n, dim, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : dim // 2]
    return pe


class StyleAdaptiveLayerNorm(nn.Module):
    """LayerNorm whose gain and bias come from the (masked) mean of a condition sequence."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.style = nn.Linear(dim, 2 * dim)
        nn.init.constant_(self.style.bias[:dim], 1.0)
        nn.init.zeros_(self.style.bias[dim:])

    def forward(self, x, cond, cond_mask):
        gamma, beta = self.style(masked_mean(cond, cond_mask)).chunk(2, dim=-1)
        return gamma * self.norm(x) + beta


class EncoderLayer(nn.Module):
    """Pre-norm self-attention + conv FFN (conv k, ReLU, linear), as Amphion's TransformerEncoderLayer."""

    def __init__(self, cfg: NS2Config, style: bool):
        super().__init__()
        h = cfg.hidden
        self.style = style
        self.ln1 = StyleAdaptiveLayerNorm(h) if style else nn.LayerNorm(h)
        self.ln2 = StyleAdaptiveLayerNorm(h) if style else nn.LayerNorm(h)
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
        y, _ = self.attn(y, y, y, key_padding_mask=~mask, need_weights=False)
        x = x + self.drop(y)
        y = self._norm(self.ln2, x, cond, cond_mask) * mask[..., None]  # the conv must not read padding
        y = F.relu(self.ffn1(y.transpose(1, 2))).transpose(1, 2)
        return x + self.ffn2(self.drop(y))


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: NS2Config, layers: int, style: bool):
        super().__init__()
        self.style = style
        self.layers = nn.ModuleList(EncoderLayer(cfg, style) for _ in range(layers))
        self.last_ln = StyleAdaptiveLayerNorm(cfg.hidden) if style else nn.LayerNorm(cfg.hidden)
        self.drop = nn.Dropout(cfg.enc_dropout)

    def forward(self, x, mask, cond=None, cond_mask=None):
        x = self.drop(x + sinusoid_positions(x.shape[1], x.shape[2], x.device).to(x.dtype))
        for layer in self.layers:
            x = layer(x, mask, cond, cond_mask)
        x = self.last_ln(x, cond, cond_mask) if self.style else self.last_ln(x)
        return x * mask[..., None]


class Predictor(nn.Module):
    """Conv stack (conv, ReLU, LayerNorm, dropout; residual after the first), with cross-attention to the prompt
    before every `every`-th layer; one value per position (log duration or log pitch)."""

    def __init__(self, cfg: NS2Config, layers: int, kernel: int):
        super().__init__()
        h = cfg.hidden
        self.every = cfg.pred_cross_attn_every
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
        x = x * m
        for i, (conv, ln) in enumerate(zip(self.convs, self.lns)):
            res = x
            if i % self.every == 0:
                k = i // self.every
                y, _ = self.attns[k](self.attn_lns[k](x), ref, ref, key_padding_mask=~ref_mask, need_weights=False)
                x = (self.attn_drop(y) + x) / math.sqrt(2.0) * m
            x = self.drop(ln(F.relu(conv(x.transpose(1, 2)).transpose(1, 2))))
            if i > 0:
                x = x + res
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
            a, _ = self.attn(self.ln(y.transpose(1, 2)), query, query, need_weights=False)
            z = self.film(z.transpose(1, 2), a).transpose(1, 2)
        gate, filt = z.chunk(2, dim=1)
        res, skip = self.out_proj(torch.sigmoid(gate) * torch.tanh(filt)).chunk(2, dim=1)
        return (x + res * m) / math.sqrt(2.0), skip * m


class WaveNet(nn.Module):
    """x0 estimator: (x_t [B, D, T], mask, condition [B, T, h], t [B], query tokens [B, Q, h]) -> x0 [B, D, T]."""

    def __init__(self, cfg: NS2Config):
        super().__init__()
        h = cfg.hidden
        self.h = h
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
        x = F.relu(self.skip_proj(skips / math.sqrt(len(self.layers))))
        return self.out_proj(x) * m


# ----------------------------------------------------------------------------- the model

def masked_l1(pred, target, mask) -> torch.Tensor:
    """Amphion's diff_loss: mean over channels, sum over real frames / their count. pred/target [B, D, T] or
    [B, T]; mask [B, T]."""
    err = (pred.float() - target.float()).abs()
    if err.dim() == 3:
        err = err.mean(1)
    m = mask.to(err.dtype)
    return (err * m).sum() / m.sum().clamp(min=1)


class NaturalSpeech2(nn.Module):
    """forward(**batch tensors) -> {loss terms, accuracy}; see the module docstring for what is simplified."""

    def __init__(self, cfg: NS2Config):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden, cfg.latent_dim
        self.code_emb = nn.Parameter(torch.randn(cfg.n_codebooks, cfg.codebook_size, d))
        self.code_norm = math.sqrt(d / cfg.n_codebooks)
        self.prompt_lin = nn.Linear(d, h)
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
        self.duration_predictor = Predictor(cfg, cfg.dur_layers, cfg.dur_kernel)
        self.pitch_predictor = Predictor(cfg, cfg.pitch_layers, cfg.pitch_kernel)
        bins = torch.exp(torch.linspace(math.log(cfg.pitch_min), math.log(cfg.pitch_max), cfg.pitch_bins - 1))
        self.register_buffer("pitch_bin_edges", bins, persistent=False)
        self.pitch_emb = nn.Embedding(cfg.pitch_bins, h)
        self.wavenet = WaveNet(cfg)

    # -- latent

    def codebooks(self) -> torch.Tensor:
        """[Q, K, D]: learned rows at a fixed norm, so the summed latent has about unit scale per channel."""
        return F.normalize(self.code_emb, dim=-1) * self.code_norm

    def latent(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> latent [B, D, T] = sum over codebooks of their embeddings."""
        books = self.codebooks()
        z = sum(F.embedding(codes[:, q].long(), books[q]) for q in range(books.shape[0]))
        return z.transpose(1, 2)

    def code_ce(self, x0_pred: torch.Tensor, codes: torch.Tensor, mask: torch.Tensor):
        """Cross-entropy of the codes given the predicted latent: logits are minus squared distances to codebook
        q's rows; the row picked is subtracted before codebook q + 1 (Amphion's latent_to_code)."""
        books = self.codebooks()
        keep = mask.reshape(-1)
        r = x0_pred.transpose(1, 2).reshape(-1, x0_pred.shape[1])[keep].float()  # real frames only: [N, D]
        target = codes.transpose(1, 2).reshape(-1, codes.shape[1])[keep].long()  # [N, Q]
        ce, correct = 0.0, 0.0
        for q in range(books.shape[0]):
            e = books[q].float()  # [K, D]
            # -|r - e|^2 without the -|r|^2 term, which is the same for every row: same softmax, same argmax.
            logits = F.linear(r, 2 * e, -(e * e).sum(-1))
            ce = ce + F.cross_entropy(logits, target[:, q], reduction="sum")
            pred = logits.argmax(-1)
            correct = correct + (pred == target[:, q]).sum().detach().float()
            r = r - F.embedding(pred, e)
        n = max(len(target), 1) * books.shape[0]
        return ce / n, correct / n

    # -- conditioning

    def encode_prompt(self, prompt_codes, prompt_mask):
        ref = self.prompt_encoder(self.prompt_lin(self.latent(prompt_codes).transpose(1, 2)), prompt_mask)
        query = self.query_emb.weight[None].expand(ref.shape[0], -1, -1)
        query, _ = self.query_attn(query, ref, ref, key_padding_mask=~prompt_mask, need_weights=False)
        return ref, query

    def align(self, enc, phones_mask, z, frames_mask, durations=None, durations_lengths=None):
        """Hard phone-to-frame path [B, P, T] and Glow-TTS's prior loss of each frame under its phone's mean.

        Items with durations (durations_lengths > 0, from an MFA TextGrid) use them; the others get the
        monotonic alignment search (MAS) path on the Gaussian log-likelihood of the latent frames."""
        mu = self.align_proj(enc)  # [B, P, D]
        zt = z.transpose(1, 2).detach()  # [B, T, D]: a target, like the frozen codec latent
        b, p, t = mu.shape[0], mu.shape[1], zt.shape[1]
        given = torch.zeros(b, dtype=torch.bool, device=mu.device)
        if durations is not None:
            given = (durations_lengths > 0) if durations_lengths is not None else torch.ones_like(given)
        path = torch.zeros(b, p, t, device=mu.device)
        if given.any():
            d = F.pad(durations[given].long(), (0, p - durations.shape[1]))
            path[given] = durations_to_path(d, t)
        if not given.all():
            with torch.no_grad():
                m, zm = mu[~given], zt[~given]
                logp = -0.5 * ((m * m).sum(-1)[:, :, None] - 2 * m @ zm.transpose(1, 2)
                               + (zm * zm).sum(-1)[:, None, :])
            path[~given] = mas_durations(logp.float(), phones_mask[~given], frames_mask[~given])[0].float()
        path = path.to(mu.dtype)
        mu_frames = path.transpose(1, 2) @ mu  # [B, T, D]
        fm = frames_mask[..., None].to(mu.dtype)
        loss = 0.5 * (((zt - mu_frames) ** 2) * fm).sum() / (fm.sum().clamp(min=1) * zt.shape[-1])
        return path, path.sum(-1).round().long(), loss

    # -- diffusion (Amphion's VP-SDE)

    def cum_beta(self, t):
        return self.cfg.beta_min * t + 0.5 * (self.cfg.beta_max - self.cfg.beta_min) * t * t

    def forward(self, codes, codes_mask, phones, phones_mask, f0, prompt_codes, prompt_mask, prompt_lengths,
                target_codes, target_mask, target_f0, durations=None, durations_lengths=None, t=None,
                noise=None, **_: Any) -> dict[str, torch.Tensor]:
        cfg = self.cfg
        ref, query = self.encode_prompt(prompt_codes, prompt_mask)
        enc = self.phone_encoder(self.phone_emb(phones.long()), phones_mask, ref, prompt_mask)  # [B, P, h]

        z_full = self.latent(codes)
        path, durations, align_loss = self.align(enc, phones_mask, z_full, codes_mask, durations, durations_lengths)
        dur_log = self.duration_predictor(enc, phones_mask, ref, prompt_mask)
        dur_loss = masked_l1(dur_log, torch.log1p(durations.to(dur_log.dtype)), phones_mask)

        # Frame-level phone encodings of the whole utterance, then the target's part.
        frames = path.transpose(1, 2).to(enc.dtype) @ enc  # [B, T, h]
        tt = target_mask.shape[1]
        idx = (prompt_lengths[:, None] + torch.arange(tt, device=frames.device)[None]).clamp(max=frames.shape[1] - 1)
        x = torch.gather(frames, 1, idx[..., None].expand(-1, -1, frames.shape[2])) * target_mask[..., None]

        pitch_log = self.pitch_predictor(x, target_mask, ref, prompt_mask)
        pitch_loss = masked_l1(pitch_log, torch.log(target_f0.float()), target_mask)
        x = (x + self.pitch_emb(torch.bucketize(target_f0, self.pitch_bin_edges))) * target_mask[..., None]

        x0 = self.latent(target_codes).detach()  # [B, D, Tt]
        b = x0.shape[0]
        if t is None:
            t = torch.rand(b, device=x0.device, dtype=x0.dtype)
        t = t.clamp(1e-5, 1.0 - 1e-5)
        if noise is None:
            noise = torch.randn_like(x0)
        cb = self.cum_beta(t)[:, None, None]
        keep = torch.exp(-0.5 * cb / cfg.sigma ** 2)
        std = torch.sqrt(cfg.sigma ** 2 * (1.0 - torch.exp(-cb / cfg.sigma ** 2))) * cfg.noise_factor
        xt = (x0 * keep + noise * std) * target_mask[:, None]
        x0_pred = self.wavenet(xt, target_mask, x, t, query)
        noise_pred = (xt - x0_pred * keep) / std
        x0_loss = masked_l1(x0_pred, x0, target_mask)
        noise_loss = masked_l1(noise_pred, noise, target_mask)
        ce_loss, acc = self.code_ce(x0_pred, target_codes, target_mask)

        total = (pitch_loss + dur_loss + x0_loss + cfg.noise_loss_weight * noise_loss + cfg.ce_loss_weight * ce_loss
                 + cfg.align_loss_weight * align_loss)
        return {"loss": total, "pitch": pitch_loss, "duration": dur_loss, "x0": x0_loss, "noise": noise_loss,
                "ce": ce_loss, "align": align_loss, "code_acc": acc,
                "x0_pred": x0_pred, "dur_log": dur_log, "pitch_log": pitch_log, "durations": durations}


def durations_to_path(durations: torch.Tensor, n_frames: int) -> torch.Tensor:
    """durations [B, P] -> path [B, P, T]: phone p covers frames [cumsum_{p-1}, cumsum_p)."""
    end = durations.cumsum(-1)
    start = end - durations
    pos = torch.arange(n_frames, device=durations.device)[None, None]
    return ((pos >= start[..., None]) & (pos < end[..., None])).float()


LOSS_TERMS = ("pitch", "duration", "x0", "noise", "ce", "align")


# ----------------------------------------------------------------------------- loss

MODEL_KEYS = ("codes", "codes_mask", "phones", "phones_mask", "f0", "prompt_codes", "prompt_mask", "prompt_lengths",
              "target_codes", "target_mask", "target_f0", "durations", "durations_lengths")


def loss_fn(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The summed loss and every term (left on the device for core to average). Dropout, t and noise come
    from the global RNG, which core reseeds every step from (seed, rank, step): --resume draws them again."""
    out = model(**{k: batch[k] for k in MODEL_KEYS if k in batch})
    return out["loss"], {k: out[k].detach() for k in (*LOSS_TERMS, "code_acc")}


# ----------------------------------------------------------------------------- training

def main(argv: list[str] | None = None) -> int:
    # config
    cfg, _ = parse_args("Train NaturalSpeech 2 on audiopipe ns2 shards.", defaults=RUN_DEFAULTS, argv=argv)
    d = setup_dist(cfg.seed)
    mcfg = load_model_config(cfg.config, CONFIGS, NS2Config)
    # data: the utterances a prompt/target split and an alignment can use, and the split itself
    # Per --shards folder (several are mixed): durations are read only when every folder has the column.
    has_column = all([check_shards(s, mcfg) for s in shard_dirs(cfg)])
    parts = [usable_subset(s) for s in shard_dirs(cfg)]
    subset = np.concatenate([p[0] + off for p, off in zip(parts, corpus_offsets(cfg))])
    dropped = [x for p in parts for x in p[1]]
    n_durations = sum(p[2] for p in parts) if has_column else 0
    if len(subset) == 0:
        raise SystemExit(f"{cfg.shards}: no utterance has >= 2 frames and at least one frame per phone")
    features = FEATURES + (["durations"] if has_column else [])
    split = PromptSplit(mcfg.prompt_min_frac, mcfg.prompt_max_frac, seed=cfg.seed, vocab_size=mcfg.vocab_size)
    if d.main:
        if dropped:
            print(f"[ns2] leaving out {len(dropped)} utterance(s) with < 2 frames or fewer frames than phones: "
                  f"{', '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''}", flush=True)
        if n_durations < len(subset):
            print(f"[ns2] {len(subset) - n_durations} of {len(subset)} utterances have no phone durations in the "
                  f"shards: learning them with monotonic alignment search (MAS) between phone encodings and the "
                  f"latent, as Glow-TTS/VITS", flush=True)
        if n_durations:
            print(f"[ns2] {n_durations} of {len(subset)} utterances use the shards' MFA durations", flush=True)
    # model
    model = NaturalSpeech2(mcfg)
    if d.main:
        print(f"[ns2] config {cfg.config}: {count_parameters(model) / 1e6:.2f} M parameters", flush=True)
    # loss and training
    train(model, loss_fn, cfg, d, features=features, length_feature="codes",
          loader_kw={"batch_transform": split, "subset": subset}, log_name="ns2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
