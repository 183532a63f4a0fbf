"""GPT-SoVITS stage 1: an autoregressive transformer from phones to semantic tokens.

    audiopipe shard  --corpus ./wavs --out ./shards --preset gpt_sovits,eres2net --language auto   # phones, pcm, fbank
    audiopipe tokens --shards ./shards --out ./tokens --name2semantic 6-name2semantic.tsv   # or --kmeans 512
    torchrun --nproc_per_node=2 trainers/train_gpt_sovits.py --shards ./tokens --config tiny --out runs/s1

--shards is a TOKEN folder (a sidecar shard set from `audiopipe tokens`): it reads `phones` int16 [P] (ids in the
shards' phone table: GPT-SoVITS's own symbols with `audiopipe shard --language zh|auto`, or audiopipe's ARPAbet
table with the default `--language en`), `semantic` int16 [T] (SoVITS codes, or k-means units named
kmeans-<feature>-<k>), and `bert` float16 [1024, P] when the shards were made with `--bert-checkpoint`.

The network is GPT-SoVITS's Text2SemanticDecoder (AR/models/t2s_model.py) tensor for tensor, so its checkpoints
load whole (`--init-from s1bert25hz-....ckpt`, audiopipe.checkpoints.gpt_sovits) and ours export to its `.ckpt`
(`--export`, or `audiopipe export-checkpoint`): phone embedding plus Linear(1024 -> dim) of per-phone BERT features
(zeros, so the projection's bias, where a phone has none), semantic-token embedding (codebook + EOS), each with
its own sinusoidal positions scaled by a learned alpha; one post-norm transformer (ReLU MLP, dropout 0.1) over
[phones; tokens] with its mask: phones see every real phone and no token, tokens see every real phone and the
tokens up to themselves, padding is never a key. A bias-free head predicts the next token; EOS follows the last.

Two training recipes (docs/trainers/gpt_sovits.md has the measured comparison and every remaining difference):
- upstream (the default when --init-from is a GPT-SoVITS checkpoint): GPT-SoVITS's loss, cross-entropy summed
  over every position of the batch (padding is trained to predict EOS, as there), and its optimizer, ScaledAdam
  (trainers/scaled_adam.py) at the LR its scheduler really sets (0.01 for the first step, then 0.002), one step
  every 4 batches, no other clipping;
- audiopipe (the default otherwise): mean cross-entropy over real targets, AdamW with the core's warmup + cosine.
`--optimizer` and `--loss` pick each half separately.

Batches: audiopipe's length-bucketed sampler, budget = phones + tokens per utterance (the sequence the transformer
runs over), instead of GPT-SoVITS's 2-second duration buckets; its data filters are kept (at most max_sec of
tokens, phones per second in [min_ps_ratio, max_ps_ratio]). Training only: no sampling / KV-cache inference.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.checkpoints import gpt_sovits as ckpt_io
from audiopipe.checkpoints.files import CheckpointError, read_weights
from audiopipe.index.lengths import LengthIndex
from audiopipe.tokens import token_spec

from init_family import refuse_other_family
from core import corpus_offsets, load_model_config, parse_args, setup_dist, shard_dirs, train
from scaled_adam import ScaledAdam, upstream_lr

BERT_DIM = 1024  # chinese-roberta-wwm-ext-large's hidden size: the input of bert_proj in every GPT-SoVITS model


# ----------------------------------------------------------------------------- config

@dataclass
class ModelConfig:
    dim: int = 512  # embedding_dim == hidden_dim
    heads: int = 16
    layers: int = 24
    ff: int = 2048  # linear_units
    vocab_size: int = 1025  # semantic codebook (1024) + EOS; EOS is the last id
    phone_vocab: int = 512  # phoneme_vocab_size: rows of the phone embedding (v1 512, v2 732; >= the phone table)
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
    p.add_argument("--max-sec", type=float, default=54.0, help="drop utterances with more seconds of tokens (default %(default)s)")
    p.add_argument("--min-ps-ratio", type=float, default=3.0, help="drop utterances with fewer phones per second (default %(default)s)")
    p.add_argument("--max-ps-ratio", type=float, default=25.0, help="drop utterances with more phones per second (default %(default)s)")
    p.add_argument("--optimizer", choices=("auto", "scaled_adam", "adamw"), default="auto",
                   help="scaled_adam: GPT-SoVITS's (LR 0.01 on the first step then 0.002, one step per 4 batches, "
                        "no --clip, unless --lr/--warmup-steps/--grad-accum/--clip are given); adamw: AdamW with "
                        "the warmup + cosine schedule. auto: scaled_adam when --init-from is a GPT-SoVITS .ckpt, "
                        "else adamw (default %(default)s)")
    p.add_argument("--loss", choices=("auto", "sum", "mean"), default="auto",
                   help="sum: GPT-SoVITS's cross-entropy summed over every position of the batch, padding "
                        "(trained to predict EOS) included; mean: over real targets only. auto: sum when "
                        "--init-from is a GPT-SoVITS .ckpt, else mean (default %(default)s)")
    p.add_argument("--export", default="",
                   help="when training ends, also write the weights as a GPT-SoVITS s1 .ckpt here (what its WebUI "
                        "and TTS inference load; see docs/trainers/gpt_sovits.md; default: no export)")
    p.add_argument("--export-format", choices=ckpt_io.FORMATS, default="fp16",
                   help="weights of --export: fp16 as GPT-SoVITS's WebUI writes them, or fp32 (default %(default)s)")


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
    never to padding (GPT-SoVITS's mask). Padded queries keep a finite softmax because every item has at least
    one real phone (the data filter drops utterances without phones); their outputs are trained only by the
    upstream loss, which has them predict EOS, as GPT-SoVITS does."""
    dev = phone_lens.device
    n = tx + ty
    allowed = torch.zeros(n, n, dtype=torch.bool, device=dev)
    allowed[:, :tx] = True
    allowed[tx:, tx:] = torch.ones(ty, ty, dtype=torch.bool, device=dev).tril()
    real = torch.cat([torch.arange(tx, device=dev)[None] < phone_lens[:, None],
                      torch.arange(ty, device=dev)[None] < token_lens[:, None]], dim=1)
    return (allowed[None] & real[:, None, :])[:, None]


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
        self.bert_proj = nn.Linear(BERT_DIM, c.dim)  # per-phone BERT features (Chinese); zeros elsewhere
        self.phone_pos = SinePositions(c.dim, c.pos_dropout)
        self.token_emb = nn.Embedding(c.vocab_size, c.dim)
        self.token_pos = SinePositions(c.dim, c.pos_dropout)
        self.emb_drop = nn.Dropout(c.emb_dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)

    def forward(self, phones: torch.Tensor, phone_lens: torch.Tensor, tokens: torch.Tensor,
                token_lens: torch.Tensor, bert: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """phones [B, P], tokens [B, T] (long, padded), bert [B, 1024, P] or None (all zeros) ->
        (logits [B, T, vocab], targets [B, T] with -100 on padding)."""
        tx, ty = phones.shape[1], tokens.shape[1]
        x = self.emb_drop(self.phone_emb(phones))
        # Without features the projection of zeros is its bias: the same numbers, none of the 1024-wide matmul.
        x = x + (self.bert_proj(bert.transpose(1, 2).to(x.dtype)) if bert is not None else self.bert_proj.bias)
        x = self.phone_pos(x)
        # Padded token inputs are EOS, as GPT-SoVITS feeds them: only padded queries see them, and those are
        # trained (by the upstream loss) to predict EOS.
        real = torch.arange(ty, device=tokens.device)[None] < token_lens[:, None]
        y = self.token_pos(self.emb_drop(self.token_emb(torch.where(real, tokens, self.c.eos))))
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


def make_loss_fn(c: ModelConfig, mode: str = "mean", grad_accum: int = 1):
    """mode "mean": cross-entropy averaged over real targets. "sum": GPT-SoVITS's, summed over every position of
    the batch, padding included with EOS as its target; multiplied by grad_accum so that the core's division
    leaves the gradient GPT-SoVITS accumulates (the sum over the step's batches). Both log `ce`, the mean over
    real targets, so runs of either recipe compare."""
    if mode not in ("mean", "sum"):
        raise ValueError(f"loss mode must be mean or sum, got {mode!r}")

    def loss_fn(model: nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, Any]]:
        # Dropout draws from the global RNG, which core reseeds every step from (seed, rank, step).
        logits, targets = model(batch["phones"].long(), batch["phones_lengths"], batch["semantic"].long(),
                                batch["semantic_lengths"], batch.get("bert"))
        real = targets >= 0
        tgt = targets.masked_fill(~real, c.eos)
        ce = F.cross_entropy(logits.float().transpose(1, 2), tgt, reduction="none")
        ce_real = (ce * real).sum() / real.sum().clamp(min=1)
        loss = ce.sum() * grad_accum if mode == "sum" else ce_real
        return loss, {"ce": ce_real.detach(),
                      f"top{c.top_k}_acc": top_k_accuracy(logits.detach(), targets, c.top_k, c.eos)}

    return loss_fn


# ----------------------------------------------------------------------------- starting weights

@dataclass
class Start:
    """What --init-from points at: GPT-SoVITS's .ckpt (weights converted to our names, its config) or ours."""

    upstream: bool = False
    state: dict[str, torch.Tensor] | None = None
    config: dict[str, Any] | None = None  # the upstream checkpoint's config (sizes, max_sec, ...)
    sizes: dict[str, Any] | None = None
    run_config: dict[str, Any] | None = None  # our run's model_config.json, when there is one beside it


def read_start(path: str) -> Start:
    """Read --init-from once, to tell which kind it is and, for GPT-SoVITS's, the model's sizes."""
    p = Path(path)
    if p.is_file():
        obj = read_weights(p)
        if ckpt_io.is_upstream(obj):
            state, config, _ = ckpt_io.read_upstream(p, obj)
            return Start(True, state, config, ckpt_io.sizes_from_config(config, str(p)))
        if "weight" in obj:  # looks upstream-ish but is not stage 1: say what it is
            ckpt_io.read_upstream(p, obj)
    folder = p if p.is_dir() else p.parent
    rc = folder / "model_config.json"
    return Start(run_config=json.loads(rc.read_text()) if rc.is_file() else None)


def _given(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def phone_table(shards: list[str]) -> tuple[str, list[str]]:
    """(table name, symbols) of the shards' phone ids: "gpt_sovits" (GPT-SoVITS's symbols) or "arpabet"."""
    from audiopipe.shard.manifest import read_manifest

    # Several --shards folders are mixed: they must share one phone table (the loader refuses two).
    phones = max((read_manifest(s).get("phones") or {} for s in shards), key=lambda ph: len(ph.get("vocab") or []))
    return ("gpt_sovits" if phones.get("table") == "gpt_sovits" else "arpabet"), list(phones.get("vocab") or [])


def check_phones_for_upstream(table: str, symbols: list[str], rows: int, path: str) -> None:
    """GPT-SoVITS checkpoints embed ids of its symbol table: refuse shards whose ids mean other phones."""
    if table != "gpt_sovits":
        raise SystemExit(f"gpt_sovits: error: --init-from {path} embeds phone ids of GPT-SoVITS's symbol table, but "
                         f"these shards hold audiopipe's ARPAbet ids ({len(symbols)} symbols); re-shard with "
                         f"`audiopipe shard --language auto` (English or mixed text) or `--language zh` (Chinese)")
    if len(symbols) > rows:
        raise SystemExit(f"gpt_sovits: error: --init-from {path} has {rows} phone rows, fewer than the shards' "
                         f"{len(symbols)}-symbol table; use a checkpoint with at least {len(symbols)} rows (v2: 732)")


# ----------------------------------------------------------------------------- training

def main(argv: list[str] | None = None) -> dict:
    # config
    argv = list(sys.argv[1:] if argv is None else argv)
    cfg, args = parse_args("GPT-SoVITS stage 1 (phones -> semantic tokens)", defaults=DEFAULTS, extra=_extra,
                           argv=argv)
    refuse_other_family(cfg, "gpt_sovits", "gpt_sovits")
    d = setup_dist(cfg.seed)
    c = load_model_config(cfg.config, CONFIGS, ModelConfig)
    table, symbols = phone_table(shard_dirs(cfg))
    start = Start()
    if cfg.init_from:
        try:
            start = read_start(cfg.init_from)
        except CheckpointError as e:
            raise SystemExit(f"gpt_sovits: error: --init-from {e}") from None
    if start.upstream:
        # The checkpoint decides the sizes: its weights fit no other model.
        wanted = replace(c, **start.sizes)
        if _given(argv, "--config") and asdict(wanted) != asdict(c):
            raise SystemExit(f"gpt_sovits: error: --config {cfg.config} is not the model in --init-from "
                             f"{cfg.init_from} ({start.sizes['layers']} layers, dim {start.sizes['dim']}, "
                             f"{start.sizes['phone_vocab']} phone rows); leave --config out to take the checkpoint's")
        c = wanted
        check_phones_for_upstream(table, symbols, c.phone_vocab, cfg.init_from)
    else:
        if len(symbols) > c.phone_vocab:  # ids index the shards' phone table (GPT-SoVITS's has 322 symbols)
            c = replace(c, phone_vocab=len(symbols))
        theirs = (start.run_config or {}).get("phones_table")
        if theirs and theirs != table:
            raise SystemExit(f"gpt_sovits: error: --init-from {cfg.init_from} was trained on {theirs} phone ids, "
                             f"these shards hold {table} ids; shard with the --language the checkpoint's data had "
                             f"(zh/auto: GPT-SoVITS's symbols, en: ARPAbet)")
    optimizer = args.optimizer if args.optimizer != "auto" else ("scaled_adam" if start.upstream else "adamw")
    loss_mode = args.loss if args.loss != "auto" else ("sum" if start.upstream else "mean")
    lr_fn, opt_note = None, f"AdamW lr {cfg.lr:g}, warmup {cfg.warmup_steps} + cosine"
    if optimizer == "scaled_adam":
        # GPT-SoVITS steps every 4 batches and clips only inside ScaledAdam; its LR is 0.01 once, then 0.002.
        cfg = replace(cfg, grad_accum=cfg.grad_accum if _given(argv, "--grad-accum") else 4,
                      clip=cfg.clip if _given(argv, "--clip") else 0.0)
        own_schedule = any(_given(argv, f) for f in ("--lr", "--warmup-steps", "--min-lr-ratio"))
        lr_fn = None if own_schedule else upstream_lr
        opt_note = (f"ScaledAdam, " + (f"lr {cfg.lr:g} warmup {cfg.warmup_steps} + cosine" if own_schedule
                                       else "lr 0.01 on the first step, then 0.002 (GPT-SoVITS's)")
                    + f", a step every {cfg.grad_accum} batches, clip {'off' if cfg.clip == 0 else cfg.clip}")
    parts = [select_utterances(s, c, args.max_sec, args.min_ps_ratio, args.max_ps_ratio) for s in shard_dirs(cfg)]
    subset = np.concatenate([p[0] + off for p, off in zip(parts, corpus_offsets(cfg))])
    lengths = np.concatenate([p[1] for p in parts])
    summary = "; ".join(p[2] for p in parts)
    features = ["semantic", "phones"] + (["bert"] if all(has_bert(s) for s in shard_dirs(cfg)) else [])
    model = Text2Semantic(c)
    if "bert" not in features:
        # Without features the projection's weight sees only zeros: GPT-SoVITS's gradient for it is exactly 0, so
        # its ScaledAdam leaves it as it is; frozen, it stays so under either optimizer, and DDP does not wait for
        # a gradient that never comes.
        model.bert_proj.weight.requires_grad_(False)
    opt = ScaledAdam(model.parameters()) if optimizer == "scaled_adam" else None
    out = Path(cfg.out)
    if d.main:
        n = sum(p.numel() for p in model.parameters())
        print(f"[gpt_sovits] {summary}; model {n / 1e6:.2f} M parameters "
              f"({'from ' + cfg.init_from if start.upstream else cfg.config}); phones: {table} table, "
              f"{len(symbols)} symbols; BERT features: {'yes' if 'bert' in features else 'none (zeros)'}", flush=True)
        print(f"[gpt_sovits] loss {loss_mode} ({'GPT-SoVITS' if loss_mode == 'sum' else 'audiopipe'}); {opt_note}",
              flush=True)
        from audiopipe.storage.atomic import write_text_atomic

        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "model_config.json", json.dumps({
            "trainer": "gpt_sovits", "model": asdict(c), "max_sec": args.max_sec, "phones_table": table,
            "phones": len(symbols), "bert": "bert" in features, "optimizer": optimizer, "loss": loss_mode,
            "init_from": cfg.init_from, "upstream_config": start.config}, indent=1))
    hints = {"phone_emb.": "the checkpoint's phone table has another number of rows: give --config a JSON file "
                           "with its \"phone_vocab\"",
             "token_emb.": "the checkpoint has another token vocabulary: give --config a JSON file with its "
                           "\"vocab_size\" (and tokens with as many ids)",
             "head.": "the checkpoint has another token vocabulary: give --config a JSON file with its "
                      "\"vocab_size\""}
    # loss and training
    last = train(model, make_loss_fn(c, loss_mode, cfg.grad_accum), cfg, d, features=features,
                 loader_kw={"subset": subset, "lengths": lengths}, log_name="gpt_sovits", optimizer=opt,
                 lr_fn=lr_fn, init_weights=(lambda _: start.state) if start.upstream else None, init_hints=hints)
    if args.export and d.main:
        config = ckpt_io.upstream_config(asdict(c), args.max_sec, start.config)
        path = ckpt_io.write_upstream(model.state_dict(), args.export, config,
                                      f"GPT-audiopipe-step{cfg.max_steps}", args.export_format)
        print(f"[gpt_sovits] exported GPT-SoVITS s1 checkpoint {path} ({args.export_format})", flush=True)
    return last


def has_bert(shards: str) -> bool:
    from audiopipe.shard.manifest import read_manifest

    return "bert" in read_manifest(shards).get("features", {})


if __name__ == "__main__":
    main()
