"""What each of the NS2 trainer's Amphion choices does (docs/trainers/ns2.md, "What each choice does").

    python benchmarks/bench_ns2_choices.py --shards demo/shards_ast --codec-checkpoint demo/encodec \
        --steps 200 --json benchmarks/results/ns2_choices.json

1. Outputs: Amphion's weights and padded batch (tests/data/ns2_amphion, made by Amphion's code): max |difference|
   from Amphion's own outputs of our model in Amphion's forward, and with each of its three choices switched to
   audiopipe's alone, and all three (audiopipe's forward).
2. Code labels: on the shards, the share of (frame, codebook) entries where Amphion's labels (the greedy
   re-quantisation of the latent the codes decode to) differ from the codes themselves.
3. Training: the tiny config for --steps steps, one process, same seed and batches, under four settings: audiopipe
   (frames rule, audiopipe forward), Amphion's forward alone, Amphion's prompt rule alone, and all of Amphion's
   choices (phones rule, Amphion forward, Amphion phone table). Per term, the mean of the last quarter of the
   logged window means; and the mean step time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "trainers"), str(ROOT / "tests")]

TERMS = ("loss", "pitch", "duration", "x0", "noise", "ce", "align", "code_acc")
SETTINGS = {
    "audiopipe": [],
    "amphion forward": ["--forward", "amphion", "--prompt-rule", "frames", "--phone-table", "audiopipe"],
    "amphion prompt rule": ["--prompt-rule", "phones"],
    "all amphion": ["--forward", "amphion", "--prompt-rule", "phones", "--phone-table", "amphion"],
}


def outputs_gap() -> dict[str, float]:
    from safetensors.torch import load_file

    from audiopipe.checkpoints.load import load_matching
    from train_ns2 import AMPHION_FORWARD, INIT_HINTS, NS2Config, NaturalSpeech2, make_init_reader
    from audiopipe.checkpoints.ns2 import config_from_upstream

    fx = ROOT / "tests" / "data" / "ns2_amphion"
    meta = json.loads((fx / "meta.json").read_text())
    io = load_file(str(fx / "io.safetensors"))
    x = {k[3:]: v for k, v in io.items() if k.startswith("in.")}
    real = x["mask"].bool()
    state = make_init_reader(None, 4)(str(fx / "amphion_checkpoint"))
    base = {**config_from_upstream(meta["model"]), "n_codebooks": 4, "codec_layers": 4, "codebook_size": 16}
    out = {}
    for name, change in {"amphion forward": {}, "positions per time step": {"positions": "time"},
                         "padding masked": {"mask_padding": True}, "labels = codes": {"ce_labels": "codes"},
                         "audiopipe forward": {"positions": "time", "mask_padding": True, "ce_labels": "codes"}}.items():
        model = NaturalSpeech2(NS2Config(**{**base, **AMPHION_FORWARD, **change})).eval()
        load_matching(model, state, INIT_HINTS)
        with torch.no_grad():
            o = model.amphion_forward(**x, t=io["t"], noise=io["noise"])
        out[name] = {
            "x0_pred (real frames)": float(((o["x0_pred"] - io["x0_pred"]).abs() * real[:, None]).max()),
            "dur_log (real phones)": float(((o["dur_log"] - io["dur_pred_log"]).abs() * x["phone_mask"]).max()),
            "pitch_log (real frames)": float(((o["pitch_log"] - io["pitch_pred_log"]).abs() * real).max()),
            "loss": abs(float(o["loss"]) - float(io["loss.loss"])),
        }
    out["scale"] = {"x0_pred": float(io["x0_pred"].abs().max()), "dur_log": float(io["dur_pred_log"].abs().max()),
                    "pitch_log": float(io["pitch_pred_log"].abs().max())}
    return out


def label_disagreement(shards: str, codec: str, n: int = 64) -> dict[str, float]:
    from audiopipe.checkpoints.ns2 import from_codec
    from audiopipe.features.codec import quantizer_state
    from audiopipe.reader.arrow_dataset import ShardDataset
    from train_ns2 import CONFIGS, NaturalSpeech2

    model = NaturalSpeech2(CONFIGS["tiny"])
    model.set_codec(from_codec(quantizer_state(checkpoint=codec)))
    ds = ShardDataset(shards, ["codes"])
    differ = total = 0
    per_book = np.zeros(16)
    for i in range(min(n, len(ds))):
        codes = torch.from_numpy(np.asarray(ds[i]["codes"])).long()[None]
        again = model.requantize(model.latent(codes))
        d = (again != codes).float()
        differ += float(d.sum())
        total += d.numel()
        per_book += d.mean(-1)[0].numpy() * codes.shape[-1]
    frames = total / 16
    return {"utterances": min(n, len(ds)), "frames": frames, "share": differ / total,
            "share_per_codebook": (per_book / frames).round(4).tolist()}


def train_runs(shards: str, codec: str, steps: int, out: Path, batch_frames: int) -> dict[str, dict]:
    res = {}
    for name, flags in SETTINGS.items():
        run = out / name.replace(" ", "_")
        cmd = [sys.executable, str(ROOT / "trainers" / "train_ns2.py"), "--shards", shards, "--codec-checkpoint",
               codec, "--config", "tiny", "--out", str(run), "--max-steps", str(steps), "--batch-frames",
               str(batch_frames), "--log-every", "10", "--ckpt-every", str(steps), "--lr", "2e-3",
               "--warmup-steps", "30", *flags]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
        if r.returncode != 0:
            raise SystemExit(f"{name}: {r.stderr[-2000:]}")
        recs = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
        tail = recs[-max(1, len(recs) // 4):]
        res[name] = {"flags": flags, "wall_s": time.perf_counter() - t0,
                     "step_time_s": float(np.mean([x["step_time"] for x in recs[1:]])),
                     "last_quarter": {k: float(np.mean([x[k] for x in tail])) for k in TERMS},
                     "first_window": {k: recs[0][k] for k in TERMS},
                     "log": [{k: x[k] for k in ("step", *TERMS)} for x in recs]}
        print(name, {k: round(v, 4) for k, v in res[name]["last_quarter"].items()},
              f"step {res[name]['step_time_s']:.3f} s", flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", required=True)
    p.add_argument("--codec-checkpoint", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-frames", type=int, default=1500)
    p.add_argument("--out", default="runs/ns2_choices")
    p.add_argument("--json", required=True)
    a = p.parse_args()
    started = time.time()
    load = os.getloadavg()
    doc = {"machine": platform.node(), "cpus": os.cpu_count(), "load_at_start": load,
           "outputs_gap": outputs_gap()}
    print(json.dumps(doc["outputs_gap"], indent=1), flush=True)
    doc["label_disagreement"] = label_disagreement(a.shards, a.codec_checkpoint)
    print(doc["label_disagreement"], flush=True)
    doc["training"] = train_runs(a.shards, a.codec_checkpoint, a.steps, Path(a.out), a.batch_frames)
    doc["load_at_end"] = os.getloadavg()
    doc["wall_s"] = time.time() - started
    Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
