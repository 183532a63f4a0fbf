"""Which shards of a folder can be read, decided before an epoch is planned.

A shard is corrupt when it is missing, its size differs from the manifest's, its Arrow footer, schema or
record-batch header cannot be read, it lacks a requested column, its feature hashes differ from the manifest's,
its row count differs from the manifest's, or (verify="checksum") its checksum differs. Every check but the checksum
touches no row payload: one stat, then the footer and headers (about 0.1 ms a shard when they are cached), so
a folder of 10,000 shards is checked in about a second.

What the scan cannot see (a flipped byte in the values, which only the checksum catches; a file rewritten after the
scan) is caught when the shard is mapped or read, as CorruptShardError; by then the epoch is planned, so that
error stops training whatever on_corrupt says (see docs/loader.md, "Corrupt shards").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from audiopipe.errors import InvalidValue
from audiopipe.shard.checksum import checksum_of, file_checksum, new_hash
from audiopipe.shard.writer import METADATA_KEY

ON_CORRUPT = ("fail", "skip")
# "checksum": every byte against the manifest's checksum (xxh3-128, or sha256 for older shards). "sha256" is the
# name that option had when sha256 was the only checksum; it is still accepted and means the same.
VERIFY = ("size", "checksum")
_VERIFY_ALIASES = {"sha256": "checksum"}


def verify_mode(verify: str) -> str:
    """The readers' `verify` argument, checked, with the old name taken for the new."""
    mode = _VERIFY_ALIASES.get(verify, verify)
    if mode not in VERIFY:
        raise InvalidValue(f"verify must be one of {VERIFY}, got {verify!r}")
    return mode


def checksum_fails(path: Path, file_entry: dict[str, Any]) -> str | None:
    """Why a local file fails the checksum its manifest entry names, or None when it passes."""
    try:
        want = checksum_of(file_entry)
    except KeyError:
        return "has no checksum in the manifest"
    if file_checksum(path, want.algorithm) != want.hexdigest:
        return f"fails its {want.algorithm} checksum"
    return None


@dataclass(frozen=True)
class CorruptShard:
    shard: int  # position in manifest["shards"]
    name: str
    path: str
    rows: int  # rows the manifest lists for it: what skipping it drops
    reason: str

    def line(self) -> str:
        return f"shard {self.name} ({self.path}, {self.rows} row{'' if self.rows == 1 else 's'}): {self.reason}"


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def check_shard(root: Path, entry: dict[str, Any], features: Sequence[str], feature_hashes: dict[str, str],
                verify: str = "size") -> str | None:
    """Why this shard cannot be read, or None when it passes."""
    path = root / entry["arrow"]["path"]
    want = int(entry["arrow"]["bytes"])
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if size != want:
        return f"{size} bytes, manifest says {want}: truncated or replaced"
    try:
        # The mapping is closed at once: only the footer, the schema and the batch headers are read.
        with pa.memory_map(str(path)) as mm:
            reader = pa.ipc.open_file(mm)
            schema = reader.schema
            rows = 0
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                # Buffer sizes against the array lengths the header declares (no row payload read): a shrunk
                # buffer length is named here, not met later as a numpy error.
                batch.validate()
                rows += batch.num_rows
    except (pa.lib.ArrowException, OSError) as e:
        return f"unreadable Arrow file ({first_line(e)})"
    reason = check_contents(schema, rows, entry, features, feature_hashes)
    if reason is None and verify == "checksum":
        reason = checksum_fails(path, entry["arrow"])
    return reason


def check_contents(schema: pa.Schema, rows: int, entry: dict[str, Any], features: Sequence[str],
                   feature_hashes: dict[str, str]) -> str | None:
    """The checks on a shard's schema and row count, wherever it was read from (local file or object store)."""
    for f in features:
        for col in (f, f"{f}_frames"):
            if col not in schema.names:
                return f"no column {col!r}"
    try:
        meta = json.loads((schema.metadata or {})[METADATA_KEY])["features"]
    except (KeyError, TypeError, ValueError):
        return "no readable audiopipe metadata in its schema"
    for f in features:
        if f in feature_hashes and meta.get(f, {}).get("hash") != feature_hashes[f]:
            return f"feature {f} hash differs from the manifest"
    if rows != int(entry["rows"]):
        return f"{rows} rows, manifest says {entry['rows']}"
    return None


def scan(root: Path, manifest: dict[str, Any], features: Sequence[str], verify: str = "size") -> list[CorruptShard]:
    """Every corrupt shard of the folder, in manifest order."""
    hashes = {f: spec["hash"] for f, spec in manifest["features"].items()}
    bad = []
    for k, entry in enumerate(manifest["shards"]):
        reason = check_shard(root, entry, features, hashes, verify)
        if reason is not None:
            bad.append(CorruptShard(k, entry["name"], str(root / entry["arrow"]["path"]), int(entry["rows"]), reason))
    return bad


def index_checksum_fails(data: bytes | memoryview | None, path: Path | None, manifest: dict[str, Any]) -> str | None:
    """Why index.arrow (its bytes, or the file at `path`) fails the manifest's checksum of it, or None.

    xxh3-128 when the manifest has it (tens of GB/s: a 50M-utterance index, ~2 GB, in well under a second),
    else sha256 (manifests written before the index had an xxh3 entry); no entry: nothing to check against."""
    entry = manifest.get("index") or {}
    try:
        want = checksum_of(entry)
    except KeyError:
        return None
    if data is not None:
        h = new_hash(want.algorithm)
        h.update(data)
        got = h.hexdigest()
    else:
        got = file_checksum(path, want.algorithm)
    return None if got == want.hexdigest else f"fails the manifest's {want.algorithm} check"


def check_index(shard_of: np.ndarray, row_of: np.ndarray, manifest: dict[str, Any], where: str) -> None:
    """The index must list the manifest's shards row by row, as `audiopipe shard` writes it: shard k's rows
    0..rows_k-1, in manifest order. Anything else (a permuted `row` column, a row or shard out of range, a
    stale index) is a CorruptIndexError naming the file: reading on would pair one utterance's id and length
    with another's features, or fail with a bare IndexError. O(utterances) in numpy: ~10 ms a million."""
    from audiopipe.reader.errors import CorruptIndexError

    rows = np.array([int(s["rows"]) for s in manifest["shards"]], dtype=np.int64)
    n = int(rows.sum())
    shard_of = np.asarray(shard_of)
    row_of = np.asarray(row_of)
    if shard_of.size != n or row_of.size != n:
        raise CorruptIndexError(f"{where} lists {shard_of.size} utterances, the manifest's shards hold {n}: stale "
                                f"or from another run; rebuild the shard set")
    if n == 0:
        return
    want_shard = np.repeat(np.arange(rows.size, dtype=np.int64), rows)
    bad = np.flatnonzero(shard_of != want_shard)
    if bad.size == 0:
        starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
        bad = np.flatnonzero(row_of != np.arange(n, dtype=np.int64) - starts[want_shard])
    if bad.size:
        i = int(bad[0])
        raise CorruptIndexError(
            f"{where} is corrupt: entry {i} points at shard {int(shard_of[i])} row {int(row_of[i])}, where shard "
            f"{int(want_shard[i])} row {i - int(np.concatenate([[0], np.cumsum(rows)])[want_shard[i]])} belongs "
            f"({bad.size} entries out of place or out of range); rebuild the shard set")


def summary(bad: Sequence[CorruptShard], total_shards: int, limit: int = 3) -> str:
    """One line: the first few corrupt shards and how many more."""
    lines = "; ".join(b.line() for b in bad[:limit])
    more = f"; and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"{len(bad)} of {total_shards} shards corrupt: {lines}{more}"


def spans_whole_group(rank: int | None, world_size: int | None) -> bool:
    """Whether a loader with this rank/world_size is one of the whole torch.distributed group's (so every rank
    builds one, and a collective among them cannot hang): torch.distributed is initialised with more than one
    rank, and rank and world_size are left to default or equal the group's. A loader built on one rank alone
    (evaluation: rank=0, world_size=1) is not."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return False
    return ((rank is None or int(rank) == dist.get_rank())
            and (world_size is None or int(world_size) == dist.get_world_size()))


def union_across_ranks(shards: Sequence[int], num_shards: int) -> list[int]:
    """The corrupt shards any rank found, when torch.distributed is initialised (else `shards` as is).

    Ranks on different nodes may see different files (node-local copies, a shard truncated between two
    ranks' scans); planning over the union keeps every rank's plan, and so its batch count, the same.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return sorted(shards)
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":  # NCCL reduces GPU tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    mask = torch.zeros(num_shards, dtype=torch.int32, device=device)
    if len(shards):
        mask[torch.as_tensor(list(shards), dtype=torch.long, device=device)] = 1
    dist.all_reduce(mask, op=dist.ReduceOp.MAX)
    return np.flatnonzero(mask.cpu().numpy()).tolist()
