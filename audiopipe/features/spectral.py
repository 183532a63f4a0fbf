"""Compiled kernels of the offline (one utterance, one CPU thread) STFT features, used by `mel.py`.

Trainers call the batched torch functions in `mel.py`; offline extraction spends most of its time in the
magnitude and the mel, so it does the same maths in fewer passes:

- `abs_complex` takes sqrt(re^2 + im^2) of torch.stft's float64 output in one pass, in the order the FFT
  wrote it (frames outer), instead of three tensor passes. The magnitudes agree with torch's to 1 ulp of
  float64 (the compiler may fuse a multiply-add).
- `SparseMel` applies the mel filterbank as the sparse matrix it is: a triangular filter covers a few FFT bins
  and every bin feeds at most two filters, so the dense [n_mels, n_fft/2+1] matmul did ~50x the needed work.
  Only the order of a handful of float64 additions differs from BLAS's, far below the float32 the mel is
  stored in (tests/test_features_spectral.py checks it against `mel_spectrogram`).
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
    """[T, F, 2] float64 (real, imag), frames outer as torch.stft lays them out -> [T, F] sqrt(re^2 + im^2 [+ eps])."""
    T, F = ri.shape[0], ri.shape[1]
    out = np.empty((T, F))
    for t in range(T):
        for k in range(F):
            re = ri[t, k, 0]
            im = ri[t, k, 1]
            s = re * re + im * im
            if eps > 0:
                s = s + eps
            out[t, k] = np.sqrt(s)
    return out


@numba.njit(cache=True, nogil=True)
def _sparse_log_mel(mag_t, col_ptr, rows, vals, n_mels, floor):  # pragma: no cover - numba
    """log(max(W @ mag, floor)) as float32 [n_mels, T], from mag_t = mag.T [T, F] and W by columns (CSC).

    Each mel value sums its bins in ascending bin order, as a dot product would."""
    T, F = mag_t.shape
    acc = np.zeros((T, n_mels))
    for t in range(T):
        for k in range(F):
            m = mag_t[t, k]
            for i in range(col_ptr[k], col_ptr[k + 1]):
                acc[t, rows[i]] += vals[i] * m
    out = np.empty((n_mels, T), dtype=np.float32)
    for j in range(n_mels):
        for t in range(T):
            v = acc[t, j]
            out[j, t] = np.log(v if v > floor else floor)
    return out


class SparseMel:
    """A dense filterbank [n_mels, F] kept as CSC arrays and applied by `_sparse_log_mel`."""

    def __init__(self, fb: np.ndarray, log_floor: float) -> None:
        n_mels = fb.shape[0]
        cols = [np.flatnonzero(fb[:, k]) for k in range(fb.shape[1])]
        self.col_ptr = np.zeros(fb.shape[1] + 1, dtype=np.int64)
        np.cumsum([len(c) for c in cols], out=self.col_ptr[1:])
        self.rows = np.concatenate(cols).astype(np.int64) if cols else np.zeros(0, np.int64)
        self.vals = np.concatenate([fb[c, k] for k, c in enumerate(cols)]) if cols else np.zeros(0)
        self.n_mels, self.log_floor = n_mels, float(log_floor)

    def __call__(self, mag: np.ndarray) -> np.ndarray:
        """float64 |STFT| [F, T] (best as the transposed view `stft_magnitude` returns) -> float32 [n_mels, T]."""
        return _sparse_log_mel(np.ascontiguousarray(mag.T), self.col_ptr, self.rows, self.vals, self.n_mels,
                               self.log_floor)
