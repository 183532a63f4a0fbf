"""One local Arrow shard mapped into memory (pyarrow.memory_map): its feature columns as zero-copy numpy views.

Mapping reads the footer and the record-batch headers and checks each feature column's offsets against its frame
counts (O(rows), on the offsets only); no row payload is touched until collate copies a batch's rows. Before a
batch's rows are touched, `check()` refuses a file whose size changed since it was mapped (a truncated mapping
read past its end is a SIGBUS that kills the process with no message). `willneed()` asks the kernel to read
rows of batches to come into the page cache (madvise), without waiting for the disk.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from audiopipe.collate.rows import Rows
from audiopipe.index.arrow_views import numeric_view, numeric_view_possible
from audiopipe.reader import integrity
from audiopipe.reader.errors import CorruptShardError
from audiopipe.shard.columns import ListColumn

_PAGE = mmap.PAGESIZE
_MADV_WILLNEED = getattr(mmap, "MADV_WILLNEED", 3)
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    _madvise = _libc.madvise
except (OSError, AttributeError):  # no madvise here: read-ahead becomes a no-op
    def _madvise(addr: int, length: int, advice: int) -> int:
        return 0


@dataclass
class _Column:
    values: np.ndarray  # flat zero-copy view over the mmap'd buffer
    offsets: np.ndarray  # int64 [rows + 1]
    frames: np.ndarray  # int64 [rows]
    channels: int


class MappedShard:
    def __init__(self, path: Path, name: str, features: Sequence[str], channels: dict[str, int],
                 meta_columns: Sequence[str]):
        self.name, self.path = name, path
        try:
            self._mmap = pa.memory_map(str(path))
            table = pa.ipc.open_file(self._mmap).read_all()
        except (pa.lib.ArrowException, OSError) as e:
            raise CorruptShardError(f"shard {name} ({path}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e
        self.size, self._fd = self._mmap.size(), self._mmap.fileno()
        self.table = table
        self.columns: dict[str, _Column] = {}
        try:
            # Buffer sizes against the lengths the headers declare (cheap: no row payload is read). A header
            # whose buffer length was shrunk would otherwise surface as a bare numpy ValueError naming nothing.
            table.validate()
            self._columns(table, features, channels)
        except (pa.lib.ArrowException, ValueError, IndexError) as e:
            self._mmap.close()
            raise CorruptShardError(f"shard {name} ({path}) is unreadable: {integrity.first_line(e)}; "
                                    f"run `audiopipe verify`") from e
        self.meta = {c: table.column(c) for c in meta_columns if c in table.column_names}
        self._meta_get = {c: meta_reader(col) for c, col in self.meta.items()}

    def _columns(self, table: pa.Table, features: Sequence[str], channels: dict[str, int]) -> None:
        name = self.name
        for f in features:
            if f not in table.column_names:
                raise CorruptShardError(f"shard {name} has no column {f!r} (it has {table.column_names})")
            column = ListColumn(table.column(f))
            offsets, values = column.offsets, column.values
            frames_col = table.column(f"{f}_frames")
            frames = (numeric_view(frames_col.chunk(0)) if frames_col.num_chunks == 1 and
                      numeric_view_possible(frames_col.chunk(0)) else frames_col.to_numpy())
            ch = channels.get(f, 0)
            # Structural checks are O(rows) and catch truncation or corruption of the offsets.
            if offsets[-1] != len(values) or (np.diff(offsets) != np.maximum(ch, 1) * frames).any():
                raise CorruptShardError(f"shard {name}: column {f} offsets do not match frame counts (corrupted)")
            # int64 once here: the copy kernel takes int64 frame counts, and a batch gathers them per shard.
            self.columns[f] = _Column(values, offsets, frames.astype(np.int64), ch)

    def check(self) -> None:
        """Refuse to touch rows of a file whose size changed since it was mapped.

        Reading a page past a truncated file's new end is a SIGBUS that kills the process with no message; one
        fstat (a few microseconds) before each batch's rows are touched turns it into a named error. A file
        replaced by rename (how audiopipe writes) keeps its old inode mapped and is not affected.
        """
        try:
            now = os.fstat(self._fd).st_size
        except OSError as e:
            raise CorruptShardError(f"shard {self.name} ({self.path}) cannot be checked: {e.strerror}") from e
        if now != self.size:
            raise CorruptShardError(
                f"shard {self.name} ({self.path}) changed size after it was mapped ({self.size} -> {now} bytes): "
                f"rewritten in place while training; its rows can no longer be read safely")

    def close(self) -> None:
        """Give back the file descriptor. Views already handed out stay valid: the mapping lives until the
        last of them is gone (pyarrow's buffers hold it), so closing never pulls memory from under a batch."""
        self._mmap.close()

    def rows(self, feature: str, rows: np.ndarray, positions: np.ndarray) -> Rows:
        """Where these rows of `feature` lie: views into the mapped column (collate copies them)."""
        column = self.columns[feature]
        return Rows(column.values, column.offsets[rows].astype(np.int64, copy=False), column.frames[rows], positions)

    def meta_values(self, column: str, rows: np.ndarray) -> list[Any]:
        """Python values of a metadata column at `rows` (int64 array), without a pyarrow scalar per value."""
        return self._meta_get[column](rows)

    def willneed(self, rows: np.ndarray) -> None:
        """Ask the kernel to start reading these rows' bytes into the page cache, and return at once.

        Page faults on a mapping read one small window at a time, in the trainer's thread; a cold shard (first
        epoch, or a corpus larger than RAM) then costs a disk round trip per window. Announcing the next
        batches' rows lets the disk (or network file system) read them in parallel while this batch is copied.
        """
        for c in self.columns.values():
            size = c.values.itemsize
            base = c.values.ctypes.data
            starts = c.offsets[rows] * size + base
            ends = c.offsets[rows + 1] * size + base
            starts -= starts % _PAGE  # madvise wants a page-aligned start
            for a, b in zip(starts.tolist(), ends.tolist()):
                _madvise(a, b - a, _MADV_WILLNEED)


def meta_reader(column: pa.ChunkedArray) -> Callable[[np.ndarray], list[Any]]:
    """rows -> values. Strings are decoded from the zero-copy data buffer (~0.3 us a value against ~1 us for a
    pyarrow scalar's as_py), numbers come from a numpy view; anything else (nulls, other types) per scalar."""
    arr = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if arr.null_count == 0 and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        width = np.int64 if pa.types.is_large_string(arr.type) else np.int32
        offsets = np.frombuffer(arr.buffers()[1], dtype=width)[arr.offset:arr.offset + len(arr) + 1]
        data = memoryview(arr.buffers()[2] or b"")

        def strings(rows: np.ndarray) -> list[str]:
            return [str(data[a:b], "utf-8") for a, b in zip(offsets[rows].tolist(), offsets[rows + 1].tolist())]

        return strings
    if numeric_view_possible(arr):
        values = numeric_view(arr)  # not arr.to_numpy(): it imports pandas (1-3 s) on the first batch
        return lambda rows: values[rows].tolist()
    return lambda rows: [arr[int(r)].as_py() for r in rows]
