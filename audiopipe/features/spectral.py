"""Compiled kernels of the offline (one utterance, one CPU thread) STFT features, used by `mel.py`.

Trainers call the batched torch functions in `mel.py`; offline extraction spends most of its time in the
magnitude and the mel, so it does the same maths in fewer passes, in float32 (see `mel.stft_magnitude` for
why float32 is the models' own precision):

- `abs_complex` takes sqrt(re^2 + im^2) of torch.stft's float32 output in one pass, reading it in the order
  the FFT wrote it (frames outer) and writing [F, T] with time contiguous, the layout the mel wants.
- `SparseMel` applies the mel filterbank band by band: a triangular filter covers one contiguous run of FFT
  bins, so each mel row is a short sum of weighted magnitude rows (~1,000 multiply-adds a frame for the vocos
  mel instead of the dense matmul's 51,300), and each of those is a multiply-add over all frames at once,
  which the compiler vectorises. Every mel value still sums its bins in ascending bin order, as a dot product
  would, so the result does not depend on the vector width.
- Features with the same framing (`StftKey`) share one magnitude per utterance: the vocos mel and the default
  energy, or the NS2 energy and a mel of the same framing, cost one STFT (audiopipe/shard/build.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np


class StftKey(NamedTuple):
    """Everything that determines a magnitude spectrogram; equal keys give equal magnitudes."""

    sample_rate: int
    n_fft: int
    hop_length: int
    win_length: int
    padding: str  # "center" or "hifigan", as in mel.magnitude_spectrogram
    magnitude_eps: float


@numba.njit(cache=True, nogil=True)
def abs_complex(ri, eps):  # pragma: no cover - numba
    """[T, F, 2] float32 (real, imag), frames outer as torch.stft lays them out -> float32 [F, T]
    sqrt(re^2 + im^2 [+ eps]), time contiguous."""
    T, F = ri.shape[0], ri.shape[1]
    out = np.empty((F, T), dtype=np.float32)
    e = np.float32(eps)
    for t in range(T):
        for k in range(F):
            re = ri[t, k, 0]
            im = ri[t, k, 1]
            # Adding eps = 0 is exact (re^2 + im^2 >= +0), and without a branch the loop vectorises.
            out[k, t] = np.sqrt(re * re + im * im + e)
    return out


@numba.njit(cache=True, nogil=True)
def _band_log_mel(mag, lo, hi, start, w, floor):  # pragma: no cover - numba
    """log(max(W @ mag, floor)) as float32 [n_mels, T] from float32 mag [F, T]; mel j covers bins lo[j]..hi[j]-1,
    whose weights are w[start[j]:start[j] + hi[j] - lo[j]]."""
    T = mag.shape[1]
    n_mels = lo.shape[0]
    out = np.empty((n_mels, T), dtype=np.float32)
    acc = np.empty(T, dtype=np.float32)
    f = np.float32(floor)
    for j in range(n_mels):
        acc[:] = 0
        for k in range(lo[j], hi[j]):
            wk = w[start[j] + k - lo[j]]
            for t in range(T):
                acc[t] += wk * mag[k, t]
        for t in range(T):
            v = acc[t]
            out[j, t] = np.log(v if v > f else f)
    return out


class SparseMel:
    """A dense filterbank [n_mels, F] kept as one contiguous run of weights per mel, applied by `_band_log_mel`."""

    def __init__(self, fb: np.ndarray, log_floor: float) -> None:
        n_mels = fb.shape[0]
        self.lo = np.zeros(n_mels, dtype=np.int64)
        self.hi = np.zeros(n_mels, dtype=np.int64)
        runs = []
        for j in range(n_mels):
            nz = np.flatnonzero(fb[j])
            if len(nz):  # an empty filter (more mels than bins can feed) stays at the floor, as the matmul gives
                self.lo[j], self.hi[j] = nz[0], nz[-1] + 1
            runs.append(fb[j, self.lo[j]:self.hi[j]])
        self.start = np.zeros(n_mels, dtype=np.int64)
        np.cumsum([len(r) for r in runs[:-1]], out=self.start[1:])
        self.w = np.concatenate(runs).astype(np.float32) if runs else np.zeros(0, np.float32)
        self.n_mels, self.log_floor = n_mels, float(log_floor)

    def __call__(self, mag: np.ndarray) -> np.ndarray:
        """float32 |STFT| [F, T] (as `stft_magnitude` returns it) -> float32 log-mel [n_mels, T]."""
        return _band_log_mel(np.ascontiguousarray(mag, dtype=np.float32), self.lo, self.hi, self.start, self.w,
                             self.log_floor)
