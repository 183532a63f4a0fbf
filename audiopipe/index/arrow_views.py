"""Zero-copy numpy views of null-free numeric Arrow arrays, for the index, the shard columns and the reader.

Here, below both `shard/` and `reader/`, because all three read Arrow columns as numpy on the path of a loader's
first batch, and pyarrow's own to_numpy() imports pandas the first time (1-3 s).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def numeric_view_possible(arr: pa.Array) -> bool:
    return arr.null_count == 0 and (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type))


def numeric_view(arr: pa.Array) -> np.ndarray:
    """A read-only numpy view of a null-free integer/float Arrow array (zero-copy), as to_numpy() gives, but
    without pyarrow importing pandas on its first to_numpy() (1-3 s, on the path of a loader's first batch)."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)
