"""Shard folders of known rows for the reader tests, and the helpers those tests share.

`write_shards` builds a shard folder in-process with audiopipe.shard.writer / index / manifest (no Ray, no
audio), so every test knows exactly what each row holds. Imported by the reader, loader, S3, WebDataset,
corrupt-shard and benchmark tests.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from launch import run_group
from audiopipe.decode.audio import resampler_info
from audiopipe.features.registry import build_feature
from audiopipe.index.lengths import build_index
from audiopipe.shard.checksum import checksum_of, file_checksum
from audiopipe.shard.manifest import assemble_manifest
from audiopipe.shard.writer import ArrayColumn, write_arrow, write_tar

SPECS = {s.name: s for kind, params in (("vocos_mel", {}), ("f0", {"sample_rate": 16000, "hop_length": 160}),
                                          ("pcm", {"sample_rate": 16000}))
         for s in build_feature(kind, **params).specs}
ROWS_PER_SHARD = (5, 9, 1, 7, 6)


@dataclass
class Written:
    root: Path
    rows: list[dict]  # in global index order: id, speaker, text, duration, arrays

    def shard_path(self, k: int, kind: str = "arrow") -> Path:
        m = json.loads((self.root / "manifest.json").read_text())
        return self.root / m["shards"][k][kind]["path"]


def write_shards(out: Path, rows_per_shard=ROWS_PER_SHARD, seed: int = 0, mel_frames=(20, 400),
                 tars: bool = True) -> Written:
    """A shard folder of random rows (mel [100, T], f0/voiced [T'], int16 pcm [N]) via the real writer."""
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    acols = [ArrayColumn(s.name, s.dtype, s.channels) for s in SPECS.values()]
    features = {s.name: {**s.to_dict(), "hash": s.config_hash} for s in SPECS.values()}
    records, everything = [], []
    for k, n in enumerate(rows_per_shard):
        rows = []
        for j in range(n):
            t = int(rng.integers(*mel_frames))
            seconds = t * 256 / 24000
            t16 = int(seconds * 100)
            rows.append({
                # a dot and a slash in the id: the tar key replaces the dot, the folder stays
                "id": f"spk{k % 2}/utt{k:02d}.{j:03d}", "speaker": f"spk{k % 2}", "text": f"text {k} {j} é",
                "source": f"spk{k % 2}/utt{k:02d}.{j:03d}.wav", "duration": float(np.float32(seconds)),
                "arrays": {"mel": rng.standard_normal((100, t)).astype(np.float32),
                           "f0": rng.uniform(80, 300, t16).astype(np.float32),
                           "voiced": rng.integers(0, 2, t16).astype(np.uint8),
                           "pcm": rng.integers(-32768, 32767, int(seconds * 16000)).astype(np.int16)},
                "scalars": {}})
        name = f"shard-{k:06d}"
        arrow = out / "arrow" / f"{name}.arrow"
        digest = write_arrow(arrow, rows, acols, [], {"features": features, "job": "test"})
        rec = {"name": name, "rows": n, "duration": sum(r["duration"] for r in rows), "rejects": [],
               "arrow": digest.entry(f"arrow/{name}.arrow")}
        if tars:
            tar = out / "wds" / f"{name}.tar"
            rec["tar"] = write_tar(tar, rows, acols, [], 16000).entry(f"wds/{name}.tar")
        records.append(rec)
        everything += rows
    index = build_index(out, [r["arrow"]["path"] for r in records])
    assemble_manifest(out, records, features, resampler_info(), {"presets": ["test"]}, len(everything), 0, index)
    return Written(out, everything)


def copy_shards(w: Written, dst: Path) -> Written:
    shutil.copytree(w.root, dst)
    return Written(dst, w.rows)


def rewrite_index_column(root: Path, column: str, change) -> None:
    """index.arrow with one column changed by `change(values)`, and the manifest rehashed to match: only a
    comparison with the shards themselves can tell."""
    path = root / "index.arrow"
    t = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    i = t.column_names.index(column)
    t = t.set_column(i, column, pa.array(change(t.column(column).to_pylist()), t.schema.field(column).type))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    m = json.loads((root / "manifest.json").read_text())
    m["index"] = {"path": "index.arrow", "sha256": file_checksum(path, "sha256"),
                  "xxh3_128": file_checksum(path, "xxh3_128")}
    (root / "manifest.json").write_text(json.dumps(m))


def swap_first_two(values: list) -> list:
    values[0], values[1] = values[1], values[0]
    return values


def set_manifest_entry(root: Path, k: int, kind: str = "arrow") -> None:
    """Make the manifest agree with a shard file's current size and hash (a 'replaced' shard)."""
    m = json.loads((root / "manifest.json").read_text())
    e = m["shards"][k][kind]
    algorithm = checksum_of(e).algorithm
    e.update({"bytes": (root / e["path"]).stat().st_size, algorithm: file_checksum(root / e["path"], algorithm)})
    (root / "manifest.json").write_text(json.dumps(m))


def as_sha256_shards(root: Path) -> None:
    """Give the manifest the sha256 entries of shards made before xxh3 (same files, older records)."""
    m = json.loads((root / "manifest.json").read_text())
    for sh in m["shards"]:
        for kind in ("arrow", "tar"):
            if kind in sh:
                sh[kind].pop(checksum_of(sh[kind]).algorithm)
                sh[kind]["sha256"] = file_checksum(root / sh[kind]["path"], "sha256")
    (root / "manifest.json").write_text(json.dumps(m))


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of `path` (from /proc/self/maps)."""
    target = os.path.realpath(path)
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == target:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                out.append((lo, hi))
    return out


def global_of(shard: int, row: int) -> int:
    return sum(ROWS_PER_SHARD[:shard]) + row


# ---- samples ---------------------------------------------------------------------------------------------------


def run_torchrun(script: Path, *args: str, timeout: float = 150) -> None:
    """Two CPU ranks under torchrun; kills the whole process group on timeout."""
    # --standalone picks a free rendezvous port (--master_port=0 hangs the ranks with this torch).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), *args]
    r = run_group(cmd, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]


def poison_feature(path: Path, feature: str = "mel", values: int = 4) -> None:
    """Overwrite the first `values` floats of `feature` in an Arrow shard (its first row) with NaN, in place: the
    file keeps its size, so only a checksum or a look at the numbers can tell."""
    import struct

    import pyarrow as pa

    from audiopipe.reader import ipc_layout

    data = bytearray(path.read_bytes())
    flen = ipc_layout.footer_length(bytes(data[-10:]))
    block = ipc_layout.record_batch_blocks(bytes(data[len(data) - 10 - flen:len(data) - 10]))[0]
    schema = pa.ipc.open_file(pa.BufferReader(bytes(data))).schema
    head = bytes(data[block.offset:block.offset + block.metadata_length])
    off, n = ipc_layout.columns(schema, ipc_layout.batch_layout(block, head))[feature].buffers[-1]
    assert n >= 4 * values
    data[off:off + 4 * values] = struct.pack(f"<{values}f", *[float("nan")] * values)
    path.write_bytes(bytes(data))
