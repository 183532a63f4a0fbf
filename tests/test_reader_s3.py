"""Shards on object storage (issue 11, part 1 "Reading"): make_loader("s3://bucket/prefix") against a real S3
server on 127.0.0.1 (moto's server mode, tests/s3server.py) gives the same batches as the local folder, reads
rows by byte range, fetches the batches to come ahead, survives a server restart, names (or skips) a corrupt
object, keeps a bounded local cache, and works with DataLoader workers and under torchrun.

Shards come from the real writer (tests/test_reader.py's write_shards) and are copied to the bucket with
pyarrow.fs.copy_files: the layout under the prefix is the local folder's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from pyarrow import fs as pafs

from audiopipe.reader.errors import CorruptShardError
from audiopipe.reader.loader import make_loader
from audiopipe.reader.remote_dataset import RemoteShardDataset
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, parse_s3
from audiopipe.storage.s3_ranges import RetryPolicy
from test_reader import ROWS_PER_SHARD, write_shards

pytest_plugins = ["s3server"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FEATURES = ["mel", "f0"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("s3read") / "shards", tars=False)


def _admin(server) -> pafs.S3FileSystem:
    """A client of the test's own (not audiopipe's) for putting and breaking objects."""
    env = server.env()
    return pafs.S3FileSystem(access_key=env["AWS_ACCESS_KEY_ID"], secret_key=env["AWS_SECRET_ACCESS_KEY"],
                             region=env["AWS_REGION"], endpoint_override=server.endpoint, scheme="http")


def upload(server, folder: Path, url: str) -> str:
    """Copy a local shard folder under an s3:// prefix, the same layout."""
    pafs.copy_files(str(folder), parse_s3(url).path, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=_admin(server))
    return url


@pytest.fixture
def remote(s3, local):
    server, bucket = s3
    return server, upload(server, local.root, f"{bucket}/corpus/v1")


def _batches(loader, epochs=(0,)) -> list[dict]:
    out = []
    for e in epochs:
        loader.set_epoch(e)
        for b in loader:
            out.append({k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()})
    return out


def _same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and a
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], torch.Tensor):
                assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
            else:
                assert x[k] == y[k], k


def _loader(src, **kw):
    kw.setdefault("max_frames", 1500)
    return make_loader(str(src), FEATURES, rank=0, world_size=1, **kw)


def test_same_batches_as_the_local_folder_and_rows_by_byte_range(remote, local):
    server, url = remote
    want = _batches(_loader(local.root), epochs=(0, 1))
    loader = _loader(url)
    got = _batches(loader, epochs=(0, 1))
    _same(want, got)
    d = loader.dataset.diagnostics()
    shard_bytes = sum(p.stat().st_size for p in (local.root / "arrow").glob("*.arrow"))
    payload = sum(r["arrays"][f].nbytes for r in local.rows for f in FEATURES)
    # Every row of two epochs was delivered (twice each feature), and no shard was downloaded whole for it:
    # what was asked for beyond the rows is the footers, headers and small buffers.
    assert d["bytes_delivered"] == 2 * payload
    assert d["bytes_requested"] < 2 * payload + shard_bytes * 0.25, d
    assert d["bytes_requested_per_byte_delivered"] < 1.15, d
    assert d["retries"] == 0


def test_read_ahead_fetches_the_announced_batches_before_they_are_asked_for(remote):
    server, url = remote
    loader = _loader(url, read_ahead=2, prefetch=0)
    batches = _batches(loader)
    d = loader.dataset.diagnostics()
    assert len(batches) > 3
    # All but the first batch were announced two batches early: their ranges were in flight or fetched.
    assert d["ranges_prefetched"] >= d["ranges_taken"] * (len(batches) - 1) / len(batches) - 1e-9, d
    off = _loader(url, read_ahead=0)
    _batches(off)
    assert off.dataset.diagnostics()["ranges_prefetched"] == 0
