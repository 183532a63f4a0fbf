"""Log-mel spectrograms in torch: the vocos mel (F5-TTS) and the HiFi-GAN/BigVGAN slaney mel.

One batched function, `mel_spectrogram`, does the work for both the offline features (one utterance at a
time on CPU) and trainers (a batch on the training device), so the two can never drift apart. The mel
filterbank is built here (HTK or Slaney scale, optional Slaney area normalisation) and matches
`librosa.filters.mel`; torchaudio is deliberately not used.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np
import torch

from audiopipe.errors import InvalidValue, WrongType
from audiopipe.features.base import FeatureSpec
from audiopipe.features.pcm import check_waveform
from audiopipe.features.spectral import SparseMel, StftKey, abs_complex

MelScale = Literal["htk", "slaney"]
Padding = Literal["center", "hifigan"]

# Slaney's Auditory Toolbox scale: linear below 1 kHz, logarithmic above.
_SLANEY_F_SP = 200.0 / 3
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def hz_to_mel(freq: np.ndarray | float, scale: MelScale) -> np.ndarray:
    f = np.asarray(freq, dtype=np.float64)
    if scale == "htk":
        return 2595.0 * np.log10(1.0 + f / 700.0)
    if scale == "slaney":
        lin = f / _SLANEY_F_SP
        log = _SLANEY_MIN_LOG_MEL + np.log(np.maximum(f, _SLANEY_MIN_LOG_HZ) / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP
        return np.where(f >= _SLANEY_MIN_LOG_HZ, log, lin)
    raise InvalidValue(f"unknown mel scale {scale!r}: expected 'htk' or 'slaney'")


def mel_to_hz(mel: np.ndarray | float, scale: MelScale) -> np.ndarray:
    m = np.asarray(mel, dtype=np.float64)
    if scale == "htk":
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)
    if scale == "slaney":
        lin = _SLANEY_F_SP * m
        log = _SLANEY_MIN_LOG_HZ * np.exp(_SLANEY_LOGSTEP * (m - _SLANEY_MIN_LOG_MEL))
        return np.where(m >= _SLANEY_MIN_LOG_MEL, log, lin)
    raise InvalidValue(f"unknown mel scale {scale!r}: expected 'htk' or 'slaney'")


@functools.lru_cache(maxsize=32)
def mel_filterbank(
    sample_rate: int,
    n_fft: int,
    n_mels: int,
    fmin: float = 0.0,
    fmax: float | None = None,
    scale: MelScale = "htk",
    norm: Literal["slaney"] | None = None,
) -> np.ndarray:
    """Triangular mel filters, float64 [n_mels, n_fft // 2 + 1] (read-only; same maths as librosa.filters.mel).

    Triangles are linear in Hz between mel-spaced edges; norm="slaney" scales each to unit area (2 / width).
    """
    fmax = sample_rate / 2 if fmax is None else float(fmax)
    if not 0 <= fmin < fmax <= sample_rate / 2:
        raise InvalidValue(f"need 0 <= fmin < fmax <= sample_rate/2, got fmin={fmin} fmax={fmax} sr={sample_rate}")
    if norm not in (None, "slaney"):
        raise InvalidValue(f"unknown mel norm {norm!r}: expected 'slaney' or None")
    fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin, scale), hz_to_mel(fmax, scale), n_mels + 2), scale)
    widths = np.diff(edges)
    # Distance of every FFT bin from every edge: rising slope uses the lower edge, falling the upper.
    ramps = edges[:, None] - fft_freqs[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(rising, falling))
    if norm == "slaney":
        weights *= (2.0 / (edges[2:] - edges[:-2]))[:, None]
    weights.setflags(write=False)
    return weights


# Trainers call every step: keep the window and filterbank resident per (device, dtype). They are built
# outside inference mode, or a first call under torch.inference_mode() would poison the cache for autograd.
@functools.lru_cache(maxsize=16)
def _hann(win_length: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.hann_window(win_length, periodic=True, dtype=torch.float64).to(device=device, dtype=dtype)


@functools.lru_cache(maxsize=16)
def _filterbank_tensor(key: tuple, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    with torch.inference_mode(False):
        return torch.from_numpy(np.array(mel_filterbank(*key))).to(device=device, dtype=dtype)


def stft_num_frames(num_samples: int, n_fft: int, hop_length: int, padding: Padding) -> int:
    """Frames an STFT with this framing yields (0 when the input is too short to frame at all)."""
    if padding == "center":
        return num_samples // hop_length + 1
    if padding == "hifigan":
        pad = (n_fft - hop_length) // 2
        return max(0, (num_samples + 2 * pad - n_fft) // hop_length + 1)
    raise InvalidValue(f"unknown padding {padding!r}: expected 'center' or 'hifigan'")


def stft_min_samples(n_fft: int, hop_length: int, padding: Padding) -> int:
    """Shortest input the framing accepts: reflect padding needs more samples than it pads."""
    if padding == "center":
        return n_fft // 2 + 1
    pad = (n_fft - hop_length) // 2
    return max(pad + 1, n_fft - 2 * pad)


def magnitude_spectrogram(
    wav: torch.Tensor,
    *,
    n_fft: int,
    hop_length: int,
    win_length: int,
    padding: Padding = "center",
    magnitude_eps: float = 0.0,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """|STFT| of a batch: [B, N] -> [B, n_fft // 2 + 1, T], hann window, reflect padding.

    padding="center": torch.stft(center=True) (librosa / torchaudio / vocos framing, T = N // hop + 1).
    padding="hifigan": reflect-pad (n_fft - hop) // 2 per side, then center=False (HiFi-GAN/BigVGAN framing).
    magnitude_eps > 0 gives sqrt(re^2 + im^2 + eps) as HiFi-GAN does (keeps the gradient finite at 0).
    lengths ([B] samples): rows are utterances of these lengths, zero-padded to N. Each is then reflect-padded
    at its own end, so its first `stft_num_frames(length)` frames equal those of the utterance framed alone
    (without it, a short row's last frames would see the batch's zeros instead of its own reflection); the
    frames after those are of zeros. T is that of N.
    """
    if wav.dim() != 2:
        raise InvalidValue(f"expected a batch of waveforms [B, N], got shape {tuple(wav.shape)}")
    if not wav.is_floating_point():
        raise WrongType(f"expected a floating point waveform, got {wav.dtype}")
    n = wav.shape[-1]
    need = stft_min_samples(n_fft, hop_length, padding)
    if padding not in ("center", "hifigan"):
        raise InvalidValue(f"unknown padding {padding!r}: expected 'center' or 'hifigan'")
    if lengths is not None:
        lengths = _check_lengths(lengths, wav, need)
    elif n < need:
        raise InvalidValue(f"waveform of {n} samples is too short for this STFT framing (needs >= {need})")
    window = _hann(win_length, wav.device, wav.dtype)
    if lengths is not None:
        pad = n_fft // 2 if padding == "center" else (n_fft - hop_length) // 2
        wav = _reflect_pad_rows(wav, lengths, pad)
        center = False
    elif padding == "hifigan":
        pad = (n_fft - hop_length) // 2
        wav = torch.nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
        center = False
    else:
        center = True
    spec = torch.stft(
        wav, n_fft, hop_length=hop_length, win_length=win_length, window=window,
        center=center, pad_mode="reflect", normalized=False, onesided=True, return_complex=True,
    )
    if magnitude_eps > 0:
        return torch.sqrt(spec.real.square() + spec.imag.square() + magnitude_eps)
    if spec.requires_grad:
        return spec.abs()  # zero subgradient at |X| = 0, where sqrt's would be infinite (NaN in a mel loss)
    # Without autograd sqrt(re^2 + im^2): abs()'s hypot overflow guard is useless for audio and costs ~2x.
    return torch.sqrt(spec.real.square() + spec.imag.square())


def _check_lengths(lengths: torch.Tensor, wav: torch.Tensor, need: int) -> torch.Tensor:
    lengths = torch.as_tensor(lengths, device=wav.device)
    if lengths.shape != (wav.shape[0],) or lengths.is_floating_point():
        raise InvalidValue(f"lengths must be [B] = [{wav.shape[0]}] integer sample counts, got {tuple(lengths.shape)}"
                           f" {lengths.dtype}")
    if len(lengths) and (int(lengths.min()) < need or int(lengths.max()) > wav.shape[-1]):
        raise InvalidValue(f"lengths must be within {need}..{wav.shape[-1]} samples (the framing needs >= {need}), "
                           f"got {int(lengths.min())}..{int(lengths.max())}")
    return lengths.long()


def _reflect_pad_rows(wav: torch.Tensor, lengths: torch.Tensor, pad: int) -> torch.Tensor:
    """[B, N] -> [B, N + 2 * pad]: row b is its first lengths[b] samples reflect-padded by `pad` on both sides
    (as torch's reflect pad of that row alone), then zeros. Differentiable.

    Every row starts at sample 0, so the batch's own reflect pad is already right on the left and along each
    row; only a row's `pad` samples after its end need its reflection (a small gather), and what follows them
    is zeroed: no index as large as the batch."""
    out = torch.nn.functional.pad(wav.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    j = torch.arange(out.shape[-1], device=wav.device)[None, :]
    out = out * (j < (lengths + 2 * pad)[:, None]).to(wav.dtype)  # zeros after each row's right padding
    t = torch.arange(pad, device=wav.device)[None, :]
    tail = torch.gather(wav, 1, lengths[:, None] - 2 - t)  # sample L + i reflects L - 2 - i
    return out.scatter(1, lengths[:, None] + pad + t, tail)


def stft_magnitude(x: np.ndarray, key: StftKey) -> np.ndarray:
    """One waveform -> float32 |STFT| [n_fft // 2 + 1, T] (time contiguous): `magnitude_spectrogram` in float32,
    in one pass after the FFT (the offline path; features sharing `key` share its result).

    float32, as the models' own mels are: F5-TTS/vocos (torchaudio) and HiFi-GAN/BigVGAN (torch.stft) take the
    FFT in single precision (librosa does not: its float64 window makes the FFT float64). Its rounding noise is relative to the frame's
    loudest bins (~1e-7 of them), so bands within ~1e-5 of the log floor in a loud frame move by up to ~1 nat,
    exactly as they do between any two float32 implementations (ours and the trainers' batched torch mel differ
    as much from a float64 mel as each other); where the mel is above 1e-2 the log-mel is within 3.5e-4 nats of
    the float64 one on the test clips, above 1 within 4e-6 (tests/test_features_spectral.py,
    tests/test_features_mel.py). A float64 FFT costs ~2x.
    """
    need = stft_min_samples(key.n_fft, key.hop_length, key.padding)
    if len(x) < need:
        raise InvalidValue(f"waveform of {len(x)} samples is too short for this STFT framing (needs >= {need})")
    w = torch.from_numpy(np.asarray(x, dtype=np.float32))[None]
    with torch.inference_mode():
        if key.padding == "hifigan":
            pad = (key.n_fft - key.hop_length) // 2
            w = torch.nn.functional.pad(w.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
        elif key.padding != "center":
            raise InvalidValue(f"unknown padding {key.padding!r}: expected 'center' or 'hifigan'")
        spec = torch.stft(w, key.n_fft, hop_length=key.hop_length, win_length=key.win_length,
                          window=_hann(key.win_length, w.device, torch.float32), center=key.padding == "center",
                          pad_mode="reflect", normalized=False, onesided=True, return_complex=True)[0]
        # torch.stft lays frames out outermost: [F, T] with strides (1, F). Read it in that order ([T, F]).
        return abs_complex(torch.view_as_real(spec.transpose(0, 1)).numpy(), float(key.magnitude_eps))


def mel_spectrogram(
    wav: torch.Tensor,
    *,
    sample_rate: int = 24000,
    n_fft: int = 1024,
    hop_length: int = 256,
    win_length: int = 1024,
    n_mels: int = 100,
    fmin: float = 0.0,
    fmax: float | None = 12000.0,
    mel_scale: MelScale = "htk",
    norm: Literal["slaney"] | None = None,
    padding: Padding = "center",
    power: float = 1.0,
    magnitude_eps: float = 0.0,
    log_floor: float = 1e-5,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batched log-mel on wav's device and dtype: [B, N] -> [B, n_mels, T]. Defaults are the vocos mel.

    log(clamp(mel(|STFT| ** power), log_floor)), natural log. For the HiFi-GAN mel use `hifigan_mel_kwargs()`.
    lengths: [B] sample counts of utterances zero-padded into one batch; row b's first
    `stft_num_frames(lengths[b], ...)` frames then equal its mel computed alone (see magnitude_spectrogram).
    """
    mag = magnitude_spectrogram(
        wav, n_fft=n_fft, hop_length=hop_length, win_length=win_length, padding=padding,
        magnitude_eps=magnitude_eps, lengths=lengths,
    )
    if power != 1.0:
        mag = mag.pow(power)
    key = (sample_rate, n_fft, n_mels, float(fmin), None if fmax is None else float(fmax), mel_scale, norm)
    fb = _filterbank_tensor(key, wav.device, wav.dtype)
    return torch.log(torch.clamp(torch.matmul(fb, mag), min=log_floor))


def vocos_mel_kwargs() -> dict:
    """F5-TTS / vocos mel: 24 kHz, n_fft=win=1024, hop 256, 100 HTK bins 0-12 kHz, no norm, magnitude."""
    return dict(
        sample_rate=24000, n_fft=1024, hop_length=256, win_length=1024, n_mels=100, fmin=0.0, fmax=12000.0,
        mel_scale="htk", norm=None, padding="center", power=1.0, magnitude_eps=0.0, log_floor=1e-5,
    )


def hifigan_mel_kwargs() -> dict:
    """HiFi-GAN meldataset.py mel (BigVGAN 22 kHz): 80 slaney bins 0-8 kHz, slaney norm, hifigan padding."""
    return dict(
        sample_rate=22050, n_fft=1024, hop_length=256, win_length=1024, n_mels=80, fmin=0.0, fmax=8000.0,
        mel_scale="slaney", norm="slaney", padding="hifigan", power=1.0, magnitude_eps=1e-9, log_floor=1e-5,
    )


# Version of the offline mel's stored values. 2: computed in float32 (`stft_magnitude`), not float64; values
# move by float32 FFT noise, so shards of version 1 and 2 have different feature hashes and are never mixed.
MEL_VERSION = 2


class _LogMel:
    """One utterance -> {"mel": float32 [n_mels, T]}: `mel_spectrogram`'s maths on CPU in float32, in fewer
    passes (`stft_magnitude`, then the banded mel of audiopipe/features/spectral.py)."""

    kind: str
    specs: tuple[FeatureSpec, ...]

    def __init__(self, defaults: dict, overrides: dict) -> None:
        unknown = set(overrides) - set(defaults)
        if unknown:
            raise WrongType(f"{self.kind}: unknown parameter(s) {sorted(unknown)}; accepted: {sorted(defaults)}")
        p = {**defaults, **overrides}
        # Normalise types so fmin=0 and fmin=0.0 hash alike; resolve fmax=None to the value actually used.
        for k in ("sample_rate", "n_fft", "hop_length", "win_length", "n_mels"):
            p[k] = int(p[k])
        for k in ("fmin", "power", "magnitude_eps", "log_floor"):
            p[k] = float(p[k])
        p["fmax"] = p["sample_rate"] / 2 if p["fmax"] is None else float(p["fmax"])
        if p["win_length"] > p["n_fft"]:
            raise InvalidValue(f"{self.kind}: win_length {p['win_length']} > n_fft {p['n_fft']}")
        if p["padding"] not in ("center", "hifigan"):
            raise InvalidValue(f"{self.kind}: unknown padding {p['padding']!r}: expected 'center' or 'hifigan'")
        if p["hop_length"] <= 0 or p["n_mels"] <= 0:
            raise InvalidValue(f"{self.kind}: hop_length and n_mels must be positive")
        fb = mel_filterbank(p["sample_rate"], p["n_fft"], p["n_mels"], p["fmin"], p["fmax"], p["mel_scale"], p["norm"])
        self._sparse = SparseMel(fb, p["log_floor"])
        self.params = p
        self.specs = (
            FeatureSpec(
                name="mel", kind=self.kind, sample_rate=p["sample_rate"], dtype="float32",
                channels=p["n_mels"], hop_length=p["hop_length"], params=dict(p), version=MEL_VERSION,
            ),
        )

    def num_frames(self, num_samples: int) -> int:
        p = self.params
        return stft_num_frames(num_samples, p["n_fft"], p["hop_length"], p["padding"])

    @property
    def stft_key(self) -> StftKey:
        """The framing of this mel's |STFT|: features with an equal key can share it."""
        p = self.params
        return StftKey(p["sample_rate"], p["n_fft"], p["hop_length"], p["win_length"], p["padding"],
                       p["magnitude_eps"])

    def from_magnitude(self, mag: np.ndarray) -> dict[str, np.ndarray]:
        """The mel of a float32 |STFT| [F, T] from `stft_magnitude(x, self.stft_key)`."""
        if self.params["power"] != 1.0:
            mag = np.power(mag, self.params["power"])
        return {"mel": self._sparse(mag)}

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        return self.from_magnitude(stft_magnitude(check_waveform(wav, self.kind), self.stft_key))


class VocosMel(_LogMel):
    """F5-TTS's vocos mel (name "mel", kind "vocos_mel"); any default can be overridden by keyword."""

    kind = "vocos_mel"

    def __init__(self, **params) -> None:
        super().__init__(vocos_mel_kwargs(), params)


class SlaneyMel(_LogMel):
    """HiFi-GAN / BigVGAN mel (name "mel", kind "slaney_mel"); any default can be overridden by keyword."""

    kind = "slaney_mel"

    def __init__(self, **params) -> None:
        super().__init__(hifigan_mel_kwargs(), params)
