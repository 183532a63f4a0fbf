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
     frame, so breathy onsets and vowel decays are not voiced;
  5. a second opinion on voicing: Praat's autocorrelation voicing measure (Hann window of 3 periods of fmin,
     normalised autocorrelation peak near the lag step 4 chose, against a threshold raised in frames far below
     the clip's peak), one window and a few lags per frame; "unvoiced" is priced by it and step 4 runs again.
"""

from __future__ import annotations

import functools
import math
from typing import Literal

import numba
import numpy as np
import soxr

from audiopipe.errors import Failed, InvalidValue, MissingExtra
from audiopipe.features.base import FeatureSpec
from audiopipe.features.pcm import check_waveform

Backend = Literal["yin", "dio", "harvest", "praat"]
BACKENDS: tuple[str, ...] = ("yin", "dio", "harvest", "praat")

# Tuning of the "yin" backend. The voicing constants (YIN_UNVOICED_COST, YIN_SWITCH_COST,
# YIN_VOICING_WEIGHT) were chosen on the dev sources of the real read speech set and the held-in split of the first
# set, never on their test / held-out parts (docs/features.md); the candidate search on tones, chirps and harvest.
# Changing any of these changes the output: bump F0_VERSION.
F0_VERSION = 5
YIN_RATE = 8000  # analysis rate (Hz)
YIN_WINDOW_S = 0.040  # integration window of the difference function
YIN_CANDIDATES = 6  # CMNDF dips kept per frame
YIN_LAG_BIAS = 0.08  # cost per octave below a frame's shortest candidate, so the shortest of equally good periods wins,
YIN_LAG_BIAS_OCTAVES = 1.0  # ... counted up to this many octaves (a low voice's true period lies 2-3 octaves below
# its first formant's ringing, which a creaky or telephone-band male voice shows as a short-lag dip: see _candidate_costs)
YIN_UNVOICED_COST = 0.5  # local cost of "unvoiced" (a voiced candidate's cost is its CMNDF value) ...
YIN_QUIET_DB = -20.0  # ... in frames within this of the clip's loudest frame (window level, dB); below it ...
YIN_QUIET_SLOPE = 1.0  # ... "unvoiced" gets this much cheaper per 10 dB
YIN_OCTAVE_COST = 3.0  # transition cost per octave of F0 change between consecutive frames
YIN_SWITCH_COST = 0.2  # transition cost of a voiced <-> unvoiced switch
YIN_REFINE_ABOVE_HZ = 400.0  # voiced frames above this are re-located on the input-rate signal
YIN_REFINE_WINDOW_S = 0.010
YIN_SILENCE_DB = -70.0  # frames quieter than this (RMS re full scale, DC removed) are unvoiced
YIN_HIGH_HZ = 400.0  # candidates above this pay ...
YIN_HIGH_COST = 0.3  # ... this much per octave above it, in full where the CMNDF dip is above ...
YIN_HIGH_CLEAN = 0.1  # ... this (a clean periodic high sound, a tone or a child's vowel, pays less)
# Second voicing opinion (Praat's autocorrelation voicing measure at the first pass's lag): "unvoiced" costs
# YIN_VOICING_WEIGHT x (Praat's voiced strength - its unvoiced strength) more, so it is cheaper where Praat's measure
# says unvoiced and dearer where it says voiced.
YIN_VOICING_WEIGHT = 4.0
YIN_VOICING_PERIODS = 3.0  # window: this many periods of fmin (Praat's default for the autocorrelation method)
YIN_VOICING_SEARCH = 0.1  # the autocorrelation peak is looked for within +-10 % of the first pass's lag
PRAAT_VOICING_THRESHOLD = 0.45  # Praat's defaults (Sound: To Pitch (ac)...)
PRAAT_SILENCE_THRESHOLD = 0.03
PRAAT_OCTAVE_COST = 0.01
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


@numba.njit(cache=True, nogil=True)
def _lag_product(y, n, tau):  # pragma: no cover - numba
    acc = 0.0
    for i in range(n - tau):
        acc += y[i] * y[i + tau]
    return acc


@numba.njit(cache=True, nogil=True)
def _periodicity(x, centers, lags, w, rw, n_mean, n_peak, tau_lo, tau_hi, fmax_lag):  # pragma: no cover - numba
    """Praat's autocorrelation voicing evidence at one lag per frame: (strength, local peak).

    Per frame with lags[t] > 0: the window x[c - n/2 : c + n/2] less its local mean (over c +- n_mean), times the Hann
    window w; its autocorrelation r(tau) / r(0), divided by the window's own (rw), is climbed from round(lags[t]) to the
    nearest local maximum within YIN_VOICING_SEARCH of lags[t]; strength is that maximum (parabola; values above 1
    reflected, as Praat does) less PRAAT_OCTAVE_COST per octave below fmax (fmax_lag), or -1 where there is no maximum
    above half Praat's voicing threshold (Praat registers no candidate there). Local peak: the largest |windowed
    sample| within n_peak of the centre.
    """
    T = centers.shape[0]
    n = w.shape[0]
    half = n // 2
    strength = np.full(T, -1.0)
    peak = np.zeros(T)
    y = np.empty(n)
    cs = np.empty(x.shape[0] + 1)
    cs[0] = 0.0
    acc = 0.0
    for j in range(x.shape[0]):
        acc += x[j]
        cs[j + 1] = acc
    for t in range(T):
        lag = lags[t]
        if lag <= 0.0:
            continue
        c = centers[t]
        mean = (cs[c + n_mean] - cs[c - n_mean]) / (2 * n_mean)
        s0 = c - half
        e0 = 0.0
        for i in range(n):
            v = (x[s0 + i] - mean) * w[i]
            y[i] = v
            e0 += v * v
        pk = 0.0
        for i in range(half - n_peak, half + n_peak):
            a = abs(y[i])
            if a > pk:
                pk = a
        peak[t] = pk
        if e0 <= 0.0:
            continue
        lo = max(tau_lo, int(lag * (1.0 - YIN_VOICING_SEARCH)))
        hi = min(tau_hi, int(lag * (1.0 + YIN_VOICING_SEARCH)) + 1)
        k = min(max(int(round(lag)), lo), hi)
        rm = 0.0  # r(k - 1), r(k), r(k + 1) in one pass
        r0 = 0.0
        rp = 0.0
        for i in range(n - k - 1):
            v = y[i]
            rm += v * y[i + k - 1]
            r0 += v * y[i + k]
            rp += v * y[i + k + 1]
        rm += y[n - k - 1] * y[n - 2] + y[n - k] * y[n - 1]
        r0 += y[n - k - 1] * y[n - 1]
        rm /= e0 * rw[k - 1]
        r0 /= e0 * rw[k]
        rp /= e0 * rw[k + 1]
        while rp > r0 and k < hi:
            k += 1
            rm, r0 = r0, rp
            rp = _lag_product(y, n, k + 1) / (e0 * rw[k + 1])
        while rm > r0 and k > lo:
            k -= 1
            rp, r0 = r0, rm
            rm = _lag_product(y, n, k - 1) / (e0 * rw[k - 1])
        if r0 < rm or r0 < rp or r0 <= 0.5 * PRAAT_VOICING_THRESHOLD:
            continue
        den = rm - 2.0 * r0 + rp
        frac = 0.5 * (rm - rp) / den if den < 0.0 else 0.0
        val = r0 - 0.25 * (rm - rp) * frac
        if val > 1.0:
            val = 1.0 / val
        strength[t] = val - PRAAT_OCTAVE_COST * math.log2((k + frac) / fmax_lag)
    return strength, peak


def _candidate_costs(lags: np.ndarray, costs: np.ndarray, rate: int, tau_min: int) -> np.ndarray:
    """Local cost of each voiced candidate: its CMNDF dip (with the lag bias of _yin_candidates), less the bias of the
    frame's shortest candidate, plus a cost for F0 above YIN_HIGH_HZ.

    The lag bias is there to rank a frame's candidates (of several equally good periods the shortest wins, against
    sub-harmonic errors); measured from tau_min it would also make every low voice look less periodic than a high
    one, and so unvoiced. Speaking voices rarely go above ~400 Hz, while a whistle, a fricative's resonance or a
    codec artefact easily shows a short-lag dip: those pay per octave above it, scaled down for dips close to 0 (a
    pure 1 kHz tone, whose sub-harmonics are as deep, keeps its own period).

    The bias stops growing after YIN_LAG_BIAS_OCTAVES: one octave is all a sub-harmonic needs to lose, while a low male
    voice (80-100 Hz; creaky, or with little energy at F0 in a telephone band) often shows its first formant's ringing
    (500-700 Hz, within each glottal pulse) as a dip about as deep as the true period's, three octaves shorter: a bias
    growing by octave would hand that frame, and through the octave cost the whole voiced run, to the ringing.
    """
    ok = np.isfinite(costs) & (lags > 0.0)
    costs = np.where(ok, costs, np.inf)
    shortest = np.min(np.where(ok, lags, np.inf), axis=1)
    shortest = np.where(np.isfinite(shortest), shortest, tau_min)
    f0 = rate / np.where(ok, lags, 1.0)
    raw = costs - YIN_LAG_BIAS * np.log2(np.where(ok, lags, tau_min) / tau_min)
    dip = np.clip(raw / YIN_HIGH_CLEAN, 0.0, 1.0)
    octaves = np.log2(np.where(ok, lags, tau_min) / shortest[:, None])
    costs = raw + YIN_LAG_BIAS * np.minimum(octaves, YIN_LAG_BIAS_OCTAVES)
    return costs + dip * YIN_HIGH_COST * np.maximum(0.0, np.log2(f0 / YIN_HIGH_HZ))


def _unvoiced_costs(level_db: np.ndarray) -> np.ndarray:
    """Per-frame cost of "unvoiced": cheaper the further a frame lies below YIN_QUIET_DB re the clip's loudest frame.

    Periodicity alone cannot tell a breathy onset or the decay of a vowel from voiced speech (both have clear
    CMNDF dips); Praat's voicing decision weighs a frame's level against the clip's peak for the same reason.
    """
    rel = level_db - level_db.max()
    return YIN_UNVOICED_COST - YIN_QUIET_SLOPE * np.maximum(0.0, (YIN_QUIET_DB - rel) / 10.0)


@functools.lru_cache(maxsize=8)
def _hann_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Praat's Hann window of n samples and its normalised autocorrelation (r_w(tau) / r_w(0), tau = 0..n-1)."""
    w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(1, n + 1) / (n + 1))
    spec = np.fft.rfft(w, 2 * n)
    rw = np.fft.irfft(spec.real**2 + spec.imag**2, 2 * n)[:n]
    return w, rw / rw[0]


@numba.njit(cache=True, nogil=True)
def _window_energy(x, centers, n):  # pragma: no cover - numba
    """Mean square of x (its mean removed) over [c - n/2, c - n/2 + n) for each centre c (clipped to the signal);
    centres ascending. One pass: sums of x and x^2 are read off at the window edges as it goes."""
    N = x.shape[0]
    T = centers.shape[0]
    s1 = np.zeros(2 * T)  # running sums at window starts (even) and ends (odd)
    s2 = np.zeros(2 * T)
    a1 = 0.0
    a2 = 0.0
    j = 0
    ia = 0  # next window start to record
    ib = 0  # next window end to record
    while ia < T or ib < T:
        pa = min(max(centers[ia] - n // 2, 0), N) if ia < T else N + 1
        pb = min(max(centers[ib] - n // 2 + n, 0), N) if ib < T else N + 1
        p = min(pa, pb)
        while j < p:
            v = x[j]
            a1 += v
            a2 += v * v
            j += 1
        if pa == p:
            s1[2 * ia] = a1
            s2[2 * ia] = a2
            ia += 1
        else:
            s1[2 * ib + 1] = a1
            s2[2 * ib + 1] = a2
            ib += 1
    while j < N:
        a1 += x[j]
        j += 1
    mean = a1 / max(N, 1)
    out = np.empty(T)
    for t in range(T):
        d1 = s1[2 * t + 1] - s1[2 * t]
        d2 = s2[2 * t + 1] - s2[2 * t]
        out[t] = max(d2 - 2.0 * mean * d1 + (min(max(centers[t] - n // 2 + n, 0), N)
                                              - min(max(centers[t] - n // 2, 0), N)) * mean * mean, 0.0) / n
    return out


def _voicing_margin(wav: np.ndarray, sr: int, x: np.ndarray, xp: np.ndarray, offset: int, rate: int, hop: int,
                    lags: np.ndarray, fmin: float, fmax: float) -> np.ndarray:
    """Per frame: Praat's voiced strength at the frame's lag (0 = none) less its unvoiced strength, on x (wav at rate;
    xp: x with at least 1.5 / fmin s of zeros before it, from offset on).

    Praat's voicing decision weighs the normalised autocorrelation peak against a threshold raised in frames whose
    local peak is far below the clip's (silence). x is band-limited to rate / 2: the noise a breathy or fricative
    frame carries above it would lower the peak in Praat's full-band analysis, so the strength is scaled by the share
    of the frame's energy below rate / 2 (1 where wav is no wider).
    """
    T = len(lags)
    if not (lags > 0).any():  # nothing but silence: no frame can be voiced anyway
        return np.zeros(T)
    n = int(round(YIN_VOICING_PERIODS / fmin * rate))
    n_mean = int(rate / fmin)  # Praat takes the local mean over one longest period each side, ...
    n_peak = n_mean // 2 + 1  # ... and the local peak over half of one
    reach = max(n // 2, n_mean) + 1
    centers = np.rint(np.arange(T) * (hop * rate / sr)).astype(np.int64)
    centers = np.clip(centers, min(reach, len(x) // 2), max(len(x) - reach, len(x) // 2))  # windows that fit
    w, rw = _hann_tables(n)
    tau_lo, tau_hi = max(2, int(rate / fmax)), min(int(math.ceil(rate / fmin)), n // 2)
    strength, peak = _periodicity(xp, centers + offset, lags, w, rw, n_mean, n_peak, tau_lo, tau_hi, rate / fmax)
    if sr > rate:
        wide = np.rint(np.arange(T) * hop).astype(np.int64)
        n_wide = int(round(YIN_VOICING_PERIODS / fmin * sr))
        r_wide = max(n_wide // 2, 1)
        wide = np.clip(wide, min(r_wide, len(wav) // 2), max(len(wav) - r_wide, len(wav) // 2))
        share = _window_energy(x, centers, n) / np.maximum(_window_energy(wav, wide, n_wide), 1e-30)
        strength = np.where(strength > -1.0, strength * np.clip(share, 0.0, 1.0), strength)
    global_peak = np.abs(x - x.mean()).max() if len(x) else 0.0
    rel = np.minimum(peak / global_peak, 1.0) if global_peak > 0 else np.zeros(T)
    unvoiced = PRAAT_VOICING_THRESHOLD + np.maximum(
        0.0, 2.0 - rel * (1.0 + PRAAT_VOICING_THRESHOLD) / PRAAT_SILENCE_THRESHOLD)
    return np.where(lags > 0, strength - unvoiced, 0.0)


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
    unvoiced = _unvoiced_costs(level_db)
    path = _viterbi(lags, costs, unvoiced, YIN_OCTAVE_COST, YIN_SWITCH_COST)
    # Second opinion on voicing, at the first pass's lag (its path's where voiced, else the frame's best candidate),
    # then the path again with "unvoiced" priced by it.
    rows = np.arange(T)
    first = lags[rows, np.where(path < YIN_CANDIDATES, path, np.argmin(costs, axis=1))]
    first = np.where(np.isfinite(costs.min(axis=1)), first, 0.0)
    evidence = _voicing_margin(wav, sr, x, xp, pad + margin, rate, hop, first, fmin, fmax)
    path = _viterbi(lags, costs, unvoiced + YIN_VOICING_WEIGHT * evidence, YIN_OCTAVE_COST, YIN_SWITCH_COST)
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
        raise MissingExtra(f"f0 backend {algo!r} needs pyworld: pip install 'audiopipe[reference]'") from e
    x = wav.astype(np.float64)
    period_ms = 1000.0 * hop / sr
    if algo == "dio":
        f0, t = pyworld.dio(x, sr, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms)
        f0 = pyworld.stonemask(x, f0, t, sr)
    else:
        f0, _ = pyworld.harvest(x, sr, f0_floor=fmin, f0_ceil=fmax, frame_period=period_ms)
    return _fit_length(f0, len(wav) // hop + 1)


def _praat_padding(n: int, sr: int, hop: int, window_s: float) -> tuple[int, int]:
    """Zeros to put before and after an n-sample clip so that Praat's frame grid falls exactly on t * hop.

    Praat centres its frames in the sound: with D the padded duration, it makes k = floor((D - window) / dt) + 1
    frames starting at D / 2 - (k - 1) * dt / 2. For frame times pad_left / sr + t * dt, (n + pad_right - pad_left -
    (k - 1) * hop) must be a multiple of 2 * hop. The left pad is chosen so that one right pad in every 2 * hop
    consecutive ones satisfies it away from the rounding edge of the floor; both cover half a window past the clip.
    """
    left = int(math.ceil(window_s / 2 * sr + hop / 4)) + hop
    for right in range(left, left + 2 * hop):
        q = ((left + n + right) / sr - window_s) / (hop / sr)
        if abs(q - round(q)) < 1e-6:
            continue  # Praat's own floor could fall either way here
        if (n + right - left - math.floor(q) * hop) % (2 * hop) == 0:
            return left, right
    raise AssertionError("unreachable: one right pad in 2 * hop aligns the grid")  # pragma: no cover


def _praat_track(wav: np.ndarray, sr: int, hop: int, fmin: float, fmax: float) -> np.ndarray:
    try:
        import parselmouth
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingExtra("f0 backend 'praat' needs praat-parselmouth: pip install 'audiopipe[reference]'") from e
    T = len(wav) // hop + 1
    # Praat's grid must land on t * hop itself: a grid offset by a fraction of a frame, read through the nearest frame,
    # moves every voicing edge by up to half a frame, always in the same direction for a given clip length.
    left, right = _praat_padding(len(wav), sr, hop, 3.0 / fmin)  # to_pitch_ac's window: 3 periods of the floor
    x = np.concatenate([np.zeros(left), wav.astype(np.float64), np.zeros(right)])
    pitch = parselmouth.Sound(x, sampling_frequency=sr).to_pitch_ac(
        time_step=hop / sr, pitch_floor=fmin, pitch_ceiling=fmax
    )
    pos = (pitch.xs() - left / sr) * sr / hop  # frame index of each Praat frame
    k = np.rint(pos).astype(np.int64)
    if not np.allclose(pos, k, atol=1e-6) or k[0] > 0 or k[-1] < T - 1:
        raise Failed(f"f0 backend 'praat': Praat placed its frames at {pos[0]:.4f} + k frames, not on t * hop "
                     f"(parselmouth {parselmouth.__version__}: frame placement changed?)")
    return pitch.selected_array["frequency"][(k >= 0) & (k < T)].astype(np.float64)


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
            raise InvalidValue(f"f0: unknown backend {backend!r}; expected one of {BACKENDS}")
        if hop_length <= 0 or sample_rate <= 0:
            raise InvalidValue(f"f0: sample_rate and hop_length must be positive, got {sample_rate}, {hop_length}")
        if not 0 < fmin < fmax:
            raise InvalidValue(f"f0: need 0 < fmin < fmax, got fmin={fmin} fmax={fmax}")
        if fmax >= min(sample_rate, YIN_RATE) / 2:
            raise InvalidValue(f"f0: fmax {fmax} Hz must be below the analysis Nyquist "
                               f"{min(sample_rate, YIN_RATE) / 2}")
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
