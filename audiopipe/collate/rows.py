"""A batch as the mmap reader hands it to collate: columns of rows, not a list of per-item dicts.

Building one dict of views per item costs more Python than copying its bytes. `ShardDataset.__getitems__`
returns a `RowBatch` instead: for every feature, where each row's data sits in its shard's flat column
(`Rows`: one entry per shard the batch touches), and the metadata already in batch order. `PadCollator`
copies and pads a whole `RowBatch` in one compiled pass per shard (audiopipe/collate/kernels.py).

A RowBatch is still a sequence of items: `batch[i]` builds item i's dict of zero-copy views, so code written
for lists of dicts (a custom collate_fn, torch's default_collate) keeps working, only slower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from audiopipe.errors import OutOfRange


class Rows(NamedTuple):  # a tuple: made ~15 times per batch, and a dataclass costs more to build
    """Rows of one feature that live in one flat buffer (one shard's column)."""

    values: np.ndarray  # the column's flat values, zero-copy; row data is [channels, frames] row-major
    starts: np.ndarray  # int64: element offset of each row in `values`
    frames: np.ndarray  # int64: time frames of each row
    positions: np.ndarray  # int64: where each row goes in the batch


@dataclass(frozen=True)
class RowBatch(Sequence):
    """`size` items: `arrays[f]` locates feature f's rows, `channels[f]` its leading axis (0: a [T] feature),
    `columns[k]` is the list of metadata k (id, speaker, text, duration, index) in batch order."""

    size: int
    channels: dict[str, int]
    arrays: dict[str, list[Rows]]
    columns: dict[str, list[Any]]

    def __len__(self) -> int:
        return self.size

    def keys(self) -> list[str]:
        """The keys every item has, as in the item dicts."""
        return [*self.columns, *self.arrays]

    def array(self, feature: str, i: int) -> np.ndarray:
        for rows in self.arrays[feature]:
            hit = np.flatnonzero(rows.positions == i)
            if hit.size:
                k = int(hit[0])
                start, t = int(rows.starts[k]), int(rows.frames[k])
                ch = self.channels[feature]
                flat = rows.values[start:start + max(ch, 1) * t]
                return flat.reshape(ch, t) if ch else flat
        raise OutOfRange(f"item {i} has no rows for {feature!r}")

    def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
        if not -self.size <= i < self.size:
            raise OutOfRange(f"item {i} of a batch of {self.size}")
        i %= self.size
        item = {k: col[i] for k, col in self.columns.items()}
        for f in self.arrays:
            item[f] = self.array(f, i)
        return item
