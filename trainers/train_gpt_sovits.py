"""GPT-SoVITS stage 1: an autoregressive transformer from phones to semantic tokens.

    audiopipe shard  --corpus ./wavs --out ./shards --preset gpt_sovits,eres2net   # phones, pcm, fbank
    audiopipe tokens --shards ./shards --out ./tokens --name2semantic 6-name2semantic.tsv   # or --kmeans 512
    torchrun --nproc_per_node=2 trainers/train_gpt_sovits.py --shards ./tokens --config tiny --out runs/s1

--shards is a TOKEN folder (a sidecar shard set from `audiopipe tokens`): it reads `phones` int16 [P] (ids in the
shards' phone table: ARPAbet, or GPT-SoVITS's own symbols with `audiopipe shard --language zh`) and `semantic` int16 [T] (SoVITS codes, or k-means units named kmeans-<feature>-<k>).

Faithful to RVC-Boss/GPT-SoVITS AR/models/t2s_model.py (Text2SemanticDecoder) with the s1 config as `default`:
phone embedding and semantic-token embedding (codebook + EOS), each with its own sinusoidal positions scaled by a
learned alpha; one post-norm transformer (ReLU MLP, dropout 0.1) over the concatenation [phones; tokens] with the
reference's mask: phones see every phone and no token, tokens see every phone and the tokens up to themselves,
padding is never a key. A bias-free linear head predicts the next token; the target after the last token is EOS.
Top-3 accuracy (EOS targets ignored) is logged as in the reference.

Simplified or changed, on purpose:
- No BERT slot. The reference adds Linear(1024 -> dim) of per-phone BERT features to the phone embedding; its
  data preparation computes them for Chinese only and feeds zeros otherwise, so for English text the slot is a
  learned constant (the projection's bias), which the phone embedding can absorb.
- Loss: mean cross-entropy over real target tokens. The reference sums over every position, padding included
  (padding is trained to predict EOS), and newer versions add a DPO term on corrupted sequences.
- Optimiser: AdamW with the core's warmup + cosine schedule instead of ScaledAdam (lr 0.01).
- Batches: audiopipe's length-bucketed sampler, budget = phones + tokens per utterance (the sequence the
  transformer runs over), instead of the reference's 2-second duration buckets. The reference's data filters are
  kept (at most max_sec of tokens, phones per second in [min_ps_ratio, max_ps_ratio]).
- Training only: no sampling / KV-cache inference code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core import corpus_offsets, load_model_config, parse_args, setup_dist, shard_dirs, train  # first: core finds audiopipe
from audiopipe.index.lengths import LengthIndex
from audiopipe.tokens import token_spec


# ----------------------------------------------------------------------------- config

@dataclass
class ModelConfig:
    dim: int = 512  # embedding_dim == hidden_dim
    heads: int = 16
    layers: int = 24
    ff: int = 2048  # linear_units
    vocab_size: int = 1025  # semantic codebook (1024) + EOS; EOS is the last id
    phone_vocab: int = 512  # phoneme_vocab_size (ours: 99 ARPAbet ids, see audiopipe.features.phones)
    dropout: float = 0.1  # inside the transformer layers (hard-coded 0.1 in the reference)
    emb_dropout: float = 0.0  # token-embedding dropout ("dropout: 0" in the s1 config)
    pos_dropout: float = 0.1  # after adding the sinusoidal positions
    top_k: int = 3  # the logged accuracy is top-k

    @property
    def eos(self) -> int:
        return self.vocab_size - 1


CONFIGS = {
    "tiny": ModelConfig(dim=64, heads=4, layers=2, ff=256, vocab_size=1025, phone_vocab=128),
    "default": ModelConfig(),  # configs/s1longer.yaml: 512 dim, 16 heads, 24 layers, 2048 ff, 1025 tokens
}

DEFAULTS = {"batch_frames": 10_000, "lr": 2e-4, "warmup_steps": 2000, "weight_decay": 0.01, "clip": 1.0}


# ----------------------------------------------------------------------------- data

def select_utterances(shards: str, c: ModelConfig, max_sec: float, min_ps: float, max_ps: float
                      ) -> tuple[np.ndarray, np.ndarray, str]:
    """The reference's filters on the length index (no payload read) -> (subset, budget lengths, summary)."""
    try:
        spec = token_spec(shards)
    except (ValueError, OSError) as e:
        raise SystemExit(f"--shards: {e}") from None
    cb = int(spec["params"].get("codebook_size", 0))
    if not 0 < cb <= c.eos:
        raise SystemExit(f"{shards}: tokens have {cb} ids but vocab_size {c.vocab_size} holds {c.eos} ids + EOS; "
                         f"use a config with vocab_size >= {cb + 1}")
    idx = LengthIndex.open(shards)
    if "phones_frames" not in idx.table.column_names:
        raise SystemExit(f"{shards}: the token folder has no phones; make it from shards with phones "
                         f"(`audiopipe shard --preset gpt_sovits`, then `audiopipe tokens`)")
    rate = spec["sample_rate"] / spec["hop_length"]
    nt, nph = idx.frames("semantic").astype(np.int64), idx.frames("phones").astype(np.int64)
    sec = nt / rate
    ps = nph / np.maximum(sec, 1e-9)
    ok = (nt > 0) & (nph > 0) & (sec <= max_sec) & (nph <= max_sec * rate / 2.5) & (ps >= min_ps) & (ps <= max_ps)
    subset = np.flatnonzero(ok)
    if len(subset) == 0:
        raise SystemExit(f"{shards}: no utterance passes the filters (max_sec {max_sec}, phones/s in "
                         f"[{min_ps}, {max_ps}]); loosen --min-ps-ratio/--max-ps-ratio/--max-sec")
    summary = (f"{len(subset)}/{len(ok)} utterances ({sec[subset].sum() / 3600:.3f} h) pass the filters; tokens "
               f"{spec['kind']} at {rate:g}/s, codebook {cb}")
    return subset, (nt + nph)[subset], summary


def _extra(p) -> None:
    p.add_argument("--max-sec", type=float, default=54.0, help="drop utterances with more seconds of tokens")
    p.add_argument("--min-ps-ratio", type=float, default=3.0, help="drop utterances with fewer phones per second")
    p.add_argument("--max-ps-ratio", type=float, default=25.0, help="drop utterances with more phones per second")


# ----------------------------------------------------------------------------- model

class SinePositions(nn.Module):
    """x + alpha * sinusoid(position), then dropout (the reference's SinePositionalEmbedding, scale=False)."""

    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.dim = dim
        self.alpha = nn.Parameter(torch.ones(1))
        self.drop = nn.Dropout(dropout)

    def table(self, n: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        pos = torch.arange(n, device=device, dtype=torch.float32)[:, None]
        div = torch.exp(torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) * (-math.log(1e4) / self.dim))
        pe = torch.zeros(n, self.dim, device=device)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div)
        return pe.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(x + self.alpha * self.table(x.shape[1], x.device, x.dtype))


class Block(nn.Module):
    """Post-norm transformer layer (torch's TransformerEncoderLayer with norm_first=False, ReLU), on SDPA so the
    per-item mask is [B, 1, L, L] rather than one copy per head."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.heads, self.p = c.heads, c.dropout
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.norm1, self.norm2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.mlp = nn.Sequential(nn.Linear(c.dim, c.ff), nn.ReLU(), nn.Dropout(c.dropout), nn.Linear(c.ff, c.dim))
        self.drop1, self.drop2 = nn.Dropout(c.dropout), nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p if self.training else 0.0)
        x = self.norm1(x + self.drop1(self.proj(a.transpose(1, 2).reshape(b, n, d))))
        return self.norm2(x + self.drop2(self.mlp(x)))


def attention_mask(phone_lens: torch.Tensor, token_lens: torch.Tensor, tx: int, ty: int) -> torch.Tensor:
    """[B, 1, tx+ty, tx+ty] bool, True where a query may attend: phones -> phones; tokens -> phones + past tokens;
    never to padding. Every query also sees itself, which changes nothing for real positions (they already do)
    and keeps the softmax of padded queries finite."""
    dev = phone_lens.device
    n = tx + ty
    allowed = torch.zeros(n, n, dtype=torch.bool, device=dev)
    allowed[:, :tx] = True
    allowed[tx:, tx:] = torch.ones(ty, ty, dtype=torch.bool, device=dev).tril()
    real = torch.cat([torch.arange(tx, device=dev)[None] < phone_lens[:, None],
                      torch.arange(ty, device=dev)[None] < token_lens[:, None]], dim=1)
    mask = allowed[None] & real[:, None, :]
    mask |= torch.eye(n, dtype=torch.bool, device=dev)[None]
    return mask[:, None]


def next_token_targets(tokens: torch.Tensor, lens: torch.Tensor, eos: int, ignore: int = -100) -> torch.Tensor:
    """Target at t is token t+1; EOS after the last real token; `ignore` on padding (reference: pad_y_eos)."""
    b, ty = tokens.shape
    t = torch.arange(ty, device=tokens.device)[None]
    tgt = torch.full_like(tokens, ignore)
    tgt[:, :-1] = tokens[:, 1:]
    tgt[t == (lens[:, None] - 1)] = eos
    tgt[t >= lens[:, None]] = ignore
    return tgt


class Text2Semantic(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        self.phone_emb = nn.Embedding(c.phone_vocab, c.dim)
        self.phone_pos = SinePositions(c.dim, c.pos_dropout)
        self.token_emb = nn.Embedding(c.vocab_size, c.dim)
        self.token_pos = SinePositions(c.dim, c.pos_dropout)
        self.emb_drop = nn.Dropout(c.emb_dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)

    def forward(self, phones: torch.Tensor, phone_lens: torch.Tensor, tokens: torch.Tensor,
                token_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """phones [B, P], tokens [B, T] (long, padded) -> (logits [B, T, vocab], targets [B, T])."""
        tx, ty = phones.shape[1], tokens.shape[1]
        x = self.phone_pos(self.emb_drop(self.phone_emb(phones)))
        y = self.token_pos(self.emb_drop(self.token_emb(tokens)))
        h = torch.cat([x, y], dim=1)
        mask = attention_mask(phone_lens, token_lens, tx, ty)
        for blk in self.blocks:
            h = blk(h, mask)
        return self.head(h[:, tx:]), next_token_targets(tokens, token_lens, self.c.eos)


# ----------------------------------------------------------------------------- loss

def top_k_accuracy(logits: torch.Tensor, targets: torch.Tensor, k: int, eos: int) -> torch.Tensor:
    """Share of real, non-EOS targets among the k best logits (the reference ignores EOS targets); 0 when there
    are none. A 0-d tensor on the logits' device: reading it back is left to the log line."""
    keep = (targets >= 0) & (targets != eos)
    top = logits.topk(min(k, logits.shape[-1]), dim=-1).indices
    hit = (top == targets[..., None]).any(-1) & keep
    return hit.sum() / keep.sum().clamp(min=1)


def make_loss_fn(c: ModelConfig):
    def loss_fn(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, Any]]:
        # Dropout draws from the global RNG, which core reseeds every step from (seed, rank, step).
        logits, targets = model(batch["phones"].long(), batch["phones_lengths"], batch["semantic"].long(),
                                batch["semantic_lengths"])
        loss = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=-100)
        return loss, {f"top{c.top_k}_acc": top_k_accuracy(logits.detach(), targets, c.top_k, c.eos)}

    return loss_fn


# ----------------------------------------------------------------------------- training

def main(argv: list[str] | None = None) -> dict:
    # config
    cfg, args = parse_args("GPT-SoVITS stage 1 (phones -> semantic tokens)", defaults=DEFAULTS, extra=_extra,
                           argv=argv)
    d = setup_dist(cfg.seed)
    c = load_model_config(cfg.config, CONFIGS, ModelConfig)
    from audiopipe.shard.manifest import read_manifest

    # Several --shards folders are mixed: they must share one phone table (the loader refuses two).
    table = max((read_manifest(s).get("phones", {}).get("vocab") or [] for s in shard_dirs(cfg)), key=len)
    if len(table) > c.phone_vocab:  # ids index the shards' phone table (GPT-SoVITS's has 322 symbols)
        c = replace(c, phone_vocab=len(table))
    parts = [select_utterances(s, c, args.max_sec, args.min_ps_ratio, args.max_ps_ratio) for s in shard_dirs(cfg)]
    subset = np.concatenate([p[0] + off for p, off in zip(parts, corpus_offsets(cfg))])
    lengths = np.concatenate([p[1] for p in parts])
    summary = "; ".join(p[2] for p in parts)
    model = Text2Semantic(c)
    if d.main:
        n = sum(p.numel() for p in model.parameters())
        print(f"[gpt_sovits] {summary}; model {n / 1e6:.2f} M parameters ({cfg.config})", flush=True)
    # loss and training
    return train(model, make_loss_fn(c), cfg, d, features=["semantic", "phones"],
                 loader_kw={"subset": subset, "lengths": lengths}, log_name="gpt_sovits")


if __name__ == "__main__":
    main()
