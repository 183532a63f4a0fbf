"""CPU cost of a speaker trainer's batch: crops finished per crop in the loader (`--augment-on cpu`: soxr, scipy)
against crops only sliced there and finished on the device (`--augment-on device`, the default). The commands, what
each figure counts and the results: docs/trainers/campplus.md#the-cost-of-a-batch-on-the-cpu.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "trainers"))

import core  # noqa: E402
import speaker  # noqa: E402
import speaker_data  # noqa: E402
import train_campplus  # noqa: E402
from audiopipe.reader.loader import make_loader  # noqa: E402
from results_io import grouped_bars, host, output_args, pyplot, save, spread, write_results  # noqa: E402

PATHS = ("cpu", "device")


def folders(root: Path) -> tuple[Path, Path]:
    """A noise folder (white and pink-ish noise, 10 s each) and a RIR folder (two decaying-noise responses)."""
    import soundfile as sf

    noise, rir = root / "noise", root / "rir"
    noise.mkdir(parents=True, exist_ok=True), rir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sr = speaker_data.SAMPLE_RATE
    sf.write(noise / "white.wav", 0.1 * rng.standard_normal(10 * sr), sr)
    sf.write(noise / "low.wav", 0.1 * np.cumsum(rng.standard_normal(10 * sr)) / 100, sr)
    for k, t60 in enumerate((0.3, 0.6)):
        t = np.arange(int(t60 * sr)) / sr
        sf.write(rir / f"room{k}.wav", rng.standard_normal(len(t)) * np.exp(-6.9 * t / t60), sr)
    return noise, rir


def batch_loader(shards: Path, path: str, aug: tuple[Path, Path] | None):
    """The trainer's loader for CAM++ `default` (no worker, no prefetch) and its speaker data."""
    argv = ["--shards", str(shards), "--config", "default", "--augment-on", path]
    argv += ["--noise-dir", str(aug[0]), "--rir-dir", str(aug[1])] if aug else []
    cfg, args = core.parse_args("bench", defaults=speaker.run_defaults(train_campplus.RECIPE),
                                extra=lambda p: speaker.add_speaker_args(p, train_campplus.RECIPE), argv=argv)
    d = core.Dist(0, 1, 0, torch.device("cpu"))
    data = speaker_data.speaker_data(cfg, args, d, "campplus")
    loader = make_loader(str(shards), ["pcm"], max_frames=cfg.batch_frames, seed=cfg.seed, num_workers=0,
                         prefetch=0, **data.loader_kw)
    return loader, data


def slice_only(item: dict) -> dict:
    """The least any item transform does: the first 3 s of the utterance (repeated when short), no draw."""
    return {"wav": np.resize(item["pcm"], 48000) if len(item["pcm"]) < 48000 else item["pcm"][:48000], "label": 0}


def measure_batches(shards: Path, aug: tuple[Path, Path] | None, rounds: int = 5, batches: int = 4) -> dict:
    """The training thread's CPU time to build one batch of CAM++'s `default` recipe, the paths alternating batch by
    batch over the same utterances and draws; `floor`: the same loader whose item transform only takes the first 3 s
    (no draw); `device_side_ms_on_cpu`: what the device path then does on the device, with the CPU as the device."""
    loaders = {"cpu": batch_loader(shards, "cpu", aug)[0]}
    loaders["device"], data = batch_loader(shards, "device", aug)
    kw = {**data.loader_kw, "item_transform": slice_only, "batch_transform": None}
    loaders["floor"] = make_loader(str(shards), ["pcm"], max_frames=64 * 48000, seed=0, num_workers=0, prefetch=0, **kw)
    per_round: dict[str, list[float]] = {p: [] for p in loaders}
    device_ms, fbank_ms = [], []
    for r in range(rounds):
        for loader in loaders.values():
            loader.set_epoch(r)
        its = {p: iter(loader) for p, loader in loaders.items()}
        times: dict[str, list[float]] = {p: [] for p in loaders}
        for _ in range(batches):
            for p, it in its.items():  # side by side: the same batch of the plan, one path then the other
                t0 = time.thread_time()
                batch = next(it)
                times[p].append(time.thread_time() - t0)
                if p == "device":
                    t0 = time.thread_time()
                    wav = data.finish(batch)
                    t1 = time.thread_time()
                    speaker_data.fbank_batch(wav)
                    device_ms.append((t1 - t0) * 1e3)
                    fbank_ms.append((time.thread_time() - t1) * 1e3)
                assert len(batch["label"]) == 64, len(batch["label"])
        for p in loaders:
            per_round[p].append(float(np.median(times[p])) * 1e3)
    ratios = [c / d for c, d in zip(per_round["cpu"], per_round["device"])]
    return {"cpu_ms_per_batch": {p: {"median": float(np.median(v)), "per_round": v} for p, v in per_round.items()},
            "ratio_cpu_over_device": spread(ratios),
            "device_side_ms_on_cpu": {"augment": float(np.median(device_ms)), "fbank": float(np.median(fbank_ms))},
            "crops_per_batch": 64, "batches_per_round": batches, "rounds": rounds}


def measure_datawait(shards: Path, runs: int = 2, steps: int = 12) -> dict:
    """Short CAM++ `tiny` runs of the real trainer on the CPU (16 crops, no prefetch), the paths alternating run by
    run: the data-wait share and step time of each run's second half, from its log."""
    out = {p: {"data_wait_share": [], "step_time_s": []} for p in PATHS}
    for _ in range(runs):
        for p in PATHS:
            with tempfile.TemporaryDirectory() as tmp:
                argv = ["--shards", str(shards), "--config", "tiny", "--out", tmp, "--augment-on", p,
                        "--max-steps", str(steps), "--batch-frames", str(16 * 48000), "--prefetch", "0",
                        "--num-workers", "0", "--log-every", str(steps // 2), "--ckpt-every", str(10 ** 6),
                        "--heldout-speakers", "0", "--cpu-threads", "1", "--lr", "0.2"]
                train_campplus.main(argv)
                rec = json.loads((Path(tmp) / "log.jsonl").read_text().splitlines()[-1])  # the second half
            out[p]["data_wait_share"].append(rec["data_wait_share"])
            out[p]["step_time_s"].append(rec["step_time"])
    return {**out, "runs": runs, "steps": steps, "config": "tiny", "crops_per_batch": 16}


def plot(result: dict, png: Path) -> None:
    fig, ax = pyplot().subplots(figsize=(7.5, 3.6))
    paths = {"cpu": "--augment-on cpu", "device": "--augment-on device", "floor": "floor: read + collate, no draw"}
    runs = (result["batch"], result["batch_aug"])
    grouped_bars(ax, ["speed", "speed + noise/reverb"],
                 {label: [spread(r["cpu_ms_per_batch"][p]["per_round"]) for r in runs] for p, label in paths.items()})
    ax.set_ylabel("CPU ms per batch (median round, range)")
    ax.set_title("one CAM++ default batch (64 crops of 3 s)", fontsize=9)
    save(fig, png, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True, type=Path, help="16 kHz PCM shards (--preset campplus)")
    output_args(p)
    a = p.parse_args()
    torch.set_num_threads(1)
    machine = host(a.machine, torch_threads="1")  # the load average at the start
    with tempfile.TemporaryDirectory() as tmp:
        aug = folders(Path(tmp))
        batch = measure_batches(a.shards, None)
        batch_aug = measure_batches(a.shards, aug)
    datawait = measure_datawait(a.shards)
    result = {"command": " ".join(["python", "benchmarks/bench_speaker_batch.py", *sys.argv[1:]]), "machine": machine,
              "batch": batch, "batch_aug": batch_aug, "datawait": datawait}
    write_results(result, a.json, lambda png: plot(result, png), a.plot)


if __name__ == "__main__":
    main()
