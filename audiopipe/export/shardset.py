"""What an export reads: a shard folder's rows in shard order, one bounded chunk at a time, with its columns.

Rows come through the mmap reader (`ShardDataset`): a chunk of rows is a few views into the mapped shards, and at
most two shards stay mapped, so an export holds one chunk's arrays, whatever the size of the shard set. Which
columns a shard set has is read from its manifest and the first shard's Arrow schema.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from audiopipe.export.errors import ExportError
from audiopipe.shard.writer import BASE_FIELDS
from audiopipe.features.names import column_names

BASE_COLUMNS = tuple(f.name for f in BASE_FIELDS)  # id, speaker, text, source, duration
_CHUNK_BYTES = 64 << 20  # feature bytes per chunk: what one step of an export holds in memory


@dataclass(frozen=True)
class ArrayInfo:
    """One per-utterance array column of the shards: [channels, T] (or [T] when channels is 0)."""

    name: str
    dtype: str
    channels: int
    kind: str | None  # feature kind (kaldi_fbank, vocos_mel, ...); None for phones/durations (no feature spec)
    sample_rate: int | None
    hop_length: int | None

    @property
    def frame_shift(self) -> float | None:
        """Seconds between frames, for features with a frame rate."""
        return self.hop_length / self.sample_rate if self.kind and self.sample_rate and self.hop_length else None


class ShardSource:
    """A shard folder opened for export: `arrays` it holds, `extra_columns` (kept manifest columns, trim
    offsets), `pcm` (the waveform feature, or None), and, once `open()`ed, `chunks()` of rows in shard order.

    arrays: the array columns to read (None: every one the shards hold, pcm excluded); one they lack is an
    ExportError naming what they have."""

    def __init__(self, shards_dir: str | Path, arrays: Sequence[str] | None = None):
        from audiopipe.shard.manifest import read_manifest
        from audiopipe.storage.paths import require_local

        self.root = Path(require_local(shards_dir, "shard folder"))
        try:
            self.manifest = read_manifest(self.root)
        except FileNotFoundError as e:
            raise ExportError(str(e)) from None
        if not self.manifest.get("shards"):
            raise ExportError(f"{self.root} holds no shards: nothing to export")
        schema = self._schema()
        specs = self.manifest.get("features", {})
        held: dict[str, ArrayInfo] = {}
        for name in schema.names:
            if f"{name}_frames" not in schema.names:
                continue
            spec = specs.get(name)
            value = schema.field(name).type.value_type
            held[name] = ArrayInfo(name, spec["dtype"] if spec else np.dtype(value.to_pandas_dtype()).name,
                                   int(spec["channels"]) if spec else 0, spec.get("kind") if spec else None,
                                   spec.get("sample_rate") if spec else None, spec.get("hop_length") if spec else None)
        self.held = held
        self.pcm = held.get("pcm")
        if arrays is None:
            arrays = [n for n in held if n != "pcm"]
        arrays = column_names(arrays)  # kaldi_fbank -> fbank (features/names.py)
        missing = [a for a in arrays if a not in held]
        if missing:
            raise ExportError(f"{self.root} has no feature {', '.join(missing)} (it has "
                              f"{', '.join(held) or 'no arrays'})")
        self.arrays = {a: held[a] for a in arrays if a != "pcm"}
        taken = set(BASE_COLUMNS) | {f"{n}_frames" for n in held} | set(held)
        self.extra_columns = [n for n in schema.names if n not in taken and not n.startswith("_")]
        self.extra_types = {n: schema.field(n).type for n in self.extra_columns}
        job = self.manifest.get("job", {})
        self.corpus: str | None = job.get("corpus")
        self.trimmed = bool(job.get("trim"))
        self.dataset: Any = None
        self._read: list[str] = []

    def open(self, pcm: bool = False) -> "ShardSource":
        """Open the rows for reading: the chosen arrays, and the pcm feature too when `pcm`."""
        from audiopipe.reader.arrow_dataset import ShardDataset

        self._read = list(self.arrays) + (["pcm"] if pcm else [])
        try:
            # Two shards mapped at most: rows are read in shard order, so the one before is never needed again.
            self.dataset = ShardDataset(self.root, self._read, meta_columns=(*BASE_COLUMNS, *self.extra_columns),
                                        max_open=2)
        except (FileNotFoundError, ValueError) as e:
            raise ExportError(str(e)) from None
        return self

    def _schema(self) -> pa.Schema:
        first = self.root / self.manifest["shards"][0]["arrow"]["path"]
        try:
            with pa.memory_map(str(first)) as src:
                return pa.ipc.open_file(src).schema
        except (OSError, pa.ArrowException) as e:
            raise ExportError(f"shard {first} is unreadable: {str(e).splitlines()[0]}; "
                              f"run `audiopipe verify`") from None

    def __len__(self) -> int:
        return len(self.dataset)

    def shard_ranges(self) -> list[tuple[str, int, int]]:
        """(shard name, first row, end row) in index order: the index lists the shards' rows in manifest order."""
        out, start = [], 0
        for entry in self.manifest["shards"]:
            out.append((entry["name"], start, start + int(entry["rows"])))
            start += int(entry["rows"])
        if start != len(self.dataset):
            raise ExportError(f"{self.root}: the manifest lists {start} rows, the index {len(self.dataset)}; "
                              f"run `audiopipe verify`")
        return out

    def chunks(self, start: int, stop: int) -> Iterator[list[dict[str, Any]]]:
        """Rows start..stop-1 as item dicts ({id, speaker, text, source, duration, extra columns, arrays}),
        in chunks of at most 256 rows or ~64 MB of arrays; the arrays are views into the mapped shards."""
        lengths = {a: self.dataset.lengths(a) for a in self._read}
        sizes = {a: max(self.dataset.channels[a], 1) * np.dtype(self.held[a].dtype).itemsize for a in self._read}
        i = start
        while i < stop:
            j, nbytes = i, 0
            while j < stop and (j == i or nbytes < _CHUNK_BYTES) and j - i < 256:
                nbytes += sum(int(lengths[a][j]) * sizes[a] for a in self._read)
                j += 1
            batch = self.dataset.__getitems__(list(range(i, j)))
            yield [batch[k] for k in range(len(batch))]
            i = j


def progress_bar(total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="utt", desc=desc, disable=not enabled, file=sys.stderr)


def feature_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ExportError("features= names no feature")
    return names


def add_export_arguments(p: Any, *, out_help: str, overwrite_help: str, audio_help: str,
                         audio_choices: tuple[str, ...], features_help: str | None = None) -> None:
    """The options every shard-set export shares (--shards, --out, [--features], --audio, --overwrite,
    --no-progress), each with the help text of its format."""
    p.add_argument("--shards", required=True, help="audiopipe shard folder")
    p.add_argument("--out", required=True, help=out_help)
    if features_help is not None:
        p.add_argument("--features", default=None, help=features_help)
    p.add_argument("--audio", choices=audio_choices, default="auto", help=audio_help)
    p.add_argument("--overwrite", action="store_true", help=overwrite_help)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

