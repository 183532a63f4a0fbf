"""Where every buffer of an Arrow IPC file lies, from its footer and record-batch header alone.

A shard is one uncompressed record batch. To read a few rows of it from object storage by byte range, the
reader needs the file offset of each column's buffers (the values of `mel` are one contiguous buffer, row r
being values[offsets[r]:offsets[r+1]]). pyarrow reads a record batch's body whole, so the offsets come from
the two small flatbuffers the IPC format puts around the body: the footer (the file's last bytes: where each
record batch's message starts) and the message header (each buffer's offset and length within the body).
Both are read here with a minimal flatbuffer walker (only tables, structs vectors and unions are needed); the
schema itself is still read by pyarrow.

Format reference: Arrow's File.fbs, Message.fbs and Schema.fbs (columnar format specification, "IPC File
Format" and "Encapsulated message format").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import pyarrow as pa

MAGIC = b"ARROW1"
TRAILER = 10  # int32 footer length + "ARROW1"
_CONTINUATION = 0xFFFFFFFF
_RECORD_BATCH = 3  # MessageHeader union tag


class LayoutError(ValueError):
    """The bytes are not an Arrow IPC file this reader understands (truncated, corrupted, compressed)."""


class _Table:
    """One flatbuffer table: fields by index, scalars read in place, offsets followed."""

    def __init__(self, buf: bytes, pos: int):
        if pos < 0 or pos + 4 > len(buf):
            raise LayoutError("flatbuffer table out of bounds")
        self.buf, self.pos = buf, pos
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        if vt < 0 or vt + 4 > len(buf):
            raise LayoutError("flatbuffer vtable out of bounds")
        self.vt = vt
        self.vt_len = struct.unpack_from("<H", buf, vt)[0]

    def _field(self, i: int) -> int:
        """Absolute position of field i, or 0 when it is absent (default value)."""
        at = 4 + 2 * i
        if at + 2 > self.vt_len:
            return 0
        off = struct.unpack_from("<H", self.buf, self.vt + at)[0]
        return self.pos + off if off else 0

    def scalar(self, i: int, fmt: str, default=0):
        p = self._field(i)
        return struct.unpack_from("<" + fmt, self.buf, p)[0] if p else default

    def _target(self, i: int) -> int:
        p = self._field(i)
        if not p:
            return 0
        t = p + struct.unpack_from("<I", self.buf, p)[0]
        if t >= len(self.buf):
            raise LayoutError("flatbuffer offset out of bounds")
        return t

    def table(self, i: int) -> "_Table | None":
        t = self._target(i)
        return _Table(self.buf, t) if t else None

    def structs(self, i: int, fmt: str) -> list[tuple]:
        """A vector of structs packed as `fmt` (little-endian, no implicit padding)."""
        t = self._target(i)
        if not t:
            return []
        n = struct.unpack_from("<I", self.buf, t)[0]
        size = struct.calcsize("<" + fmt)
        if t + 4 + n * size > len(self.buf):
            raise LayoutError("flatbuffer vector out of bounds")
        return [struct.unpack_from("<" + fmt, self.buf, t + 4 + k * size) for k in range(n)]


def _root(buf: bytes) -> _Table:
    if len(buf) < 8:
        raise LayoutError("flatbuffer too short")
    return _Table(buf, struct.unpack_from("<I", buf, 0)[0])


@dataclass(frozen=True)
class Block:
    offset: int  # where the encapsulated message starts in the file
    metadata_length: int  # its prefix + flatbuffer + padding; the body follows at offset + metadata_length
    body_length: int


def footer_length(trailer: bytes) -> int:
    """The footer's length from the file's last 10 bytes."""
    if len(trailer) < TRAILER or trailer[-6:] != MAGIC:
        raise LayoutError("no Arrow IPC file trailer (truncated or not an Arrow file)")
    n = struct.unpack_from("<i", trailer, len(trailer) - TRAILER)[0]
    if n <= 0:
        raise LayoutError(f"bad footer length {n}")
    return n


def record_batch_blocks(footer: bytes) -> list[Block]:
    """The record batches' blocks listed in the footer flatbuffer (Footer.recordBatches, field 3)."""
    # struct Block { offset: long; metaDataLength: int; <4 bytes padding>; bodyLength: long }
    return [Block(o, m, b) for o, m, _, b in _root(footer).structs(3, "qiiq")]


@dataclass(frozen=True)
class BatchLayout:
    rows: int
    nodes: list[tuple[int, int]]  # (length, null_count) per array, schema pre-order
    buffers: list[tuple[int, int]]  # (file offset, length) per buffer, schema pre-order


def message_flatbuffer(head: bytes) -> bytes:
    """The flatbuffer of an encapsulated message (with or without the 0xFFFFFFFF continuation marker)."""
    if len(head) < 8:
        raise LayoutError("message header truncated")
    first = struct.unpack_from("<I", head, 0)[0]
    start = 8 if first == _CONTINUATION else 4
    size = struct.unpack_from("<i", head, start - 4)[0]
    if size <= 0 or start + size > len(head):
        raise LayoutError("message header truncated")
    return head[start:start + size]


def batch_layout(block: Block, head: bytes) -> BatchLayout:
    """Buffer offsets in the file of one record batch, from its message's metadata bytes (`head`, the
    block's metadata_length bytes at block.offset)."""
    msg = _root(message_flatbuffer(head))
    if msg.scalar(1, "B") != _RECORD_BATCH:
        raise LayoutError("block is not a record batch message")
    rb = msg.table(2)
    if rb is None:
        raise LayoutError("record batch message has no header")
    if rb.table(3) is not None:
        raise LayoutError("compressed record batch: object-store reads need uncompressed shards")
    body = block.offset + block.metadata_length
    buffers = [(body + off, n) for off, n in rb.structs(2, "qq")]
    if any(off < body or off + n > body + block.body_length for off, n in buffers):
        raise LayoutError("a buffer lies outside its record batch body")
    return BatchLayout(rb.scalar(0, "q"), [tuple(x) for x in rb.structs(1, "qq")], buffers)


@dataclass(frozen=True)
class ColumnBuffers:
    """One top-level column: its arrays' nodes and buffers (file offset, length), children after parents."""

    field: pa.Field
    nodes: list[tuple[int, int]]
    buffers: list[tuple[int, int]]


def columns(schema: pa.Schema, layout: BatchLayout) -> dict[str, ColumnBuffers]:
    """Split the batch's nodes and buffers by top-level column (Arrow lays them out in schema pre-order)."""
    out: dict[str, ColumnBuffers] = {}
    ni = bi = 0

    def walk(t: pa.DataType) -> tuple[int, int]:
        nodes, bufs = 1, _ipc_buffers(t)
        for k in range(t.num_fields):
            n, b = walk(t.field(k).type)
            nodes, bufs = nodes + n, bufs + b
        return nodes, bufs

    for field in schema:
        n, b = walk(field.type)
        out[field.name] = ColumnBuffers(field, layout.nodes[ni:ni + n], layout.buffers[bi:bi + b])
        ni, bi = ni + n, bi + b
    if ni != len(layout.nodes) or bi != len(layout.buffers):
        raise LayoutError(f"schema needs {ni} arrays and {bi} buffers, the batch has {len(layout.nodes)} and "
                          f"{len(layout.buffers)}")
    return out


def _ipc_buffers(t: pa.DataType) -> int:
    """Buffers an array of this type has in an IPC body (the null type has none there, though pyarrow's in-memory
    layout counts one)."""
    return 0 if pa.types.is_null(t) else t.num_buffers


def _offset_width(t: pa.DataType) -> int:
    large = (pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t))
    return 8 if large else 4


def check_sizes(column: ColumnBuffers) -> None:
    """Every array of the column has buffers at least as long as its length needs, from the header alone (what
    pyarrow's RecordBatch.validate checks on a local file): validity bits when there are nulls, fixed-width
    values, offsets. A shrunk buffer length is a LayoutError here, not a misread row later."""
    ni = bi = 0

    def walk(t: pa.DataType) -> None:
        nonlocal ni, bi
        if ni >= len(column.nodes):
            raise LayoutError(f"column {column.field.name}: fewer arrays than its type needs")
        length, nulls = column.nodes[ni]
        nb = _ipc_buffers(t)
        bufs = column.buffers[bi:bi + nb]
        ni, bi = ni + 1, bi + nb
        if length < 0 or not 0 <= nulls <= length:
            raise LayoutError(f"column {column.field.name}: bad array length {length} or null count {nulls}")
        need: dict[int, int] = {}
        if nb and nulls and not pa.types.is_null(t):
            need[0] = (length + 7) // 8
        try:
            width = t.bit_width
        except ValueError:
            width = None
        if width is not None and nb >= 2:
            need[1] = (length * width + 7) // 8
        elif (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
              or pa.types.is_large_binary(t) or pa.types.is_list(t) or pa.types.is_large_list(t)):
            need[1] = (length + 1) * _offset_width(t) if length else 0
        for j, n in need.items():
            if bufs[j][1] < n:
                raise LayoutError(f"column {column.field.name}: buffer {j} is {bufs[j][1]} bytes, its {length} "
                                  f"values need at least {n}")
        for k in range(t.num_fields):
            walk(t.field(k).type)

    walk(column.field.type)
