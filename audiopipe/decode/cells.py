"""Audio stored as bytes in a cell of a Parquet or Arrow table (a Hugging Face dataset's `Audio` column), decoded
in place: the bytes go from the table to libsndfile in memory, never to a file.

A cell utterance's path is the table file; its `extra` has `cell_format` ("parquet" or "arrow"), `cell_column`
(the column), `cell_field` ("bytes" inside Hugging Face's `{bytes, path}` struct, or None for a plain binary
column), `cell_row` (the row: within its row group for Parquet, in the file for Arrow) and, for Parquet,
`cell_group` (the row group). Parquet is read one row group of that one column at a time, each kept until the
shard's last utterance in it; an Arrow file is memory-mapped. The checks are those of `load_audio`.
"""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

import numpy as np
import soundfile as sf

from audiopipe.decode import declared
from audiopipe.decode.audio import DecodeLimits, Header, RejectError, decode_open, measure_frames
from audiopipe.storage import guard

# A cell larger than this is refused rather than decoded from memory (a 2 GiB binary value is not a clip).
MAX_CELL_BYTES = 1 << 30


class AudioBytes(io.BytesIO):
    """Audio bytes in memory for libsndfile. A damaged header can make libsndfile seek before the start; BytesIO
    raises there, inside soundfile's C callback, which prints a traceback and goes on: clamp instead, as a file
    does (audiopipe.decode.members.MemberView does the same for tar members)."""

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        try:
            return super().seek(pos, whence)
        except ValueError:
            return super().seek(0)

    def __repr__(self) -> str:
        # libsndfile's errors name the file by its repr: never an address, which would differ between runs of
        # the same job (rejects.jsonl and plan.json are byte-identical from run to run).
        return f"<{len(self.getbuffer())} bytes of audio>"


def is_cell(u: Any) -> bool:
    return bool(u.extra) and "cell_row" in u.extra


def cell_info(data: bytes | memoryview) -> Header:
    """The header of audio bytes, or RejectError (empty, unreadable). A stream whose header gives no length is
    measured by decoding it, as audiopipe.decode.audio.read_info does."""
    size = len(data)
    if size == 0:
        raise RejectError("empty", "the audio cell holds 0 bytes")
    if size > MAX_CELL_BYTES:
        raise RejectError("too_large", f"the audio cell holds {size} bytes, more than {MAX_CELL_BYTES}")
    try:
        with sf.SoundFile(AudioBytes(data)) as f:
            frames = measure_frames(f) if declared.unknown(f.frames) else f.frames
            return Header(f.samplerate, frames, f.channels, f.format, f.subtype)
    except (RuntimeError, OSError, ValueError, TypeError) as e:
        raise RejectError("unreadable", f"libsndfile cannot read the cell's header ({size} bytes): {e}") from None


def decode_cell(data: bytes | memoryview, limits: DecodeLimits | None = None) -> tuple[np.ndarray, int]:
    """Decode audio bytes to (float32 mono, rate) with load_audio's checks (the length its header declares
    included)."""
    limits = limits or DecodeLimits()
    cell_info(data)  # the refusals of bytes that are not audio
    with sf.SoundFile(AudioBytes(data)) as f:
        return decode_open(f, AudioBytes(data), len(data), limits, what="embedded audio")


def _regular(path: str) -> None:
    try:
        guard.regular(path)
    except guard.Refused as e:
        raise RejectError(e.reason, e.detail) from None


def open_arrow(path: str) -> Any:
    """The table of an Arrow file, memory-mapped: the IPC file format, or the stream format that Hugging Face
    `datasets` writes."""
    import pyarrow as pa

    source = pa.memory_map(path, "r")
    try:
        return pa.ipc.open_file(source).read_all()
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source).read_all()


def _cell_bytes(column: Any, row: int, field: str | None) -> Any:
    value = column[row]
    if field is not None:
        value = value[field] if value.is_valid else value
    if not value.is_valid:
        raise RejectError("missing", "the audio cell is empty (null)")
    buf = value.as_buffer()
    return memoryview(buf) if buf is not None else b""


class CellCache:
    """The table columns one shard's cell utterances read: Parquet row groups kept until their last utterance
    in the shard is decoded, Arrow files mapped once."""

    def __init__(self, utterances: Any):
        cells = [u for u in utterances if is_cell(u)]
        self._left = Counter(self._group(u) for u in cells if u.extra["cell_format"] == "parquet")
        self._groups: dict[tuple, Any] = {}
        self._arrow: dict[tuple, Any] = {}
        self.group_reads = 0  # diagnostics: Parquet row groups read

    @staticmethod
    def _group(u: Any) -> tuple:
        return (u.path, int(u.extra["cell_group"]), u.extra["cell_column"])

    def _column(self, u: Any) -> Any:
        x = u.extra
        if x["cell_format"] == "arrow":
            key = (u.path, x["cell_column"])
            if key not in self._arrow:
                _regular(u.path)
                self._arrow[key] = open_arrow(u.path).column(x["cell_column"])
            return self._arrow[key]
        key = self._group(u)
        column = self._groups.get(key)
        if column is None:
            import pyarrow.parquet as pq

            _regular(u.path)
            with pq.ParquetFile(u.path) as pf:
                column = pf.read_row_group(key[1], columns=[key[2]]).column(0)
            self._groups[key] = column
            self.group_reads += 1
        self._left[key] -= 1
        if self._left[key] <= 0:  # the shard's last utterance in this row group: let it go after this one
            self._groups.pop(key, None)
        return column

    def bytes_of(self, u: Any) -> Any:
        """The audio bytes of a cell utterance, or RejectError."""
        try:
            column = self._column(u)
            return _cell_bytes(column, int(u.extra["cell_row"]), u.extra.get("cell_field"))
        except (OSError, ValueError, IndexError, KeyError) as e:  # the table changed or went bad since discovery
            raise RejectError("unreadable", f"cannot read row {u.extra['cell_row']} of {u.path}: {e}") from None

    def load(self, u: Any, limits: DecodeLimits) -> tuple[np.ndarray, int]:
        return decode_cell(self.bytes_of(u), limits)
