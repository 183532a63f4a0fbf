"""The length index: one small row per written utterance, so samplers plan batches without opening payloads.

Built from the shards' scalar columns only (the mmap reads touch those buffers alone, not the feature arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from audiopipe.errors import MissingKey, NotFound
from audiopipe.index.arrow_views import numeric_view, numeric_view_possible
from audiopipe.storage.atomic import atomic_path
from audiopipe.storage.s3 import is_s3, parse_s3

INDEX_NAME = "index.arrow"
_KEEP = ("id", "speaker", "duration")


def _index_column(name: str) -> bool:
    return name in _KEEP or name.endswith("_frames")


def build_index(out: Path, shard_paths: list[str], read=None) -> Path:
    """Concatenate id/speaker/duration/<feature>_frames of every shard (in manifest order) into index.arrow.

    read(rel, keep) -> pa.Table, when given, reads the columns whose name keep(name) accepts instead (an s3://
    output's shards, fetching only those columns' bytes)."""
    tables = []
    for i, rel in enumerate(shard_paths):
        if read is not None:
            t = read(rel, _index_column)
        else:
            with pa.memory_map(str(out / rel)) as src:
                t = pa.ipc.open_file(src).read_all()
        cols = [c for c in t.column_names if _index_column(c)]
        t = t.select(cols)
        t = t.append_column("shard", pa.array(np.full(len(t), i, dtype=np.int32)))
        t = t.append_column("row", pa.array(np.arange(len(t), dtype=np.int32)))
        tables.append(t)
    table = pa.concat_tables(tables) if tables else pa.table({
        "id": pa.array([], pa.string()), "speaker": pa.array([], pa.string()),
        "duration": pa.array([], pa.float32()), "shard": pa.array([], pa.int32()), "row": pa.array([], pa.int32())})
    # One record batch: readers then see each column as one zero-copy array (the loader reads id/speaker/
    # duration of a whole batch from here in one call per column).
    table = table.combine_chunks()
    path = out / INDEX_NAME
    with atomic_path(path) as tmp, pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return path


@dataclass
class LengthIndex:
    """Columns of index.arrow as numpy arrays (ids stay in Arrow: a million Python strings is slow)."""

    table: pa.Table

    @staticmethod
    def open(shards_dir: str | Path) -> "LengthIndex":
        """Memory-map index.arrow: nothing is read until a column is asked for (a 50M-row index opens in ms).

        On s3:// the object is fetched whole (the index is the small part of a shard set: ~40 bytes an utterance)."""
        if is_s3(shards_dir):
            from audiopipe.storage.s3_ranges import ObjectChanged, RangeReader

            url = parse_s3(shards_dir).child(INDEX_NAME)
            try:
                data = RangeReader().read_object(url)
            except ObjectChanged as e:
                raise NotFound(f"{url} not found: is {shards_dir} an audiopipe shard prefix? ({e})") from e
            return LengthIndex(pa.ipc.open_file(pa.BufferReader(data)).read_all())
        path = Path(shards_dir) / INDEX_NAME
        if not path.exists():
            raise NotFound(f"{path} not found: is {shards_dir} an audiopipe shard folder?")
        with pa.memory_map(str(path)) as src:
            return LengthIndex(pa.ipc.open_file(src).read_all())

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> np.ndarray:
        if name not in self.table.column_names:
            raise MissingKey(f"index has no column {name!r}; it has {self.table.column_names}")
        col = self.table.column(name)
        if col.num_chunks == 1 and numeric_view_possible(col.chunk(0)):
            return numeric_view(col.chunk(0))
        return col.to_numpy()

    def frames(self, feature: str) -> np.ndarray:
        return self.column(f"{feature}_frames")

    @property
    def shard(self) -> np.ndarray:
        return self.column("shard")

    @property
    def row(self) -> np.ndarray:
        return self.column("row")

    @property
    def duration(self) -> np.ndarray:
        return self.column("duration")
