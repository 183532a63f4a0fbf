"""Write one shard as an Arrow IPC file and a WebDataset tar, atomically.

Both files are first written under a temporary name in the same folder and renamed only when complete and
fsync'd, so a crash or kill -9 leaves either a finished shard or nothing that a reader would trust.
Bytes are deterministic: same rows in, same bytes out (no timestamps, sorted JSON, fixed tar metadata).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import soundfile as sf

FORMAT_VERSION = 1
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


def _atomic_target(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _commit(tmp: Path, path: Path) -> None:
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_arrow(path: Path, rows: list[dict[str, Any]], array_cols: list[ArrayColumn],
                scalar_cols: list[ScalarColumn], metadata: dict[str, Any]) -> None:
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
    tmp = _atomic_target(path)
    # IPC *file* format, no compression: readers memory-map it and take zero-copy views.
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    _commit(tmp, path)


def wds_key(utt_id: str) -> str:
    # webdataset splits a member name at the first dot of its basename; ids may contain dots.
    return utt_id.replace(".", "_")


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _flac_bytes(pcm: np.ndarray, sample_rate: int) -> bytes:
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


def write_tar(path: Path, rows: list[dict[str, Any]], array_cols: list[ArrayColumn],
              scalar_cols: list[ScalarColumn], pcm_rate: int | None) -> None:
    tmp = _atomic_target(path)
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for row in rows:
            key = wds_key(row["id"])
            members: list[tuple[str, bytes]] = [
                ("json", json.dumps(sample_json(row, array_cols, scalar_cols), sort_keys=True,
                                    ensure_ascii=False).encode())
            ]
            for c in array_cols:
                a = row["arrays"][c.name]
                if c.name == "pcm" and pcm_rate:
                    members.append(("flac", _flac_bytes(a, pcm_rate)))
                else:
                    members.append((f"{c.name}.npy", _npy_bytes(a)))
            for ext, blob in members:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(blob)
                info.mtime = 0
                info.mode = 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(blob))
    _commit(tmp, path)
