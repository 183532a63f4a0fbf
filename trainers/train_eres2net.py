"""ERes2Net speaker embeddings (3D-Speaker), trained on audiopipe shards with AAM-softmax.

    torchrun --nproc_per_node=2 trainers/train_eres2net.py --shards ./shards --config tiny --out runs/eres2net \
        --max-steps 20 --batch-frames $((8 * 48000))

Reads the `pcm` column (int16 @16 kHz, preset eres2net) and takes random 3 s crops of it; see speaker_data.py for the
whole data path (speed perturbation, augmentation, fbank on the device) and speaker_eval.py for the EER.

The model follows 3D-Speaker's ERes2Net: a ResNet34-shaped stack of Res2Net-style blocks whose channel groups
are fused by plain addition in the first two stages and by attentional feature fusion (AFF) in the last two
(local feature fusion), plus a bottom-up path that fuses every stage's output with the next one through
strided convolutions and AFF (global feature fusion); temporal statistics pooling and a linear embedding.
Simplified: only the TSTP pooling, and no two-layer embedding option (the reference's default is one layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import core
import speaker
from speaker_data import speaker_data


@dataclass(frozen=True)
class ERes2NetConfig:
    feat_dim: int = 80
    embedding_size: int = 192
    m_channels: int = 32  # 64 is ERes2Net-large
    num_blocks: tuple[int, int, int, int] = (3, 4, 6, 3)
    base_width: int = 32  # Res2Net group width = planes * base_width / 64
    scale: int = 2  # channel groups per block
    aff_reduction: int = 4


CONFIGS = {
    "tiny": ERes2NetConfig(embedding_size=32, m_channels=8, num_blocks=(1, 1, 1, 1)),
    "default": ERes2NetConfig(),  # 3D-Speaker's VoxCeleb ERes2Net: 6.61 M parameters
}


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


def temporal_stats(x: torch.Tensor) -> torch.Tensor:
    """TSTP: [B, C, F, T] -> [B, 2 * C * F], mean and standard deviation over time."""
    x = x.flatten(1, 2)
    return torch.cat([x.mean(dim=-1), torch.sqrt(x.var(dim=-1) + 1e-7)], dim=1)


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
        return self.embed(temporal_stats(fused))


def main(argv: list[str] | None = None) -> dict:
    # config
    cfg, args = core.parse_args("Train ERes2Net speaker embeddings (3D-Speaker recipe) on audiopipe shards.",
                                defaults=speaker.RUN_DEFAULTS,
                                extra=lambda p: speaker.add_speaker_args(p, margin=0.3, aug_prob=0.8), argv=argv)
    d = core.setup_dist(cfg.seed)
    speaker.set_cpu_threads(args, d)
    mcfg = core.load_model_config(cfg.config, CONFIGS, ERes2NetConfig)
    # data: held-out speakers, crops, speed perturbation, augmentation (speaker_data.py)
    data = speaker_data(cfg, args, verbose=d.main)
    # model: the embedding model under an AAM-softmax head (speaker.py, speaker_eval.py)
    model = speaker.build_speaker_model(ERes2Net(mcfg), mcfg.embedding_size, data, cfg, args, d)
    # loss and training (speaker.loss_fn), then the EER on the held-out speakers
    return speaker.train_and_evaluate("eres2net", model, data, cfg, args, d)


if __name__ == "__main__":
    main()
