"""Reading the array columns of a shard: each is an Arrow large_list, one flat values buffer plus offsets.

The writer (shard/writer.py) stores an utterance's array as one list row; every reader of those rows (the mmap
dataset, verify, the token writer) takes them through ListColumn, so row r is values[offsets[r]:offsets[r+1]]
as a numpy view, never a pyarrow scalar per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from audiopipe.index.arrow_views import numeric_view, numeric_view_possible


class ListColumn:
    """Rows of a large_list column as numpy views: `offsets` int64 [rows + 1] into the flat `values`.

    zero_copy_only: refuse (pyarrow.ArrowInvalid) a column whose values numpy cannot view in place, as the mmap
    reader must; False lets pyarrow copy such values instead.
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array, zero_copy_only: bool = True):
        if isinstance(column, pa.ChunkedArray):
            # combine_chunks() copies even a lone chunk into fresh memory; a shard is one record batch.
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        self.offsets: np.ndarray = numeric_view(column.offsets)
        values = column.values
        self.values: np.ndarray = (numeric_view(values) if numeric_view_possible(values)
                                   else values.to_numpy(zero_copy_only=zero_copy_only))

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, r: int) -> np.ndarray:
        return self.values[self.offsets[r]:self.offsets[r + 1]]
