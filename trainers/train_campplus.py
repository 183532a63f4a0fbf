"""CAM++ speaker embeddings (3D-Speaker), trained on audiopipe shards with AAM-softmax, as 3D-Speaker trains it.

    torchrun --nproc_per_node=2 trainers/train_campplus.py --shards ./shards --config tiny --out runs/campplus \
        --epochs 10 --batch-frames $((16 * 48000))

Fine-tuning 3D-Speaker's released CAM++: `--init-from campplus_voxceleb.bin` (or an experiment folder of
speakerlab's trainer) with the --config of its size; `--export-upstream DIR` writes the result for speakerlab's
extract.py. docs/trainers/campplus.md has the recipe and every difference from 3D-Speaker's trainer.

Read top to bottom: the configs and the recipe's numbers, the network, then main(): flags, data (speaker_data.py:
held-out speakers, random 3 s crops of the `pcm` column; speed perturbation, noise/reverb and fbank on the device),
model (CAM++ under an AAM-softmax head), loss and schedule (speaker.py), core.train, then the EER
(speaker_eval.py) and the export.

The network follows 3D-Speaker's CAM++ (D-TDNN with context-aware masking): a 2-D convolutional front-end (FCM,
residual blocks that stride only along frequency) flattened into channels, a strided TDNN layer, three densely
connected TDNN blocks whose layers gate a local convolution by a mask computed from utterance-level plus
100-frame segment-level mean context, transition layers that halve the channels, statistics pooling and a
linear embedding with a non-affine batch norm. As in speakerlab, each dense layer's first BN-ReLU + 1x1 conv is
recomputed in the backward pass (memory_efficient), which also updates that BatchNorm's running statistics twice
per step. Simplified: only the batchnorm-relu nonlinearity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import core
from init_family import refuse_other_family
import speaker
from speaker_data import speaker_data

# ----------------------------------------------------------------------------- config


@dataclass(frozen=True)
class CAMPPlusConfig:
    feat_dim: int = 80
    embedding_size: int = 512
    fcm_channels: int = 32
    fcm_blocks: int = 2  # residual blocks in each of the two FCM stages
    init_channels: int = 128
    growth_rate: int = 32
    bn_size: int = 4  # bottleneck channels = bn_size * growth_rate
    block_layers: tuple[int, int, int] = (12, 24, 16)
    block_kernels: tuple[int, int, int] = (3, 3, 3)
    block_dilations: tuple[int, int, int] = (1, 2, 2)
    seg_len: int = 100  # frames per segment of the segment-level context
    # speakerlab's default: in training, each dense layer's first BN-ReLU + 1x1 conv is recomputed in the backward
    # pass instead of kept (torch.utils.checkpoint). Besides saving memory, the recompute updates that BatchNorm's
    # running statistics a second time per step, as in the runs that made 3D-Speaker's released models.
    memory_efficient: bool = True


CONFIGS = {
    "tiny": CAMPPlusConfig(embedding_size=32, fcm_channels=8, init_channels=32, growth_rate=8, bn_size=2,
                           block_layers=(2, 2, 2)),
    "default": CAMPPlusConfig(),  # 3D-Speaker's VoxCeleb CAM++ (campplus_voxceleb.bin): 512-d, 7.18 M parameters
    "common": CAMPPlusConfig(embedding_size=192),  # its Chinese / Chinese-English CAM++ (campplus_cn_common.bin)
}

#: egs/voxceleb/sv-cam++/conf/cam++.yaml
RECIPE = speaker.Recipe(lr=0.1, min_lr=1e-4, epochs=60, warmup_epochs=5, margin=0.2, margin_start_epoch=15,
                        margin_fix_epoch=25, aug_prob=0.2)


def upstream_args(c: CAMPPlusConfig) -> dict | None:
    """speakerlab's CAMPPlus(**args) for this config; None when its fixed front end or dense blocks differ."""
    fixed = (c.fcm_channels, c.fcm_blocks, c.block_layers, c.block_kernels, c.block_dilations, c.seg_len)
    if fixed != (32, 2, (12, 24, 16), (3, 3, 3), (1, 2, 2), 100) or c.feat_dim % 8:
        return None
    return {"feat_dim": c.feat_dim, "embedding_size": c.embedding_size, "growth_rate": c.growth_rate,
            "bn_size": c.bn_size, "init_channels": c.init_channels}


# ----------------------------------------------------------------------------- model


def bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm1d(channels), nn.ReLU())


class ResBlock2d(nn.Module):
    """Two 3x3 convolutions with a residual; stride applies to frequency only, time keeps its resolution."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + self.shortcut(x))


class FCM(nn.Module):
    """Front-end convolution module: [B, F, T] -> [B, channels * F / 8, T]."""

    def __init__(self, cfg: CAMPPlusConfig):
        super().__init__()
        m = cfg.fcm_channels
        self.conv1 = nn.Conv2d(1, m, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m)
        self.layer1 = nn.Sequential(*[ResBlock2d(m, m, 2 if i == 0 else 1) for i in range(cfg.fcm_blocks)])
        self.layer2 = nn.Sequential(*[ResBlock2d(m, m, 2 if i == 0 else 1) for i in range(cfg.fcm_blocks)])
        self.conv2 = nn.Conv2d(m, m, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m)
        freq = cfg.feat_dim
        for _ in range(3):
            freq = (freq - 1) // 2 + 1
        self.out_channels = m * freq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        x = F.relu(self.bn2(self.conv2(self.layer2(self.layer1(x)))))
        return x.flatten(1, 2)


class CAMLayer(nn.Module):
    """A local TDNN convolution gated by a sigmoid mask of (utterance mean + segment mean) context."""

    def __init__(self, bn_channels: int, out_channels: int, kernel: int, dilation: int, seg_len: int,
                 reduction: int = 2):
        super().__init__()
        self.local = nn.Conv1d(bn_channels, out_channels, kernel, padding=(kernel - 1) // 2 * dilation,
                               dilation=dilation, bias=False)
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // reduction, 1)
        self.linear2 = nn.Conv1d(bn_channels // reduction, out_channels, 1)
        self.seg_len = seg_len

    def segment_mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean over each seg_len-frame segment (the last one partial), repeated back over its frames."""
        seg = F.avg_pool1d(x, self.seg_len, self.seg_len, ceil_mode=True)
        return seg.repeat_interleave(self.seg_len, dim=-1)[..., : x.shape[-1]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # speakerlab's order (local convolution first): it sets the order in which x's gradients add up, and a
        # training step is sensitive enough to that rounding that the step parity test would otherwise drift
        y = self.local(x)
        context = x.mean(dim=-1, keepdim=True) + self.segment_mean(x)
        mask = torch.sigmoid(self.linear2(F.relu(self.linear1(context))))
        return y * mask


class CAMDenseLayer(nn.Module):
    """BN-ReLU, 1x1 bottleneck, BN-ReLU, CAM layer: growth_rate new channels for the dense block."""

    def __init__(self, in_channels: int, cfg: CAMPPlusConfig, kernel: int, dilation: int):
        super().__init__()
        bn = cfg.bn_size * cfg.growth_rate
        self.bottleneck = nn.Sequential(bn_relu(in_channels), nn.Conv1d(in_channels, bn, 1, bias=False), bn_relu(bn))
        self.cam = CAMLayer(bn, cfg.growth_rate, kernel, dilation, cfg.seg_len)
        self.memory_efficient = cfg.memory_efficient

    def _squeeze(self, x: torch.Tensor) -> torch.Tensor:
        return self.bottleneck[1](self.bottleneck[0](x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.memory_efficient and torch.is_grad_enabled():
            # nothing random inside, so no RNG state to keep for the recompute
            h = checkpoint(self._squeeze, x, use_reentrant=False, preserve_rng_state=False)
        else:
            h = self._squeeze(x)
        return self.cam(self.bottleneck[2](h))


class CAMDenseBlock(nn.ModuleList):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class CAMPPlus(nn.Module):
    """[B, T, feat_dim] fbank -> [B, embedding_size]."""

    def __init__(self, cfg: CAMPPlusConfig):
        super().__init__()
        self.cfg = cfg
        self.fcm = FCM(cfg)
        c = cfg.init_channels
        layers: list[nn.Module] = [nn.Conv1d(self.fcm.out_channels, c, 5, stride=2, padding=2, bias=False),
                                   bn_relu(c)]
        for n, k, dil in zip(cfg.block_layers, cfg.block_kernels, cfg.block_dilations):
            if k % 2 != 1:
                raise ValueError(f"CAM++ block kernels must be odd (same padding), got {k}")
            layers.append(CAMDenseBlock(CAMDenseLayer(c + i * cfg.growth_rate, cfg, k, dil) for i in range(n)))
            c += n * cfg.growth_rate
            layers += [bn_relu(c), nn.Conv1d(c, c // 2, 1, bias=False)]  # transition
            c //= 2
        layers.append(bn_relu(c))
        self.xvector = nn.Sequential(*layers)
        self.embed = nn.Conv1d(2 * c, cfg.embedding_size, 1, bias=False)
        self.embed_bn = nn.BatchNorm1d(cfg.embedding_size, affine=False)
        for mod in self.modules():
            if isinstance(mod, (nn.Conv1d, nn.Linear)):
                nn.init.kaiming_normal_(mod.weight)
                if mod.bias is not None:
                    nn.init.zeros_(mod.bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        if feats.dim() != 3 or feats.shape[2] != self.cfg.feat_dim:
            raise ValueError(f"CAM++ expects [B, T, {self.cfg.feat_dim}] features, got {tuple(feats.shape)}")
        x = self.xvector(self.fcm(feats.transpose(1, 2)))
        stats = torch.cat([x.mean(dim=-1), x.std(dim=-1)], dim=1)  # statistics pooling
        return self.embed_bn(self.embed(stats.unsqueeze(-1)).squeeze(-1))


# ----------------------------------------------------------------------------- training


def main(argv: list[str] | None = None) -> dict:
    # config: core's flags with CAM++'s recipe as defaults (its own LR: 0.1 down to 1e-4), the speaker flags
    cfg, args = core.parse_args("Train CAM++ speaker embeddings with 3D-Speaker's recipe on audiopipe shards.",
                                defaults=speaker.run_defaults(RECIPE), argv=argv, flag_help=speaker.FLAG_HELP,
                                extra=lambda p: speaker.add_speaker_args(p, RECIPE))
    refuse_other_family(cfg, "campplus", "campplus")
    d = core.setup_dist(cfg.seed)
    speaker.check_flags(cfg, args, d)
    mcfg = core.load_model_config(cfg.config, CONFIGS, CAMPPlusConfig)

    # data: held-out speakers, 3 s crops, speed perturbation (3 classes per speaker), noise/reverb. Every batch
    # holds 2+ crops: CAM++'s last layer is a BatchNorm without affine parameters (speaker_data.fill_last_batch)
    data = speaker_data(cfg, args, d, "campplus")

    # model: CAM++ under an AAM-softmax head whose margin follows the epochs
    schedule = speaker.EpochSchedule.from_flags(cfg, args)
    model = speaker.SpeakerModel(CAMPPlus(mcfg), mcfg.embedding_size, data.num_classes, schedule.margin,
                                 scale=args.scale, grad_accum=cfg.grad_accum)
    speaker.write_model_config(cfg, d, "campplus", mcfg)
    read_init = speaker.init_weights("campplus", model, upstream_args, CONFIGS, cfg.config)

    # loss, optimizer, schedule: AAM-softmax cross entropy, SGD, LR and margin counted in epochs of the loader
    last = core.train(speaker.sync_batchnorm(model, args, d), speaker.loss_for(data), cfg, d, features=["pcm"],
                      loader_kw=data.loader_kw, optimizer=speaker.sgd(model, cfg), lr_fn=schedule.lr,
                      on_loader=lambda loader: schedule.start(cfg, len(loader) // cfg.grad_accum),
                      init_weights=read_init, init_hints=speaker.INIT_HINTS, log_name="campplus")

    # after training: the EER on the held-out speakers, the export for speakerlab
    return speaker.evaluate_and_export("campplus", model, data, cfg, args, d, last)


if __name__ == "__main__":
    main()
