"""F5-TTS on audiopipe shards: a DiT that infills masked mel spans by conditional flow matching.

    torchrun --nproc_per_node=2 trainers/train_f5tts.py --shards ./shards --config tiny --out runs/f5 --max-steps 20

Reads the `mel` column (the f5tts preset: vocos log-mel, 100 bins, 24 kHz, hop 256; shards made with any other
mel config are refused) and `text`. Follows SWivid/F5-TTS (v1 Base settings):
  - text: UTF-8 bytes (F5's "byte" tokenizer: a fixed 256-symbol vocabulary; for ASCII one token per character),
    or an F5 vocab.txt via --vocab (one symbol per line, unknown symbols -> id 0, as F5's char tokenizer),
    or `--tokenizer pinyin`: F5's Chinese tokens (audiopipe.text.f5_pinyin), unknown symbols counted at start;
    filler-padded to the mel length, sinusoidal positions, ConvNeXt-V2 blocks;
  - input: Linear([noisy mel, masked mel, text]) + a grouped-conv position embedding;
  - backbone: DiT blocks with adaLN-zero modulation from the flow time, self-attention with rotary positions;
  - training: OT path with sigma = 0 (x_t = (1 - t) x0 + t x1, target x1 - x0), t ~ U(0, 1); the loss is the MSE
    inside one random contiguous span of 70-100 % of each utterance, the rest of the mel is the audio prompt;
    classifier-free guidance drops (per batch, as F5): audio prompt with p = 0.3, audio and text with p = 0.2.
  - F5's training rules: its LR schedule (warmup, then linear decay) and its EMA of the weights (EmaHook).
Forward: by default padding and filler are masked everywhere (attention keys, convolutions, the GRN statistics),
so they change nothing; `--forward upstream` is F5's own forward, used whenever --init-from is an F5 checkpoint.
--init-from reads F5's model_*.pt, its released .safetensors or ours (audiopipe/checkpoints/f5tts.py);
`audiopipe export-checkpoint` writes a run back in F5's files. No sampler or vocoder here: training only.
"""

from __future__ import annotations

import json
import math
import random
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.checkpoints import f5tts as f5ckpt
from audiopipe.checkpoints.f5tts import CheckpointError, F5Checkpoint
from audiopipe.features.mel import VocosMel
from audiopipe.storage.atomic import write_json_atomic, write_text_atomic

from init_family import refuse_other_family
from core import count_parameters, latest_checkpoint, load_model_config, parse_args, setup_dist, shard_dirs, train

# ----------------------------------------------------------------------------- config

@dataclass
class ModelConfig:
    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    text_dim: int = 512
    conv_layers: int = 4  # ConvNeXt-V2 blocks of the text embedding
    mel_dim: int = 100
    text_num_embeds: int = 256  # set from the tokenizer at start-up
    dropout: float = 0.1
    pe_attn_head: int | None = None  # heads that get rotary positions (None: all, v1; F5TTS_Base used 1)
    conv_pos_kernel: int = 31
    conv_pos_groups: int = 16
    text_max_pos: int = 8192  # sinusoidal text positions (~87 s of frames, as F5); later positions share the last
    text_mask_padding: bool = True  # filler tokens zeroed around each text block (v1; F5TTS_Base v0: False)
    # F5's own forward: the text blocks' GRN statistics count filler frames and attention keys are not masked, so
    # padding and filler change real frames. On whenever the model starts from an F5-TTS checkpoint.
    upstream_forward: bool = False
    audio_drop_prob: float = 0.3
    cond_drop_prob: float = 0.2
    frac_lengths: tuple[float, float] = (0.7, 1.0)


CONFIGS = {
    # F5's position convolution (kernel 31, 16 groups, which its DiT fixes), so even a tiny run exports
    "tiny": ModelConfig(dim=64, depth=2, heads=2, dim_head=32, text_dim=32, conv_layers=1),
    "small": ModelConfig(dim=768, depth=18, heads=12, text_dim=512, conv_layers=4),  # F5TTS_v1_Small
    "default": ModelConfig(),  # F5TTS_v1_Base: dim 1024, depth 22, heads 16, ff 2, text 512, conv 4
    "base_v0": ModelConfig(text_mask_padding=False, pe_attn_head=1),  # F5TTS_Base, the first release
}

MEL_HASH = VocosMel().specs[0].config_hash  # the f5tts preset's mel; other mel configs are refused
RUN_DEFAULTS = dict(batch_frames=38_400, max_items=64, lr=7.5e-5, warmup_steps=20_000, clip=1.0)  # F5 Base


# ----------------------------------------------------------------------------- text

class Tokenizer:
    """Text -> ids. Default: UTF-8 bytes (fixed vocabulary of 256). With a vocab list: F5's char tokenizer."""

    def __init__(self, vocab: list[str] | None = None, split=None):
        if vocab is not None:
            if len(set(vocab)) != len(vocab):
                raise ValueError("vocab has duplicate entries")
            if not vocab:
                raise ValueError("vocab is empty")
        self.vocab = vocab
        self.map = {s: i for i, s in enumerate(vocab)} if vocab else None
        self.split = split  # text -> symbols (audiopipe.text.f5_pinyin.f5_pinyin_tokens); None: characters

    @staticmethod
    def from_file(path: str | Path) -> "Tokenizer":
        """An F5 vocab.txt: one symbol per line, line number = id."""
        try:
            lines = Path(path).read_text(encoding="utf-8").split("\n")
        except OSError as e:
            raise SystemExit(f"cannot read --vocab {path}: {e}") from None
        if lines and lines[-1] == "":
            lines = lines[:-1]
        return Tokenizer(lines)

    @property
    def size(self) -> int:
        return 256 if self.map is None else len(self.map)

    def encode(self, text: str) -> list[int]:
        if self.map is None:
            return list(text.encode("utf-8"))
        return [self.map.get(c, 0) for c in (self.split(text) if self.split else text)]

    def batch(self, texts: list[str]) -> torch.Tensor:
        """[B, Nt] int64, padded with -1 (F5's convention: -1 + 1 = the filler id 0 of the embedding)."""
        ids = [self.encode(t) for t in texts]
        out = torch.full((len(ids), max(1, max(map(len, ids)))), -1, dtype=torch.long)
        for i, x in enumerate(ids):
            out[i, :len(x)] = torch.tensor(x, dtype=torch.long)
        return out


class AddTextIds:
    """Loader batch_transform: the batch's transcripts as `text_ids` (runs in DataLoader workers; picklable)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        # With --shapes the mel has a shape's rows: its empty rows (length 0) get empty transcripts.
        empty = batch["mel"].shape[0] - len(batch["text"]) if "mel" in batch else 0
        batch["text_ids"] = self.tokenizer.batch(list(batch["text"]) + [""] * empty)
        return batch


# ----------------------------------------------------------------------------- model

def lengths_to_mask(lengths: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]


def sinusoidal_table(n: int, dim: int, theta: float = 10000.0) -> torch.Tensor:
    """[n, dim]: cos of every frequency, then sin (F5's absolute text positions)."""
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim)
    ang = torch.outer(torch.arange(n).float(), freqs)
    return torch.cat([ang.cos(), ang.sin()], dim=-1)


class TimestepEmbedding(nn.Module):
    """Flow time t in [0, 1] -> sinusoid (scaled by 1000, 256 frequencies) -> MLP."""

    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
        ang = 1000.0 * t.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([ang.sin(), ang.cos()], dim=-1).to(t.dtype))


class GRN(nn.Module):
    """Global response normalisation over time, counting only the positions of `keep` (None: all, as F5)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.zeros(1, 1, dim))
        self.beta = nn.Parameter(torch.zeros(1, 1, dim))

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        if keep is not None:
            x = x * keep  # filler and padding must not enter the time norm (F5 lets them in)
        gx = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return self.gamma * (x * nx) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1 = nn.Linear(dim, hidden)
        self.grn = GRN(hidden)
        self.pw2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        h = self.dwconv(x.transpose(1, 2)).transpose(1, 2)
        h = F.gelu(self.pw1(self.norm(h)))
        return x + self.pw2(self.grn(h, keep))


def dropped(x: torch.Tensor, drop: bool | torch.Tensor) -> torch.Tensor:
    """x, or zeros where the guidance drop is on. `drop` is a bool, or a 0-dim bool tensor on x's device: that
    takes no Python branch, so a compiled forward traces one graph for every draw."""
    if isinstance(drop, torch.Tensor):
        return x.masked_fill(drop, 0)
    return torch.zeros_like(x) if drop else x


class TextEmbedding(nn.Module):
    """Token ids [B, Nt] (-1 padded) -> [B, T, text_dim] aligned to the T mel frames, zero on filler positions."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed = nn.Embedding(cfg.text_num_embeds + 1, cfg.text_dim)  # id 0 is the filler
        self.max_pos = cfg.text_max_pos
        self.mask_filler, self.upstream = cfg.text_mask_padding, cfg.upstream_forward
        self.register_buffer("pos", sinusoidal_table(cfg.text_max_pos, cfg.text_dim), persistent=False)
        self.blocks = nn.ModuleList(ConvNeXtV2Block(cfg.text_dim, cfg.text_dim * 2) for _ in range(cfg.conv_layers))

    def forward(self, text: torch.Tensor, mel_lens: torch.Tensor, seq_len: int,
                drop_text: bool | torch.Tensor) -> torch.Tensor:
        text = (text + 1)[:, :seq_len]
        text = F.pad(text, (0, seq_len - text.shape[1]), value=0)
        # Each utterance's text stops at its own mel length, so a longer batch neighbour changes nothing.
        valid = lengths_to_mask(mel_lens, seq_len)
        text = text.masked_fill(~valid, 0)
        # v1 zeroes the filler around every block; v0 (text_mask_padding off) keeps the filler embedding.
        keep = ((text != 0) if self.mask_filler else valid).unsqueeze(-1).to(self.pos.dtype)
        text = dropped(text, drop_text)
        pos = self.pos[torch.arange(seq_len, device=text.device).clamp(max=self.max_pos - 1)]
        x = (self.embed(text) + pos) * keep
        for block in self.blocks:
            if not self.upstream:
                x = block(x, keep) * keep
            elif self.mask_filler:  # F5 v1: zeroed after each block, but the GRN statistics see every frame
                x = block(x, None) * keep
            else:  # F5 v0: nothing masked inside the text blocks
                x = block(x, None)
        return x


class ConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv1d(dim, dim, kernel, groups=groups, padding=kernel // 2)
        self.conv2 = nn.Conv1d(dim, dim, kernel, groups=groups, padding=kernel // 2)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        h = (x * keep).transpose(1, 2)
        h = F.mish(self.conv2(F.mish(self.conv1(h)) * keep.transpose(1, 2)))
        return h.transpose(1, 2) * keep


class InputEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.mel_dim * 2 + cfg.text_dim, cfg.dim)
        self.conv_pos = ConvPositionEmbedding(cfg.dim, cfg.conv_pos_kernel, cfg.conv_pos_groups)

    def forward(self, x, cond, text_embed, keep, drop_audio_cond: bool | torch.Tensor):
        h = self.proj(torch.cat([x, dropped(cond, drop_audio_cond), text_embed], dim=-1))
        return self.conv_pos(h, keep) + h


def rope_tables(n: int, dim_head: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [n, dim_head] for rotary positions on interleaved channel pairs (x-transformers' layout)."""
    inv = 1.0 / 10000 ** (torch.arange(0, dim_head, 2, device=device).float() / dim_head)
    ang = torch.outer(torch.arange(n, device=device).float(), inv).repeat_interleave(2, dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads, self.pe_heads = cfg.heads, cfg.pe_attn_head
        self.key_mask = not cfg.upstream_forward
        self.to_q, self.to_k, self.to_v = (nn.Linear(cfg.dim, inner) for _ in range(3))
        self.to_out = nn.Linear(inner, cfg.dim)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = (f(x).view(b, n, self.heads, -1).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        cos, sin = rope
        if self.pe_heads is None:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        else:
            p = self.pe_heads
            q = torch.cat([apply_rope(q[:, :p], cos, sin), q[:, p:]], dim=1)
            k = torch.cat([apply_rope(k[:, :p], cos, sin), k[:, p:]], dim=1)
        # Padded frames are never attended to (F5 v1 trains without this key mask: upstream_forward).
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :] if self.key_mask else None)
        out = self.drop(self.to_out(out.transpose(1, 2).reshape(b, n, -1)))
        return out.masked_fill(~mask[..., None], 0.0)


class DiTBlock(nn.Module):
    """Pre-norm attention + feed-forward, each shifted/scaled/gated by the time embedding (adaLN-zero)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ada = nn.Linear(cfg.dim, cfg.dim * 6)
        self.attn_norm = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(cfg)
        self.ff_norm = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.ff = nn.Sequential(nn.Linear(cfg.dim, cfg.dim * cfg.ff_mult), nn.GELU(approximate="tanh"),
                                nn.Dropout(cfg.dropout), nn.Linear(cfg.dim * cfg.ff_mult, cfg.dim))
        nn.init.zeros_(self.ada.weight)  # "zero": every block starts as the identity
        nn.init.zeros_(self.ada.bias)

    def forward(self, x, t, mask, rope):
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.ada(F.silu(t))[:, None].chunk(6, dim=-1)
        x = x + gate_a * self.attn(self.attn_norm(x) * (1 + scale_a) + shift_a, mask, rope)
        return x + gate_f * self.ff(self.ff_norm(x) * (1 + scale_f) + shift_f)


class DiT(nn.Module):
    """(noisy mel x_t, masked mel, text, t) -> predicted flow [B, T, mel_dim]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.dim)
        self.text_embed = TextEmbedding(cfg)
        self.input_embed = InputEmbedding(cfg)
        self.blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.ada_out = nn.Linear(cfg.dim, cfg.dim * 2)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)
        for lin in (self.ada_out, self.proj_out):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor, text: torch.Tensor, time: torch.Tensor,
                lens: torch.Tensor, drop_audio_cond: bool | torch.Tensor = False,
                drop_text: bool | torch.Tensor = False) -> torch.Tensor:
        b, n, _ = x.shape
        mask = lengths_to_mask(lens, n)
        keep = mask[..., None].to(x.dtype)
        t = self.time_embed(time)
        h = self.input_embed(x, cond, self.text_embed(text, lens, n, drop_text), keep, drop_audio_cond)
        rope = rope_tables(n, self.cfg.dim_head, x.device, h.dtype)
        for block in self.blocks:
            h = block(h, t, mask, rope)
        scale, shift = self.ada_out(F.silu(t))[:, None].chunk(2, dim=-1)
        return self.proj_out(self.norm_out(h) * (1 + scale) + shift)


# ----------------------------------------------------------------------------- conditional flow matching

def random_span_mask(lens: torch.Tensor, frac_range: tuple[float, float], n: int) -> torch.Tensor:
    """One contiguous span per utterance covering frac ~ U(frac_range) of its frames, at a uniform start."""
    frac = torch.empty(lens.shape, device=lens.device).uniform_(*frac_range)
    span = (frac * lens).long()
    start = ((lens - span) * torch.rand(lens.shape, device=lens.device)).long().clamp(min=0)
    pos = torch.arange(n, device=lens.device)[None, :]
    return (pos >= start[:, None]) & (pos < (start + span)[:, None])


def draw_drops(audio_drop_prob: float, cond_drop_prob: float) -> tuple[bool, bool]:
    """Classifier-free guidance drops for one batch: (drop audio prompt, drop text). Dropping text drops both.
    Drawn from Python's `random`, in F5's order, so a batch under the same seeds draws what F5's CFM draws."""
    drop_audio = random.random() < audio_drop_prob
    drop_text = random.random() < cond_drop_prob
    return drop_audio or drop_text, drop_text


class F5TTS(nn.Module):
    """The DiT plus its training objective; forward(mel [B, T, 100], lens, text ids, drops) -> (loss, logs).
    The drops are 0-dim bool tensors (loss_fn draws them), so that forward, which --compile compiles, holds no
    Python random draw and no branch on one."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.transformer = DiT(cfg)

    def forward(self, mel: torch.Tensor, lens: torch.Tensor, text: torch.Tensor, drop_audio: torch.Tensor,
                drop_text: torch.Tensor) -> tuple[torch.Tensor, dict]:
        b, n, _ = mel.shape
        mask = lengths_to_mask(lens, n)
        span = random_span_mask(lens, self.cfg.frac_lengths, n) & mask
        x1 = mel.masked_fill(~mask[..., None], 0.0)  # padding holds whatever collate put there: never read it
        # In the input's memory layout, as F5's randn_like(inp): its Trainer, like loss_fn, hands the model a
        # transposed view of [B, 100, T] mels, so the same RNG state puts the same noise on the same frames
        x0 = torch.randn_like(mel)
        t = torch.rand(b, device=mel.device, dtype=mel.dtype)
        xt = (1 - t)[:, None, None] * x0 + t[:, None, None] * x1  # OT path, sigma = 0
        flow = x1 - x0
        cond = x1.masked_fill(span[..., None], 0.0)  # the prompt: everything outside the span
        pred = self.transformer(xt, cond, text, t, lens, drop_audio_cond=drop_audio, drop_text=drop_text)
        # F5's loss[span].mean() as a masked sum: the same mean, without the boolean index, whose data-dependent
        # size makes the host wait for the device every step and breaks a compiled graph.
        err = F.mse_loss(pred.float(), flow.float(), reduction="none").masked_fill(~span[..., None], 0.0)
        loss = err.sum() / (span.sum() * err.shape[-1])
        return loss, {"span_frac": (span.sum() / lens.sum()).detach()}  # on the device until core logs it


# ----------------------------------------------------------------------------- loss


def loss_fn(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
    """The batch's flow-matching loss. Noise, t, span, drops and dropout come from the global RNG, which
    core reseeds every step from (seed, rank, step): --resume draws them again exactly."""
    mel = batch["mel"].transpose(1, 2)  # [B, 100, T] -> [B, T, 100]; a view, the batch buffer is not written
    f5 = model
    while not isinstance(f5, F5TTS):  # under DDP's .module, torch.compile's ._orig_mod
        f5 = getattr(f5, "_orig_mod", None) or f5.module
    drop_audio, drop_text = draw_drops(f5.cfg.audio_drop_prob, f5.cfg.cond_drop_prob)
    # torch.full launches a fill on the device: no host-to-device copy, so the host does not wait
    flags = [torch.full((), v, dtype=torch.bool, device=mel.device) for v in (drop_audio, drop_text)]
    loss, logs = model(mel, batch["mel_lengths"], batch["text_ids"], *flags)
    return loss, {"drop_audio": float(drop_audio), "drop_text": float(drop_text), **logs}


# ----------------------------------------------------------------------------- F5's training rules

def f5_lr(step: int, lr: float, warmup: int, max_steps: int) -> float:
    """F5's schedule: linear warmup from 1e-8 x lr over `warmup` updates, then linear decay to 1e-8 x lr at
    max_steps (its Trainer's LinearLR + LinearLR; step is the optimizer update about to be taken, from 0).

    F5 steps its scheduler once per process per update and multiplies the warmup by the number of processes, so
    in updates its warmup and decay do not depend on the world size, and neither do these."""
    if step < warmup:
        return lr * (1e-8 + (1 - 1e-8) * step / warmup)
    span = max(1, max_steps - warmup)
    return lr * (1 + (1e-8 - 1) * min(step - warmup, span) / span)


class EmaHook:
    """F5's EMA of the weights (its Trainer's `ema_pytorch.EMA(model)` with the defaults): the first update copies
    the weights; then every 10th update copies them until update 100 and after that moves the EMA towards them
    by 1 - decay, where decay = 1 - (1 + n)^(-2/3) at n = updates - 101, capped at beta = 0.9999 (0.99 after
    about 1,000 updates, 0.999 after 31,600, the cap after 1 M). Runs on rank 0 only, as F5's does (the weights
    are the same on every rank); checkpointed with the run and exported as F5's `ema_model_state_dict`.

    Starting from a checkpoint that keeps an EMA (F5's files, ours), the EMA continues from its weights and update
    count, as F5's Trainer does when it fine-tunes a `pretrained_*` file; `restart` counts from 0 instead."""

    name = "ema"

    def __init__(self, active: bool = True, beta: float = 0.9999, update_after_step: int = 100,
                 update_every: int = 10, inv_gamma: float = 1.0, power: float = 2 / 3):
        self.active = active
        self.beta, self.after, self.every, self.inv_gamma, self.power = (beta, update_after_step, update_every,
                                                                         inv_gamma, power)
        self.weights: dict[str, torch.Tensor] | None = None
        self.step, self.initted = 0, False
        self._start: tuple[dict[str, torch.Tensor], int, bool] | None = None

    def start_from(self, weights: dict[str, torch.Tensor], step: int, initted: bool) -> None:
        """The EMA state to start from (from --init-from), taken at on_start unless the run resumes."""
        self._start = (weights, step, initted)

    def decay(self) -> float:
        """ema_pytorch's get_current_decay (in float32, as it computes it) at the current update count."""
        epoch = (torch.tensor(self.step) - self.after - 1).clamp(min=0.0)
        if epoch.item() <= 0:
            return 0.0
        value = 1 - (1 + epoch / self.inv_gamma) ** -self.power
        return value.clamp(min=0.0, max=self.beta).item()

    @staticmethod
    def _params(model: nn.Module) -> dict[str, torch.Tensor]:
        return {k: v for k, v in model.named_parameters() if v.is_floating_point()}

    def on_start(self, model: nn.Module, resumed: bool) -> None:
        if not self.active or (resumed and self.weights is not None):
            if self.weights is not None:
                dev = next(model.parameters()).device
                self.weights = {k: v.to(dev) for k, v in self.weights.items()}
            return
        params = self._params(model)
        if self._start is not None:
            weights, step, initted = self._start
            self.weights = {k: weights[k].detach().to(p.device, p.dtype).clone() if k in weights else
                            p.detach().clone() for k, p in params.items()}
            self.step, self.initted = step, initted
        else:  # F5's EMA is a copy of the model made when its Trainer starts
            self.weights = {k: p.detach().clone() for k, p in params.items()}
            self.step, self.initted = 0, False
        self._start = None

    @torch.no_grad()
    def after_step(self, step: int, model: nn.Module) -> None:
        if not self.active:
            return
        assert self.weights is not None
        count = self.step
        self.step += 1
        params = self._params(model)
        if not self.initted:
            for k, p in params.items():
                self.weights[k].copy_(p)
            self.initted = True
            return
        if count % self.every:
            return
        if count <= self.after:
            for k, p in params.items():
                self.weights[k].copy_(p)
            return
        w = 1.0 - self.decay()
        for k, p in params.items():
            self.weights[k].lerp_(p, w)

    def state_dict(self) -> dict[str, Any]:
        if not self.active:
            return {}
        return {"step": self.step, "initted": self.initted, "weights": self.weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.active and state:
            self.weights, self.step, self.initted = state["weights"], int(state["step"]), bool(state["initted"])


# ----------------------------------------------------------------------------- starting from a checkpoint

VOCAB_HINT = "pass --vocab with the checkpoint's vocab.txt (and --tokenizer pinyin for F5's released models)"


def check_vocab(ck: F5Checkpoint, tok: Tokenizer, vocab_arg: str | None) -> None:
    """Refuse, in one line, a start whose token ids would not mean what they meant to the checkpoint."""
    rows = int(ck.weights[f5ckpt.EMBEDDING].shape[0]) - 1
    where = f" ({ck.vocab_file})" if ck.vocab_file else ""
    theirs = (ck.run_config or {}).get("tokenizer")
    if tok.vocab is None and (rows != 256 or theirs not in (None, "byte")):
        raise SystemExit(f"f5tts: error: --init-from {ck.path} was trained with a {rows}-symbol vocab.txt, but this "
                         f"run tokenizes UTF-8 bytes (256 symbols): {VOCAB_HINT}{where}")
    if tok.vocab is not None and theirs == "byte":
        raise SystemExit(f"f5tts: error: --init-from {ck.path} was trained on UTF-8 bytes; drop --vocab/--tokenizer "
                         f"to keep its byte tokenizer")
    if rows != tok.size:
        raise SystemExit(f"f5tts: error: --init-from {ck.path} has {rows} text symbols but --vocab {vocab_arg} has "
                         f"{tok.size}: {VOCAB_HINT}{where}")
    if tok.vocab is not None and ck.vocab_file is not None:
        from audiopipe.text.f5_pinyin import read_vocab

        theirs_vocab = read_vocab(ck.vocab_file)
        if theirs_vocab != tok.vocab:
            diff = sum(a != b for a, b in zip(theirs_vocab, tok.vocab))
            raise SystemExit(f"f5tts: error: --vocab {vocab_arg} puts {diff} of its {tok.size} symbols on other "
                             f"ids than {ck.vocab_file}, the vocabulary beside --init-from: use that file")


def check_architecture(ck: F5Checkpoint, mcfg: ModelConfig, config_name: str) -> None:
    arch = f5ckpt.architecture(ck.weights, ck.dim_head)
    arch.pop("text_num_embeds")
    ours = {k: getattr(mcfg, k) for k in arch}
    if arch == ours:
        return
    fits = [n for n, c in CONFIGS.items() if all(getattr(c, k) == v for k, v in arch.items())]
    theirs = ", ".join(f"{k} {v}" for k, v in arch.items() if ours[k] != v)
    mine = ", ".join(f"{k} {ours[k]}" for k, v in arch.items() if ours[k] != v)
    raise SystemExit(f"f5tts: error: --init-from {ck.path} is a model with {theirs} but --config {config_name} has "
                     f"{mine}: " + (f"use --config {fits[0]}" if fits else "give --config a JSON file with its values"))


def read_init(path: str) -> F5Checkpoint:
    try:
        return f5ckpt.read_f5_checkpoint(path)
    except CheckpointError as e:
        raise SystemExit(f"f5tts: error: --init-from {e}") from None


# ----------------------------------------------------------------------------- training

def warn_untranscribed(dirs: list[str]) -> None:
    """One warning line when rows without a transcript are trained on (F5 learns them with empty text)."""
    from audiopipe.reader.texts import shard_texts

    texts = [t for s in dirs for t in shard_texts(s)]
    empty = sum(1 for t in texts if not (t or "").strip())
    if empty:
        print(f"[f5tts] warning: {empty} of {len(texts)} utterances have no transcript and are trained with an "
              f"empty text; `audiopipe shard --require-text` leaves them out", flush=True)


def main(argv: list[str] | None = None) -> int:
    def extra(p):
        p.add_argument("--vocab", default=None, help="F5 vocab.txt (one symbol per line) instead of the UTF-8 byte "
                                                     "tokenizer: a released checkpoint's, or the one `audiopipe "
                                                     "export-f5` writes")
        p.add_argument("--tokenizer", choices=("byte", "char", "pinyin"), default=None,
                       help="byte (default without --vocab), char (default with --vocab), or pinyin: F5's Chinese "
                            "tokens (jieba + pypinyin TONE3) through --vocab, or a vocab built from the shards; "
                            "F5's inference tokenizes this way")
        p.add_argument("--lr-schedule", choices=("f5", "cosine"), default="f5",
                       help="f5 (default): linear warmup from 0, then linear decay to 0 at --max-steps, as F5's "
                            "trainer; cosine: warmup, then cosine decay to --min-lr-ratio")
        p.add_argument("--ema", choices=("f5", "off"), default="f5",
                       help="f5 (default): keep F5's EMA of the weights (beta 0.9999, every 10 updates after 100, "
                            "with its decay warmup), saved in each checkpoint and exported; off: none")
        p.add_argument("--ema-restart", action="store_true",
                       help="with --init-from: count the EMA's updates from 0, so its decay warms up again and a "
                            "short fine-tune shows in the EMA weights (F5 continues the checkpoint's count, "
                            "about 1.25 M for the released models, where the EMA barely moves)")
        p.add_argument("--forward", choices=("auto", "masked", "upstream"), default="auto",
                       help="masked: padding and filler never reach real frames; upstream: F5's own forward (GRN "
                            "statistics over filler, attention keys unmasked). auto (default): upstream when "
                            "--init-from is an F5-TTS checkpoint, what the run used when it is ours, else masked")
    cfg, args = parse_args("Train F5-TTS (DiT + conditional flow matching) on audiopipe f5tts shards.",
                           defaults=RUN_DEFAULTS, extra=extra, argv=argv, flag_help={
                               "warmup_steps": "linear warmup updates, then the decay of --lr-schedule",
                               "min_lr_ratio": "with --lr-schedule cosine: final LR as a fraction of --lr"})
    refuse_other_family(cfg, "f5tts", "f5tts")
    if args.tokenizer == "pinyin":
        from audiopipe.reader.texts import shard_texts
        from audiopipe.text.f5_pinyin import f5_pinyin_tokens
        from audiopipe.text.f5_vocab import pinyin_vocab_for

        try:
            pv = pinyin_vocab_for([t for s in shard_dirs(cfg) for t in shard_texts(s)], args.vocab)
        except (ValueError, OSError) as e:
            raise SystemExit(f"train_f5tts: error: {e}") from None
        tok = Tokenizer(pv.vocab, split=f5_pinyin_tokens)
        tok.report = pv.report()  # unknown symbols, printed once below
    elif (args.tokenizer == "char") != bool(args.vocab) and args.tokenizer is not None:
        raise SystemExit(f"train_f5tts: error: --tokenizer {args.tokenizer} "
                         f"{'needs' if args.tokenizer == 'char' else 'takes no'} --vocab")
    else:
        tok = Tokenizer.from_file(args.vocab) if args.vocab else Tokenizer()
    out = Path(cfg.out)
    resuming = cfg.resume and latest_checkpoint(out) is not None
    base = load_model_config(cfg.config, CONFIGS, ModelConfig)
    # The forward a run keeps: a resumed run its own; a start from an F5 file F5's; a start from ours that run's.
    ck = read_init(cfg.init_from) if cfg.init_from and not resuming else None
    saved = None
    if resuming and (out / "model_config.json").is_file():
        saved = json.loads((out / "model_config.json").read_text()).get("model", {}).get("upstream_forward")
    if args.forward != "auto":
        upstream = args.forward == "upstream"
        if saved is not None and saved != upstream:
            raise SystemExit(f"f5tts: error: --forward {args.forward}, but the run in {out} was trained with the "
                             f"{'upstream' if saved else 'masked'} forward; a resumed run keeps it")
    elif saved is not None:
        upstream = saved
    elif ck is not None:
        upstream = ck.origin == "upstream" or bool(((ck.run_config or {}).get("model") or {}).get("upstream_forward"))
    else:
        upstream = False
    mcfg = replace(base, text_num_embeds=tok.size, upstream_forward=upstream)
    if ck is not None:
        check_vocab(ck, tok, args.vocab)
        check_architecture(ck, mcfg, cfg.config)
    d = setup_dist(cfg.seed)
    if d.main:
        warn_untranscribed(shard_dirs(cfg))
    model = F5TTS(mcfg)
    ema = EmaHook(active=d.main) if args.ema == "f5" else None
    if ck is not None and ema is not None and ck.ema_weights is not None and not args.ema_restart:
        ema.start_from(ck.ema_weights, ck.ema_step or 0, ck.ema_initted)
    if d.main:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "model_config.json", {
            "trainer": "f5tts", "model": asdict(mcfg),
            "tokenizer": "byte" if tok.vocab is None else ("pinyin" if tok.split else "vocab"),
            "mel_hash": MEL_HASH, "parameters": count_parameters(model), "lr_schedule": args.lr_schedule,
            "ema": args.ema})
        if tok.vocab is not None:
            write_text_atomic(out / "vocab.txt", "".join(s + "\n" for s in tok.vocab))
        print(f"[f5tts] {count_parameters(model) / 1e6:.2f} M parameters, config {cfg.config}, "
              f"vocab {tok.size}, world {d.world}, forward {'upstream' if upstream else 'masked'}, "
              f"lr schedule {args.lr_schedule}, ema {args.ema}", flush=True)
        if getattr(tok, "report", None):
            print(f"[f5tts] {tok.report}", flush=True)
        if ck is not None:
            ema_said = ("" if ema is None or ck.ema_weights is None else
                        f"; the EMA restarts from its weights at update 0" if args.ema_restart else
                        f"; the EMA continues from its weights at update {ck.ema_step or 0}")
            print(f"[f5tts] --init-from {ck.path}: {ck.kind}{ema_said}", flush=True)
    lr_fn = ((lambda s: f5_lr(s, cfg.lr, cfg.warmup_steps, cfg.max_steps)) if args.lr_schedule == "f5"
             else None)  # None: core's warmup + cosine
    # loss and training
    train(model, loss_fn, cfg, d, features=["mel"], expect={"mel": MEL_HASH},
          loader_kw={"batch_transform": AddTextIds(tok)}, log_name="f5tts",
          init_weights=(lambda _path: ck.weights) if ck is not None else None,
          init_hints={"transformer.text_embed.embed": VOCAB_HINT}, lr_fn=lr_fn,
          hooks=[ema] if ema is not None else [])  # core ends a bad shard set in one line
    return 0


if __name__ == "__main__":
    sys.exit(main())
