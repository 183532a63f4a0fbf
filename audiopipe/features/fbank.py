"""Kaldi log-mel filterbank (speaker-embedding input, 3D-Speaker / WeSpeaker style).

`KaldiFbank` computes it offline through kaldi-native-fbank; `kaldi_fbank_torch` is the same computation in
batched torch for trainers that take random crops on the training device. Both use Kaldi's defaults:
25 ms povey window every 10 ms, snip_edges (T = 1 + (N - 400) // 160 at 16 kHz), DC removal, pre-emphasis
0.97, 512-point FFT power spectrum, 80 triangular bins on Kaldi's mel scale (1127 ln(1 + f/700), triangles
linear in mel) from 20 Hz to Nyquist, log floored at float32 epsilon, no dither, no energy column.

Sample scaling: kaldi-native-fbank and torchaudio.compliance.kaldi.fbank take samples as given. 3D-Speaker
feeds the float waveform in [-1, 1] (torchaudio.load) unscaled; WeSpeaker and Kaldi itself use int16-range
samples (x 32768). `input_scale` selects this; the default 1.0 is the 3D-Speaker convention. The two differ
by 2 ln(32768) ~ 20.8 per bin (CMN removes it) except where the epsilon floor bites.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from audiopipe.errors import InvalidValue, WrongType
from audiopipe.features.base import FeatureSpec
from audiopipe.features.pcm import check_waveform

_PREEMPH = 0.97
_POVEY_POWER = 0.85
_LOG_EPS = float(np.finfo(np.float32).eps)  # Kaldi's std::numeric_limits<float>::epsilon()


def _frame_sizes(sample_rate: int, frame_length_ms: float, frame_shift_ms: float) -> tuple[int, int, int]:
    # Kaldi truncates (int cast) the window and shift lengths; the FFT is the next power of two.
    win = int(sample_rate * 0.001 * frame_length_ms)
    shift = int(sample_rate * 0.001 * frame_shift_ms)
    return win, shift, 1 << (win - 1).bit_length()


def fbank_num_frames(num_samples: int, win: int, shift: int) -> int:
    """Kaldi's frame count with snip_edges=true (0 when shorter than one window)."""
    return 0 if num_samples < win else 1 + (num_samples - win) // shift


@functools.lru_cache(maxsize=8)
def kaldi_mel_banks(
    num_bins: int, sample_rate: int, n_fft: int, low_freq: float = 20.0, high_freq: float = 0.0
) -> np.ndarray:
    """Kaldi's MelBanks as a float64 matrix [num_bins, n_fft // 2] (Nyquist bin dropped, as Kaldi does)."""
    nyquist = 0.5 * sample_rate
    high = nyquist + high_freq if high_freq <= 0 else high_freq
    if not 0 <= low_freq < high <= nyquist:
        raise InvalidValue(f"kaldi fbank: need 0 <= low_freq < high_freq <= Nyquist, got {low_freq}, {high}")

    def mel(f: np.ndarray | float) -> np.ndarray:
        return 1127.0 * np.log(1.0 + np.asarray(f, dtype=np.float64) / 700.0)

    mel_low, mel_high = mel(low_freq), mel(high)
    delta = (mel_high - mel_low) / (num_bins + 1)
    left = mel_low + delta * np.arange(num_bins)[:, None]
    center, right = left + delta, left + 2 * delta
    m = mel(np.arange(n_fft // 2) * (sample_rate / n_fft))[None, :]
    up = (m - left) / (center - left)
    down = (right - m) / (right - center)
    banks = np.where((m > left) & (m < right), np.where(m <= center, up, down), 0.0)
    banks.setflags(write=False)
    return banks


@functools.lru_cache(maxsize=8)
def _torch_consts(key: tuple, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    num_bins, sample_rate, win, n_fft, low_freq, high_freq = key
    with torch.inference_mode(False):  # cached: must stay usable by autograd after a first inference call
        i = torch.arange(win, dtype=torch.float64)
        window = (0.5 - 0.5 * torch.cos(2 * math.pi * i / (win - 1))) ** _POVEY_POWER
        banks = torch.from_numpy(np.array(kaldi_mel_banks(num_bins, sample_rate, n_fft, low_freq, high_freq)))
        return window.to(device, dtype), banks.to(device, dtype)


def kaldi_fbank_torch(
    wav: torch.Tensor,
    *,
    sample_rate: int = 16000,
    num_mel_bins: int = 80,
    frame_length_ms: float = 25.0,
    frame_shift_ms: float = 10.0,
    low_freq: float = 20.0,
    high_freq: float = 0.0,
    input_scale: float = 1.0,
) -> torch.Tensor:
    """Batched Kaldi fbank on wav's device and dtype: [B, N] -> [B, T, num_mel_bins] (log mel energies).

    Matches kaldi-native-fbank with the module's defaults (see the module docstring). Use float64 for
    bit-for-bit closeness in near-silent bands; float32 agrees to ~1e-3 wherever the band energy is well
    above the epsilon floor.
    """
    if wav.dim() != 2:
        raise InvalidValue(f"kaldi_fbank_torch: expected [B, N], got shape {tuple(wav.shape)}")
    if not wav.is_floating_point():
        raise WrongType(f"kaldi_fbank_torch: expected a floating point waveform, got {wav.dtype}")
    win, shift, n_fft = _frame_sizes(sample_rate, frame_length_ms, frame_shift_ms)
    if wav.shape[1] < win:
        raise InvalidValue(f"kaldi_fbank_torch: {wav.shape[1]} samples is shorter than one {win}-sample frame")
    window, banks = _torch_consts(
        (num_mel_bins, sample_rate, win, n_fft, float(low_freq), float(high_freq)), wav.device, wav.dtype
    )
    frames = (wav * input_scale).unfold(-1, win, shift)  # [B, T, win]
    frames = frames - frames.mean(dim=-1, keepdim=True)
    # Kaldi's pre-emphasis treats the sample before the frame as the first sample itself.
    prev = torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)
    frames = (frames - _PREEMPH * prev) * window
    spec = torch.fft.rfft(frames, n=n_fft, dim=-1)
    power = spec.real.square() + spec.imag.square()
    mel = torch.matmul(power[..., : n_fft // 2], banks.T)
    return torch.log(torch.clamp(mel, min=_LOG_EPS))


def mean_normalize(feats, time_axis: int = -1, lengths=None):
    """Per-utterance cepstral mean normalisation: subtract each utterance's mean over time.

    Works on numpy arrays and torch tensors. time_axis=-1 fits stored features ([80, T]); use time_axis=1
    for kaldi_fbank_torch's [B, T, 80]. With a batch, `lengths` (frames per utterance, [B]) restricts the mean
    to each utterance's valid frames and leaves the padding untouched; the batch must be axis 0.
    """
    if lengths is None:
        if isinstance(feats, torch.Tensor):
            return feats - feats.mean(dim=time_axis, keepdim=True)
        return feats - feats.mean(axis=time_axis, keepdims=True)
    is_torch = isinstance(feats, torch.Tensor)
    x = feats if is_torch else torch.from_numpy(np.asarray(feats))
    ax = time_axis % x.dim()
    if ax == 0:
        raise InvalidValue("mean_normalize: with lengths, axis 0 must be the batch and time another axis")
    lens = torch.as_tensor(lengths, device=x.device)
    if lens.shape != (x.shape[0],) or (lens <= 0).any() or (lens > x.shape[ax]).any():
        raise InvalidValue(f"mean_normalize: lengths must be [B] within 1..{x.shape[ax]}, got {lens.tolist()}")
    shape = [1] * x.dim()
    shape[0], shape[ax] = x.shape[0], x.shape[ax]
    mask = (torch.arange(x.shape[ax], device=x.device)[None, :] < lens[:, None]).reshape(shape).to(x.dtype)
    count_shape = [x.shape[0]] + [1] * (x.dim() - 1)
    mean = (x * mask).sum(dim=ax, keepdim=True) / lens.to(x.dtype).reshape(count_shape)
    out = x - mean * mask
    return out if is_torch else out.numpy()


class KaldiFbank:
    """{"fbank": float32 [num_mel_bins, T]} through kaldi-native-fbank (Kaldi / 3D-Speaker defaults).

    T = 1 + (N - win) // shift; an input shorter than one window is refused with a ValueError.
    """

    kind = "kaldi_fbank"

    def __init__(
        self,
        sample_rate: int = 16000,
        num_mel_bins: int = 80,
        frame_length_ms: float = 25.0,
        frame_shift_ms: float = 10.0,
        low_freq: float = 20.0,
        high_freq: float = 0.0,
        input_scale: float = 1.0,
    ) -> None:
        self.params = {
            "sample_rate": int(sample_rate), "num_mel_bins": int(num_mel_bins),
            "frame_length_ms": float(frame_length_ms), "frame_shift_ms": float(frame_shift_ms),
            "low_freq": float(low_freq), "high_freq": float(high_freq), "input_scale": float(input_scale),
        }
        p = self.params
        self._win, self._shift, n_fft = _frame_sizes(p["sample_rate"], p["frame_length_ms"], p["frame_shift_ms"])
        if self._win < 2 or self._shift < 1:
            raise InvalidValue(f"kaldi_fbank: frame length/shift too small at {p['sample_rate']} Hz")
        kaldi_mel_banks(p["num_mel_bins"], p["sample_rate"], n_fft, p["low_freq"], p["high_freq"])  # validates
        self.specs = (
            FeatureSpec(
                name="fbank", kind=self.kind, sample_rate=p["sample_rate"], dtype="float32",
                channels=p["num_mel_bins"], hop_length=self._shift, params=dict(p),
            ),
        )

    def _options(self):
        import kaldi_native_fbank as knf

        p = self.params
        opts = knf.FbankOptions()
        fo = opts.frame_opts
        fo.samp_freq = p["sample_rate"]
        fo.frame_length_ms = p["frame_length_ms"]
        fo.frame_shift_ms = p["frame_shift_ms"]
        fo.dither = 0.0  # knf's default is 3e-5: random, so never reproducible
        fo.snip_edges = True
        fo.window_type = "povey"
        fo.preemph_coeff = _PREEMPH
        fo.remove_dc_offset = True
        fo.round_to_power_of_two = True
        mo = opts.mel_opts
        mo.num_bins = p["num_mel_bins"]
        mo.low_freq = p["low_freq"]
        mo.high_freq = p["high_freq"]
        opts.use_energy = False
        opts.energy_floor = 0.0
        opts.use_log_fbank = True
        opts.use_power = True
        return opts

    def num_frames(self, num_samples: int) -> int:
        return fbank_num_frames(num_samples, self._win, self._shift)

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        import kaldi_native_fbank as knf

        x = check_waveform(wav, self.kind)
        if len(x) < self._win:
            raise InvalidValue(
                f"kaldi_fbank: {len(x)} samples is shorter than one {self._win}-sample "
                f"({self.params['frame_length_ms']} ms) frame"
            )
        fb = knf.OnlineFbank(self._options())
        fb.accept_waveform(float(self.params["sample_rate"]), x * np.float32(self.params["input_scale"]))
        fb.input_finished()
        n = fb.num_frames_ready
        out = np.empty((self.params["num_mel_bins"], n), dtype=np.float32)
        for i in range(n):
            out[:, i] = fb.get_frame(i)
        return {"fbank": out}
