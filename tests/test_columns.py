"""shard/columns.ListColumn: the one reader of large_list array columns (mmap dataset, verify, tokens)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from audiopipe.shard.columns import ListColumn
from audiopipe.shard.writer import ArrayColumn, write_arrow


def _rows(rng, n):
    return [rng.integers(-5, 5, size=int(rng.integers(0, 7))).astype(np.int16) for _ in range(n)]


def test_rows_of_a_written_shard_are_views_of_its_mapped_buffer(tmp_path):
    rng = np.random.default_rng(0)
    arrays = _rows(rng, 9)
    rows = [{"id": f"s/{i}", "speaker": "s", "text": "", "source": "", "duration": 0.1,
             "arrays": {"phones": a}, "scalars": {}} for i, a in enumerate(arrays)]
    write_arrow(tmp_path / "x.arrow", rows, [ArrayColumn("phones", "int16", 0)], [], {})
    with pa.memory_map(str(tmp_path / "x.arrow")) as src:
        table = pa.ipc.open_file(src).read_all()
    col = ListColumn(table.column("phones"))
    assert len(col) == len(arrays)
    for r, a in enumerate(arrays):
        np.testing.assert_array_equal(col[r], a)
    assert not col.values.flags.owndata  # a view of Arrow's buffer, not a copy


def test_chunked_and_sliced_columns_give_the_same_rows():
    rng = np.random.default_rng(1)
    arrays = _rows(rng, 12)
    full = pa.array([a.tolist() for a in arrays], type=pa.large_list(pa.int16()))
    chunked = pa.chunked_array([full.slice(0, 5), full.slice(5)])
    sliced = full.slice(3, 6)  # offsets no longer start at 0
    for col, want in ((ListColumn(chunked), arrays), (ListColumn(sliced), arrays[3:9])):
        assert [c.tolist() for c in (col[r] for r in range(len(col)))] == [a.tolist() for a in want]


def test_values_numpy_cannot_view_are_refused_unless_a_copy_is_allowed():
    col = pa.array([[True, False], [True]], type=pa.large_list(pa.bool_()))
    with pytest.raises(pa.ArrowInvalid):
        ListColumn(col)
    assert ListColumn(col, zero_copy_only=False)[1].tolist() == [True]
