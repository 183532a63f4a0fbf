"""Write one shard as an Arrow IPC file and a WebDataset tar, atomically.

Both files go through `audiopipe.storage.atomic.atomic_path` (temporary beside the target, fsync, rename, fsync
of the folder), so a crash, kill -9 or full disk leaves either a finished shard or nothing a reader would trust.
Bytes are deterministic: same rows in, same bytes out (no timestamps, sorted JSON, fixed tar metadata).
"""

from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from audiopipe.errors import InvalidValue, WrongType
from audiopipe.shard.checksum import DEFAULT as DEFAULT_CHECKSUM, Digest, HashingWriter
from audiopipe.shard.keys import member_name_problem, sample_key
from audiopipe.storage.atomic import AtomicBatch, atomic_path

# 2: tar keys are an injective escape of the id (1 replaced "." by "_", so two ids could share a key).
FORMAT_VERSION = 2
METADATA_KEY = b"audiopipe"

# Columns every shard has, in this order; feature columns follow.
BASE_FIELDS = [
    pa.field("id", pa.string()),
    pa.field("speaker", pa.string()),
    pa.field("text", pa.string()),
    pa.field("source", pa.string()),
    pa.field("duration", pa.float32()),
]


@dataclass(frozen=True)
class ArrayColumn:
    """A per-utterance array stored flattened with its time length in `<name>_frames`."""

    name: str
    dtype: str
    channels: int  # 0 for 1-D arrays

    def shape(self, frames: int) -> tuple[int, ...]:
        return (frames,) if self.channels == 0 else (self.channels, frames)


@dataclass(frozen=True)
class ScalarColumn:
    name: str
    type: pa.DataType


def _flat_column(arrays: list[np.ndarray], col: ArrayColumn) -> pa.Array:
    dtype = np.dtype(col.dtype)
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    values = np.concatenate([np.ascontiguousarray(a, dtype=dtype).reshape(-1) for a in arrays]) if arrays \
        else np.zeros(0, dtype=dtype)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))


def shard_schema(array_cols: list[ArrayColumn], scalar_cols: list[ScalarColumn], metadata: dict[str, Any]) -> pa.Schema:
    fields = list(BASE_FIELDS)
    for c in array_cols:
        fields.append(pa.field(c.name, pa.large_list(pa.from_numpy_dtype(np.dtype(c.dtype)))))
        fields.append(pa.field(f"{c.name}_frames", pa.int32()))
    for c in scalar_cols:
        fields.append(pa.field(c.name, c.type))
    meta = json.dumps({"format_version": FORMAT_VERSION, **metadata}, sort_keys=True, separators=(",", ":"))
    return pa.schema(fields, metadata={METADATA_KEY: meta.encode()})


def _target(path: Path, files: AtomicBatch | None):
    return files.path(path) if files is not None else atomic_path(path)


def write_arrow(path: Path, rows: list[dict[str, Any]], array_cols: list[ArrayColumn],
                scalar_cols: list[ScalarColumn], metadata: dict[str, Any], files: AtomicBatch | None = None,
                checksum: str = DEFAULT_CHECKSUM) -> Digest:
    """Write the shard's Arrow file; returns its size and checksum, hashed as the bytes were written.

    files: put the file in place with that batch's commit (fsync in the background), else at once."""
    schema = shard_schema(array_cols, scalar_cols, metadata)
    data: list[pa.Array] = [
        pa.array([r["id"] for r in rows], pa.string()),
        pa.array([r["speaker"] for r in rows], pa.string()),
        pa.array([r["text"] for r in rows], pa.string()),
        pa.array([r["source"] for r in rows], pa.string()),
        pa.array([r["duration"] for r in rows], pa.float32()),
    ]
    for c in array_cols:
        arrays = [r["arrays"][c.name] for r in rows]
        data.append(_flat_column(arrays, c))
        data.append(pa.array([a.shape[-1] for a in arrays], pa.int32()))
    for c in scalar_cols:
        data.append(pa.array([r["scalars"][c.name] for r in rows], c.type))
    batch = pa.RecordBatch.from_arrays(data, schema=schema)
    # IPC *file* format, no compression: readers memory-map it and take zero-copy views.
    with _target(path, files) as tmp:
        with HashingWriter(tmp, checksum) as f, pa.PythonFile(f, mode="w") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
    return f.digest()


# The WebDataset key of an id (an injective escape, see audiopipe.shard.keys); kept under this name for readers.
wds_key = sample_key


def npy_parts(a: np.ndarray) -> tuple[bytes, memoryview]:
    """The bytes np.save writes for `a`, as (header, a view of the array's own memory): the feature reaches
    the tar without a copy (np.save to a BytesIO copied it twice, the tar member a third time)."""
    a = np.ascontiguousarray(a)
    if a.dtype.hasobject:
        raise WrongType(f"cannot store an object array ({a.dtype}) in a tar without pickles")
    head = io.BytesIO()
    header = np.lib.format.header_data_from_array_1_0(a)
    try:  # np.save's own choice: format 1.0 unless the header does not fit it
        np.lib.format.write_array_header_1_0(head, header)
    except ValueError:
        head = io.BytesIO()
        np.lib.format.write_array_header_2_0(head, header)
    return head.getvalue(), memoryview(a).cast("B")


def _flac_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
    import soundfile as sf  # here, not at the top: the readers import this module for METADATA_KEY alone

    buf = io.BytesIO()
    sf.write(buf, pcm, sample_rate, format="FLAC", subtype="PCM_16")
    return buf.getvalue()


def sample_json(row: dict[str, Any], array_cols: list[ArrayColumn], scalar_cols: list[ScalarColumn]) -> dict[str, Any]:
    meta = {k: row[k] for k in ("id", "speaker", "text", "source")}
    meta["duration"] = float(np.float32(row["duration"]))
    for c in array_cols:
        meta[f"{c.name}_frames"] = int(row["arrays"][c.name].shape[-1])
    for c in scalar_cols:
        meta[c.name] = row["scalars"][c.name]
    return meta


_BLOCK = tarfile.BLOCKSIZE
_RECORD = tarfile.RECORDSIZE
_MEMBER_MODE = 0o644


def _member_header(name: str, size: int) -> bytes:
    """The header tarfile.addfile writes for a member with fixed metadata (PAX format: a PAX extended header
    only when a field needs one, e.g. a non-ASCII name)."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = _MEMBER_MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def write_tar(path: Path, rows: list[dict[str, Any]], array_cols: list[ArrayColumn],
              scalar_cols: list[ScalarColumn], pcm_rate: int | None, files: AtomicBatch | None = None,
              checksum: str = DEFAULT_CHECKSUM) -> Digest:
    """Write the shard's WebDataset tar; returns its size and checksum, hashed as the bytes were written.

    The bytes are those of tarfile (PAX format, fixed metadata, tests/test_shard_hotpath.py compares them),
    written directly: per member one header, the payload straight from the feature's memory, the padding;
    the end-of-archive blocks and the record padding last, as tarfile.close() writes them."""
    with _target(path, files) as tmp, HashingWriter(tmp, checksum) as f:
        offset = 0
        for row in rows:
            key = sample_key(row["id"])
            # Plan-time checks refuse such ids; this is the last line of defence, whatever the input.
            problem = member_name_problem(key)
            if problem:
                raise InvalidValue(f"utterance id {row['id']!r} cannot be a tar member name: it {problem}")
            members: list[tuple[str, tuple[Any, ...]]] = [
                ("json", (json.dumps(sample_json(row, array_cols, scalar_cols), sort_keys=True,
                                     ensure_ascii=False).encode(),))
            ]
            for c in array_cols:
                a = row["arrays"][c.name]
                if c.name == "pcm" and pcm_rate:
                    members.append(("flac", (_flac_bytes(a, pcm_rate),)))
                else:
                    members.append((f"{c.name}.npy", npy_parts(a)))
            for ext, parts in members:
                size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
                header = _member_header(f"{key}.{ext}", size)
                f.write(header)
                for part in parts:
                    f.write(part)
                pad = -size % _BLOCK
                if pad:
                    f.write(bytes(pad))
                offset += len(header) + size + pad
        offset += 2 * _BLOCK
        f.write(bytes(2 * _BLOCK + (-offset % _RECORD)))
    return f.digest()
