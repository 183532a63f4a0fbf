"""Pad a batch of samples into torch tensors: one copy per item, into reused buffers, pad region written only.

Two inputs, one result: a list of item dicts (any dataset), or the mmap reader's RowBatch (columns of rows,
see audiopipe/collate/rows.py), which is copied and padded by one compiled pass per shard
(audiopipe/collate/kernels.py) with no Python per item: that is what brings a batch close to memcpy speed.

Every feature has time on its LAST axis (see audiopipe/features/base.py), so one rule pads them all:
`mel [80, T] -> [B, 80, T_max]`, `f0 [T] -> [B, T_max]`, `codes [16, T] -> [B, 16, T_max]`.
`layout="BTC"` hands time-major batches instead (`mel -> [B, T_max, 80]`, `f0` unchanged): a transpose
during the copy, which costs the CPU several times the straight copy (docs/bench-loader.md, "Where the bytes
go"); on a GPU, transposing the [B, C, T] batch there is cheaper, so "BCT" stays the default.

Buffer reuse and its aliasing rule: in the training process, a batch's tensors are views into a small ring
of `ring_size` preallocated buffers per feature (grown on demand, never shrunk). Batch k's memory is written
again by batch k + ring_size, so the caller must be done with a batch (moved it to the GPU, or copied it)
before ring_size more batches are collated. The default of 2 keeps batch k intact while batch k + 1 is
built; raise it by the number of batches held longer (in-flight copies, a prefetching thread). More slots
cost cache: each slot touched is another batch-sized working set (the benchmark shows it). A batch tensor's
storage can be larger than the tensor: `.clone()` it before keeping or saving it for long.

Inside DataLoader worker processes the ring is NOT used: each batch is written once, directly into a fresh
shared-memory block (as torch's default_collate does), because sending a tensor to the main process moves
its storage into shared memory, and a reused one would be overwritten while the main process still reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from audiopipe.collate.kernels import LAYOUTS, pad_rows_into
from audiopipe.collate.rows import RowBatch
from audiopipe.errors import InvalidValue, MissingKey, WrongType


@dataclass
class CollateStats:
    """Running totals of this collator (per process: each DataLoader worker counts its own batches)."""

    batches: int = 0
    real: dict[str, int] = field(default_factory=dict)  # frames that hold data, per feature
    padded: dict[str, int] = field(default_factory=dict)  # frames of the padded tensors (B * T_max)

    def padding_ratio(self, feature: str) -> float:
        total = self.padded.get(feature, 0)
        return 1.0 - self.real.get(feature, 0) / total if total else 0.0


class _Ring:
    """`size` flat buffers used in turn; a slot is reallocated only when a batch needs more room."""

    def __init__(self, size: int, pin_memory: bool = False):
        self.slots: list[torch.Tensor | None] = [None] * size
        self.next = 0
        self.pin_memory = pin_memory

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        i = self.next
        self.next = (i + 1) % len(self.slots)
        buf = self.slots[i]
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            # Headroom so that a slowly growing longest item does not reallocate every batch.
            buf = torch.empty(int(numel * 1.25) + 64, dtype=dtype, pin_memory=self.pin_memory)
            self.slots[i] = buf
        return buf[:numel]


def _shared_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor in shared memory, so sending it from a worker costs no extra copy."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    try:
        storage = torch.UntypedStorage._new_shared(max(numel, 1) * itemsize)
        return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,))
    except (AttributeError, RuntimeError):  # private API moved: pay one extra copy instead
        return torch.empty(numel, dtype=dtype).share_memory_()


_TORCH_DTYPES: dict[np.dtype, torch.dtype] = {}


def _torch_dtype(dtype: np.dtype, feature: str) -> torch.dtype:
    have = _TORCH_DTYPES.get(dtype)  # asked once per batch and feature: remembered, not re-derived
    if have is not None:
        return have
    try:
        have = _TORCH_DTYPES[dtype] = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    except TypeError as e:
        raise WrongType(f"feature {feature!r} has dtype {dtype}, which torch cannot hold") from e
    return have


class PadCollator:
    """collate_fn that pads `features` along the last axis and passes every other key through as a list.

    Returns a dict with, for each feature f: `f` (tensor [B, ..., T_max], the items' dtype; with layout="BTC"
    [B, T_max, ...], time second), `f_lengths`
    (int64 [B], frames before padding), `f_mask` (bool [B, T_max], True on real frames); `padding_ratio`
    ({f: padded-but-empty frames / all frames of the tensor}); and `key: [item[key] ...]` for every other key
    (id, speaker, text, scalars). T_max is the longest item, rounded up to a multiple of pad_to_multiple.
    With `shapes` (sampler/shapes.py's BatchShapes, the sampler's `shapes`), every batch is padded to one of its
    shapes: T_max to the first edge at or above the longest item, and B to that edge's size with empty rows
    (length 0, mask all False) after the items; the other keys' lists hold the items only. The first feature
    (the one the sampler planned with) picks the shape; other features get the same rows and their own T_max.
    Items are dicts of numpy arrays (read-only mmap views are fine: they are only read, once).
    """

    def __init__(
        self,
        features: Sequence[str],
        *,
        pad_to_multiple: int = 1,
        pad_value: float | Mapping[str, float] = 0,
        ring_size: int = 2,
        pin_memory: bool = False,
        layout: str = "BCT",
        shapes: Any = None,
    ):
        if isinstance(features, str) or not features:
            raise InvalidValue(f"features must be a non-empty list of feature names, got {features!r}")
        if len(set(features)) != len(features):
            raise InvalidValue(f"features listed twice: {list(features)}")
        if not isinstance(pad_to_multiple, int) or pad_to_multiple < 1:
            raise InvalidValue(f"pad_to_multiple must be an integer >= 1, got {pad_to_multiple!r}")
        if ring_size < 1:
            raise InvalidValue(f"ring_size must be >= 1, got {ring_size!r}")
        if layout not in LAYOUTS:
            raise InvalidValue(f"layout must be one of {', '.join(LAYOUTS)} (batch axes), got {layout!r}")
        self.layout = layout
        self.shapes = shapes  # BatchShapes or None
        self.features = list(features)
        self.pad_to_multiple = pad_to_multiple
        if isinstance(pad_value, Mapping):
            unknown = set(pad_value) - set(self.features)
            if unknown:
                raise InvalidValue(f"pad_value names features that are not collated: {sorted(unknown)}")
            self.pad_value = {f: pad_value.get(f, 0) for f in self.features}
        else:
            self.pad_value = {f: pad_value for f in self.features}
        self.ring_size = ring_size
        # Page-locked ring buffers (CUDA only): a host-to-device copy from them can run asynchronously.
        self.pin_memory = bool(pin_memory)
        self.stats = CollateStats()
        self._rings: dict[tuple[str, str], _Ring] = {}
        self._ramp = np.arange(0, dtype=np.int64)
        self._reserved = {"padding_ratio"} | {f"{f}_{s}" for f in self.features for s in ("lengths", "mask")}

    def __getstate__(self) -> dict[str, Any]:
        # Workers get a copy without buffers (they allocate in shared memory anyway).
        state = self.__dict__.copy()
        state["_rings"] = {}
        state["stats"] = CollateStats()
        return state

    def __call__(self, items: Sequence[Mapping[str, Any]] | RowBatch) -> dict[str, Any]:
        if len(items) == 0:
            raise InvalidValue("cannot collate an empty batch")
        rows = isinstance(items, RowBatch)
        keys = items.keys() if rows else self._common_keys(items)
        clash = self._reserved & set(keys)
        if clash:
            raise InvalidValue(f"items have keys that collate would overwrite: {sorted(clash)}")
        if rows:
            return self._collate_rows(items)
        in_worker = torch.utils.data.get_worker_info() is not None
        out: dict[str, Any] = {}
        ratios: dict[str, float] = {}
        for f in self.features:
            tensor, lengths, mask, ratio = self._pad(f, items, in_worker)
            out[f], out[f"{f}_lengths"], out[f"{f}_mask"] = tensor, lengths, mask
            ratios[f] = ratio
        out["padding_ratio"] = ratios
        for k in keys:
            if k not in out:
                out[k] = [item[k] for item in items]
        self.stats.batches += 1
        return out

    @staticmethod
    def _common_keys(items: Sequence[Mapping[str, Any]]) -> Any:
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise WrongType(f"item {i} is a {type(item).__name__}, expected a dict of arrays and metadata")
        keys = items[0].keys()
        for i, item in enumerate(items):
            if item.keys() != keys:  # set-like comparison, in C
                raise InvalidValue(
                    f"item {i} ({_name(item, i)}) has keys {sorted(item.keys())}, item 0 has {sorted(keys)}"
                )
        return keys

    def _pad(
        self, f: str, items: Sequence[Mapping[str, Any]], in_worker: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        try:
            arrays = [item[f] for item in items]
        except KeyError:
            i = next(i for i, item in enumerate(items) if f not in item)
            raise MissingKey(
                f"item {i} ({_name(items[i], i)}) has no feature {f!r}; it has {sorted(items[i].keys())}"
            ) from None
        arrays = [a if type(a) is np.ndarray else np.asarray(a) for a in arrays]
        first = arrays[0]
        lead, dtype = first.shape[:-1], first.dtype
        shapes = [a.shape for a in arrays]
        # One pass of cheap checks; the loop that names the culprit runs only when something is wrong.
        if len({s[:-1] for s in shapes}) != 1 or len({a.dtype for a in arrays}) != 1 or min(map(len, shapes)) == 0:
            for i, a in enumerate(arrays):
                if a.ndim == 0:
                    raise InvalidValue(
                        f"feature {f!r} of item {i} ({_name(items[i], i)}) is a scalar; time must be the last axis"
                    )
                if a.shape[:-1] != lead or a.dtype != dtype:
                    raise InvalidValue(
                        f"feature {f!r}: item {i} ({_name(items[i], i)}) is {a.dtype}{list(a.shape)}, item 0 is "
                        f"{dtype}{list(first.shape)}; all items need the same dtype and non-time axes"
                    )
        lengths = np.array([s[-1] for s in shapes], dtype=np.int64)
        tensor, mask = self._allocate(f, lengths, lead, dtype, in_worker)
        dst = tensor.numpy()
        n, t_max = len(arrays), mask.shape[1]
        pad = self.pad_value[f]
        if mask.shape[0] > n:  # a shape's empty rows: pad only, length 0
            dst[n:] = pad
            lengths = np.concatenate([lengths, np.zeros(mask.shape[0] - n, dtype=np.int64)])
        t_min = int(lengths[:n].min())
        # Bucketed batches have similar lengths: filling the box [t_min, t_max) of every row in one call
        # costs less than one call per item and writes at most twice the pad area. Otherwise, per item.
        box_fill = t_min < t_max and n * (t_max - t_min) <= 2 * (n * t_max - int(lengths[:n].sum()))
        if self.layout == "BTC" and lead:  # time-major rows: [t, *lead] slots, items transposed on the way in
            if box_fill:
                dst[:n, t_min:] = pad
            for row, a, (*_, t) in zip(dst, arrays, shapes):
                row[:t] = np.moveaxis(a, -1, 0)
                if t < t_max and not box_fill:
                    row[t:] = pad
            return tensor, torch.from_numpy(lengths), mask, self._finish(f, lengths, mask)
        if box_fill:
            dst[:n, ..., t_min:] = pad
        for row, a, (*_, t) in zip(dst, arrays, shapes):
            row[..., :t] = a  # the one copy of this item
            if t < t_max and not box_fill:
                row[..., t:] = pad  # only the pad region; the rest was just overwritten
        return tensor, torch.from_numpy(lengths), mask, self._finish(f, lengths, mask)

    def _allocate(self, f: str, lengths: np.ndarray, lead: tuple[int, ...], dtype: np.dtype,
                  in_worker: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The uninitialised batch [B, *lead, T_max] ([B, T_max, *lead] for "BTC") and mask [B, T_max]: ring slots,
        or fresh shared memory."""
        m = self.pad_to_multiple
        n, t_max = lengths.size, int(lengths.max())
        if self.shapes is not None:  # the shape this batch is padded to: more rows, a longer T_max
            if f == self.features[0]:
                # The first feature is the one the sampler planned with: its longest item picks the shape.
                n, t_max = self.shapes.shape(n, t_max)
                self._shape_rows = n
            else:
                # Other features (GPT-SoVITS's phones beside its tokens) get the same rows, so every tensor of
                # the batch has B rows, and keep their own T_max: the shape's edges are frames of the first.
                n = max(n, getattr(self, "_shape_rows", n))
        t_max = -(-t_max // m) * m
        shape = (n, t_max, *lead) if self.layout == "BTC" else (n, *lead, t_max)
        numel = int(np.prod(shape))
        tdtype = _torch_dtype(dtype, f)
        if in_worker:
            flat, mask_flat = _shared_empty(numel, tdtype), _shared_empty(n * t_max, torch.bool)
        else:
            flat = self._ring(f, "data").take(numel, tdtype)
            mask_flat = self._ring(f, "mask").take(n * t_max, torch.bool)
        return flat.view(shape), mask_flat.view(n, t_max)

    def _finish(self, f: str, lengths: np.ndarray, mask: torch.Tensor) -> float:
        """Write the mask, count real and padded frames; returns the batch's padding ratio."""
        n, t_max = mask.shape
        if self._ramp.size < t_max:  # 0, 1, 2, ... kept between batches: the mask is one comparison with it
            self._ramp = np.arange(max(t_max, 2 * self._ramp.size), dtype=np.int64)
        np.less(self._ramp[:t_max], lengths[:, None], out=mask.numpy())
        real, total = int(lengths.sum()), n * t_max
        self.stats.real[f] = self.stats.real.get(f, 0) + real
        self.stats.padded[f] = self.stats.padded.get(f, 0) + total
        return 1.0 - real / total if total else 0.0

    def _collate_rows(self, batch: RowBatch) -> dict[str, Any]:
        """The mmap reader's columnar batch: one compiled copy-and-pad pass per shard, no per-item Python."""
        missing = [f for f in self.features if f not in batch.arrays]
        if missing:
            raise MissingKey(f"the batch has no feature {missing[0]!r}; it has {sorted(batch.keys())}")
        in_worker = torch.utils.data.get_worker_info() is not None
        n = batch.size
        out: dict[str, Any] = {}
        ratios: dict[str, float] = {}
        for f in self.features:
            parts = batch.arrays[f]
            lengths = np.empty(n, dtype=np.int64)
            for rows in parts:
                lengths[rows.positions] = rows.frames
            ch = batch.channels[f]
            tensor, mask = self._allocate(f, lengths, (ch,) if ch else (), parts[0].values.dtype, in_worker)
            dst = tensor.view(-1).numpy()
            pad_rows_into(dst, parts, ch, mask.shape[1], self.pad_value[f], self.layout)
            if mask.shape[0] > n:  # a shape's empty rows: pad only, length 0
                tensor[n:] = self.pad_value[f]
                lengths = np.concatenate([lengths, np.zeros(mask.shape[0] - n, dtype=np.int64)])
            out[f], out[f"{f}_lengths"], out[f"{f}_mask"] = tensor, torch.from_numpy(lengths), mask
            ratios[f] = self._finish(f, lengths, mask)
        out["padding_ratio"] = ratios
        for k, col in batch.columns.items():
            out[k] = col
        for f in batch.arrays:
            if f not in out:  # read but not padded: the views, as the list path passes other keys through
                out[f] = [batch.array(f, i) for i in range(n)]
        self.stats.batches += 1
        return out

    def _ring(self, feature: str, role: str) -> _Ring:
        key = (feature, role)
        if key not in self._rings:
            self._rings[key] = _Ring(self.ring_size, self.pin_memory)
        return self._rings[key]


def _name(item: Mapping[str, Any], i: int) -> str:
    return f"id={item['id']!r}" if "id" in item else f"#{i}"


def padded_bytes(features: Sequence[str], specs: Mapping[str, Any], channels: Mapping[str, int], frames: float,
                 mask: bool = True) -> int:
    """Bytes of padded batches holding `frames` frames in all: every feature's channels x item size per frame,
    plus its bool mask. What a DataLoader worker's batches cost in /dev/shm (a full /dev/shm is a SIGBUS, as
    3D-Speaker users meet it), so the bound can be printed before training instead of found by a crash.

    specs: the manifest's feature specs; a column without one (phones, durations) is collated as int64.
    """
    per_frame = 0
    for f in features:
        spec = specs.get(f)
        itemsize = np.dtype(spec["dtype"]).itemsize if spec else np.dtype("int64").itemsize
        per_frame += max(1, channels.get(f, 0)) * itemsize + (1 if mask else 0)
    return int(frames * per_frame)
