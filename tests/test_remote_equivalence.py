"""The s3 reader returns exactly what the local reader returns, for every valid Arrow shard.

A hypothesis property over shard contents (empty strings everywhere, zero-length lists, a single row, all-null
columns, very long rows, several record batches): the same shard set read from its local folder (mmap), from an
S3 server on 127.0.0.1 (rows by byte range) and from the s3 reader's local cache must give the same items,
bit for bit. Shards are written with pyarrow's IPC writer in audiopipe's layout (schema and metadata from the
real writer's `shard_schema`), so several record batches per file can be written too.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from audiopipe.decode.audio import resampler_info
from audiopipe.index.lengths import build_index
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.remote_dataset import RemoteShardDataset
from audiopipe.shard.checksum import file_checksum
from audiopipe.shard.manifest import assemble_manifest
from audiopipe.shard.writer import ArrayColumn, shard_schema
from reader_helpers import SPECS

pytest_plugins = ["s3server"]

FEATURES = ["mel", "f0"]
COLUMNS = [ArrayColumn(SPECS[f].name, SPECS[f].dtype, SPECS[f].channels) for f in FEATURES]
META = {"features": {f: {**SPECS[f].to_dict(), "hash": SPECS[f].config_hash} for f in FEATURES}, "job": "prop"}


def _column(values: list, typ: pa.DataType, all_null: bool) -> pa.Array:
    return pa.array([None] * len(values) if all_null else values, typ)


def write_set(root: Path, shards: list[dict]) -> None:
    """A shard folder: each shard {"rows": [...], "batch_rows": k, "null": {column: bool}}, index, manifest."""
    records = []
    for k, sh in enumerate(shards):
        rows, null = sh["rows"], sh["null"]
        schema = shard_schema(COLUMNS, [], META)
        data = [_column([r["id"] for r in rows], pa.string(), False),
                _column([r["speaker"] for r in rows], pa.string(), null["speaker"]),
                _column([r["text"] for r in rows], pa.string(), null["text"]),
                _column([r["id"] + ".wav" for r in rows], pa.string(), null["source"]),
                pa.array([r["duration"] for r in rows], pa.float32())]
        for c in COLUMNS:
            arrays = [r[c.name] for r in rows]
            offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
            np.cumsum([a.size for a in arrays], out=offsets[1:])
            flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(c.dtype)
            data.append(pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat)))
            data.append(pa.array([a.shape[-1] for a in arrays], pa.int32()))
        table = pa.Table.from_arrays(data, schema=schema)
        name = f"shard-{k:06d}"
        path = root / "arrow" / f"{name}.arrow"
        path.parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema) as w:
            for batch in table.to_batches(max_chunksize=sh["batch_rows"]):
                w.write_batch(batch)
        records.append({"name": name, "rows": len(rows), "duration": sum(r["duration"] for r in rows),
                        "rejects": [], "arrow": {"path": f"arrow/{name}.arrow", "bytes": path.stat().st_size,
                                                 "xxh3_128": file_checksum(path)}})
    index = build_index(root, [r["arrow"]["path"] for r in records])
    total = sum(r["rows"] for r in records)
    assemble_manifest(root, records, META["features"], resampler_info(), {"presets": ["prop"]}, total, 0, index)


@st.composite
def shard_sets(draw):
    texts = st.one_of(st.just(""), st.text(max_size=12))
    n_shards = draw(st.integers(1, 3))
    shards, uid = [], 0
    for _ in range(n_shards):
        n = draw(st.integers(1, 6))
        long_row = draw(st.one_of(st.none(), st.integers(0, n - 1)))
        every_text_empty = draw(st.booleans())
        rows = []
        for j in range(n):
            t = draw(st.integers(0, 6))  # zero-length lists included
            if j == long_row:
                t = draw(st.integers(3000, 6000))  # a row of MBs: larger than a merged request's gap
            seed = draw(st.integers(0, 2**31))
            rng = np.random.default_rng(seed)
            rows.append({"id": f"u{uid:04d}", "speaker": draw(st.sampled_from(["", "a", "spk/1"])),
                         "text": "" if every_text_empty else draw(texts), "duration": float(np.float32(t / 93.75)),
                         "mel": rng.standard_normal((100, t)).astype(np.float32),
                         "f0": rng.uniform(50, 400, t // 2).astype(np.float32)})
            uid += 1
        shards.append({"rows": rows, "batch_rows": draw(st.integers(1, n)),
                       "null": {c: draw(st.booleans()) for c in ("speaker", "text", "source")}})
    return shards


def _items(ds, order) -> list[dict]:
    batch = ds.__getitems__(order)
    return [batch[i] for i in range(len(order))]


def _same_items(a: list[dict], b: list[dict], what: str) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys(), what
        for k in x:
            if isinstance(x[k], np.ndarray):
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and np.array_equal(x[k], y[k]), (what, k)
            else:
                assert type(x[k]) is type(y[k]) and x[k] == y[k], (what, k, x[k], y[k])


def test_remote_and_cache_equal_local_for_any_valid_shard(s3):
    server, bucket = s3
    from s3server import upload

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(shard_sets(), st.randoms(use_true_random=False))
    def check(shards, rnd):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "shards"
            write_set(root, shards)
            url = upload(server, root, f"{bucket}/{uuid.uuid4().hex[:8]}")
            n = sum(len(s["rows"]) for s in shards)
            order = list(range(n))
            rnd.shuffle(order)
            order += order[: n // 2]  # rows asked twice in one batch too
            want = _items(ShardDataset(root, FEATURES), order)
            remote = RemoteShardDataset(url, FEATURES, max_open=1)
            _same_items(want, _items(remote, order), "s3")
            # Read again after every shard was evicted (max_open=1): from the kept small buffers, same bytes.
            _same_items(want, _items(remote, order[::-1])[::-1], "s3 after eviction")
            cached = RemoteShardDataset(url, FEATURES, cache_dir=Path(tmp) / "cache", max_cache_bytes=1 << 30)
            for k, entry in enumerate(cached.manifest["shards"]):
                assert cached.cache.download(cached._shard_url(k), entry) is not None
            _same_items(want, _items(cached, order), "cache")
            assert cached.diagnostics()["mappings_made"] == len(shards)  # every shard came from the cache

    check()


def test_an_all_empty_text_column_reads_from_s3(s3, tmp_path):
    """The defect as found: a shard whose transcripts are all empty has a zero-length text data buffer."""
    server, bucket = s3
    from s3server import upload

    rows = [{"id": f"u{j}", "speaker": "s", "text": "", "duration": 0.5,
             "mel": np.ones((100, 5 + j), np.float32), "f0": np.ones(3, np.float32)} for j in range(4)]
    write_set(tmp_path / "s", [{"rows": rows, "batch_rows": 4, "null": dict.fromkeys(("speaker", "text", "source"),
                                                                                      False)}])
    url = upload(server, tmp_path / "s", f"{bucket}/empty-text")
    got = _items(RemoteShardDataset(url, FEATURES), [0, 1, 2, 3])
    assert [g["text"] for g in got] == ["", "", "", ""]
    _same_items(_items(ShardDataset(tmp_path / "s", FEATURES), [0, 1, 2, 3]), got, "s3")
