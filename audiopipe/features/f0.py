"""F0 (Hz) and a voicing flag per frame: a fast YIN + Viterbi tracker, and pyworld / Praat reference backends.

Every backend yields frames centred at t * hop (t = 0 .. N // hop), i.e. exactly N // hop + 1 frames, the
framing of a centred STFT with the same hop, so F0 lines up with the mel of the same hop.

The default backend "yin" (design and accuracy in docs/features.md):
  1. resample to 8 kHz (soxr; enough bandwidth for F0 <= 1100 Hz and its first harmonics);
  2. YIN's cumulative-mean-normalised difference (CMNDF) for every frame and lag, with the window sums
     taken from per-lag running sums over the signal, so the cost is O(samples x lags) whatever the
     window length or hop (numba, one thread);
  3. per frame the best few CMNDF dips (parabolic interpolation, a small bias towards short lags so that
     pure tones do not fall to sub-harmonics) plus an "unvoiced" state;
  4. Viterbi over those states: octave jumps and voicing switches cost, so the track is continuous and
     isolated voicing blips vanish; "unvoiced" costs less the further a frame lies below the clip's loudest
     frame (as in Praat's voicing decision), so breathy onsets and vowel decays are not voiced.
"""

from __future__ import annotations

import math
from typing import Literal

import numba
import numpy as np
import soxr

from audiopipe.features.base import FeatureSpec
from audiopipe.features.pcm import check_waveform

Backend = Literal["yin", "dio", "harvest", "praat"]
BACKENDS: tuple[str, ...] = ("yin", "dio", "harvest", "praat")

# Tuning of the "yin" backend. The voicing costs were chosen on the held-in split of the consensus reference
# (tests/data/f0_reference.npz: frames where Praat 50-1100 and CREPE agree) and checked on its held-out split
# (docs/features.md); the candidate search on tones, chirps and harvest. Changing any of these changes the
# output: bump F0_VERSION.
F0_VERSION = 3
YIN_RATE = 8000  # analysis rate (Hz)
YIN_WINDOW_S = 0.040  # integration window of the difference function
YIN_CANDIDATES = 6  # CMNDF dips kept per frame
YIN_LAG_BIAS = 0.08  # cost per octave below a frame's shortest candidate, so the shortest of equally good periods wins
YIN_UNVOICED_COST = 0.7  # local cost of "unvoiced" (a voiced candidate's cost is its CMNDF value) ...
YIN_QUIET_DB = -20.0  # ... in frames within this of the clip's loudest frame (window level, dB); below it ...
YIN_QUIET_SLOPE = 1.0  # ... "unvoiced" gets this much cheaper per 10 dB
YIN_OCTAVE_COST = 3.0  # transition cost per octave of F0 change between consecutive frames
YIN_SWITCH_COST = 0.4  # transition cost of a voiced <-> unvoiced switch
YIN_REFINE_ABOVE_HZ = 400.0  # voiced frames above this are re-located on the input-rate signal
YIN_REFINE_WINDOW_S = 0.010
YIN_SILENCE_DB = -70.0  # frames quieter than this (RMS re full scale, DC removed) are unvoiced
YIN_HIGH_HZ = 400.0  # candidates above this pay ...
YIN_HIGH_COST = 0.3  # ... this much per octave above it, in full where the CMNDF dip is above ...
YIN_HIGH_CLEAN = 0.1  # ... this (a clean periodic high sound, a tone or a child's vowel, pays less)
_BLOCK_FRAMES = 256  # frames per block: keeps the running-sum buffer in cache and memory O(K) per frame


@numba.njit(cache=True, nogil=True)
def _yin_candidates(x, centers, W, tau_min, tau_max, K, lag_bias):  # pragma: no cover - numba
    """Per frame: K best CMNDF dips (lags, costs) in [tau_min, tau_max] and the window's energy.

    x is zero padded so every index used exists. For lag tau the compared windows are
    x[s : s + W] and x[s + tau : s + tau + W] with s = c - W // 2 - tau // 2: centred on the frame.
    """
    T = centers.shape[0]
    n_lags = tau_max + 2  # one lag past tau_max for the parabola
    lags = np.zeros((T, K))
    costs = np.full((T, K), np.inf)
    energy = np.zeros(T)
    half_w = W // 2
    margin = half_w + n_lags // 2 + W + n_lags + 2
    d = np.empty((_BLOCK_FRAMES, n_lags))
    for b0 in range(0, T, _BLOCK_FRAMES):
        b1 = min(T, b0 + _BLOCK_FRAMES)
        lo = centers[b0] - margin
        hi = centers[b1 - 1] + margin
        L = hi - lo
        sq = np.zeros(L + 1)
        sm = np.zeros(L + 1)
        acc = 0.0
        acc1 = 0.0
        for j in range(L):
            v = x[lo + j]
            acc += v * v
            acc1 += v
            sq[j + 1] = acc
            sm[j + 1] = acc1
        for t in range(b0, b1):
            s = centers[t] - half_w - lo
            e = sq[s + W] - sq[s]
            m = sm[s + W] - sm[s]
            energy[t] = max(e - m * m / W, 0.0)
        # Running sums of x[j] * x[j + tau]. One running sum is a chain of dependent adds, bound by the add's
        # latency: four lags per pass, each split into even- and odd-sample sums, make eight independent chains
        # (~1.3x faster than four). Only the sums at window edges are kept (two per frame), not a prefix array.
        # Lags 2m..2m+3 share a pass, so their windows start at only two offsets, m and m + 1 samples before
        # the frame's base.
        base = np.empty(2 * (b1 - b0), np.int64)
        for t in range(b0, b1):
            base[2 * (t - b0)] = centers[t] - half_w - lo
            base[2 * (t - b0) + 1] = centers[t] - half_w - lo + W
        order = np.argsort(base, kind="mergesort")
        nq = 0
        Q = np.empty(len(base), np.int64)
        where = np.empty(len(base), np.int64)
        for i in range(len(order)):
            p = base[order[i]]
            if nq == 0 or Q[nq - 1] != p:
                Q[nq] = p
                nq += 1
            where[order[i]] = nq - 1
        rec = np.empty((4, nq))
        for tau0 in range(0, n_lags, 4):
            m0 = tau0 // 2
            a0 = 0.0
            a1 = 0.0
            a2 = 0.0
            a3 = 0.0
            c0 = 0.0
            c1 = 0.0
            c2 = 0.0
            c3 = 0.0
            j = Q[0] - m0 - 1
            for i in range(nq):
                stop = Q[i] - m0 - 1
                while j + 3 < stop:  # four samples a step: even samples into a*, odd into c*, two products each
                    xj = x[lo + j]
                    xn = x[lo + j + 1]
                    xp = x[lo + j + 2]
                    xq = x[lo + j + 3]
                    k = lo + j + tau0
                    y0 = x[k]
                    y1 = x[k + 1]
                    y2 = x[k + 2]
                    y3 = x[k + 3]
                    y4 = x[k + 4]
                    y5 = x[k + 5]
                    y6 = x[k + 6]
                    a0 += xj * y0 + xp * y2
                    a1 += xj * y1 + xp * y3
                    a2 += xj * y2 + xp * y4
                    a3 += xj * y3 + xp * y5
                    c0 += xn * y1 + xq * y3
                    c1 += xn * y2 + xq * y4
                    c2 += xn * y3 + xq * y5
                    c3 += xn * y4 + xq * y6
                    j += 4
                while j + 1 < stop:
                    xj = x[lo + j]
                    xn = x[lo + j + 1]
                    k = lo + j + tau0
                    y1 = x[k + 1]
                    y2 = x[k + 2]
                    y3 = x[k + 3]
                    a0 += xj * x[k]
                    a1 += xj * y1
                    a2 += xj * y2
                    a3 += xj * y3
                    c0 += xn * y1
                    c1 += xn * y2
                    c2 += xn * y3
                    c3 += xn * x[k + 4]
                    j += 2
                if j < stop:
                    xj = x[lo + j]
                    k = lo + j + tau0
                    a0 += xj * x[k]
                    a1 += xj * x[k + 1]
                    a2 += xj * x[k + 2]
                    a3 += xj * x[k + 3]
                    j += 1
                # prefix up to (not including) stop: the window edge of lags 2m0+2, 2m0+3 (offset m0 + 1)
                rec[2, i] = a2 + c2
                rec[3, i] = a3 + c3
                xj = x[lo + j]
                k = lo + j + tau0
                a0 += xj * x[k]
                a1 += xj * x[k + 1]
                a2 += xj * x[k + 2]
                a3 += xj * x[k + 3]
                j += 1
                # one sample further: the window edge of lags 2m0, 2m0+1 (offset m0)
                rec[0, i] = a0 + c0
                rec[1, i] = a1 + c1
            for q in range(4):
                tau = tau0 + q
                if tau >= n_lags or tau == 0:
                    continue
                off = half_w + tau // 2
                for t in range(b0, b1):
                    s = centers[t] - off - lo
                    r = rec[q, where[2 * (t - b0) + 1]] - rec[q, where[2 * (t - b0)]]
                    e1 = sq[s + W] - sq[s]
                    e2 = sq[s + tau + W] - sq[s + tau]
                    v = e1 + e2 - 2.0 * r
                    d[t - b0, tau] = v if v > 0.0 else 0.0
        for t in range(b0, b1):
            row = d[t - b0]
            # Cumulative-mean normalisation in place (YIN step 3); d'(tau) = 1 where the running sum is 0.
            run = 0.0
            for tau in range(1, n_lags):
                run += row[tau]
                row[tau] = row[tau] * tau / run if run > 0.0 else 1.0
            n = 0
            for tau in range(tau_min, tau_max + 1):
                v = row[tau]
                if tau > tau_min and row[tau - 1] < v:
                    continue
                if row[tau + 1] <= v:
                    continue
                a = row[tau - 1]
                g = row[tau + 1]
                den = a - 2.0 * v + g
                frac = 0.0
                if den > 0.0:
                    frac = 0.5 * (a - g) / den
                    # The parabola's minimum, not the sampled value: at lags of ~8 samples a dip that falls
                    # between two samples would otherwise look shallower than its sub-harmonic's.
                    v = max(v - 0.25 * (a - g) * frac, 0.0)
                cost = v + lag_bias * math.log2(tau / tau_min)
                if n < K:
                    pos = n
                    n += 1
                elif cost < costs[t, K - 1]:
                    pos = K - 1
                else:
                    continue
                while pos > 0 and costs[t, pos - 1] > cost:
                    costs[t, pos] = costs[t, pos - 1]
                    lags[t, pos] = lags[t, pos - 1]
                    pos -= 1
                costs[t, pos] = cost
                lags[t, pos] = tau + frac
    return lags, costs, energy


@numba.njit(cache=True, nogil=True)
def _viterbi(lags, costs, unvoiced_cost, octave_cost, switch_cost):  # pragma: no cover - numba
    """Cheapest state path; states 0..K-1 are the frame's candidates, state K is unvoiced (cost per frame)."""
    T, K = lags.shape
    S = K + 1
    acc = np.empty(S)
    new = np.empty(S)
    back = np.zeros((T, S), np.int8)
    for k in range(K):
        acc[k] = costs[0, k]
    acc[K] = unvoiced_cost[0]
    for t in range(1, T):
        for k in range(S):
            local = unvoiced_cost[t] if k == K else costs[t, k]
            best = np.inf
            arg = K
            if local < np.inf:
                for j in range(S):
                    if acc[j] == np.inf:
                        continue
                    if k == K and j == K:
                        tr = 0.0
                    elif k == K or j == K:
                        tr = switch_cost
                    else:
                        tr = octave_cost * abs(math.log2(lags[t, k] / lags[t - 1, j]))
                    if acc[j] + tr < best:
                        best = acc[j] + tr
                        arg = j
            new[k] = best + local
            back[t, k] = arg
        for k in range(S):
            acc[k] = new[k]
    path = np.empty(T, np.int64)
    b = K
    for k in range(S):
        if acc[k] < acc[b]:
            b = k
    path[T - 1] = b
    for t in range(T - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


@numba.njit(cache=True, nogil=True)
def _refine_lags(x, centers, lags, W):  # pragma: no cover - numba
    """Re-locate each lag > 0 (in samples of x) on x itself: parabola through the difference function
    at the three integer lags around it, windows centred on the frame as in _yin_candidates."""
    out = lags.copy()
    half_w = W // 2
    dv = np.empty(3)
    for t in range(lags.shape[0]):
        if lags[t] <= 0.0:
            continue
        tc = int(round(lags[t]))
        if tc < 2:
            continue
        for i in range(3):
            tau = tc - 1 + i
            s = centers[t] - half_w - tau // 2
            acc = 0.0
            for j in range(s, s + W):
                diff = x[j] - x[j + tau]
                acc += diff * diff
            dv[i] = acc
        den = dv[0] - 2.0 * dv[1] + dv[2]
        if den > 0.0 and dv[1] <= dv[0] and dv[1] <= dv[2]:
            out[t] = tc + 0.5 * (dv[0] - dv[2]) / den
    return out


def _candidate_costs(lags: np.ndarray, costs: np.ndarray, rate: int, tau_min: int) -> np.ndarray:
    """Local cost of each voiced candidate: its CMNDF dip (with the lag bias of _yin_candidates), less the bias of the
    frame's shortest candidate, plus a cost for F0 above YIN_HIGH_HZ.

    The lag bias is there to rank a frame's candidates (of several equally good periods the shortest wins, against
    sub-harmonic errors); measured from tau_min it would also make every low voice look less periodic than a high
    one, and so unvoiced. Speaking voices rarely go above ~400 Hz, while a whistle, a fricative's resonance or a
    codec artefact easily shows a short-lag dip: those pay per octave above it, scaled down for dips close to 0 (a
    pure 1 kHz tone, whose sub-harmonics are as deep, keeps its own period).
    """
    ok = np.isfinite(costs) & (lags > 0.0)
    costs = np.where(ok, costs, np.inf)
    shortest = np.min(np.where(ok, lags, np.inf), axis=1)
    shortest = np.where(np.isfinite(shortest), shortest, tau_min)
    f0 = rate / np.where(ok, lags, 1.0)
    dip = np.clip((costs - YIN_LAG_BIAS * np.log2(np.where(ok, lags, tau_min) / tau_min)) / YIN_HIGH_CLEAN, 0.0, 1.0)
    costs = costs - (YIN_LAG_BIAS * np.log2(shortest / tau_min))[:, None]
    return costs + dip * YIN_HIGH_COST * np.maximum(0.0, np.log2(f0 / YIN_HIGH_HZ))


def _unvoiced_costs(level_db: np.ndarray) -> np.ndarray:
    """Per-frame cost of "unvoiced": cheaper the further a frame lies below YIN_QUIET_DB re the clip's loudest frame.

    Periodicity alone cannot tell a breathy onset or the decay of a vowel from voiced speech (both have clear
    CMNDF dips); Praat's voicing decision weighs a frame's level against the clip's peak for the same reason.
    """
    rel = level_db - level_db.max()
    return YIN_UNVOICED_COST - YIN_QUIET_SLOPE * np.maximum(0.0, (YIN_QUIET_DB - rel) / 10.0)


def _yin_track(wav: np.ndarray, sr: int, hop: int, fmin: float, fmax: float) -> tuple[np.ndarray, np.ndarray]:
    T = len(wav) // hop + 1
    rate = min(YIN_RATE, sr)
    x = soxr.resample(wav, sr, rate) if rate != sr else wav
    tau_min = max(2, int(math.floor(rate / fmax)))
    tau_max = int(math.ceil(rate / fmin))
    W = int(round(YIN_WINDOW_S * rate))
    pad = W + tau_max + 4
    margin = W // 2 + (tau_max + 2) // 2 + W + tau_max + 4
    xp = np.zeros(len(x) + 2 * (pad + margin))
    xp[pad + margin : pad + margin + len(x)] = x
    centers = np.rint(np.arange(T) * (hop * rate / sr)).astype(np.int64)
    # Frames whose longest-lag window would stick out of the clip analyse the nearest window that fits:
    # half a window of padding zeros biases the difference function (a tone's edge frames drift ~1 %).
    reach = W // 2 + (tau_max + 2) // 2 + 2
    centers = np.clip(centers, min(reach, len(x) // 2), max(len(x) - reach, len(x) // 2)) + pad + margin
    lags, costs, energy = _yin_candidates(xp, centers, W, tau_min, tau_max, YIN_CANDIDATES, YIN_LAG_BIAS)
    costs = _candidate_costs(lags, costs, rate, tau_min)
    level_db = 10.0 * np.log10(energy / W + 1e-20)
    costs[level_db < YIN_SILENCE_DB] = np.inf
    path = _viterbi(lags, costs, _unvoiced_costs(level_db), YIN_OCTAVE_COST, YIN_SWITCH_COST)
    voiced = path < YIN_CANDIDATES
    lag = lags[np.arange(T), np.minimum(path, YIN_CANDIDATES - 1)]
    f0 = np.zeros(T)
    f0[voiced] = rate / lag[voiced]
    high = voiced & (f0 > YIN_REFINE_ABOVE_HZ)
    if sr > rate and high.any():
        f0[high] = _refine_at_input_rate(wav, sr, hop, f0, high)
    f0[voiced] = np.clip(f0[voiced], fmin, fmax)
    return f0, voiced


def _refine_at_input_rate(wav: np.ndarray, sr: int, hop: int, f0: np.ndarray, which: np.ndarray) -> np.ndarray:
    # Lags of high voices are only ~8-20 samples at 8 kHz, where the parabola is off by up to ~1 %.
    W = int(round(YIN_REFINE_WINDOW_S * sr))
    max_lag = int(math.ceil(sr / YIN_REFINE_ABOVE_HZ)) + 2
    reach = W // 2 + max_lag // 2 + 2
    pad = W + max_lag + 4
    xp = np.zeros(len(wav) + 2 * pad)
    xp[pad : pad + len(wav)] = wav
    idx = np.flatnonzero(which)
    centers = np.clip(idx * hop, min(reach, len(wav) // 2), max(len(wav) - reach, len(wav) // 2)) + pad
    lags = _refine_lags(xp, centers.astype(np.int64), sr / f0[idx], W)
    return sr / lags


def _fit_length(f0: np.ndarray, T: int) -> np.ndarray:
    # pyworld counts frames with floating point (N / frame_period): off by one either way is possible.
    if len(f0) >= T:
        return f0[:T]
    return np.concatenate([f0, np.full(T - len(f0), f0[-1] if len(f0) else 0.0)])


def _pyworld_track(wav: np.ndarray, sr: int, hop: int, fmin: float, fmax: float, algo: str) -> np.ndarray:
    try:
        import pyworld
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"f0 backend {algo!r} needs pyworld: pip install 'audiopipe[reference]'") from e
    x = wav.astype(np.float64)
    period_ms = 1000.0 * hop / sr
    if algo == "dio":
        f0, t = pyworld.dio(x, sr, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms)
        f0 = pyworld.stonemask(x, f0, t, sr)
    else:
        f0, _ = pyworld.harvest(x, sr, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms)
    return _fit_length(f0, len(wav) // hop + 1)


def _praat_track(wav: np.ndarray, sr: int, hop: int, fmin: float, fmax: float) -> np.ndarray:
    try:
        import parselmouth
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("f0 backend 'praat' needs praat-parselmouth: pip install 'audiopipe[reference]'") from e
    T = len(wav) // hop + 1
    # Praat only places frames whose 3-period window fits in the sound: pad so every centre t*hop is covered.
    pad = int(math.ceil(1.5 / fmin * sr)) + hop
    x = np.concatenate([np.zeros(pad), wav.astype(np.float64), np.zeros(pad)])
    pitch = parselmouth.Sound(x, sampling_frequency=sr).to_pitch_ac(
        time_step=hop / sr, pitch_floor=fmin, pitch_ceiling=fmax
    )
    freq = pitch.selected_array["frequency"]
    times = pitch.xs() - pad / sr
    want = np.arange(T) * hop / sr
    # Voicing from the nearest Praat frame; F0 linearly interpolated when both neighbours are voiced.
    right = np.clip(np.searchsorted(times, want), 1, len(times) - 1)
    left = right - 1
    w = np.clip((want - times[left]) / (times[right] - times[left]), 0.0, 1.0)
    nearest = np.where(w < 0.5, left, right)
    f0 = freq[nearest].copy()
    both = (freq[left] > 0) & (freq[right] > 0)
    f0[both] = (1 - w[both]) * freq[left][both] + w[both] * freq[right][both]
    f0[freq[nearest] <= 0] = 0.0
    return f0


def interpolate_unvoiced(f0: np.ndarray, voiced: np.ndarray, fill_hz: float) -> np.ndarray:
    """Linear interpolation through unvoiced frames, edges held; all-unvoiced gives fill_hz everywhere."""
    if not voiced.any():
        return np.full(len(f0), fill_hz, dtype=f0.dtype)
    idx = np.flatnonzero(voiced)
    return np.interp(np.arange(len(f0)), idx, f0[idx]).astype(f0.dtype)


class F0:
    """{"f0": float32 [T] Hz, "voiced": uint8 [T]} with T = N // hop_length + 1 (frames centred at t * hop).

    interpolate=False: f0 is 0 on unvoiced frames. interpolate=True (NaturalSpeech 2): f0 is linearly
    interpolated through unvoiced frames with the edges held, so f0 > 0 everywhere; a clip with no voiced
    frame gets f0 = fmin on every frame (and voiced all 0).
    """

    kind = "f0"

    def __init__(
        self,
        sample_rate: int = 24000,
        hop_length: int = 256,
        fmin: float = 50.0,
        fmax: float = 1100.0,
        interpolate: bool = False,
        backend: Backend = "yin",
    ) -> None:
        sample_rate, hop_length, fmin, fmax = int(sample_rate), int(hop_length), float(fmin), float(fmax)
        if backend not in BACKENDS:
            raise ValueError(f"f0: unknown backend {backend!r}; expected one of {BACKENDS}")
        if hop_length <= 0 or sample_rate <= 0:
            raise ValueError(f"f0: sample_rate and hop_length must be positive, got {sample_rate}, {hop_length}")
        if not 0 < fmin < fmax:
            raise ValueError(f"f0: need 0 < fmin < fmax, got fmin={fmin} fmax={fmax}")
        if fmax >= min(sample_rate, YIN_RATE) / 2:
            raise ValueError(f"f0: fmax {fmax} Hz must be below the analysis Nyquist {min(sample_rate, YIN_RATE) / 2}")
        self.sample_rate, self.hop_length, self.fmin, self.fmax = sample_rate, hop_length, fmin, fmax
        self.interpolate, self.backend = bool(interpolate), backend
        params = {
            "sample_rate": sample_rate, "hop_length": hop_length, "fmin": fmin, "fmax": fmax,
            "interpolate": self.interpolate, "backend": backend,
        }
        common = dict(kind=self.kind, sample_rate=sample_rate, channels=0, hop_length=hop_length, version=F0_VERSION)
        self.specs = (
            FeatureSpec(name="f0", dtype="float32", params=dict(params), **common),
            FeatureSpec(name="voiced", dtype="uint8", params=dict(params), **common),
        )

    def num_frames(self, num_samples: int) -> int:
        return num_samples // self.hop_length + 1

    def __call__(self, wav: np.ndarray) -> dict[str, np.ndarray]:
        x = check_waveform(wav, self.kind)
        args = (x, self.sample_rate, self.hop_length, self.fmin, self.fmax)
        if self.backend == "yin":
            f0, voiced = _yin_track(*args)
        else:
            f0 = _praat_track(*args) if self.backend == "praat" else _pyworld_track(*args, algo=self.backend)
            voiced = f0 > 0
        f0 = np.where(voiced, f0, 0.0).astype(np.float32)
        if self.interpolate:
            f0 = interpolate_unvoiced(f0, voiced, self.fmin)
        return {"f0": f0, "voiced": voiced.astype(np.uint8)}
