"""ERes2Net speaker embeddings (3D-Speaker), trained on audiopipe shards with AAM-softmax, as 3D-Speaker trains it.

    torchrun --nproc_per_node=2 trainers/train_eres2net.py --shards ./shards --config tiny --out runs/eres2net \
        --epochs 10 --batch-frames $((16 * 48000))

Fine-tuning 3D-Speaker's released ERes2Net: `--init-from pretrained_eres2net.ckpt` (or an experiment folder of
speakerlab's trainer) with the --config of its size; `--export-upstream DIR` writes the result for speakerlab's
extract.py. docs/trainers/eres2net.md has the recipe and every difference from 3D-Speaker's trainer.

Read top to bottom: the configs and the recipe's numbers, the network, then main(): flags, data (speaker_data.py:
held-out speakers, random 3 s crops of the `pcm` column; speed perturbation, noise/reverb and fbank on the device),
model (ERes2Net under an AAM-softmax head), loss and schedule (speaker.py), core.train, then the EER
(speaker_eval.py) and the export.

The network follows 3D-Speaker's ERes2Net: a ResNet34-shaped stack of Res2Net-style blocks whose channel groups
are fused by plain addition in the first two stages and by attentional feature fusion (AFF) in the last two
(local feature fusion), plus a bottom-up path that fuses every stage's output with the next one through
strided convolutions and AFF (global feature fusion); temporal statistics pooling and a linear embedding.
Simplified: only the TSTP pooling, and no two-layer embedding option (the reference's default is one layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from audiopipe.checkpoints.speaker import UPSTREAM_POOL_EPS

import core
from init_family import refuse_other_family
import speaker
from speaker_data import speaker_data

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ERes2NetConfig:
    feat_dim: int = 80
    embedding_size: int = 192
    m_channels: int = 32  # 64 is ERes2Net-large
    num_blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    base_width: int = 32  # Res2Net group width = planes * base_width / 64
    scale: int = 2  # channel groups per block
    aff_reduction: int = 4
    pool_eps: float = UPSTREAM_POOL_EPS  # under the pooling's square root, 3D-Speaker's (--pool-eps)


CONFIGS = {
    "tiny": ERes2NetConfig(embedding_size=32, m_channels=8, num_blocks=(1, 1, 1, 1)),
    "default": ERes2NetConfig(),  # 3D-Speaker's VoxCeleb ERes2Net (pretrained_eres2net.ckpt): 6.61 M parameters
    "base": ERes2NetConfig(embedding_size=512),  # ERes2Net-base of 3D-Speaker's 3D-Speaker/200k-speaker models
    "large": ERes2NetConfig(embedding_size=512, m_channels=64),  # ERes2Net-large (eres2net_large_model.ckpt)
}

#: egs/voxceleb/sv-eres2net/conf/eres2net.yaml
RECIPE = speaker.Recipe(lr=0.2, min_lr=5e-5, epochs=70, warmup_epochs=5, margin=0.3, margin_start_epoch=20,
                        margin_fix_epoch=50, aug_prob=0.8)


def upstream_args(c: ERes2NetConfig) -> dict | None:
    """speakerlab's ERes2Net(**args) for this config; None when its fixed choices (width, scale, AFF) differ."""
    if (c.base_width, c.scale, c.aff_reduction) != (32, 2, 4) or c.feat_dim % 8:
        return None
    return {"feat_dim": c.feat_dim, "embedding_size": c.embedding_size, "m_channels": c.m_channels,
            "num_blocks": list(c.num_blocks)}


# ----------------------------------------------------------------------------- model


class ClippedReLU(nn.Hardtanh):
    """min(max(x, 0), 20): the "ReLU" of 3D-Speaker's ERes2Net blocks."""

    def __init__(self) -> None:
        super().__init__(0.0, 20.0)


class AFF(nn.Module):
    """Attentional feature fusion: a learnt per-position mix x * a + y * (2 - a), a = 1 + tanh(att([x, y]))."""

    def __init__(self, channels: int, reduction: int = 4):
        super().__init__()
        inner = channels // reduction
        if inner < 1:
            raise ValueError(f"AFF over {channels} channels with reduction {reduction} has no inner channel")
        self.att = nn.Sequential(
            nn.Conv2d(2 * channels, inner, 1), nn.BatchNorm2d(inner), nn.SiLU(),
            nn.Conv2d(inner, channels, 1), nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = 1.0 + torch.tanh(self.att(torch.cat([x, y], dim=1)))
        return x * a + y * (2.0 - a)


class ERes2NetBlock(nn.Module):
    """1x1 conv -> `scale` channel groups, each a 3x3 conv of (previous group's output fused with its own input)
    -> 1x1 conv to planes * 2, plus the shortcut. fuse="add" (stages 1-2) or "aff" (stages 3-4)."""

    expansion = 2

    def __init__(self, in_planes: int, planes: int, stride: int, cfg: ERes2NetConfig, fuse: str):
        super().__init__()
        width = int(math.floor(planes * cfg.base_width / 64.0))
        self.width, self.scale = width, cfg.scale
        self.conv1 = nn.Conv2d(in_planes, width * cfg.scale, 1, stride=stride, bias=False)
        self.bn1 = nn.BatchNorm2d(width * cfg.scale)
        self.convs = nn.ModuleList(nn.Conv2d(width, width, 3, padding=1, bias=False) for _ in range(cfg.scale))
        self.bns = nn.ModuleList(nn.BatchNorm2d(width) for _ in range(cfg.scale))
        self.fuse = (nn.ModuleList(AFF(width, cfg.aff_reduction) for _ in range(cfg.scale - 1))
                     if fuse == "aff" else None)
        out = planes * self.expansion
        self.conv3 = nn.Conv2d(width * cfg.scale, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
        self.act = ClippedReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(self.act(self.bn1(self.conv1(x))), self.width, dim=1)
        outs = []
        for i, g in enumerate(groups):
            if i > 0:
                g = self.fuse[i - 1](sp, g) if self.fuse is not None else sp + g
            sp = self.act(self.bns[i](self.convs[i](g)))
            outs.append(sp)
        return self.act(self.bn3(self.conv3(torch.cat(outs, dim=1))) + self.shortcut(x))


def temporal_stats(x: torch.Tensor, eps: float) -> torch.Tensor:
    """TSTP: [B, C, F, T] -> [B, 2 * C * F], mean and standard deviation (sqrt(var + eps)) over time."""
    x = x.flatten(1, 2)
    return torch.cat([x.mean(dim=-1), torch.sqrt(x.var(dim=-1) + eps)], dim=1)


class ERes2Net(nn.Module):
    """[B, T, feat_dim] fbank -> [B, embedding_size]."""

    def __init__(self, cfg: ERes2NetConfig):
        super().__init__()
        m = cfg.m_channels
        self.cfg = cfg
        self.conv1 = nn.Conv2d(1, m, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m)
        self._in = m
        self.layer1 = self._stage(m, cfg.num_blocks[0], 1, cfg, "add")
        self.layer2 = self._stage(2 * m, cfg.num_blocks[1], 2, cfg, "add")
        self.layer3 = self._stage(4 * m, cfg.num_blocks[2], 2, cfg, "aff")
        self.layer4 = self._stage(8 * m, cfg.num_blocks[3], 2, cfg, "aff")
        # Global feature fusion: each stage's (fused) output, strided down, joins the next stage's output.
        self.down1 = nn.Conv2d(2 * m, 4 * m, 3, stride=2, padding=1, bias=False)
        self.down2 = nn.Conv2d(4 * m, 8 * m, 3, stride=2, padding=1, bias=False)
        self.down3 = nn.Conv2d(8 * m, 16 * m, 3, stride=2, padding=1, bias=False)
        self.fuse12 = AFF(4 * m, cfg.aff_reduction)
        self.fuse123 = AFF(8 * m, cfg.aff_reduction)
        self.fuse1234 = AFF(16 * m, cfg.aff_reduction)
        freq = cfg.feat_dim
        for _ in range(3):
            freq = (freq - 1) // 2 + 1
        self.embed = nn.Linear(2 * 16 * m * freq, cfg.embedding_size)

    def _stage(self, planes: int, blocks: int, stride: int, cfg: ERes2NetConfig, fuse: str) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(ERes2NetBlock(self._in, planes, s, cfg, fuse))
            self._in = planes * ERes2NetBlock.expansion
        return nn.Sequential(*layers)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if feats.dim() != 3 or feats.shape[2] != self.cfg.feat_dim:
            raise ValueError(f"ERes2Net expects [B, T, {self.cfg.feat_dim}] features, got {tuple(feats.shape)}")
        x = F.relu(self.bn1(self.conv1(feats.transpose(1, 2).unsqueeze(1))))  # [B, 1, F, T]
        out1 = self.layer1(x)
        out2 = self.layer2(out1)
        fused = self.fuse12(out2, self.down1(out1))
        out3 = self.layer3(out2)
        fused = self.fuse123(out3, self.down2(fused))
        out4 = self.layer4(out3)
        fused = self.fuse1234(out4, self.down3(fused))
        return self.embed(temporal_stats(fused, self.cfg.pool_eps))


# ----------------------------------------------------------------------------- training


def main(argv: list[str] | None = None) -> dict:
    # config: core's flags with the recipe's defaults, the speaker flags, and the pooling epsilon
    def flags(p):
        speaker.add_speaker_args(p, RECIPE)
        p.add_argument("--pool-eps", type=float, default=None,
                       help=f"epsilon under the pooling's square root (default: a resumed or continued run's own, "
                            f"else {UPSTREAM_POOL_EPS}, 3D-Speaker's; another value makes the export compute "
                            f"other embeddings in speakerlab)")

    cfg, args = core.parse_args("Train ERes2Net speaker embeddings with 3D-Speaker's recipe on audiopipe shards.",
                                defaults=speaker.run_defaults(RECIPE), extra=flags, argv=argv,
                                flag_help=speaker.FLAG_HELP)
    refuse_other_family(cfg, "eres2net", "eres2net")
    d = core.setup_dist(cfg.seed)
    speaker.check_flags(cfg, args, d)
    mcfg = core.load_model_config(cfg.config, CONFIGS, ERes2NetConfig)
    # the pooling epsilon the weights were trained with: 3D-Speaker's from its checkpoints, a run's own when it
    # is resumed or continued, unless --pool-eps says otherwise
    from_upstream = speaker.init_is_upstream(cfg)
    trained_with = UPSTREAM_POOL_EPS if from_upstream else speaker.previous_model_config(cfg).get("pool_eps")
    pool_eps = next(e for e in (args.pool_eps, trained_with, mcfg.pool_eps) if e is not None)
    mcfg = replace(mcfg, pool_eps=pool_eps)
    if d.main and from_upstream:
        print(f"[eres2net] --init-from is a 3D-Speaker checkpoint: pooling epsilon {pool_eps} as it was trained",
              flush=True)
    if d.main and pool_eps != UPSTREAM_POOL_EPS:
        print(f"[eres2net] pooling epsilon {pool_eps} is not speakerlab's {UPSTREAM_POOL_EPS}: its export computes "
              f"other embeddings there, so export-checkpoint refuses it without --allow-different", flush=True)

    # data: held-out speakers, 3 s crops, speed perturbation (3 classes per speaker), noise/reverb
    data = speaker_data(cfg, args, d, "eres2net")

    # model: ERes2Net under an AAM-softmax head whose margin follows the epochs
    schedule = speaker.EpochSchedule.from_flags(cfg, args)
    model = speaker.SpeakerModel(ERes2Net(mcfg), mcfg.embedding_size, data.num_classes, schedule.margin,
                                 scale=args.scale, grad_accum=cfg.grad_accum)
    speaker.write_model_config(cfg, d, "eres2net", mcfg)

    # loss, optimizer, schedule: AAM-softmax cross entropy, SGD, LR and margin counted in epochs of the loader
    last = core.train(speaker.sync_batchnorm(model, args, d), speaker.loss_for(data), cfg, d, features=["pcm"],
                      loader_kw=data.loader_kw, optimizer=speaker.sgd(model, cfg), lr_fn=schedule.lr,
                      on_loader=lambda loader: schedule.start(cfg, len(loader) // cfg.grad_accum),
                      init_weights=speaker.init_weights("eres2net", model, upstream_args, CONFIGS, cfg.config),
                      init_hints=speaker.INIT_HINTS, log_name="eres2net")

    # after training: the EER on the held-out speakers, the export for speakerlab
    return speaker.evaluate_and_export("eres2net", model, data, cfg, args, d, last)


if __name__ == "__main__":
    main()
