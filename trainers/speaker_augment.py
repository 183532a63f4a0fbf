"""The speaker trainers' crops finished on the training device, for the whole batch at once: speed perturbation,
reverberation, additive noise. torch ops only, so the same code runs on the CPU or a GPU, next to the fbank.

The loader's item transform (speaker_data.SpeakerCrops) draws every random choice on the CPU and only slices:
the int16 source samples of each crop out of the mmap, and, for a corrupted crop, the impulse response and a
stretch of noise from the cached folder files; `stack_for_device`, the loader's batch transform, stacks the
latter into tensors that travel with the batch. `DeviceAugment` turns such a batch into [B, crop] float32
waveforms in [-1, 1], the same crops the per-utterance path (`--augment-on cpu`: soxr, scipy, numpy) makes from
the same draws, within the resamplers' difference (tests/test_train_speaker.py measures it on real speech).

Speed perturbation is sox's `speed` effect (3D-Speaker's): the s * crop source samples are taken as sampled at
s * 16 kHz and resampled to 16 kHz, so duration and pitch both change by s. One windowed-sinc polyphase kernel
per speed (julius' ResampleFrac: 0.9 is 9 -> 10, 1.1 is 11 -> 10), built once per device; the rows of one speed
go through one strided conv1d.
"""

from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from audiopipe.features.pcm import INT16_SCALE

SAMPLE_RATE = 16000
#: Source samples kept on each side of a perturbed crop so that the resamplers' edge transients fall outside it:
#: soxr's filter reaches about 93 input samples, the kernel below 74 (at speed 1.1).
RESAMPLE_MARGIN = 128
#: The sinc kernel: 64 zero crossings each side and a cutoff at 0.96 of the lower Nyquist frequency. On real
#: speech this lands closest to soxr's HQ filter of the settings tried (24/0.945, 48/0.96, 64/0.96, 64/0.97).
SINC_ZEROS, SINC_ROLLOFF = 64, 0.96


def source_samples(crop: int, speed: float) -> int:
    """How many 16 kHz source samples a crop of `crop` output samples at `speed` reads (margins included)."""
    if speed == 1.0:
        return crop
    return int(math.ceil(crop * speed)) + 2 * RESAMPLE_MARGIN + 2


def first_output(speed: float) -> int:
    """Index of the resampled source's output sample that starts the crop: the one at source time
    RESAMPLE_MARGIN (output sample j sits at source time j * speed in both resamplers)."""
    return int(round(RESAMPLE_MARGIN / speed))


def speed_rates(speed: float) -> tuple[int, int]:
    """(source rate, output rate) in Hz of sox's `speed` at 16 kHz; refused unless s * 16000 is whole."""
    src = speed * SAMPLE_RATE
    if abs(src - round(src)) > 1e-6:
        raise ValueError(f"speed {speed}: {speed} x {SAMPLE_RATE} Hz is not a whole number of Hz")
    return int(round(src)), SAMPLE_RATE


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """fp32 arithmetic: no autocast, and no TF32 in cuDNN's convolutions (on by default: 10-bit mantissas)."""
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad(), torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
            yield
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def energy_db(x: torch.Tensor) -> torch.Tensor:
    """Per row: 10 log10(mean power + 1e-6), in float64 as the per-utterance path computes it."""
    return 10.0 * torch.log10(x.double().square().mean(dim=-1) + 1e-6)


def fft_convolve_head(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Row-wise full convolution of x [m, n] with h [m, k], its first n samples (the causal part of a reverb)."""
    n = x.shape[-1]
    size = 1 << (n + h.shape[-1] - 2).bit_length()  # a power of two >= n + k - 1: no circular wrap
    y = torch.fft.irfft(torch.fft.rfft(x, size) * torch.fft.rfft(h, size), size)
    return y[..., :n]


def _stack(rows: Sequence[np.ndarray]) -> torch.Tensor:
    """float32 [m, longest], zero after each row's end."""
    out = np.zeros((len(rows), max(len(r) for r in rows)), dtype=np.float32)
    for dst, r in zip(out, rows):
        dst[: len(r)] = r
    return torch.from_numpy(out)


def labels_as_tensor(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch_transform of crops finished on the CPU: the labels as a tensor the loader moves to the device
    with the batch (a list would be copied there in the step, the host waiting for the device)."""
    batch["label"] = torch.as_tensor(batch["label"], dtype=torch.int64)
    return batch


def stack_for_device(batch: dict[str, Any]) -> dict[str, Any]:
    """The loader's batch_transform, run where the batch is collated (its thread or a worker), so that the step
    neither reads anything back from the device nor copies anything to it: on a GPU each would make the host wait
    for the device, every step. Host lists: `source_lengths` (the collated sources' lengths) and `speed`. Tensors
    the loader moves to the device with the batch: `label` [B] int64; `speed_rows` [B] int64, the rows grouped by
    speed, in order; the corrupted crops' impulse responses and noise stretches (lists with None for a clean
    crop) as `rir` [m, k], `noise` [m, crop] float32 and `snr` [m] float64, or None when no crop of the batch has
    one; `rir_rows` / `noise_rows` int64, the crops they belong to."""
    batch["source_lengths"] = batch["wav_lengths"].tolist()
    labels_as_tensor(batch)
    batch["speed_rows"] = torch.as_tensor(sorted(range(len(batch["speed"])), key=batch["speed"].__getitem__),
                                          dtype=torch.int64)
    for key in ("rir", "noise"):
        rows = [i for i, x in enumerate(batch[key]) if x is not None]
        batch[f"{key}_rows"] = torch.as_tensor(rows, dtype=torch.int64)
        if key == "noise":
            batch["snr"] = torch.tensor([float(batch["snr"][i]) for i in rows], dtype=torch.float64) if rows else None
        batch[key] = _stack([batch[key][i] for i in rows]) if rows else None
    return batch


class DeviceAugment:
    """batch -> [B, crop] float32 waveforms on the batch's device.

    The batch (collated SpeakerCrops items, on_device=True): `wav` int16 [B, >= source samples], `speed` (index
    into speeds, per crop), `rir` (impulse response or None), `noise` (crop-long noise stretch or None), `snr`
    (dB). Rows are grouped by speed, each group resampled with its kernel; then reverb (convolution with the
    energy-normalised response, cut to the crop), then noise scaled to `snr` dB below the (reverberant) speech.
    """

    def __init__(self, speeds: Sequence[float], crop_samples: int):
        import julius  # here: the per-utterance path and the rest of the trainers run without it

        self.speeds, self.crop = tuple(float(s) for s in speeds), int(crop_samples)
        self._kernels = {k: julius.ResampleFrac(*speed_rates(s), zeros=SINC_ZEROS, rolloff=SINC_ROLLOFF)
                         for k, s in enumerate(self.speeds) if s != 1.0}
        self._on: dict[torch.device, dict[int, torch.nn.Module]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_on": {}}

    def kernels(self, device: torch.device) -> dict[int, torch.nn.Module]:
        """The resampling modules on `device`, moved there once."""
        have = self._on.get(device)
        if have is None:
            have = self._on[device] = {k: copy.deepcopy(m).to(device) for k, m in self._kernels.items()}
        return have

    def speed(self, src: torch.Tensor, lengths: list[int], speed: list[int], src_lengths: torch.Tensor,
              speed_rows: torch.Tensor) -> torch.Tensor:
        """int16 sources [B, L] (row i holds lengths[i] samples; src_lengths, the same on src's device) ->
        float32 crops [B, crop], each at its speed (speed_rows: the rows grouped by speed, as stack_for_device
        orders them). A source shorter than its crop needs is an utterance shorter than the crop: repeated from
        its start. The host decides from its lists; the device indexes with its own tensors."""
        n, out, dev = self.crop, None, src.device
        kernels = self.kernels(dev)
        groups: dict[int, list[int]] = {}
        for row, k in enumerate(speed):
            groups.setdefault(int(k), []).append(row)
        start = 0
        for k in sorted(groups):
            rows, s = groups[k], self.speeds[k]
            need = source_samples(n, s)
            at = speed_rows[start: start + len(rows)]  # these rows, on the device
            start += len(rows)
            x = (src if len(groups) == 1 else src[at])[:, :need]
            short = any(lengths[row] < need for row in rows)
            if x.shape[1] < need:  # no source in the batch is this long: room for the repetition below
                x = torch.cat([x, x.new_zeros(len(x), need - x.shape[1])], dim=1)
            if short:  # cyclic repetition, as np.resize: sample t of the crop is sample t mod length (t itself
                # for a source at least as long as the crop's need)
                have = (src_lengths if len(groups) == 1 else src_lengths[at]).clamp(min=1)
                x = x.gather(1, torch.arange(need, device=dev) % have[:, None])
            x = x.float() / INT16_SCALE
            if s != 1.0:
                first = first_output(s)
                x = kernels[k](x)[:, first: first + n]
            if len(groups) == 1:
                return x.contiguous()
            if out is None:
                out = torch.empty(len(speed), n, dtype=torch.float32, device=dev)
            out[at] = x
        assert out is not None
        return out

    def __call__(self, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's finished crops [B, crop] (after `stack_for_device`)."""
        with exact_float32():
            wav = self.speed(batch["wav"], batch["source_lengths"], batch["speed"], batch["wav_lengths"],
                             batch["speed_rows"])
            dev = wav.device
            if batch["rir"] is not None:
                idx = batch["rir_rows"].to(dev)
                h = batch["rir"].to(dev)
                h = h / h.double().square().sum(dim=-1, keepdim=True).sqrt().clamp_min(1e-12).float()
                wav[idx] = fft_convolve_head(wav[idx], h)
            if batch["noise"] is not None:
                idx = batch["noise_rows"].to(dev)
                noise, speech = batch["noise"].to(dev), wav[idx]
                gain = torch.pow(10.0, (energy_db(speech) - energy_db(noise) - batch["snr"].to(dev)) / 20.0)
                wav[idx] = speech + gain.float()[:, None] * noise
            return wav

