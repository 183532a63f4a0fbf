"""The mmap reader (ShardDataset, make_loader) on shards written by the real writer from known arrays
(tests/reader_helpers.py)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import ConfigMismatch, CorruptShardError, ShardError
from audiopipe.reader.loader import make_loader
from audiopipe.shard.checksum import checksum_of
from reader_helpers import (ROWS_PER_SHARD, SPECS, Written, as_sha256_shards, copy_shards, global_of,
                            mapped_ranges, run_torchrun, set_manifest_entry, write_shards)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Written:
    return write_shards(tmp_path_factory.mktemp("reader") / "shards")



def test_samples_equal_what_was_written(shards):
    ds = ShardDataset(shards.root, ["mel", "f0", "voiced", "pcm"])
    assert len(ds) == len(shards.rows) == sum(ROWS_PER_SHARD)
    for i, want in enumerate(shards.rows):
        item = ds[i]
        assert set(item) == {"id", "speaker", "text", "duration", "index", "mel", "f0", "voiced", "pcm"}
        assert (item["id"], item["speaker"], item["text"]) == (want["id"], want["speaker"], want["text"])
        assert item["index"] == i
        assert item["duration"] == pytest.approx(want["duration"], rel=1e-7)
        for f in ("mel", "f0", "voiced", "pcm"):
            assert item[f].dtype == want["arrays"][f].dtype and item[f].shape == want["arrays"][f].shape
            np.testing.assert_array_equal(item[f], want["arrays"][f])
    np.testing.assert_array_equal(ds.lengths("mel"), [r["arrays"]["mel"].shape[1] for r in shards.rows])
    np.testing.assert_array_equal(ds.lengths("pcm"), [r["arrays"]["pcm"].size for r in shards.rows])


def test_a_batch_read_at_once_equals_its_items_read_one_by_one(shards):
    """__getitems__ (what the DataLoader calls) answers a RowBatch; padded, it equals the per-item path."""
    from audiopipe.collate.pad import PadCollator
    from audiopipe.collate.rows import RowBatch

    ds = ShardDataset(shards.root, ["mel", "f0", "voiced", "pcm"])
    rng = np.random.default_rng(0)
    for size in (1, 3, len(ds)):
        idx = rng.choice(len(ds), size, replace=False)  # across shards, in no particular order
        rows = ds.__getitems__(idx.tolist())
        assert isinstance(rows, RowBatch) and len(rows) == size
        items = [ds[int(i)] for i in idx]
        for got, want in zip(rows, items):
            assert got.keys() == want.keys()
            for k, v in want.items():
                assert np.array_equal(got[k], v) if isinstance(v, np.ndarray) else got[k] == v
        features = ["mel", "f0", "voiced", "pcm"]
        fast = PadCollator(features, pad_to_multiple=8, pad_value={"mel": -11.5})(rows)
        slow = PadCollator(features, pad_to_multiple=8, pad_value={"mel": -11.5})(items)
        assert fast.keys() == slow.keys()
        for k, v in slow.items():
            assert torch.equal(fast[k], v) if isinstance(v, torch.Tensor) else fast[k] == pytest.approx(v), k
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])


def test_a_rows_metadata_is_decoded_once_not_per_batch(shards):
    """Strings cost more to decode than their rows cost to copy (docs/bench-loader.md, "Where the bytes go"): a
    row's text is decoded from its shard the first time a batch asks for it, and every later batch over it
    gathers it from there, with the same values. Only the rows asked for are decoded, never a whole shard (a
    shard mapped again after an eviction would otherwise pay for all its rows)."""
    ds = ShardDataset(shards.root, ["mel"])
    decoded = []
    for k in (1, 3):
        sh = ds._shard(k)
        real = sh.meta_values
        sh.meta_values = lambda c, rows, k=k, real=real: decoded.append((k, c, rows.tolist())) or real(c, rows)
    idx = [global_of(1, 0), global_of(3, 2), global_of(1, 4)]
    first = ds.__getitems__(idx)
    assert sorted(decoded) == [(1, "text", [0, 4]), (3, "text", [2])]
    decoded.clear()
    again = ds.__getitems__(idx[::-1])
    more = ds.__getitems__([global_of(1, 4), global_of(1, 5)])
    assert decoded == [(1, "text", [5])]
    for batch, order in ((first, idx), (again, idx[::-1]), (more, [global_of(1, 4), global_of(1, 5)])):
        for got, i in zip(batch, order):
            want = shards.rows[i]
            assert (got["id"], got["speaker"], got["text"], got["duration"], got["index"]) == (
                want["id"], want["speaker"], want["text"], want["duration"], i)


def test_an_index_that_does_not_list_shards_in_order_is_refused(tmp_path):
    """The index as build_index writes it lists each shard's rows as one run, in manifest order. An index in
    another order (rows permuted, even consistently) is refused at open with a named error, whether or not the
    manifest's checksum of it was updated: the reader checks, it does not trust (it used to read such an index,
    which let a permuted `row` column pair one utterance's id with another's features unnoticed)."""
    from audiopipe.index.lengths import INDEX_NAME
    from audiopipe.reader.errors import CorruptIndexError
    from audiopipe.shard.checksum import file_checksum

    w = write_shards(tmp_path / "s", (3, 4, 2), tars=False)
    path = w.root / INDEX_NAME
    table = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()
    perm = np.random.default_rng(1).permutation(table.num_rows)
    table = table.take(pa.array(perm)).combine_chunks()
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as out:
        out.write_table(table)
    with pytest.raises(CorruptIndexError, match=r"index\.arrow fails the manifest's xxh3_128 check"):
        ShardDataset(w.root, ["mel"], check_shards=False)
    m = json.loads((w.root / "manifest.json").read_text())
    m["index"].update(sha256=file_checksum(path, "sha256"), xxh3_128=file_checksum(path, "xxh3_128"))
    (w.root / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CorruptIndexError, match=r"index\.arrow is corrupt: entry 0 points at shard"):
        ShardDataset(w.root, ["mel"], check_shards=False)


def _cached_fraction(path: Path, offset: int, length: int) -> float:
    """Share of the pages of path[offset:offset+length] that are in the page cache (mincore on a fresh map)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        arr = np.frombuffer(m, dtype=np.uint8)
        base = arr.ctypes.data
        lo = (base + offset) - (base + offset) % mmap.PAGESIZE
        hi = base + offset + length
        pages = -(-(hi - lo) // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        assert libc.mincore(lo, hi - lo, vec) == 0, ctypes.get_errno()
        del arr
        return sum(b & 1 for b in vec.raw) / pages


def test_read_ahead_brings_an_evicted_row_into_the_page_cache(tmp_path):
    w = write_shards(tmp_path / "s", (4, 4), mel_frames=(3000, 3001), tars=False)  # 1.2 MB mel rows
    ds = ShardDataset(w.root, ["mel"])
    path = w.shard_path(1)
    sh = ds._shard(1)  # mapped, metadata read; the mel values not touched yet
    col = sh.columns["mel"]
    base = col.values.ctypes.data - sh._mmap.read_buffer(1).address
    offset, length = base + int(col.offsets[2]) * 4, int(col.offsets[3] - col.offsets[2]) * 4
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if _cached_fraction(path, offset, length) > 0.5:
        pytest.skip("this file system keeps the pages cached (tmpfs or no eviction): nothing to observe")
    i = 4 + 2  # shard 1, row 2
    ds.read_ahead([i])  # returns at once; a background thread advises the kernel
    deadline = time.monotonic() + 10
    while _cached_fraction(path, offset, length) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _cached_fraction(path, offset, length) == 1.0
    np.testing.assert_array_equal(ds[i]["mel"], w.rows[i]["arrays"]["mel"])
    # A row is hinted once while the corpus fits in memory; the next announcement of it is free.
    hinted = ds._read_ahead.hinted
    assert hinted[i] and hinted.sum() == 1


def test_the_index_is_one_record_batch_so_its_columns_are_zero_copy(shards):
    from audiopipe.index.lengths import LengthIndex

    table = LengthIndex.open(shards.root).table
    assert len(ROWS_PER_SHARD) > 1  # written from several shards
    assert {table.column(c).num_chunks for c in table.column_names} == {1}


def test_arrays_are_zero_copy_views_into_the_mapped_shard(shards):
    ds = ShardDataset(shards.root, ["mel", "pcm"])
    for shard in (0, 1, 3):
        i = global_of(shard, 0)
        item = ds[i]
        ranges = mapped_ranges(shards.shard_path(shard))
        assert ranges, "the shard must be memory-mapped once an item of it is read"
        for f in ("mel", "pcm"):
            a = item[f]
            lo = a.__array_interface__["data"][0]
            hi = lo + a.nbytes
            assert any(r0 <= lo and hi <= r1 for r0, r1 in ranges), f"{f} of row {i} is not inside the mmap: a copy"
            assert not a.flags.writeable  # a view of a read-only mapping, never a private buffer
        again = ds[i]
        assert np.shares_memory(item["mel"], again["mel"])  # the same bytes, not a fresh copy per access


def test_only_the_selected_columns_are_read(shards):
    ds = ShardDataset(shards.root, ["f0"])
    item = ds[3]
    assert "f0" in item and not {"mel", "pcm", "voiced"} & set(item)
    np.testing.assert_array_equal(item["f0"], shards.rows[3]["arrays"]["f0"])
    np.testing.assert_array_equal(ds.lengths(), [r["arrays"]["f0"].size for r in shards.rows])  # first feature's
    with pytest.raises(ConfigMismatch, match=r"no feature \['energy'\]"):
        ShardDataset(shards.root, ["mel", "energy"])


def test_opening_touches_no_shard_whatever_the_corpus_size(tmp_path):
    """Opening reads manifest.json and index.arrow only: no shard is mapped until a row of it is asked for."""
    for rows in ((3,) * 4, (3,) * 40):
        w = write_shards(tmp_path / f"n{len(rows)}", rows, mel_frames=(5, 20), tars=False)
        ds = ShardDataset(w.root, ["mel"])
        len(ds), ds.lengths()
        mapped = [k for k in range(len(rows)) if mapped_ranges(w.shard_path(k))]
        assert mapped == []
        ds[len(ds) - 1]
        mapped = [k for k in range(len(rows)) if mapped_ranges(w.shard_path(k))]
        assert mapped == [len(rows) - 1]  # exactly the shard of that row, however many there are
        del ds


# ---- refusals: every error names the shard -------------------------------------------------------------------


def test_config_hash_mismatch_is_refused_naming_both(shards):
    have = SPECS["mel"].config_hash
    with pytest.raises(ConfigMismatch, match=rf"mel.*made with config {have}.*asks for deadbeef"):
        ShardDataset(shards.root, ["mel"], expect={"mel": "deadbeef"})
    with pytest.raises(ConfigMismatch, match="deadbeef"):
        make_loader(shards.root, ["mel"], max_frames=2000, expect={"mel": "deadbeef"})
    ShardDataset(shards.root, ["mel"], expect={"mel": have})  # the right hash opens


def test_a_shard_whose_schema_hash_differs_from_the_manifest_is_refused(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    p = w.shard_path(2)
    # Read into memory, not through a mapping: truncating a mapped file under its readers is a SIGBUS.
    table = pa.ipc.open_file(pa.BufferReader(p.read_bytes())).read_all()
    meta = json.loads(table.schema.metadata[b"audiopipe"])
    meta["features"]["mel"]["hash"] = "0" * 16
    table = table.replace_schema_metadata({b"audiopipe": json.dumps(meta).encode()})
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    set_manifest_entry(w.root, 2)
    with pytest.raises(CorruptShardError, match="shard shard-000002 .*feature mel hash differs"):
        ShardDataset(w.root, ["mel"])  # refused at open, before anything is planned
    ds = ShardDataset(w.root, ["mel"], check_shards=False)  # and again when mapped, had it changed since
    ds[0]  # other shards are fine
    with pytest.raises(CorruptShardError, match="shard-000002: feature mel hash differs"):
        ds[global_of(2, 0)]


def test_truncated_shard_is_named_never_garbage(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    p = w.shard_path(1)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptShardError, match=r"shard shard-000001 .*bytes, manifest says .*truncated"):
        ShardDataset(w.root, ["mel"])
    ds = ShardDataset(w.root, ["mel"], check_shards=False)  # the same check again when the shard is mapped
    np.testing.assert_array_equal(ds[0]["mel"], w.rows[0]["arrays"]["mel"])
    with pytest.raises(CorruptShardError, match=r"shard-000001 .*bytes, manifest says .*truncated"):
        ds[global_of(1, 2)]
    set_manifest_entry(w.root, 1)  # sizes agree now: the Arrow reader itself must refuse the file
    with pytest.raises(CorruptShardError, match=r"shard-000001 .*unreadable"):
        ShardDataset(w.root, ["mel"])
    with pytest.raises(CorruptShardError, match=r"shard-000001 .*unreadable"):
        ShardDataset(w.root, ["mel"], check_shards=False)[global_of(1, 2)]


def _offsets_position(path: Path, column: str, row: int) -> int:
    """File position of the int64 offset that ends `row` in a large_list column (where a flip breaks structure)."""
    with pa.memory_map(str(path)) as mm:
        mm.seek(0)
        base = mm.read_buffer(mm.size()).address
        chunk = pa.ipc.open_file(mm).read_all().column(column).chunk(0)
        offsets = chunk.buffers()[1]
        return offsets.address - base + 8 * (row + 1)


def test_flipped_offsets_are_a_structural_error_naming_the_shard(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    p = w.shard_path(3)
    pos = _offsets_position(p, "mel", 2) + 1  # second-lowest byte of one offset: it moves by 256 values
    data = bytearray(p.read_bytes())
    data[pos] ^= 0x01
    p.write_bytes(bytes(data))  # same size: the manifest's size check passes
    ds = ShardDataset(w.root, ["mel"])
    with pytest.raises(ShardError, match="shard-000003: column mel offsets do not match frame counts"):
        ds[global_of(3, 0)]


def test_shard_files_carry_an_xxh3_checksum():
    e = checksum_of({"path": "a", "bytes": 3, "xxh3_128": "ab"})
    assert (e.algorithm, e.hexdigest) == ("xxh3_128", "ab")
    with pytest.raises(KeyError, match="has no checksum"):
        checksum_of({"path": "arrow/x.arrow", "bytes": 3})
    with pytest.raises(ValueError, match="verify must be one of"):
        ShardDataset("/nonexistent", ["mel"], verify="md5")


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_checksum_verify_catches_any_flip(shards, tmp_path, algorithm):
    w = copy_shards(shards, tmp_path / "s")
    m = json.loads((w.root / "manifest.json").read_text())
    assert checksum_of(m["shards"][4]["arrow"]).algorithm == "xxh3_128"  # what audiopipe writes
    if algorithm == "sha256":  # shards made before xxh3: still checked, by their own algorithm
        as_sha256_shards(w.root)
    p = w.shard_path(4)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40  # somewhere in the mel values: structure stays valid
    p.write_bytes(bytes(data))
    i = global_of(4, 0)
    ShardDataset(w.root, ["mel"])[i]  # structure intact: only the hash can tell
    with pytest.raises(CorruptShardError, match=f"shard shard-000004 .*fails its {algorithm} checksum"):
        ShardDataset(w.root, ["mel"], verify="checksum")
    with pytest.raises(CorruptShardError, match=f"shard-000004 .*fails its {algorithm} checksum"):
        ShardDataset(w.root, ["mel"], verify="sha256", check_shards=False)[i]  # the option's old name
    ds = ShardDataset(w.root, ["mel"], verify="checksum", on_corrupt="skip")
    np.testing.assert_array_equal(ds[0]["mel"], w.rows[0]["arrays"]["mel"])  # intact shards pass the check
    assert [b["name"] for b in ds.diagnostics()["skipped_shards"]] == ["shard-000004"]


def test_missing_shard_is_named(shards, tmp_path):
    w = copy_shards(shards, tmp_path / "s")
    w.shard_path(0).unlink()
    with pytest.raises(CorruptShardError, match=r"shard shard-000000 \(.*\): missing"):
        ShardDataset(w.root, ["mel"])
    with pytest.raises(CorruptShardError, match="shard shard-000000 is missing"):
        ShardDataset(w.root, ["mel"], check_shards=False)[0]


def test_an_entry_without_a_checksum_is_named_not_a_traceback(shards, tmp_path):
    from audiopipe.shard.verify import verify

    w = copy_shards(shards, tmp_path / "s")
    m = json.loads((w.root / "manifest.json").read_text())
    del m["shards"][1]["arrow"]["xxh3_128"]  # a hand-edited or foreign manifest
    (w.root / "manifest.json").write_text(json.dumps(m))
    ShardDataset(w.root, ["mel"])  # sizes and structure do not need it
    ds = ShardDataset(w.root, ["mel"], verify="checksum", on_corrupt="skip")
    assert [(b["name"], b["reason"]) for b in ds.diagnostics()["skipped_shards"]] == [
        ("shard-000001", "has no checksum in the manifest")]
    assert "shard-000001: arrow/shard-000001.arrow has no checksum in the manifest" in verify(w.root).failures


# ---- make_loader -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_make_loader_yields_every_sample_once_per_epoch(shards, workers):
    budget = 1500
    # passes=1: exactly once per epoch (on this small corpus the default plans several passes)
    loader = make_loader(shards.root, ["mel", "pcm"], max_frames=budget, num_workers=workers, seed=3, passes=1)
    lengths = np.array([r["arrays"]["mel"].shape[1] for r in shards.rows])
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen = []
        n = 0
        for batch in loader:
            n += 1
            ids = batch["index"]
            seen += ids
            b, ch, t_max = batch["mel"].shape
            assert ch == 100 and b * t_max <= budget
            np.testing.assert_array_equal(batch["mel_lengths"].numpy(), lengths[ids])
            for row, i in enumerate(ids):
                want = shards.rows[i]["arrays"]
                t = want["mel"].shape[1]
                np.testing.assert_array_equal(batch["mel"][row, :, :t].numpy(), want["mel"])
                assert not batch["mel"][row, :, t:].any()
                np.testing.assert_array_equal(batch["pcm"][row, : want["pcm"].size].numpy(), want["pcm"])
        assert n == len(loader)
        assert sorted(seen) == list(range(len(shards.rows)))
    if workers:
        assert loader.shm_bytes_per_worker() == 2 * budget * (100 * 4 + 1 + 2 + 1)
    else:
        assert loader.shm_bytes_per_worker() == 0


_DDP_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch.distributed as dist
    from audiopipe.reader.loader import make_loader

    dist.init_process_group("gloo")
    loader = make_loader(sys.argv[1], ["mel"], max_frames=int(sys.argv[3]), seed=5, passes=1)  # exactly once
    out = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        out.append({"len": len(loader), "batches": [batch["index"] for batch in loader]})
    with open(f"{sys.argv[2]}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_two_ranks_read_every_sample_exactly_once(shards, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(_DDP_SCRIPT)
    run_torchrun(script, str(shards.root), str(tmp_path), "1200")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in (0, 1):
        e0, e1 = (r[epoch] for r in ranks)
        assert len(e0["batches"]) == len(e1["batches"]) == e0["len"] == e1["len"] > 0  # equal counts: no DDP hang
        ids = [i for batch in e0["batches"] + e1["batches"] for i in batch]
        assert sorted(ids) == list(range(len(shards.rows)))  # every sample once across ranks
    assert ranks[0][0]["batches"] != ranks[0][1]["batches"]  # a new plan every epoch
