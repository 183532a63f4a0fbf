"""Blocks of a shard set: runs of consecutive rows of one shard, about `block_bytes` of feature values each.

A shard stores each feature's rows back to back in one buffer, so a block of rows is one contiguous byte range
per feature: one ranged GET fetches it (audiopipe/sampler/block_window.py plans batches from a few blocks at a
time). Blocks are cut from the length index alone (frames x channels x item size per row, per feature read),
so they are a pure function of the shard set, the features and block_bytes: every rank and every resume cuts
the same ones. A row larger than block_bytes is a block of its own; a shard smaller than it is one block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from audiopipe.errors import InvalidValue


@dataclass(frozen=True)
class BlockTable:
    """Block b holds rows start[b]..end[b]-1 of shard shard[b], nbytes[b] bytes of the features read; of_row[i]
    is the block of the index's row i (global index)."""

    shard: np.ndarray
    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray
    of_row: np.ndarray

    def __len__(self) -> int:
        return int(self.shard.size)


def row_bytes(index: Any, manifest: dict[str, Any], features: Sequence[str], channels: dict[str, int]) -> np.ndarray:
    """Bytes of feature values of every row of the index (int64), from its <feature>_frames columns."""
    total = np.zeros(len(index), dtype=np.int64)
    specs = manifest["features"]
    for f in features:
        itemsize = np.dtype(specs[f]["dtype"]).itemsize if f in specs and "dtype" in specs[f] else 8
        total += index.frames(f).astype(np.int64) * max(channels.get(f, 0), 1) * itemsize
    return total


def cut_blocks(index: Any, manifest: dict[str, Any], features: Sequence[str], channels: dict[str, int],
               block_bytes: int) -> BlockTable:
    """Cut every shard's rows into blocks of about block_bytes (a new block starts at the first row whose
    values begin at or past the next multiple of block_bytes within its shard). The index lists the shards
    row by row (checked when the dataset opens), so a block is also a range of global indices."""
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, (int, np.integer)) or block_bytes < 1:
        raise InvalidValue(f"block_bytes must be a positive number of bytes, got {block_bytes!r}")
    size = row_bytes(index, manifest, features, channels)
    shard = np.asarray(index.shard, dtype=np.int64)
    row = np.asarray(index.row, dtype=np.int64)
    n = size.size
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return BlockTable(z, z, z, z, z)
    before = np.cumsum(size) - size  # bytes before each row, from the start of the shard set
    shard_first = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1]])
    within = before - np.repeat(before[shard_first], np.diff(np.r_[shard_first, n]))
    piece = within // int(block_bytes)
    new = np.r_[True, (shard[1:] != shard[:-1]) | (piece[1:] != piece[:-1])]
    of_row = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    ends = np.r_[firsts[1:], n]
    nbytes = np.add.reduceat(size, firsts)
    return BlockTable(shard[firsts], row[firsts], row[ends - 1] + 1, nbytes.astype(np.int64), of_row.astype(np.int64))


def block_rows(manifest: dict[str, Any], blocks: BlockTable, ids: Sequence[int]) -> np.ndarray:
    """Global indices of the rows of these blocks (the index lists the shards row by row, in manifest order)."""
    rows = np.array([int(s["rows"]) for s in manifest["shards"]], dtype=np.int64)
    shard_first = np.concatenate([[0], np.cumsum(rows)[:-1]])
    ids = np.asarray(ids, dtype=np.int64)
    first = shard_first[blocks.shard[ids]] + blocks.start[ids]
    count = blocks.end[ids] - blocks.start[ids]
    return np.repeat(first - np.cumsum(count) + count, count) + np.arange(int(count.sum()), dtype=np.int64)
