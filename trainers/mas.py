"""Monotonic alignment search (Glow-TTS, VITS): the best monotonic path from phones to frames, in numba.

Given a score `value[p, t]` (a log-likelihood of frame t under phone p), find the path that assigns every frame
to exactly one phone, starts at (0, 0), ends at (P-1, T-1), and at each frame either stays on the phone or moves
to the next one, maximising the summed score. Every phone then gets at least one frame, so T >= P is required.
Durations are the path's row sums; they add up to T.

    path = maximum_path(value, phone_lengths, frame_lengths)   # numpy, [B, P, T] -> int32 [B, P, T]
    path, durations = mas_durations(logp, phone_mask, frame_mask)   # torch in, torch out (no gradient)
"""

from __future__ import annotations

import numba
import numpy as np

_NEG = -1e30  # "unreachable": finite, so sums of two stay finite and comparisons stay exact


@numba.njit(cache=True, nogil=True)
def _path_one(value: np.ndarray, out: np.ndarray, p_len: int, t_len: int) -> None:
    # q[p, t]: best score of a path through (p, t); a cell is reachable only when p <= t (one frame per phone
    # so far) and p >= P - (T - t) (enough frames left for the remaining phones).
    q = np.full((p_len, t_len), _NEG, dtype=np.float64)
    q[0, 0] = value[0, 0]
    for t in range(1, t_len):
        lo = max(0, p_len - (t_len - t))
        hi = min(p_len - 1, t)
        for p in range(lo, hi + 1):
            stay = q[p, t - 1]
            move = q[p - 1, t - 1] if p > 0 else _NEG
            q[p, t] = value[p, t] + (stay if stay >= move else move)
    p = p_len - 1
    for t in range(t_len - 1, -1, -1):
        out[p, t] = 1
        # Step back to the previous phone when staying was impossible or scored lower; ties stay.
        if p > 0 and (p == t or q[p, t - 1] < q[p - 1, t - 1]):
            p -= 1


@numba.njit(cache=True, nogil=True)
def _path_batch(value: np.ndarray, out: np.ndarray, p_lens: np.ndarray, t_lens: np.ndarray) -> None:
    # One thread: O(B*P*T) is tiny next to a training step, and the ranks already share the cores.
    for b in range(value.shape[0]):
        _path_one(value[b], out[b], p_lens[b], t_lens[b])


def maximum_path(value: np.ndarray, phone_lengths: np.ndarray, frame_lengths: np.ndarray) -> np.ndarray:
    """The best monotonic path per batch item: int32 [B, P, T], 1 where frame t belongs to phone p.

    value: [B, P_max, T_max] scores (higher is better); entries beyond an item's lengths are ignored and
    the path is 0 there. Needs 1 <= phone_lengths[b] <= frame_lengths[b].
    """
    value = np.array(value, dtype=np.float64)  # a copy: the padding is overwritten below
    if value.ndim != 3:
        raise ValueError(f"value must be [batch, phones, frames], got shape {value.shape}")
    b, p_max, t_max = value.shape
    p_lens = np.asarray(phone_lengths, dtype=np.int64).reshape(-1)
    t_lens = np.asarray(frame_lengths, dtype=np.int64).reshape(-1)
    if len(p_lens) != b or len(t_lens) != b:
        raise ValueError(f"lengths must have one entry per batch item ({b}); got {len(p_lens)} and {len(t_lens)}")
    if (p_lens < 1).any() or (p_lens > p_max).any() or (t_lens > t_max).any():
        raise ValueError(f"lengths out of range: phones {p_lens.tolist()} (max {p_max}), "
                         f"frames {t_lens.tolist()} (max {t_max})")
    short = np.flatnonzero(t_lens < p_lens)
    if len(short):
        i = int(short[0])
        raise ValueError(f"item {i} has {t_lens[i]} frames for {p_lens[i]} phones: a monotonic alignment gives "
                         f"every phone at least one frame, so it needs frames >= phones")
    valid = (np.arange(p_max)[None, :, None] < p_lens[:, None, None]) & \
        (np.arange(t_max)[None, None, :] < t_lens[:, None, None])
    value[~valid] = 0.0  # padding may hold anything (-inf from a mask); it is never read, but keep it finite
    if not np.isfinite(value).all():
        bad = int(np.flatnonzero(~np.isfinite(value).all(axis=(1, 2)))[0])
        raise ValueError(f"value of item {bad} has NaN or infinite entries within its lengths")
    out = np.zeros((b, p_max, t_max), dtype=np.int32)
    _path_batch(value, out, p_lens, t_lens)
    return out


def mas_durations(logp, phone_mask, frame_mask):
    """Torch front end: logp [B, P, T], masks bool [B, P] and [B, T] -> (path float [B, P, T], durations long
    [B, P]) on logp's device. The search itself runs on the CPU; no gradient flows through it."""
    import torch

    with torch.no_grad():
        p_lens = phone_mask.sum(1).cpu().numpy()
        t_lens = frame_mask.sum(1).cpu().numpy()
        path = maximum_path(logp.detach().float().cpu().numpy(), p_lens, t_lens)
        path_t = torch.from_numpy(path).to(device=logp.device, dtype=logp.dtype)
        return path_t, path_t.sum(-1).long()
