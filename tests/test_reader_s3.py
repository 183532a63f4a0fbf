"""Shards on object storage (issue 11, part 1 "Reading"): make_loader("s3://bucket/prefix") against a real S3
server on 127.0.0.1 (moto's server mode, tests/s3server.py) gives the same batches as the local folder, reads
rows by byte range, fetches the batches to come ahead, survives a server restart, names (or skips) a corrupt
object, keeps a bounded local cache, and works with DataLoader workers (under torchrun: tests/test_mix.py).

Shards come from the real writer (tests/reader_helpers.py's write_shards) and are copied to the bucket with
pyarrow.fs.copy_files: the layout under the prefix is the local folder's.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from audiopipe.reader.errors import CorruptShardError
from audiopipe.reader.loader import make_loader
from audiopipe.reader.reading import Reading
from audiopipe.reader.remote_dataset import RemoteShardDataset
from audiopipe.storage.s3 import ObjectStoreError, S3Settings, parse_s3
from audiopipe.storage.s3_ranges import RetryPolicy
from reader_helpers import ROWS_PER_SHARD, write_shards

pytest_plugins = ["s3server"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FEATURES = ["mel", "f0"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("s3read") / "shards", tars=False)


def _admin(server):
    from s3server import admin_client  # here, not at import: pytest_plugins loads s3server first (assert rewriting)

    return admin_client(server)


def upload(server, folder: Path, url: str) -> str:
    from s3server import upload as copy_up

    return copy_up(server, folder, url)


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
    # One pass an epoch (28 rows fill fewer than 4 budgets: the default would plan several): the byte and
    # fetch counts below are those of whole passes over the rows.
    kw.setdefault("passes", 1)
    return make_loader(str(src), FEATURES, rank=0, world_size=1, **kw)


def test_same_batches_as_the_local_folder_and_rows_by_byte_range(remote, local):
    server, url = remote
    want = _batches(_loader(local.root), epochs=(0, 1))
    # prefetch 0: the default look-ahead would begin epoch 2 while epoch 1 ends, and the byte counts below are
    # those of exactly two epochs.
    loader = _loader(url, prefetch=0)
    got = _batches(loader, epochs=(0, 1))
    _same(want, got)
    d = loader.dataset.diagnostics()
    shard_bytes = sum(p.stat().st_size for p in (local.root / "arrow").glob("*.arrow"))
    payload = sum(r["arrays"][f].nbytes for r in local.rows for f in FEATURES)
    # Every row of two epochs was delivered (twice each feature), and no shard was downloaded whole for it:
    # what was asked for beyond the rows is the footers, headers and small buffers.
    assert d["bytes_delivered"] == 2 * payload, d
    assert d["bytes_requested"] < 2 * payload + shard_bytes * 0.25, d
    assert d["bytes_requested_per_byte_delivered"] < 1.15, d
    assert d["retries"] == 0


def test_read_ahead_fetches_the_announced_batches_before_they_are_asked_for(remote):
    server, url = remote
    loader = _loader(url, prefetch=2)
    batches = _batches(loader)
    d = loader.dataset.diagnostics()
    assert len(batches) > 3
    # All but the first batch were announced two batches early: their ranges were in flight or fetched.
    assert d["ranges_prefetched"] >= d["ranges_taken"] * (len(batches) - 1) / len(batches) - 1e-9, d
    off = _loader(url, prefetch=0)
    _batches(off)
    assert off.dataset.diagnostics()["ranges_prefetched"] == 0


def test_a_late_read_ahead_does_not_fetch_rows_twice(remote):
    # Under load the read-ahead thread can announce a batch after the batch fetched its rows itself; that
    # late announcement must not fetch them again (it did: bytes asked per byte delivered rose above 1.2).
    server, url = remote
    ds = RemoteShardDataset(url, FEATURES)
    rows = list(range(5))  # shard 0
    ds.__getitems__(rows)
    before = ds.diagnostics()
    ds.willneed(rows)
    after = ds.diagnostics()
    assert after["requests"] == before["requests"] and after["ranges_late"] == 2 * len(rows), after
    ds.willneed(rows)  # announced again (the next epoch): fetched ahead as usual
    ds.__getitems__(rows)
    d = ds.diagnostics()
    assert d["ranges_prefetched"] == 2 * len(rows) and d["requests"] > after["requests"], d


def test_two_dataloader_workers_read_the_same_batches(remote, local):
    # Workers fork after the parent has used its client: each opens its own (pid check), none hangs.
    server, url = remote
    want = _batches(_loader(local.root, num_workers=2))
    _same(want, _batches(_loader(url, num_workers=2)))


def test_server_restarted_mid_epoch_gives_the_same_batches(remote, local):
    import time

    server, url = remote
    want = _batches(_loader(local.root))
    loader = _loader(url, prefetch=0)
    loader.set_epoch(0)
    got, back, when = [], [], []

    def start_again():
        back.append(time.monotonic())
        server.start()

    for i, b in enumerate(loader):
        when.append(time.monotonic())
        got.append({k: (v.clone() if isinstance(v, torch.Tensor) else list(v)) for k, v in b.items()})
        if i == 1:  # down for 3 s between two batches, then back with the same objects
            server.stop()
            threading.Timer(3.0, start_again).start()
    _same(want, got)
    # The third batch needed requests while the server was down: it came only once the server was back.
    assert len(when) > 2 and when[2] >= back[0], (when, back)


def test_the_readers_own_retries_outlast_the_client(remote, local):
    # With the client allowed one attempt, only the reader's backoff loop can ride out the restart.
    server, url = remote
    ds = RemoteShardDataset(url, FEATURES, settings=S3Settings(attempts=1, connect_timeout=1.0))
    first = ds.__getitems__([0])
    server.stop()
    threading.Timer(1.5, server.start).start()
    batch = ds.__getitems__(list(range(5, 14)))
    assert ds.diagnostics()["retries"] >= 1
    for j, i in enumerate(range(5, 14)):  # rows of shards 1 and 2, first read after the restart
        assert all(np.array_equal(batch.array(f, j), local.rows[i]["arrays"][f]) for f in FEATURES)
    assert np.array_equal(first.array("f0", 0), local.rows[0]["arrays"]["f0"])


def test_a_server_that_stays_down_is_a_named_error_in_bounded_time(remote):
    import time

    server, url = remote
    ds = RemoteShardDataset(url, FEATURES, settings=S3Settings(attempts=2, connect_timeout=1.0, request_timeout=2.0),
                            retry=RetryPolicy(retries=2, backoff=0.1))
    server.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreError, match=r"s3://t-[0-9a-f]+/corpus/v1/arrow/shard-000000\.arrow: .*"
                                                   r"failed after 3 tries"):
            ds.__getitems__([0, 1])
        assert time.monotonic() - t0 < 60
    finally:
        server.start()


def _corrupt(server, url: str, k: int, how: str) -> None:
    fs = _admin(server)
    path = parse_s3(url).child(f"arrow/shard-{k:06d}.arrow").path
    with fs.open_input_file(path) as f:
        data = f.read()
    data = data[:-100] if how == "truncate" else data[:-10] + b"\xff\xff\xff\x7f" + data[-6:]
    with fs.open_output_stream(path) as f:
        f.write(data)


def test_a_corrupt_object_is_named_or_skipped(remote):
    server, url = remote
    _corrupt(server, url, 1, "truncate")
    _corrupt(server, url, 3, "footer")
    with pytest.raises(CorruptShardError) as e:
        _loader(url)
    msg = str(e.value)
    assert "2 of 5 shards corrupt" in msg and "shard-000001" in msg and "shard-000003" in msg, msg
    assert "manifest says" in msg and "unreadable Arrow file" in msg, msg
    loader = _loader(url, on_corrupt="skip")
    seen = sorted(i for b in _batches(loader) for i in b["index"])
    bad = set(range(sum(ROWS_PER_SHARD[:1]), sum(ROWS_PER_SHARD[:2]))) | \
        set(range(sum(ROWS_PER_SHARD[:3]), sum(ROWS_PER_SHARD[:4])))
    assert seen == sorted(set(range(sum(ROWS_PER_SHARD))) - bad)
    assert loader.dataset.diagnostics()["skipped_rows"] == ROWS_PER_SHARD[1] + ROWS_PER_SHARD[3]
    # Without the open-time scan, the garbled footer is found when the shard is first read: named, no traceback.
    unchecked = RemoteShardDataset(url, FEATURES, check_shards=False)
    with pytest.raises(CorruptShardError, match=r"shard-000003 .*is unreadable"):
        unchecked.__getitems__([sum(ROWS_PER_SHARD[:3])])


def test_checksum_verify_catches_a_flipped_byte_on_the_server(remote):
    server, url = remote
    fs = _admin(server)
    path = parse_s3(url).child("arrow/shard-000002.arrow").path
    with fs.open_input_file(path) as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF  # inside the values: same size, footer intact
    with fs.open_output_stream(path) as f:
        f.write(bytes(data))
    _loader(url)  # the size and structure checks cannot see it
    with pytest.raises(CorruptShardError, match=r"shard-000002 .*fails its xxh3_128 checksum"):
        _loader(url, verify="checksum")


def test_an_object_replaced_after_open_is_a_named_error(remote):
    server, url = remote
    ds = RemoteShardDataset(url, FEATURES)
    _corrupt(server, url, 0, "truncate")
    with pytest.raises(CorruptShardError, match=r"shard-000000 .*changed on the server"):
        ds.__getitems__([0])


def test_a_prefix_without_shards_is_a_one_line_error(s3):
    _, bucket = s3
    with pytest.raises(FileNotFoundError, match=r"manifest.json not found: not a shard set"):
        _loader(f"{bucket}/nothing/here")


def test_cache_second_epoch_sends_no_request_and_a_truncated_entry_is_fetched_again(remote, local, tmp_path):
    server, url = remote
    want = _batches(_loader(local.root), epochs=(0, 1))
    cache = tmp_path / "cache"
    loader = _loader(url, reading=Reading(cache_dir=cache, max_cache_bytes=1 << 30))
    ds = loader.dataset
    got = _batches(loader, epochs=(0,))
    assert ds.cache.wait(60)
    entries = sorted(cache.glob("*.arrow"))
    m = json.loads((local.root / "manifest.json").read_text())
    assert sorted(p.name for p in entries) == sorted(f"{s['arrow']['xxh3_128']}.arrow" for s in m["shards"])
    before = ds.diagnostics()["requests"]
    got += _batches(loader, epochs=(1,))
    _same(want, got)
    assert ds.diagnostics()["requests"] == before  # epoch 1 came from the cache alone
    # A truncated entry (a full disk, a crash outside audiopipe) is detected by its size and fetched again.
    victim = entries[0]
    victim.write_bytes(victim.read_bytes()[:1000])
    # With the default look-ahead: its thread and the batches meet the truncated entry together, and so may the
    # first loader's look-ahead, still reading its next epoch; it is deleted and fetched once in all (the entry's
    # lock in ShardCache.ready).
    again = _loader(url, reading=Reading(cache_dir=cache, max_cache_bytes=1 << 30))
    _same(want[:len(want) // 2], _batches(again, epochs=(0,)))
    assert again.dataset.cache.wait(60) and ds.cache.wait(60)
    d, first = again.dataset.diagnostics()["cache"], ds.diagnostics()["cache"]
    assert d["truncated_entries_refetched"] + first["truncated_entries_refetched"] == 1
    assert d["downloads"] + first["downloads"] - len(entries) == 1  # the first loader's own downloads aside
    assert victim.read_bytes() == (local.root / m["shards"][[f"{s['arrow']['xxh3_128']}.arrow" for s in m["shards"]]
                                                          .index(victim.name)]["arrow"]["path"]).read_bytes()


def test_a_truncated_entry_met_by_many_threads_at_once_is_deleted_once(tmp_path):
    """The look-ahead's threads and the batch path meet a truncated entry together: each round, 8 threads released
    at once ask for it; it is deleted (and so fetched again) once per round, never once per thread that saw it
    truncated (without the entry's lock, 100 rounds counted 125 to 147 deletions on a 2-core machine)."""
    from audiopipe.reader.shard_cache import ShardCache

    cache = ShardCache(tmp_path / "cache", 1 << 30, reader=None)  # ready() reads no object: no reader needed
    entry = {"name": "shard-000000", "arrow": {"bytes": 5000, "xxh3_128": "ab" * 16}}
    rounds, threads = 100, 8
    for _ in range(rounds):
        cache.path(entry).write_bytes(b"x" * 1000)
        start = threading.Barrier(threads)
        seen: list = []

        def ask():
            start.wait()
            seen.append(cache.ready(entry))

        pool = [threading.Thread(target=ask) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert seen == [None] * threads and not cache.path(entry).exists()
    assert cache.refetched == rounds


def test_cache_download_names_an_object_whose_bytes_fail_the_manifest_checksum(remote, tmp_path):
    server, url = remote
    fs = _admin(server)
    path = parse_s3(url).child("arrow/shard-000001.arrow").path
    with fs.open_input_file(path) as f:
        data = bytearray(f.read())
    data[len(data) // 2] ^= 0xFF  # same size, footer intact: only the whole bytes can tell
    with fs.open_output_stream(path) as f:
        f.write(bytes(data))
    loader = _loader(url, reading=Reading(cache_dir=tmp_path / "c", max_cache_bytes=1 << 30))
    # Rows are read by range until the background download has seen the whole object; from then on, reading
    # that shard is an error naming it (in epoch 0 already, or the next one).
    with pytest.raises(CorruptShardError, match=r"shard-000001: its bytes on the server fail the manifest's "
                                                r"xxh3_128 .*s3://.*shard-000001\.arrow"):
        for epoch in range(3):
            _batches(loader, epochs=(epoch,))
            assert loader.dataset.cache.wait(60)
    assert loader.dataset.cache.wait(60)
    bad_sha = loader.dataset.manifest["shards"][1]["arrow"]["xxh3_128"]
    leftovers = [p.name for p in (tmp_path / "c").iterdir() if bad_sha in p.name]
    assert leftovers == []  # neither an entry nor a part of the bad object stays in the cache


def test_cache_resumes_a_partial_download_and_stays_within_its_budget(remote, local, tmp_path):
    from audiopipe.reader.shard_cache import ShardCache
    from audiopipe.storage.s3_ranges import RangeReader

    server, url = remote
    m = json.loads((local.root / "manifest.json").read_text())
    entry = m["shards"][1]
    data = (local.root / entry["arrow"]["path"]).read_bytes()
    cache = ShardCache(tmp_path / "c", max_bytes=len(data) + 10, reader=RangeReader(), chunk=4096)
    (tmp_path / "c" / f".{entry['arrow']['xxh3_128']}.part").write_bytes(data[:5000])  # a killed download
    path = cache.download(parse_s3(url).child(entry["arrow"]["path"]), entry)
    assert path.read_bytes() == data
    assert cache.reader.counters()["bytes_requested"] == len(data) - 5000 and cache.resumed_bytes == 5000
    assert not list((tmp_path / "c").glob(".*.part"))
    # A second shard does not fit beside the first: the least recently used entry goes.
    other = m["shards"][3]
    cache.download(parse_s3(url).child(other["arrow"]["path"]), other)
    assert [p.name for p in (tmp_path / "c").glob("*.arrow")] == [f"{other['arrow']['xxh3_128']}.arrow"]
    assert cache.evictions == 1
    # A part whose bytes are wrong fails the checksum and is fetched again from zero.
    bad = bytearray(data[:5000])
    bad[100] ^= 0xFF
    (tmp_path / "c" / f".{entry['arrow']['xxh3_128']}.part").write_bytes(bytes(bad))
    assert cache.download(parse_s3(url).child(entry["arrow"]["path"]), entry).read_bytes() == data


# Two ranks under torchrun training from an s3:// prefix, resumed bit-exactly: tests/test_mix.py, where the prefix is
# one corpus of a weighted mix.


@pytest.mark.parametrize("extra, says", [
    ((), "manifest.json not found: not a shard set"),
    (("--reader", "files"), "--reader files exports a local shard folder"),
], ids=["missing-prefix", "files-reader"])
def test_trainer_shards_s3_errors_are_one_line(s3, tmp_path, extra, says, monkeypatch, capsys):
    """The core trainer fixture run as a script, in this process (a world of one: a subprocess would only import
    torch again): it ends in SystemExit, never another exception, with one line that says why."""
    import runpy

    server, bucket = s3
    monkeypatch.setattr(sys, "argv", [str(HERE / "core_trainer_fixture.py"), "--shards", f"{bucket}/none",
                                      "--out", str(tmp_path / "run"), "--max-steps", "1", *extra])
    with pytest.raises(SystemExit) as e:
        runpy.run_path(str(HERE / "core_trainer_fixture.py"), run_name="__main__")
    said = capsys.readouterr().err + ("" if isinstance(e.value.code, int) else str(e.value.code))
    lines = [x for x in said.splitlines() if says in x]
    assert e.value.code != 0 and len(lines) == 1 and lines[0].startswith("train: error:"), said[-2000:]
    assert "Traceback" not in said, said[-2000:]


def test_bench_loader_times_make_loader_from_s3(remote, tmp_path):
    from audiopipe.cli import main

    server, url = remote
    out = tmp_path / "s3.json"
    assert main(["bench-loader", "--shards", url, "--batch-frames", "1500", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    w = r["wait_50ms"]
    assert r["source"] == url and r["batches"] > 3 and r["audio_s_per_s"] > 0
    assert w["bytes_delivered"] > 0 and w["bytes_requested"] >= w["bytes_delivered"]
    # The data-wait pass saw every batch of the epoch the throughput pass counted (its first one untimed).
    assert w["timed_batches"] + 1 == r["batches"] and w["requests"] > r["batches"]


class _BytesReader:
    """Serves one object's bytes from memory: the byte-layout parser is what is under test here, not S3."""

    def __init__(self, data: bytes):
        self.data = data

    def read_tail(self, url, n, expect_size=None):
        return len(self.data), self.data[-n:]

    def read(self, url, start, n, size=None):
        from audiopipe.reader.ipc_layout import LayoutError

        if start < 0 or start + n > len(self.data):
            raise LayoutError("outside the object")
        return self.data[start:start + n]


def test_garbled_footer_or_header_bytes_are_a_layout_error_never_anything_else(local):
    from hypothesis import given, settings, strategies as st

    from audiopipe.reader.ipc_layout import LayoutError
    from audiopipe.reader.remote_dataset import _Layout

    data = (local.root / "arrow" / "shard-000001.arrow").read_bytes()
    good = _Layout(_BytesReader(data), None, len(data))
    assert good.rows == ROWS_PER_SHARD[1] and len(good.columns) == 1 and "mel" in good.columns[0]
    n = len(data)

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1999), st.integers(0, 255)), min_size=1, max_size=6))
    def check(flips):
        d = bytearray(data)
        for region, at, value in flips:  # the footer and schema at the end, the batch header at the start
            d[(n - 2000 + at) if region == 0 else at] = value
        try:
            _Layout(_BytesReader(bytes(d)), None, n)
        except LayoutError:
            pass

    check()


def test_a_mix_of_a_local_folder_and_an_s3_prefix_reads_as_two_local_folders(remote, local, tmp_path):
    """Weighted mixing opens each entry with the reader its location needs: an s3:// corpus in a mix gives the
    batches the same corpus gives from a local copy."""
    import shutil

    server, url = remote
    twin = shutil.copytree(local.root, tmp_path / "twin")
    mk = lambda srcs: make_loader(srcs, FEATURES, max_frames=1500, rank=0, world_size=1, weights=[1, 2])  # noqa: E731
    want = _batches(mk([str(twin), str(local.root)]), epochs=(0, 1))
    loader = mk([str(twin), url])
    got = _batches(loader, epochs=(0, 1))
    # The corpus column names where each row came from; everything else is the same bytes.
    assert {c for b in got for c in b.pop("corpus")} == {str(twin), url}
    assert {c for b in want for c in b.pop("corpus")} == {str(twin), str(local.root)}
    _same(want, got)
    assert loader.dataset.datasets[1].diagnostics()["bytes_delivered"] > 0  # the second corpus came from s3


def test_the_index_and_the_transcripts_read_from_s3_as_from_the_folder(remote, local):
    """What the trainers read besides batches (the length index for their selections, the transcripts for a
    vocab) comes from an s3:// prefix as from the local folder, so `--shards s3://...` works in every trainer."""
    from audiopipe.index.lengths import LengthIndex
    from audiopipe.reader.texts import shard_texts

    server, url = remote
    assert LengthIndex.open(url).table.equals(LengthIndex.open(local.root).table)
    texts = shard_texts(url)
    assert texts == shard_texts(local.root) and texts[0].endswith("é") and len(texts) == len(local.rows)
    with pytest.raises(FileNotFoundError, match="index.arrow not found"):
        LengthIndex.open(url + "-missing")


def test_small_buffers_are_kept_for_every_shard_and_requests_in_flight_follow_the_round_trip(remote, local):
    """Every shard's small buffers are fetched at open and kept whatever max_open (a shard evicted and read
    again sends no request to reopen); the fetch pool is sized by rate x the round trip measured while opening,
    through the delay proxy of benchmarks/bench_s3.py, which adds 40 ms to every request."""
    import pyarrow as pa

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_s3 import serve

    server, url = remote
    ready, port = threading.Event(), []
    threading.Thread(target=serve, args=((server.host, server.port), 0.040), kwargs={"ready": ready,
                                                                                    "port_out": port},
                     daemon=True).start()
    assert ready.wait(10)
    os.environ["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{port[0]}"  # restored by the s3 fixture's monkeypatch
    ds = RemoteShardDataset(url, FEATURES, max_open=1, request_rate=2000.0)
    d = ds.diagnostics()
    assert d["shards_open_small_buffers"] == len(ROWS_PER_SHARD)
    assert d["round_trip_ms"] >= 40 and ds.fetch_threads >= 80 and pa.io_thread_count() >= ds.fetch_threads
    order = list(range(len(local.rows)))
    ds.__getitems__(order)  # every shard read once (its first read asks its size again: one HEAD)
    before = ds.diagnostics()["requests"]
    batch = ds.__getitems__(order[::-1])  # every shard evicted and made again (max_open=1): rows only
    after = ds.diagnostics()
    # All of a shard's rows lie side by side in each feature's buffer: one GET per feature and shard, and no
    # request to open a shard again (its small buffers were kept).
    assert after["requests"] - before == len(FEATURES) * len(ROWS_PER_SHARD), after
    assert all(np.array_equal(batch.array("mel", j), local.rows[i]["arrays"]["mel"]) for j, i in enumerate(order[::-1]))
    assert after["mappings_made"] >= 2 * len(ROWS_PER_SHARD)
