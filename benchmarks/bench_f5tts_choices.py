"""What F5-TTS's forward details and training rules change, measured with audiopipe's F5 trainer.

    python -m audiopipe.corpus.demo /tmp/wavs
    audiopipe shard --corpus /tmp/wavs --out /tmp/f5shards --preset f5tts
    python benchmarks/bench_f5tts_choices.py --shards /tmp/f5shards --config small.json --steps 200 \\
        --out benchmarks/results/f5tts_choices.json

1. forward: one model, the same weights (random, zero-initialised layers drawn too so every path carries signal)
   and the same real batch, run with audiopipe's masked forward and with F5's (`upstream_forward`, proven equal to
   F5's own code by tests/test_checkpoint_f5tts.py): outputs on real frames and the loss under the same draws.
   At --forward-config size (default: F5TTS_v1_Base).
2. training: the trainer on the shards, the same seed and data order, three ways: audiopipe's earlier rules
   (masked forward, warmup + cosine, no EMA), masked with F5's schedule and EMA, and F5's forward with both. Each
   final model (online weights and EMA weights) is scored on fixed batches with fixed draws (dropout off), in
   both forwards: so the table shows what training in one forward costs when run in the other (F5's inference
   runs F5's forward).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "trainers"))

import train_f5tts as f5  # noqa: E402  (puts the repository root on the path through core)
from audiopipe.reader.loader import make_loader  # noqa: E402


def batches(shards: str, n: int, max_frames: int, seed: int = 99) -> list[dict]:
    """n padded batches of the shards (byte tokens), the loader's own padding and order."""
    loader = make_loader(shards, ["mel"], max_frames=max_frames, seed=seed, expect={"mel": f5.MEL_HASH},
                         batch_transform=f5.AddTextIds(f5.Tokenizer()), rank=0, world_size=1)
    loader.set_epoch(0)
    out = []
    for b in loader:
        out.append({"mel": b["mel"].transpose(1, 2).contiguous(), "lens": b["mel_lengths"], "text": b["text_ids"]})
        if len(out) == n:
            break
    return out


def scored(model: f5.F5TTS, bs: list[dict], upstream: bool) -> float:
    """Mean flow-matching loss over the batches with fixed draws per batch, dropout off, in the given forward."""
    m = f5.F5TTS(replace(model.cfg, upstream_forward=upstream))
    m.load_state_dict(model.state_dict())
    m.eval()
    losses = []
    with torch.no_grad():
        for i, b in enumerate(bs):
            torch.manual_seed(1000 + i)
            random.seed(1000 + i)
            losses.append(m(b["mel"], b["lens"], b["text"])[0].item())
    return float(np.mean(losses))


def forward_part(bs: list[dict], config: str) -> dict:
    cfg = replace(f5.load_model_config(config, f5.CONFIGS, f5.ModelConfig), dropout=0.0)
    torch.manual_seed(0)
    base = f5.F5TTS(cfg)
    with torch.no_grad():
        for p in base.parameters():
            if not p.any():
                p.normal_(0, 0.02)
    models = {}
    for up in (False, True):
        models[up] = f5.F5TTS(replace(cfg, upstream_forward=up)).eval()
        models[up].load_state_dict(base.state_dict())
    b = bs[0]
    n = b["mel"].shape[1]
    res: dict = {"config": config, "parameters": f5.count_parameters(base), "batch": b["lens"].tolist()}
    g = torch.Generator().manual_seed(5)
    x, t = torch.randn(b["mel"].shape, generator=g), torch.rand(len(b["lens"]), generator=g)
    mask = f5.lengths_to_mask(b["lens"], n)
    with torch.no_grad():
        out = {up: models[up].transformer(x, b["mel"], b["text"], t, b["lens"]) for up in (False, True)}
        real = mask[..., None].expand_as(out[False])
        diff = (out[False] - out[True]).abs()[real]
        res["padded_batch"] = {"max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
                               "mean_abs_output": out[True].abs()[real].mean().item()}
        # each utterance alone: no padding, only the filler after its text
        alone = []
        for i, L in enumerate(b["lens"].tolist()):
            o = [models[up].transformer(x[i:i + 1, :L], b["mel"][i:i + 1, :L], b["text"][i:i + 1], t[i:i + 1],
                                        b["lens"][i:i + 1]) for up in (False, True)]
            alone.append(((o[0] - o[1]).abs().max().item(), (o[0] - o[1]).abs().mean().item(),
                          o[1].abs().mean().item()))
        res["single_utterance"] = {"max_abs_diff": max(a[0] for a in alone),
                                   "mean_abs_diff": float(np.mean([a[1] for a in alone])),
                                   "mean_abs_output": float(np.mean([a[2] for a in alone]))}
        # padding in F5's forward: the same utterance alone and in the padded batch
        i = int(b["lens"].argmin())
        L = int(b["lens"][i])
        solo = models[True].transformer(x[i:i + 1, :L], b["mel"][i:i + 1, :L], b["text"][i:i + 1], t[i:i + 1],
                                        b["lens"][i:i + 1])
        res["f5_forward_padding_effect"] = {"frames": L, "padded_to": n,
                                            "max_abs_diff": (solo[0] - out[True][i, :L]).abs().max().item()}
        losses = {}
        for up in (False, True):
            torch.manual_seed(7)
            random.seed(7)
            losses["upstream" if up else "masked"] = models[up](b["mel"], b["lens"], b["text"])[0].item()
        res["loss_same_draws"] = losses
    return res


def train_part(args, bs: list[dict]) -> dict:
    variants = {
        "masked, cosine, no EMA": ["--forward", "masked", "--lr-schedule", "cosine", "--ema", "off"],
        "masked, F5 schedule, EMA": ["--forward", "masked", "--lr-schedule", "f5", "--ema", "f5"],
        "F5 forward, F5 schedule, EMA": ["--forward", "upstream", "--lr-schedule", "f5", "--ema", "f5"],
    }
    res = {}
    for name, flags in variants.items():
        out = Path(args.work) / name.replace(", ", "_").replace(" ", "-")
        t0 = time.time()
        f5.main(["--shards", args.shards, "--config", args.config, "--out", str(out), "--max-steps", str(args.steps),
                 "--batch-frames", str(args.batch_frames), "--lr", str(args.lr), "--warmup-steps",
                 str(max(1, args.steps // 10)), "--log-every", "10", "--ckpt-every", str(args.steps),
                 "--seed", str(args.seed), *flags])
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        ck = torch.load(f5.latest_checkpoint(out), weights_only=True, map_location="cpu")
        model = f5.F5TTS(f5.ModelConfig(**{**json.loads((out / "model_config.json").read_text())["model"],
                                           "frac_lengths": tuple(f5.ModelConfig.frac_lengths)}))
        model.load_state_dict(ck["model"])
        row = {"train_loss_last_quarter": float(np.mean([r["loss"] for r in log[-max(1, len(log) // 4):]])),
               "seconds": round(time.time() - t0, 1),
               "score_online": {"masked": scored(model, bs, False), "upstream": scored(model, bs, True)}}
        ema = ck["hooks"].get("ema")
        if ema:
            model.load_state_dict(ema["weights"])
            row["score_ema"] = {"masked": scored(model, bs, False), "upstream": scored(model, bs, True)}
            row["ema_updates"] = ema["step"]
        res[name] = row
        print(name, json.dumps(row), flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--config", default="tiny", help="trainer config of the training comparison")
    p.add_argument("--forward-config", default="default", help="model size of the forward comparison")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-frames", type=int, default=1500)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234, help="the trainer's seed (init, data order, draws)")
    p.add_argument("--work", default="/tmp/f5_choices")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "f5tts_choices.json"))
    p.add_argument("--forward-from", default=None,
                   help="take part 1 from this earlier result file instead of measuring it again")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads of the training runs (the trainer's default: the cores per rank)")
    args = p.parse_args()
    bs = batches(args.shards, 8, args.batch_frames)
    res = {"command": " ".join(sys.argv)}
    if args.forward_from:
        res["forward"] = json.loads(Path(args.forward_from).read_text())["forward"]
    else:
        res["forward"] = forward_part(bs, args.forward_config)
        print(json.dumps(res["forward"], indent=1), flush=True)
    if args.threads:
        setup = f5.setup_dist

        def setup_with_threads(seed):
            d = setup(seed)
            torch.set_num_threads(args.threads)
            return d

        f5.setup_dist = setup_with_threads
    res["training"] = train_part(args, bs)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
