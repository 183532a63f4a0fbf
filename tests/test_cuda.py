"""What only a GPU can show: mixed precision through trainers/core.py, the pinned side-stream prefetch, core's
CUDA-event clock, mel/fbank against torchaudio and batched EnCodec on the device.

    pytest -m cuda tests/test_cuda.py                               # on a GPU machine (benchmarks/gpu_proof.py)
    AUDIOPIPE_CUDA_TESTS_ON=cpu pytest -m cuda tests/test_cuda.py   # the same tests on the CPU

Without a CUDA device (and without AUDIOPIPE_CUDA_TESTS_ON=cpu) every test here is skipped with that reason.
Speech: the WAV files under $AUDIOPIPE_SPEECH_DIR (benchmarks/gpu_proof.py points it at its bundle), else the
Asterisk prompts where that Debian package is installed.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import wave
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.cuda

ON = os.environ.get("AUDIOPIPE_CUDA_TESTS_ON", "cuda")
ASTERISK = Path("/usr/share/asterisk/sounds/en_US_f_Allison")
# Bands this far above the log floor are compared: below it the float32 rounding of two implementations' filters
# and FFTs alone moves a band by more (torchaudio builds its filterbanks in float32: weights differ by ~7e-6).
STRONG = math.log(1e3)


@pytest.fixture(scope="module")
def device() -> torch.device:
    if ON.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA device here: these run on a GPU (benchmarks/gpu_proof.py); "
                    "AUDIOPIPE_CUDA_TESTS_ON=cpu runs the same tests on the CPU")
    return torch.device(ON)


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit PCM")
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, w.getnchannels())
        return x.mean(axis=1).astype(np.float32) / 32768.0, w.getframerate()


@pytest.fixture(scope="module")
def speech() -> list[tuple[np.ndarray, int]]:
    """Eight real utterances (float32, their own rates), sorted by name, of distinct lengths."""
    root = Path(os.environ.get("AUDIOPIPE_SPEECH_DIR", ASTERISK))
    files = sorted(root.rglob("*.wav")) if root.is_dir() else []
    if not files:
        pytest.skip(f"no real speech: set AUDIOPIPE_SPEECH_DIR to a folder of WAV files ({root} has none)")
    clips = []
    for p in files:
        x, sr = _read_wav(p)
        if 0.6 * sr <= len(x) <= 6 * sr and len(x) not in {len(c) for c, _ in clips}:
            clips.append((x, sr))
        if len(clips) == 8:
            break
    return clips


def at_rate(clips: list[tuple[np.ndarray, int]], rate: int) -> list[np.ndarray]:
    from scipy.signal import resample_poly

    out = []
    for x, sr in clips:
        g = math.gcd(rate, sr)
        out.append(np.ascontiguousarray(resample_poly(x, rate // g, sr // g), dtype=np.float32))
    return out


# ----------------------------------------------------------------------------- shards of real mels

@pytest.fixture(scope="module")
def mel_shards(tmp_path_factory, speech) -> Path:
    """A two-shard folder of the f5tts mel of the real utterances (each three times), via the real writer."""
    from audiopipe.features.mel import VocosMel
    from audiopipe.index.lengths import build_index
    from audiopipe.shard.manifest import assemble_manifest
    from audiopipe.shard.writer import ArrayColumn, write_arrow

    out = tmp_path_factory.mktemp("cuda_shards")
    mel = VocosMel()
    spec = mel.specs[0]
    features = {spec.name: {**spec.to_dict(), "hash": spec.config_hash}}
    wavs = at_rate(speech, 24000) * 3
    rows = [{"id": f"spk{i % 2}/utt{i:03d}", "speaker": f"spk{i % 2}", "text": "speech", "source": f"{i}.wav",
             "duration": len(w) / 24000, "arrays": {"mel": mel(w)["mel"]}, "scalars": {}} for i, w in enumerate(wavs)]
    records = []
    for k, part in enumerate((rows[: len(rows) // 2], rows[len(rows) // 2:])):
        name = f"shard-{k:06d}"
        digest = write_arrow(out / "arrow" / f"{name}.arrow", part, [ArrayColumn("mel", spec.dtype, spec.channels)],
                             [], {"features": features, "job": "test_cuda"})
        records.append({"name": name, "rows": len(part), "duration": sum(r["duration"] for r in part),
                        "rejects": [], "arrow": digest.entry(f"arrow/{name}.arrow")})
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, {"library": "scipy resample_poly"}, {"presets": ["f5tts"]},
                      len(rows), 0, index)
    return out


# ----------------------------------------------------------------------------- mixed precision through core


class _Snapshots:
    """A core TrainHook that keeps a copy of the weights after every optimizer step."""

    name = "snapshots"

    def __init__(self):
        self.after: list[torch.Tensor] = []

    def on_start(self, model, resumed):
        self.before = torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu()

    def after_step(self, step, model):
        self.after.append(torch.cat([p.detach().float().flatten() for p in model.parameters()]).cpu())

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def _train(mel_shards: Path, out: Path, device: torch.device, precision: str, poison_micro: int | None = None):
    """Four optimizer steps of a small conv model through core.train; returns (hook, seen dtypes, log, ckpt)."""
    import json

    from core import Dist, RunConfig, train

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(100, 64, 3, padding=1), torch.nn.GELU(), torch.nn.Conv1d(64, 100, 1))
    seen: list[torch.dtype] = []
    calls = [0]

    def loss_fn(m, b):
        calls[0] += 1
        x, mask = b["mel"], b["mel_mask"][:, None].float()
        y = m(x)
        seen.append(y.dtype)
        loss = (((y.float() - x) ** 2) * mask).sum() / mask.sum() / 100
        if calls[0] == poison_micro:  # an overflow the GradScaler must catch: this step is skipped
            loss = loss * float("inf")
        return loss, {}

    cfg = RunConfig(shards=str(mel_shards), out=str(out), max_steps=4, batch_frames=1200, precision=precision,
                    lr=1e-3, warmup_steps=1, log_every=1, ckpt_every=100, prefetch=2)
    hook = _Snapshots()
    train(model, loss_fn, cfg, Dist(device=device), features=["mel"], hooks=[hook], log_name="cuda-test")
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    ckpt = torch.load(out / "ckpt-00000004.pt", map_location="cpu", weights_only=True)
    return hook, seen, log, ckpt


def test_bf16_autocast_step_through_core(device, mel_shards, tmp_path):
    hook, seen, log, ckpt = _train(mel_shards, tmp_path / "bf16", device, "bf16")
    assert seen and all(d == torch.bfloat16 for d in seen)  # the convolutions ran in bf16 under autocast
    assert [r["step"] for r in log] == [1, 2, 3, 4] and all(math.isfinite(r["loss"]) for r in log)
    assert all(r["device"].startswith(device.type) for r in log)
    steps = [hook.before] + hook.after
    assert all(not torch.equal(a, b) for a, b in zip(steps, steps[1:]))  # every step moved the weights
    assert all(v.dtype == torch.float32 for v in ckpt["model"].values())  # fp32 master weights


def test_fp16_gradscaler_skips_an_overflowing_step_and_backs_off(device, mel_shards, tmp_path):
    hook, seen, log, ckpt = _train(mel_shards, tmp_path / "fp16", device, "fp16", poison_micro=3)
    assert seen and all(d == torch.float16 for d in seen)
    steps = [hook.before] + hook.after
    skipped = [i + 1 for i, (a, b) in enumerate(zip(steps, steps[1:])) if torch.equal(a, b)]
    # Step 3 overflowed: skipped, not applied. The first steps may overflow too while the scale (2**16 at the
    # start) finds its level; each skip halves it, and it grows only after 2000 clean steps.
    assert 3 in skipped and 4 not in skipped
    assert all(torch.isfinite(s).all() for s in steps)
    assert ckpt["scaler"]["scale"] == 65536.0 * 0.5 ** len(skipped)
    assert not math.isfinite(log[2]["loss"]) and all(math.isfinite(log[i]["loss"]) for i in (0, 1, 3))


# ----------------------------------------------------------------------------- prefetch to the device


def test_prefetch_delivers_device_tensors_equal_to_the_cpu_path(device, mel_shards):
    from audiopipe.reader.loader import make_loader

    ahead = make_loader(mel_shards, ["mel"], max_frames=1500, seed=3, prefetch=2, device=device)
    plain = make_loader(mel_shards, ["mel"], max_frames=1500, seed=3)
    assert ahead.collate.pin_memory == (device.type == "cuda")
    for epoch in (0, 1):
        ahead.set_epoch(epoch)
        plain.set_epoch(epoch)
        n = 0
        for got, want in zip(ahead, plain, strict=True):
            for k in ("mel", "mel_mask", "mel_lengths"):
                assert got[k].device.type == device.type, k
            # Work on the consumer's stream while the next batch is copied on the side stream.
            busy = (got["mel"].float() * 2).sum()
            np.testing.assert_array_equal(got["mel"].cpu().numpy(), want["mel"].numpy())
            np.testing.assert_array_equal(got["mel_mask"].cpu().numpy(), want["mel_mask"].numpy())
            assert got["index"] == want["index"] and math.isfinite(float(busy))
            n += 1
        assert n == len(plain) >= 3


# ----------------------------------------------------------------------------- core's clock


def test_core_clock_measures_an_injected_delay_as_data_wait(device):
    from core import _Clock

    clock = _Clock(device)
    a = torch.randn(512, 512, device=device)
    clock.start_pass()
    slept = window = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        clock.wait_begin()
        t1 = time.perf_counter()
        time.sleep(0.04)  # the injected delay: the batch arrives 40 ms late, with nothing queued on the device
        slept += time.perf_counter() - t1
        clock.wait_end()
        window += time.perf_counter() - t0
        for _ in range(4):
            a = torch.tanh(a @ a / 512)
        clock.step_end()
    step_s, wait_s = clock.read()
    # The delay as the host lived it (a busy machine stretches a sleep): at least the sleeps, at most the windows
    # around the marks, give or take 2 ms a wait of the device's own timeline.
    assert slept - 3 * 0.002 <= wait_s <= window + 3 * 0.002, (slept, wait_s, window)
    assert step_s >= wait_s


def test_core_clock_counts_no_wait_while_the_gpu_is_still_busy(device):
    """A batch that is late on the host but ready before the GPU finishes its queued work costs no wait."""
    if device.type != "cuda":
        pytest.skip("the host clock has no device queue to hide a late batch behind")
    from core import _Clock

    def cycles_per_ms() -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(50_000_000)
        end.record()
        end.synchronize()
        return 50_000_000 / start.elapsed_time(end)

    # An idle GPU runs at a low clock and speeds up under load: calibrated cold, the "150 ms" of sleep ran in
    # 57 ms on an H200. Calibrate once the clock is up (the second reading).
    cycles_per_ms()
    rate = cycles_per_ms()
    clock = _Clock(device)
    clock.start_pass()
    torch.cuda._sleep(int(150 * rate))  # ~150 ms of queued GPU work
    clock.wait_begin()
    time.sleep(0.05)  # 50 ms late on the host, hidden behind the queue
    clock.wait_end()
    clock.step_end()
    step_s, wait_s = clock.read()
    # The premise (the queue outlasted the host's lateness by a margin) and the claim (no wait counted).
    assert step_s >= 0.09, f"the queued work lasted only {step_s:.3f} s: the test's premise does not hold"
    assert wait_s < 0.005, (step_s, wait_s)


# ----------------------------------------------------------------------------- steps that never wait


@contextlib.contextmanager
def host_never_waits(device: torch.device):
    """torch's sync debug mode at "error": any call that makes the host wait for the device (a value read back,
    a copy from pageable memory, a data-dependent shape) raises. Nothing to check on the CPU rehearsal."""
    if device.type != "cuda":
        yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _steps(device: torch.device, model: torch.nn.Module, loss_of: Callable[[], torch.Tensor]) -> list[float]:
    """One step to warm up (first calls move constants to the device), then two with the host never waiting:
    forward, backward, clipping and AdamW as core takes them."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for k in range(3):
        with host_never_waits(device) if k else contextlib.nullcontext():
            loss = loss_of()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    return losses


def test_f5_and_speaker_steps_never_make_the_host_wait(device, speech):
    """F5-TTS (guidance drops drawn by loss_fn, the span loss a masked sum) and ERes2Net with its crops finished
    on the device (speed, reverb, noise from the loader's batch transform; batched fbank; AAM head) queue a whole
    step without waiting for the device. Each wait would stall the host every step, and the device would idle
    while the host queued the rest."""
    import speaker
    import train_eres2net as eres2net
    import train_f5tts as f5
    from audiopipe.collate.pad import PadCollator
    from core import default_to_device
    from speaker_augment import DeviceAugment, source_samples, stack_for_device

    torch.manual_seed(0)
    model = f5.F5TTS(f5.CONFIGS["tiny"]).to(device)
    tok = f5.Tokenizer()
    batch = default_to_device({"mel": torch.randn(2, 100, 60), "mel_lengths": torch.tensor([60, 41]),
                               "text_ids": tok.batch(["some speech", "more"])}, device)
    assert all(math.isfinite(x) for x in _steps(device, model, lambda: f5.loss_fn(model, batch)[0]))

    speeds, crop = (0.9, 1.0, 1.1), 16000
    rng = np.random.default_rng(0)
    rir = np.exp(-np.arange(800, dtype=np.float32) / 200) * rng.standard_normal(800, dtype=np.float32)
    items = []
    for i, w in enumerate(at_rate(speech, 16000)[:6]):
        pcm = np.round(w * 32767).astype(np.int16)
        k = i % 3  # every speed; the first an utterance shorter than its crop, which the device repeats
        items.append({"wav": pcm[: crop // 2 if i == 0 else source_samples(crop, speeds[k])], "speed": k, "index": i,
                      "label": 3 * (i % 2) + k, "rir": rir if i % 2 else None, "snr": 10.0,
                      "noise": rng.standard_normal(crop, dtype=np.float32) if i % 3 == 1 else None})
    sb = default_to_device(stack_for_device(PadCollator(["wav"])(items)), device)
    finish = DeviceAugment(speeds, crop)
    net = speaker.SpeakerModel(eres2net.ERes2Net(eres2net.CONFIGS["tiny"]), 32, 6, lambda step: 0.2).to(device)
    losses = _steps(device, net, lambda: speaker.loss_fn(net, {"wav": finish(sb), "label": sb["label"]})[0])
    assert all(math.isfinite(x) for x in losses)


# ----------------------------------------------------------------------------- features on the device


def _strong_rel(ours: torch.Tensor, ref: torch.Tensor, floor: float) -> tuple[float, float]:
    strong = ref > floor + STRONG
    d = (ours - ref)[strong]
    return float(d.norm() / ref[strong].norm()), float(d.abs().max())


def test_mel_on_device_equals_torchaudio_f5_config(device, speech):
    torchaudio = pytest.importorskip("torchaudio")
    from audiopipe.features.mel import mel_spectrogram, stft_num_frames, vocos_mel_kwargs

    kw = vocos_mel_kwargs()
    wavs = at_rate(speech, 24000)
    ta = torchaudio.transforms.MelSpectrogram(
        sample_rate=24000, n_fft=1024, win_length=1024, hop_length=256, n_mels=100, f_min=0.0, f_max=12000.0,
        power=1.0, center=True, pad_mode="reflect", norm=None, mel_scale="htk").to(device)  # F5-TTS's MelSpec
    lengths = torch.tensor([len(w) for w in wavs])
    batch = torch.zeros(len(wavs), int(lengths.max()))
    for i, w in enumerate(wavs):
        batch[i, : len(w)] = torch.from_numpy(w)
    with torch.inference_mode():
        ours = mel_spectrogram(batch.to(device), lengths=lengths.to(device), **kw)
        for i, w in enumerate(wavs):
            ref = torch.log(torch.clamp(ta(torch.from_numpy(w).to(device)), min=1e-5))
            mine = ours[i, :, : stft_num_frames(len(w), 1024, 256, "center")]
            assert mine.device.type == device.type and mine.shape == ref.shape
            rel, worst = _strong_rel(mine, ref, math.log(1e-5))
            assert rel <= 1e-4 and worst <= 1e-3, (i, rel, worst)


def test_kaldi_fbank_on_device_equals_torchaudio_3dspeaker_config(device, speech):
    torchaudio = pytest.importorskip("torchaudio")
    from audiopipe.features.fbank import KaldiFbank, kaldi_fbank_torch

    wavs = at_rate(speech, 16000)
    frames = KaldiFbank().num_frames
    batch = torch.zeros(len(wavs), max(len(w) for w in wavs))
    for i, w in enumerate(wavs):
        batch[i, : len(w)] = torch.from_numpy(w)
    with torch.inference_mode():
        ours = kaldi_fbank_torch(batch.to(device))  # [B, T, 80]; snip edges: padding changes no real frame
        for i, w in enumerate(wavs):
            # 3D-Speaker's FBank: 80 bins, 16 kHz, dither 0 (evaluation), povey window, snip edges
            ref = torchaudio.compliance.kaldi.fbank(torch.from_numpy(w).to(device)[None], num_mel_bins=80,
                                                    sample_frequency=16000, dither=0.0, window_type="povey")
            mine = ours[i, : frames(len(w))]
            assert mine.shape == ref.shape
            rel, worst = _strong_rel(mine, ref, math.log(torch.finfo(torch.float32).eps))
            assert rel <= 1e-4 and worst <= 1e-3, (i, rel, worst)


def test_encodec_batched_on_device_equals_one_at_a_time(device, speech, tmp_path):
    pytest.importorskip("transformers")
    from audiopipe.features.codec import EncodecEncoder

    # Random-init weights saved to a local folder and read back as a checkpoint: nothing is fetched.
    EncodecEncoder(random_init=True, seed=1, device="cpu")._model.save_pretrained(str(tmp_path / "encodec"))
    tok = EncodecEncoder(checkpoint=tmp_path / "encodec", device=str(device), max_batch_samples=1 << 40)
    wavs = at_rate(speech, 24000)
    if device.type != "cuda":  # EnCodec is slow on a CPU: the three shortest clips there
        wavs = sorted(wavs, key=len)[:3]
    batched = tok.encode_batch(wavs)
    alone = [tok.encode_batch([w])[0] for w in wavs]
    total = sum(a.size for a in alone)
    equal = sum(int((a == b).sum()) for a, b in zip(alone, batched) if a.shape == b.shape)
    assert all(a.shape == b.shape == (tok.num_codebooks, tok.num_frames(len(w)))
               for a, b, w in zip(alone, batched, wavs))
    assert len({int(c) for a in alone for c in np.unique(a[0])}) > 8  # informative codes, not one repeated code
    per_book = [sum(int((a[q] == b[q]).sum()) for a, b in zip(alone, batched)) / sum(a.shape[1] for a in alone)
                for q in range(tok.num_codebooks)]
    print(f"codes equal batched vs one at a time: {equal / total:.6f} of {total}; per codebook "
          + " ".join(f"{x:.4f}" for x in per_book))
    assert equal / total >= 0.999, (f"{equal}/{total} codes equal; per codebook "
                                    + " ".join(f"{x:.4f}" for x in per_book))
