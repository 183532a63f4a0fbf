"""The GPU proof, round 2: full-size F5-TTS batches mid-epoch, the CPU cores each loader needs, bucketed features.

    make gpu-bundle                                                        # here, once (the same bundle)
    python3 benchmarks/gpu_proof2.py --bundle .gpu-bundle --out $OUT       # there (docs/gpu-proof.md, round 2)
    python benchmarks/gpu_proof2.py --bundle B --out R --device cpu --quick     # the same code paths on a CPU

A separate script on gpu_proof.py's machinery (its child processes, caps, process groups, wheels, report): round 2
runs only its own parts, inside ~7 minutes of device time, and its results land in their own files
(gpu_proof2.json, gpu_proof2.log), so that the first round's command and figures stay as they are.

Parts, in order of value; each in its own process under its own cap:
  full_batches  F5-TTS `default` at its own budget (38,400 mel frames, 64 items) on a corpus grown on the machine:
                the bundle's re-sliced speech (LibriTTS-like lengths, gpu_bundle.py) listed as N corpora (links
                to one folder), so one epoch plans N x its items as distinct items and packs full batches. 10
                warm-up steps, 200 timed ones in the middle of the epoch, then the steps across the epoch's end,
                each step's time and data wait read from core's clock
  cores         F5-TTS `default`, the same batches in the same order (seen once before, so no feed pays for a new
                shape), the process pinned with os.sched_setaffinity to 1, 2, 4 and 8 cores: audiopipe (prefetch
                2, no workers) against F5's own rule (decode + resample + mel per item, workers = cores), against
                the same batches already on the device. Headline: the fewest cores at which each keeps the step
                within 3 % of the on-device step
  speaker_cores ERes2Net `default` the same way, on the bundle's speaker shards grown the same way: audiopipe
                (prefetch 2, no workers; speed perturbation and fbank of the crops in the step, on the device)
                against 3D-Speaker's rule (SpeakerlabRule: decode the whole file, speed-perturb it, crop 3 s,
                Kaldi fbank per item on the CPU, workers = cores), each against its own batches already on the
                device, same rows, same speeds, 1, 2, 4 and 8 cores; the same headline
  calibrate     calibrate_batches.py for F5-TTS, then whether the budget holds: every bucket's largest shapes
                trained in turn 3 times (no out-of-memory error, peak reserved memory <= 92 % of the device),
                and F5's frames/s with it against one global budget's (>= 1x)
  speakers      ERes2Net and CAM++ `default` as the trainers run (their own main(), prefetch 2) on the bundle's
                speaker shards grown the same way, crops finished on the device (the default) and on the CPU
                (--augment-on cpu): 5 warm-up + 30 timed steps each, data wait from their log
  shapes        (a second call: --parts shapes) F5-TTS `default` on the grown corpus, step by step with each batch's
                shape: eager as today, eager with --shapes 8, compiled with --shapes 8: the step at a shape met
                for the first time against one met before; GPT-SoVITS s1 `default` with --shapes 8, eager against
                --compile, through its own main()
  features      bench_gpu_features.py with --equal: clips in batches of equal length (each group of B
                length-sorted clips cut to its shortest), mel, fbank and codec in fp32, batched against one at a
                time on the same cut clips
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import gpu_proof as g1  # the machinery of the first round (benchmarks/, this script's folder); it puts the
# repository and trainers/ on sys.path

PARTS = ("full_batches", "cores", "speaker_cores", "features", "calibrate", "speakers", "shapes")
# Seconds per part, as in gpu_proof.CAPS: (cap, floor) on one H200 (F5 default at 38,400 frames: ~0.4 s a step, the
# calibrate part of round 1), then (cap, floor) with --quick. The default budget (420 s) with the machine's start-up and
# the device read (~50 s): under 8 minutes of device time.
# shapes compiles F5-TTS and GPT-SoVITS: it does not fit the 8 minutes with the rest, so the default call skips it
# (its floor is more than the budget leaves) and a second call runs it: --parts shapes --budget-s 300.
CAPS = {"full_batches": (115, 60, 150, 10), "cores": (95, 50, 200, 10), "speaker_cores": (60, 25, 200, 10),
        "features": (40, 15, 150, 8), "calibrate": (80, 30, 200, 8), "speakers": (35, 20, 150, 8),
        "shapes": (290, 200, 250, 8)}
SHAPES = 8  # shapes: --shapes K, the batch shapes a run meets at most
SHAPE_STEPS = {"full": 60, "quick": 4}  # shapes: F5 steps per run (the first ones meet each shape first)
GPT_STEPS = {"full": (20, 60), "quick": (1, 2)}  # shapes: GPT-SoVITS warm-up (one log window), timed
SPEAKER_STEPS = {"full": (5, 30), "quick": (1, 2)}  # speakers: warm-up (one log window), timed
SPEAKER_PATHS = ("device", "cpu")  # speakers: --augment-on, where the crops are finished
# --quick: 4 crops of 1 s a batch (ERes2Net is slow on a CPU; calibrate_batches' quick crops are 1 s too)
QUICK_SPEAKER_FLAGS = ["--batch-frames", str(4 * 16000), "--crop-seconds", "1"]
SPEAKER_COPIES = 20  # speakers: the bundle's five voices listed as 20 corpora: tens of batches an epoch
HOLD_ROUNDS = {"full": 3, "quick": 1}  # calibrate: rounds over every bucket's largest shapes (8 on F5)
HOLD_S = 30.0  # calibrate: the seconds kept for them (24 steps of ~1 s at ~100,000 frames on an H200)
PEAK_SHARE = 0.92  # calibrate: the peak (reserved) memory the budget may reach, of the device's total
STEPS = {"full": (10, 200), "quick": (1, 2)}  # full_batches: warm-up, timed mid-epoch
BOUNDARY = {"full": 5, "quick": 1}  # steps timed on each side of the epoch's end
CORES = (1, 2, 4, 8)
# --quick: one count runs every code path of the sweep (pinning, both feeds, the ratio, the headline); a second
# one on a shared 2-core test machine only adds oversubscribed steps
QUICK_CORES = (1,)
CORE_STEPS = {"full": (3, 12), "quick": (1, 2)}  # cores, speaker_cores: per feed, warm-up then timed, same batches
WITHIN = 0.03  # the headline: a loader keeps up when its step is within 3 % of the on-device step
OUT_FILES = ("gpu_proof2.json", "gpu_proof2.log")


# ----------------------------------------------------------------------------- the grown corpus


def grown(a: argparse.Namespace, folder: Path, copies: int) -> list[Path]:
    """`folder` and copies - 1 links to it, each a corpus of its own name: one epoch plans every copy's items as
    distinct items (one plan over the union), so batches pack full. A weight of k on one folder would not: the
    sampler packs each copy of a repeated item as its own round (sampler/corpus_weights.py, copy_rounds), and a
    round of a small corpus fills one or two batches, the last one part-full."""
    links = a.work / "grown"
    links.mkdir(parents=True, exist_ok=True)
    out = [folder]
    for i in range(1, copies):
        link = links / f"{folder.name}_{i:03d}"
        if not link.is_symlink():
            link.symlink_to(folder, target_is_directory=True)
        out.append(link)
    return out


def f5_setup(a: argparse.Namespace, copies: int) -> dict[str, Any]:
    """gpu_proof's F5 set-up (model, optimizer, precision, run config) over `copies` corpora of the F5 shards."""
    return regrow(a, g1._f5_setup(a), copies)


def regrow(a: argparse.Namespace, s: dict[str, Any], copies: int) -> dict[str, Any]:
    """The same set-up reading `copies` corpora (the model is kept)."""
    from dataclasses import replace

    s["cfg"] = replace(s["cfg"], shards=",".join(map(str, grown(a, s["shards"], copies))), weights=None)
    s["copies"] = copies
    return s


def copies_for(a: argparse.Namespace, batches: int) -> int:
    """How many copies make one epoch at least `batches` batches at F5's budget (estimated from the frames)."""
    import numpy as np

    import train_f5tts as f5
    from audiopipe.reader.arrow_dataset import ShardDataset

    lengths = ShardDataset(str(a.bundle / "shards" / "f5tts"), ["mel"]).lengths("mel").astype(np.int64)
    budget = 2000 if a.quick else f5.RUN_DEFAULTS["batch_frames"]
    per_copy = max(lengths.sum() / budget, len(lengths) / f5.RUN_DEFAULTS["max_items"])
    return max(2, int(np.ceil(1.02 * batches / per_copy)))  # packing's part-full batches: part_full_batches adds


def per_step(clock) -> list[tuple[float, float]]:
    """(step ms, wait ms) of every step the clock marked (one synchronisation, at the end of a call)."""
    if clock.steps:
        clock.steps[-1][1].synchronize()
    return [(a.elapsed_time(b), w0.elapsed_time(w1)) for (a, b), (w0, w1) in zip(clock.steps, clock.waits)]


def clocked(dev, feed, n: int, step: Callable[[dict[str, Any]], Any],
            describe: Callable[[dict[str, Any], Any], dict[str, Any]]
            ) -> tuple[list[tuple[float, float]], list[dict[str, Any]], Any]:
    """n training steps fed by `feed` through core's clock: each step's (ms, wait ms), `describe(batch, where)` of
    each batch (no batch is kept: they stay on the device), the last loss. `feed` yields batches or (batch, where)."""
    import core

    clock = core._Clock(dev)
    it = iter(feed)
    info = []
    clock.start_pass()
    for _ in range(n):
        clock.wait_begin()
        item = next(it)
        batch, where = (item if isinstance(item, tuple) else (item, None))
        batch = core.default_to_device(batch, dev)
        clock.wait_end()
        loss = step(batch)
        clock.step_end()
        info.append(describe(batch, where))
    return per_step(clock), info, loss


def train_steps(s: dict[str, Any], feed, n: int) -> tuple[list[tuple[float, float]], list[dict[str, Any]]]:
    """n F5 training steps fed by `feed` through core's clock: each step's (ms, wait ms) and its batch's size."""
    import torch

    def describe(b: dict[str, Any], where: Any) -> dict[str, Any]:
        return {"where": where, "shape": tuple(b["mel"].shape), "items": int(b["mel"].shape[0]),
                "frames": int(b["mel_lengths"].sum()), "padded": int(b["mel"].shape[0] * b["mel"].shape[-1])}

    steps, info, loss = clocked(s["dev"], feed, n, lambda b: g1.f5_step(s["model"], s["opt"], s["autocast"], b),
                                describe)
    g1.ensure(bool(torch.isfinite(loss)), "the loss is not finite")
    return steps, info


def summary(steps: list[tuple[float, float]], info: list[dict[str, Any]]) -> dict[str, Any]:
    step_ms = sum(x for x, _ in steps)
    return {"steps": len(steps), "step_ms": step_ms / len(steps), "data_wait_share": sum(w for _, w in steps) / step_ms,
            "max_wait_ms": max(w for _, w in steps), "frames_per_s": 1e3 * sum(i["frames"] for i in info) / step_ms,
            "mean_frames": sum(i["frames"] for i in info) / len(info),
            "mean_items": sum(i["items"] for i in info) / len(info),
            "padding_share": 1 - sum(i["frames"] for i in info) / sum(i["padded"] for i in info)}


def with_epochs(loader):
    """(batch, (epoch, index in epoch)) over epochs, as core.train walks them (set_epoch, then a pass)."""
    e = 0
    while True:
        loader.set_epoch(e)
        for i, b in enumerate(loader):
            yield b, (e, i)
        e += 1


# ----------------------------------------------------------------------------- part: full_batches


def part_full_batches(a: argparse.Namespace) -> dict[str, Any]:
    warm, timed = STEPS["quick" if a.quick else "full"]
    edge = BOUNDARY["quick" if a.quick else "full"]
    copies = copies_for(a, warm + timed + 2 * edge)
    s = f5_setup(a, copies)
    loader = g1._f5_loader(s, 2, s["dev"])
    while len(loader) < warm + timed + 2 * edge:  # packing filled fewer batches than the frames promised
        copies += max(1, copies // 20)
        loader = g1._f5_loader(regrow(a, s, copies), 2, s["dev"])
    per_epoch = len(loader)
    res: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"],
                           "batch_frames": s["cfg"].batch_frames, "max_items": s["cfg"].max_items,
                           "copies": copies, "batches_per_epoch": per_epoch, "prefetch": 2}
    feed = with_epochs(loader)
    t0 = time.perf_counter()
    steps, info = train_steps(s, feed, warm + timed)
    res["mid_epoch"] = {"first_step": warm, **summary(steps[warm:], info[warm:])}
    g1.save_partial(a, res)  # a run stopped at its cap keeps the mid-epoch figures
    more, more_info = train_steps(s, feed, per_epoch + edge - warm - timed)
    steps, info = steps + more, info + more_info
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    around = slice(per_epoch - edge, per_epoch + edge)
    res["boundary"] = {"steps_each_side": edge, **summary(steps[around], info[around]),
                       "per_step": [{"epoch_index": list(i["where"]), "step_ms": round(x, 2), "wait_ms": round(w, 3)}
                                    for (x, w), i in zip(steps[around], info[around])],
                       "first_of_next_epoch_wait_ms": steps[per_epoch][1]}
    rest = steps[warm + timed:per_epoch - edge]
    if rest:
        res["rest_of_epoch"] = summary(rest, info[warm + timed:per_epoch - edge])
    return res


# ----------------------------------------------------------------------------- part: cores


def pin(cores: int, allowed: list[int]) -> list[int]:
    """This process's threads (and what they start from now on) on the first `cores` of `allowed` (the CPUs it
    was given: read once, before any pinning, since the affinity read later is the pinned one)."""
    import torch

    chosen = allowed[:cores]
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), chosen)
        except OSError:  # a thread that ended meanwhile
            pass
    torch.set_num_threads(cores)
    return chosen


def part_cores(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    import core
    import train_f5tts as f5
    from audiopipe.collate.pad import PadCollator
    from audiopipe.reader.loader import _Collate

    warm, timed = CORE_STEPS["quick" if a.quick else "full"]
    k = warm + timed
    s = f5_setup(a, copies_for(a, k + 2))
    dev, cpu = s["dev"], torch.device("cpu")
    allowed = sorted(os.sched_getaffinity(0))
    available = len(allowed)
    counts = [c for c in (QUICK_CORES if a.quick else CORES) if c <= available]
    res: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"],
                           "batch_frames": s["cfg"].batch_frames, "cores_available": available,
                           "warmup_steps": warm, "timed_steps": timed, "within": WITHIN, "by_cores": {}}
    # The K batches every feed trains on: the loader's first K of epoch 0, with the rows they hold.
    src = g1._f5_loader(s, 0, cpu)
    src.set_epoch(0)
    on_device, rows = [], []
    for b, _ in zip(src, range(k)):
        on_device.append(core.default_to_device({x: v.clone() if torch.is_tensor(v) else v for x, v in b.items()},
                                                dev))
        rows.append([int(i) for i in b["index"]])
    g1._warm_up(s, on_device)  # every shape seen once: no feed below pays for a first-seen shape
    steps, info = train_steps(s, iter(on_device), k)
    res["on_device"] = summary(steps[warm:], info[warm:])
    frames = [i["frames"] for i in info]
    g1.save_partial(a, res)
    # F5's own rule over the same rows: the shards' items map to the files they were made from.
    from audiopipe.bench.loaders import OnTheFlyMel  # soundfile + soxr: from the bundle's wheels on the GPU image

    ds = OnTheFlyMel(str(s["shards"]), "mel", str(a.bundle / "wavs" / "en"))
    plan = [[i % len(ds) for i in r] for r in rows]  # copy c's item i is global index c * len + i (one folder)
    for c in counts:
        chosen = pin(c, allowed)
        row: dict[str, Any] = {"cpus": chosen}
        loader = g1._f5_loader(s, 2, dev)
        loader.set_epoch(0)
        steps, info = train_steps(s, iter(loader), k)
        g1.ensure([i["frames"] for i in info] == frames, "audiopipe's batches differ from the on-device ones")
        row["audiopipe"] = summary(steps[warm:], info[warm:])
        del loader
        dl = torch.utils.data.DataLoader(ds, batch_sampler=plan, num_workers=c, pin_memory=dev.type == "cuda",
                                         collate_fn=_Collate(PadCollator(["mel"]), f5.AddTextIds(s["tok"])))
        steps, info = train_steps(s, iter(dl), k)
        g1.ensure([i["frames"] for i in info] == frames, "F5's rule's batches differ from the on-device ones")
        row["f5_own_rule"] = summary(steps[warm:], info[warm:])
        del dl
        for feed in ("audiopipe", "f5_own_rule"):
            row[feed]["vs_on_device"] = row[feed]["step_ms"] / res["on_device"]["step_ms"]
        res["by_cores"][str(c)] = row
        g1.save_partial(a, res)
        print(f"[cores] {c}: audiopipe {row['audiopipe']['step_ms']:.1f} ms, F5's rule "
              f"{row['f5_own_rule']['step_ms']:.1f} ms, on the device {res['on_device']['step_ms']:.1f} ms", flush=True)
    pin(available, allowed)
    res["fewest_cores_within"] = {
        feed: next((int(c) for c, r in res["by_cores"].items() if r[feed]["vs_on_device"] <= 1 + WITHIN), None)
        for feed in ("audiopipe", "f5_own_rule")}
    return res


# ----------------------------------------------------------------------------- part: speaker_cores


def kaldi_fbank_cpu() -> tuple[str, Callable[[Any], Any]]:
    """3D-Speaker's FBank(80, mean_nor=True) for one crop on the CPU: (which code, wav [N] -> [T, 80]).
    torchaudio.compliance.kaldi.fbank where it imports (speakerlab's own call), else audiopipe's kaldi_fbank_torch
    (the same Kaldi fbank; tests/test_features_fbank.py holds it to kaldi-native-fbank)."""
    try:
        import torchaudio.compliance.kaldi as kaldi

        def fbank(wav):  # noqa: ANN001, ANN202 - torch tensors
            feat = kaldi.fbank(wav[None], num_mel_bins=80, sample_frequency=16000, dither=0.0)
            return feat - feat.mean(0, keepdim=True)

        return "torchaudio.compliance.kaldi.fbank", fbank
    except ImportError:
        from audiopipe.features.fbank import kaldi_fbank_torch

        def fbank(wav):  # noqa: ANN001, ANN202
            feat = kaldi_fbank_torch(wav[None], sample_rate=16000, num_mel_bins=80)[0]
            return feat - feat.mean(0, keepdim=True)

        return "audiopipe.features.fbank.kaldi_fbank_torch", fbank


class SpeakerlabRule:
    """3D-Speaker's training item, as speakerlab's WavSVDataset.__getitem__ builds it with WavReader(duration 3,
    speed_pertub=True), SpkLabelEncoder and FBank(80, mean_nor=True), one item at a time in DataLoader workers:
    read the whole file; speed-perturb the whole waveform (speed 1.0, 0.9 or 1.1: sox's `speed` then `rate 16000`);
    a random 3 s crop of it (a shorter one zero-padded); Kaldi fbank 80 (dither 0) minus its mean over time, on the
    CPU; the class speaker + speakers * speed index.

    Written plainly, step for step, because speakerlab's WavReader cannot run on the GPU image: it calls
    torchaudio.load (torchcodec in torchaudio >= 2.9, absent there) and torchaudio.sox_effects (removed in 2.9;
    the image has 2.11, as has the upstream venv here). The same steps: soundfile reads the whole file (what
    torchaudio.load returns), soxr, SoX's own resampler, does sox's speed + rate, and the fbank is speakerlab's call
    where torchaudio imports (kaldi_fbank_cpu). The draws (speed index, then crop start) come from
    np.random.default_rng([seed, 0, index]) in SpeakerCrops' order: each item gets audiopipe's speed for it, so both
    feeds train on the same classes. Items are the global indices of the grown corpus (copy c's item i is
    c * len(files) + i, as the links list one folder). Each item also says how many samples it decoded and
    speed-perturbed: the work the rule does for one 3 s crop."""

    def __init__(self, files: list[str], speaker: Any, num_speakers: int, *, seed: int = 0, crop: int = 48000,
                 speeds: tuple[float, ...] = (1.0, 0.9, 1.1)):
        self.files, self.speaker, self.num_speakers = list(files), speaker, int(num_speakers)
        self.seed, self.crop, self.speeds = int(seed), int(crop), tuple(speeds)
        self.fbank_code, self.fbank = kaldi_fbank_cpu()

    def __len__(self) -> int:
        return len(self.speaker)

    def __getitem__(self, g: int) -> dict[str, Any]:
        import numpy as np
        import soundfile as sf
        import soxr
        import torch

        wav, sr = sf.read(self.files[g % len(self.files)], dtype="float32", always_2d=True)
        wav = wav[:, 0]  # the first channel, as speakerlab's wav[0]
        decoded = len(wav)
        rng = np.random.default_rng([self.seed, 0, g])
        k = int(rng.integers(len(self.speeds)))
        if self.speeds[k] != 1.0:  # the whole file, as sox's effects chain runs over the whole tensor
            wav = soxr.resample(wav, self.speeds[k] * sr, sr)
        perturbed = len(wav)
        if len(wav) >= self.crop:
            start = int(rng.integers(0, len(wav) - self.crop + 1))
            wav = wav[start:start + self.crop]
        else:
            wav = np.pad(wav, (0, self.crop - len(wav)))
        label = int(self.speaker[g]) + self.num_speakers * k
        return {"fbank": self.fbank(torch.from_numpy(np.ascontiguousarray(wav))), "label": label, "index": g,
                "decoded": decoded, "perturbed": perturbed}


def speakerlab_collate(items: list[dict[str, Any]]) -> dict[str, Any]:
    """DataLoader's default collate of speakerlab's (feat, spkid) pairs: [B, T, 80] and [B]; the counts summed."""
    import torch

    return {"fbank": torch.stack([i["fbank"] for i in items]),
            "label": torch.tensor([i["label"] for i in items], dtype=torch.int64),
            "index": [i["index"] for i in items], "decoded": sum(i["decoded"] for i in items),
            "perturbed": sum(i["perturbed"] for i in items)}


def speaker_setup(a: argparse.Namespace, copies: int) -> dict[str, Any]:
    """ERes2Net as train_eres2net builds it (its flags' defaults, speaker_data's crops and loader arguments, the
    AAM head, SGD), over `copies` corpora of the speaker shards, every speaker training (no EER hold-out)."""
    import torch

    import core
    import speaker
    import train_eres2net as er
    from speaker_data import speaker_data

    dev = torch.device(a.device)
    dirs = grown(a, a.bundle / "shards" / "speakers", copies)
    argv = ["--shards", ",".join(map(str, dirs)), "--config", "tiny" if a.quick else "default",
            "--out", str(a.work / "speaker_cores"), "--seed", "0", "--heldout-speakers", "0",
            *(QUICK_SPEAKER_FLAGS if a.quick else [])]
    cfg, args = core.parse_args("speaker_cores", defaults=speaker.run_defaults(er.RECIPE),
                                extra=lambda p: speaker.add_speaker_args(p, er.RECIPE), argv=argv,
                                flag_help=speaker.FLAG_HELP)
    d = core.Dist(device=dev)
    data = speaker_data(cfg, args, d, "eres2net")
    core.seed_all(0)
    mcfg = er.CONFIGS[cfg.config]
    margin = er.RECIPE.margin
    model = speaker.SpeakerModel(er.ERes2Net(mcfg), mcfg.embedding_size, data.num_classes, lambda step: margin,
                                 scale=args.scale).to(dev)
    precision, autocast = core.autocast_for(cfg.precision, dev)
    return {"dev": dev, "cfg": cfg, "data": data, "model": model, "opt": speaker.sgd(model, cfg),
            "precision": precision, "autocast": autocast, "dirs": dirs, "crop": data.crops.crop_samples}


def speaker_loader(s: dict[str, Any], prefetch: int, device: Any):
    """audiopipe's loader of the speaker crops exactly as core.train builds it for train_eres2net."""
    from dataclasses import replace

    import core

    cfg = replace(s["cfg"], prefetch=prefetch)
    return core._make_loader(cfg, core.Dist(device=device), ["pcm"], None, None, s["data"].loader_kw,
                             Path(cfg.out))


def speaker_steps(s: dict[str, Any], feed, n: int, fn) -> tuple[list[tuple[float, float]], list[dict[str, Any]]]:
    """n ERes2Net steps (3D-Speaker's: SGD, no clipping) fed by `feed`, `fn(model, batch)` the loss."""
    import torch

    def step(batch: dict[str, Any]) -> Any:
        with s["autocast"]:
            loss, _ = fn(s["model"], batch)
        loss.backward()
        s["opt"].step()
        s["opt"].zero_grad(set_to_none=True)
        return loss

    crop = s["crop"]

    def describe(b: dict[str, Any], where: Any) -> dict[str, Any]:
        m = len(b["label"])
        return {"items": m, "frames": m * crop, "padded": m * crop, "rows": [int(i) for i in b["index"]]}

    steps, info, loss = clocked(s["dev"], feed, n, step, describe)
    g1.ensure(bool(torch.isfinite(loss)), "the loss is not finite")
    return steps, info


def speakerlab_loss(model, batch: dict[str, Any]):  # noqa: ANN001, ANN201 - torch objects
    """The step 3D-Speaker's trainer takes on its loader's batch: fbank already made, ERes2Net and the AAM head."""
    emb = model.encoder(batch["fbank"])
    loss, _ = model.head(emb, batch["label"], model.margin(0))
    return loss, {}


def export_wavs(a: argparse.Namespace, folder: Path) -> list[str]:
    """The speaker shards' utterances as 16 kHz 16-bit WAV files (what 3D-Speaker's recipes read), in row order:
    the very samples audiopipe's feed crops. Not timed."""
    import soundfile as sf

    from audiopipe.reader.arrow_dataset import ShardDataset

    ds = ShardDataset(str(folder), ["pcm"])
    out = a.work / "speaker_wavs"
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(len(ds)):
        path = out / f"{i:06d}.wav"
        sf.write(path, ds[i]["pcm"].reshape(-1), 16000, subtype="PCM_16")
        files.append(str(path))
    return files


def part_speaker_cores(a: argparse.Namespace) -> dict[str, Any]:
    """ERes2Net `default` fed two ways on the same batches, the process pinned to 1, 2, 4, 8 cores: audiopipe
    (prefetch 2, no workers; the crops' speed perturbation and fbank in the step, on the device) against
    3D-Speaker's rule (SpeakerlabRule: whole-file decode, speed perturbation, crop and fbank per item on the CPU,
    DataLoader workers = cores). Each against its own batches already on the device."""
    import numpy as np
    import torch

    import core
    import speaker
    from audiopipe.reader.arrow_dataset import ShardDataset

    warm, timed = CORE_STEPS["quick" if a.quick else "full"]
    k = warm + timed
    folder = a.bundle / "shards" / "speakers"
    per_copy = len(ShardDataset(str(folder), ["pcm"]))
    batch = 4 if a.quick else 64
    s = speaker_setup(a, max(2, int(np.ceil((k + 2) * batch / per_copy)) + 1))
    dev, cpu = s["dev"], torch.device("cpu")
    allowed = sorted(os.sched_getaffinity(0))
    counts = [c for c in (QUICK_CORES if a.quick else CORES) if c <= len(allowed)]
    res: dict[str, Any] = {"model": "tiny" if a.quick else "default", "precision": s["precision"],
                           "batch_frames": s["cfg"].batch_frames, "crop_samples": s["crop"], "copies": len(s["dirs"]),
                           "cores_available": len(allowed), "warmup_steps": warm, "timed_steps": timed,
                           "within": WITHIN, "by_cores": {}}
    # The K batches every feed trains on: audiopipe's first K of epoch 0, and the rows they hold.
    src = speaker_loader(s, 0, cpu)
    src.set_epoch(0)
    s["data"].crops.set_epoch(0)
    # (copies: the loader's collate buffers are reused, and on a CPU the move to the device is no copy)
    on_device = [core.default_to_device({x: v.clone() if torch.is_tensor(v) else v for x, v in b.items()}, dev)
                 for b, _ in zip(src, range(k))]
    rows = [[int(i) for i in b["index"]] for b in on_device]
    del src
    # 3D-Speaker's rule over the same rows: the files the shards hold, in row order.
    split = s["data"].split
    rule = SpeakerlabRule(export_wavs(a, folder), split.label_of, len(split.train_speakers), seed=0, crop=s["crop"])
    res["fbank_code"] = rule.fbank_code
    features = [core.default_to_device(speakerlab_collate([rule[g] for g in r]), dev) for r in rows]
    pcm = ShardDataset(str(folder), ["pcm"]).lengths("pcm")
    g1.ensure([b["decoded"] for b in features] == [int(sum(pcm[g % per_copy] for g in r)) for r in rows],
              "3D-Speaker's rule read other files than the rows audiopipe's batches hold")
    for fn, batches in ((speaker.loss_for(s["data"]), on_device), (speakerlab_loss, features)):
        speaker_steps(s, iter(batches), len(batches), fn)  # every kernel and shape seen once before any timing
    ours = speaker.loss_for(s["data"])
    steps, info = speaker_steps(s, iter(on_device), k, ours)
    res["on_device"] = summary(steps[warm:], info[warm:])
    steps, _ = speaker_steps(s, iter(features), k, speakerlab_loss)
    res["on_device_features"] = summary(steps[warm:], info[warm:])
    res["rule_per_item"] = {"decoded_s": sum(b["decoded"] for b in features) / sum(map(len, rows)) / 16000,
                            "perturbed_s": sum(b["perturbed"] for b in features) / sum(map(len, rows)) / 16000,
                            "crop_s": s["crop"] / 16000}
    del on_device, features
    g1.save_partial(a, res)
    refs = {"audiopipe": "on_device", "speakerlab_rule": "on_device_features"}
    for c in counts:
        chosen = pin(c, allowed)
        row: dict[str, Any] = {"cpus": chosen}
        loader = speaker_loader(s, 2, dev)
        loader.set_epoch(0)
        s["data"].crops.set_epoch(0)
        steps, info = speaker_steps(s, iter(loader), k, ours)
        g1.ensure([i["rows"] for i in info] == rows, "audiopipe's batches differ from the on-device ones")
        row["audiopipe"] = summary(steps[warm:], info[warm:])
        del loader
        dl = torch.utils.data.DataLoader(rule, batch_sampler=rows, num_workers=c, pin_memory=dev.type == "cuda",
                                         collate_fn=speakerlab_collate)
        steps, info = speaker_steps(s, iter(dl), k, speakerlab_loss)
        g1.ensure([i["rows"] for i in info] == rows, "3D-Speaker's rule's batches differ from the on-device ones")
        row["speakerlab_rule"] = summary(steps[warm:], info[warm:])
        del dl
        for feed, ref in refs.items():
            row[feed]["vs_on_device"] = row[feed]["step_ms"] / res[ref]["step_ms"]
        res["by_cores"][str(c)] = row
        g1.save_partial(a, res)
        print(f"[speaker_cores] {c}: audiopipe {row['audiopipe']['step_ms']:.1f} ms (on the device "
              f"{res['on_device']['step_ms']:.1f}), 3D-Speaker's rule {row['speakerlab_rule']['step_ms']:.1f} ms "
              f"(on the device {res['on_device_features']['step_ms']:.1f})", flush=True)
    pin(len(allowed), allowed)
    res["fewest_cores_within"] = {
        feed: next((int(c) for c, r in res["by_cores"].items() if r[feed]["vs_on_device"] <= 1 + WITHIN), None)
        for feed in refs}
    return res


# ----------------------------------------------------------------------------- part: features


def part_features(a: argparse.Namespace) -> dict[str, Any]:
    # The bundle's re-sliced speech whole (LibriTTS-like lengths); on a CPU, three half-second pieces.
    return g1.features(a, 1.5 if a.quick else 240.0, 0.5 if a.quick else None, "1,2" if a.quick else "1,16,64",
                       ["--equal"])


# ----------------------------------------------------------------------------- part: calibrate


def part_calibrate(a: argparse.Namespace) -> dict[str, Any]:
    import calibrate_batches as cb

    res = cb.calibrate(model="f5tts", device=a.device, quick=a.quick, out=a.work / "bucket_budget_f5tts.json",
                       compare=True, deadline=a.deadline - 2, hold_rounds=HOLD_ROUNDS["quick" if a.quick else "full"],
                       hold_s=0.0 if a.quick else HOLD_S)
    h, c = res.get("hold", {}), res.get("compare", {})
    res["holds"] = {"no_out_of_memory": bool(h.get("complete")), "peak_reserved_share": h.get("peak_reserved_share"),
                    "peak_within": h.get("peak_reserved_share") is not None and h["peak_reserved_share"] <= PEAK_SHARE,
                    "frames_per_s_gain": c.get("gain"), "not_slower": bool(c.get("gain")) and c["gain"] >= 1.0,
                    "margin": res["margin"], "limit": PEAK_SHARE}
    return res


# ----------------------------------------------------------------------------- part: speakers


def part_speakers(a: argparse.Namespace) -> dict[str, Any]:
    """The speaker trainers' data wait as they train: crops finished on the device (their default) and on the CPU
    (--augment-on cpu: speed perturbation through soxr per crop in the loader)."""
    import importlib

    warm, timed = SPEAKER_STEPS["quick" if a.quick else "full"]
    dirs = grown(a, a.bundle / "shards" / "speakers", 2 if a.quick else SPEAKER_COPIES)
    res: dict[str, Any] = {"warmup_steps": warm, "timed_steps": timed, "copies": len(dirs)}
    # On a CPU rehearsal CAM++ runs its default path only: both trainers share the data path.
    runs = [(n, p) for n in ("eres2net", "campplus") for p in SPEAKER_PATHS if not (a.quick and n == "campplus"
                                                                                    and p != "device")]
    for name, path in runs:
        out = a.work / f"speakers-{name}-{path}"
        argv = ["--shards", ",".join(map(str, dirs)), "--config", "tiny" if a.quick else "default", "--out", str(out),
                "--max-steps", str(warm + timed), "--log-every", str(warm), "--ckpt-every", str(10 ** 9),
                "--prefetch", "2", "--seed", "0", "--augment-on", path,
                *(QUICK_SPEAKER_FLAGS if a.quick else [])]
        t0 = time.perf_counter()
        importlib.import_module(f"train_{name}").main(argv)
        res.setdefault(name, {})[path] = {"argv": argv, "wall_s": round(time.perf_counter() - t0, 1),
                                          **g1._window_stats(g1.read_log(out), warm)}
        shutil.rmtree(out, ignore_errors=True)
        g1.save_partial(a, res)
        got = res[name][path].get("timed_steps")
        g1.ensure(got == timed, f"{name} (augment on {path}): {got} timed steps, expected {timed}")
    return res


# ----------------------------------------------------------------------------- part: shapes


def first_seen(steps: list[tuple[float, float]], info: list[dict[str, Any]]) -> dict[str, Any]:
    """Step time at a batch shape met for the first time in the run against one met before (step 0 left out:
    the first step of a process pays for more than its shape)."""
    seen, new, old = set(), [], []
    for i, ((ms, _), b) in enumerate(zip(steps, info)):
        if i:
            (old if b["shape"] in seen else new).append(ms)
        seen.add(b["shape"])
    mean = (lambda x: sum(x) / len(x) if x else None)
    return {"shapes_met": len(seen), "first_seen_steps": len(new), "first_seen_ms": mean(new),
            "repeated_steps": len(old), "repeated_ms": mean(old),
            "first_seen_vs_repeated": mean(new) / mean(old) if new and old else None}


def part_shapes(a: argparse.Namespace) -> dict[str, Any]:
    """Few batch shapes and torch.compile on the device (the trainers' --shapes and --compile)."""
    import importlib
    from dataclasses import replace

    import torch

    import core

    n = SHAPE_STEPS["quick" if a.quick else "full"]
    res: dict[str, Any] = {"shapes": SHAPES, "steps": n, "f5tts": {}}
    if "f5tts" not in a.shape_trainers.split(","):
        res.pop("f5tts")
    for key, shapes, compile_ in (("eager", 0, False), ("eager_shapes", SHAPES, False),
                                  ("compiled_shapes", SHAPES, True)) if "f5tts" in res else ():
        s = f5_setup(a, copies_for(a, n + 2))
        cfg = replace(s["cfg"], shapes=shapes, compile=compile_)
        s["cfg"] = cfg
        if compile_:  # what --compile runs; on a CPU rehearsal, dynamo and autograd without inductor's codegen
            s["model"] = core.compiled(s["model"], cfg) if not a.quick else torch.compile(s["model"],
                                                                                            backend="aot_eager")
        loader = g1._f5_loader(s, 2, s["dev"])
        t0 = time.perf_counter()
        steps, info = train_steps(s, with_epochs(loader), n)
        res["f5tts"][key] = {**summary(steps[1:], info[1:]), **first_seen(steps, info),
                             "wall_s": round(time.perf_counter() - t0, 1)}
        g1.save_partial(a, res)
        del s, loader
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if "f5tts" in res:
        f5 = res["f5tts"]
        f5["compiled_vs_eager_shapes"] = f5["compiled_shapes"]["step_ms"] / f5["eager_shapes"]["step_ms"]
    warm, timed = GPT_STEPS["quick" if a.quick else "full"]
    res["gpt_sovits"] = {}
    for key, extra in (("eager_shapes", []), ("compiled_shapes", ["--compile"])):
        if "gpt_sovits" not in a.shape_trainers.split(","):
            break
        if a.quick and extra:  # inductor on a CPU takes minutes; the trainers' own tests cover --compile there
            continue
        out = a.work / f"shapes-gpt-{key}"
        argv = ["--shards", str(a.bundle / "tokens" / "gpt_sovits"), "--config", "tiny" if a.quick else "default",
                "--out", str(out), "--max-steps", str(warm + timed), "--log-every", str(warm),
                "--ckpt-every", str(10 ** 9), "--prefetch", "2", "--seed", "0", "--shapes", str(SHAPES), *extra,
                *(["--batch-frames", "1500"] if a.quick else [])]
        t0 = time.perf_counter()
        importlib.import_module("train_gpt_sovits").main(argv)
        res["gpt_sovits"][key] = {"argv": argv, "wall_s": round(time.perf_counter() - t0, 1),
                                  **g1._window_stats(g1.read_log(out), warm)}
        shutil.rmtree(out, ignore_errors=True)
        g1.save_partial(a, res)
    gs = res["gpt_sovits"]
    if "compiled_shapes" in gs:
        gs["compiled_vs_eager"] = gs["compiled_shapes"]["step_ms"] / gs["eager_shapes"]["step_ms"]
    return res


CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "full_batches": part_full_batches, "cores": part_cores, "speaker_cores": part_speaker_cores,
    "features": part_features,
    "calibrate": part_calibrate, "speakers": part_speakers, "shapes": part_shapes,
    "info": lambda a: g1.device_info(a.device)}


# ----------------------------------------------------------------------------- headline figures


def headline(part: str, res: dict[str, Any]) -> list[str]:
    lines = []
    try:
        if part == "full_batches" and "mid_epoch" in res:
            m, b = res["mid_epoch"], res["boundary"]
            lines.append(f"  mid-epoch ({m['steps']} steps from step {m['first_step']}): {m['step_ms']:.1f} ms/step, "
                         f"data wait {100 * m['data_wait_share']:.3f} %, {m['mean_frames']:.0f} frames/batch "
                         f"({m['mean_items']:.1f} items), {m['frames_per_s']:.0f} frames/s")
            lines.append(f"  epoch boundary ({b['steps']} steps): data wait {100 * b['data_wait_share']:.3f} %, first "
                         f"step of the next epoch waited {b['first_of_next_epoch_wait_ms']:.2f} ms")
        elif part == "cores" and "on_device" in res:
            lines.append(f"  on the device: {res['on_device']['step_ms']:.1f} ms/step")
            for c, r in res["by_cores"].items():
                lines.append(f"  {c} cores: audiopipe {r['audiopipe']['step_ms']:.1f} ms "
                             f"(wait {100 * r['audiopipe']['data_wait_share']:.2f} %), F5's rule "
                             f"{r['f5_own_rule']['step_ms']:.1f} ms (wait {100 * r['f5_own_rule']['data_wait_share']:.2f} %)")
            if "fewest_cores_within" in res:
                lines.append(f"  fewest cores within {100 * WITHIN:.0f} %: {res['fewest_cores_within']}")
        elif part == "speaker_cores" and "on_device" in res:
            lines.append(f"  on the device: {res['on_device']['step_ms']:.1f} ms/step with audiopipe's crops (speed "
                         f"and fbank in the step), {res['on_device_features']['step_ms']:.1f} ms on ready fbank")
            r = res["rule_per_item"]
            lines.append(f"  3D-Speaker's rule per item: {r['decoded_s']:.2f} s decoded, {r['perturbed_s']:.2f} s "
                         f"speed-perturbed for a {r['crop_s']:.0f} s crop")
            for c, r in res["by_cores"].items():
                lines.append(f"  {c} cores: audiopipe {r['audiopipe']['step_ms']:.1f} ms "
                             f"(wait {100 * r['audiopipe']['data_wait_share']:.2f} %), 3D-Speaker's rule "
                             f"{r['speakerlab_rule']['step_ms']:.1f} ms "
                             f"(wait {100 * r['speakerlab_rule']['data_wait_share']:.2f} %)")
            if "fewest_cores_within" in res:
                lines.append(f"  fewest cores within {100 * WITHIN:.0f} % of its on-device step: "
                             f"{res['fewest_cores_within']}")
        elif part == "calibrate" and "holds" in res:
            h = res["holds"]
            lines.append(f"  margin {h['margin']}: every bucket's largest shapes ran without OOM: {h['no_out_of_memory']}; "
                         f"peak reserved {h['peak_reserved_share']} of the device (limit {h['limit']}); frames/s "
                         f"{h['frames_per_s_gain']:.2f}x the global budget's")
        elif part == "speakers":
            for name in ("eres2net", "campplus"):
                for path, r in res.get(name, {}).items():
                    if r.get("timed_steps"):
                        lines.append(f"  {name}, crops finished on the {path}: {r['step_ms']:.1f} ms/step, data wait "
                                     f"{100 * r['data_wait_share']:.3f} %, {r['epochs']} epochs")
        elif part == "shapes" and "f5tts" in res:
            for key, r in res["f5tts"].items():
                if isinstance(r, dict):
                    lines.append(f"  F5-TTS {key}: {r['step_ms']:.1f} ms/step, {r['shapes_met']} shapes, first-seen "
                                 f"step {r['first_seen_vs_repeated'] or float('nan'):.2f}x a repeated one")
            for key, r in res.get("gpt_sovits", {}).items():
                if isinstance(r, dict) and r.get("timed_steps"):
                    lines.append(f"  GPT-SoVITS {key}: {r['step_ms']:.1f} ms/step")
        elif part == "features" and "summary" in res:
            lines += [f"  {k}: {v['x_rt']} x real time" for k, v in res["summary"].items()]
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        lines.append(f"  (figures incomplete: {e!r})")
    return lines


class Report(g1.Report):
    def flush(self) -> None:
        (self.out / OUT_FILES[0]).write_text(json.dumps(self.doc, indent=1, default=str))
        (self.out / OUT_FILES[1]).write_text("\n".join(self.lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g1.common_args(ap, PARTS, "gpu_proof2.json, gpu_proof2.log", "420; 900")
    ap.add_argument("--shape-trainers", default="f5tts,gpt_sovits",
                    help="the trainers the shapes part runs (default f5tts,gpt_sovits)")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--trainers", default="", help=argparse.SUPPRESS)  # gpu_proof's child protocol carries these
    ap.add_argument("--trainer", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.out is None:
        ap.error("--out is required: the folder for gpu_proof2.json and gpu_proof2.log")
    order = g1.prepare(ap, a, PARTS, "gpu_proof2_work")
    if a.child:
        g1.CHILDREN.update(CHILDREN)  # gpu_proof's child runner, with this round's parts
        return g1.child_main(a)
    started = time.time()
    budget = a.budget_s if a.budget_s is not None else (900.0 if a.quick else 420.0)

    def run_child(a: argparse.Namespace, part: str, cap: float) -> dict[str, Any]:
        return g1.run_child(a, part, cap, script=Path(__file__).resolve(),
                            flags=["--shape-trainers", a.shape_trainers])

    wheels, info = g1.start(a, script=Path(__file__).resolve())
    doc: dict[str, Any] = {"format": "audiopipe.gpu_proof2/1", "quick": a.quick, "device": info,
                           "bundle": json.loads((a.bundle / "bundle.json").read_text()), "wheels": wheels,
                           "without": a.without, "budget_s": budget, "command": " ".join(sys.argv),
                           "loadavg": os.getloadavg(), "parts": {}}
    report = Report(a.out, doc)
    dv = doc["device"]
    report.say(f"gpu_proof2: {dv.get('name')} ({a.device}), torch {dv.get('torch')}, CUDA {dv.get('cuda')}, "
               f"commit {dv.get('commit')}" + (f"; device not read: {dv['error']}" if dv.get("error") else ""))
    statuses = g1.run_parts(a, report, order, CAPS, budget, started, headline, run_child, "gpu_proof2")
    return 0 if all(s == "ok" for s in statuses.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
