"""Corrupt or huge shard sets while training: on_corrupt fail/skip, a shard truncated under its mapping, and a
bounded number of open mappings (issue 9, section 5). Shards come from the real writer (tests/reader_helpers.py)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import CorruptShardError
from audiopipe.reader.loader import make_loader
from reader_helpers import (ROWS_PER_SHARD, copy_shards, global_of, mapped_ranges, rewrite_index_column, run_torchrun,
                            swap_first_two, write_shards)

pytest_plugins = ["s3server"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("corrupt") / "shards", tars=False)


def _break(w, tmp_path: Path):
    """A copy with shard 1 truncated (size differs from the manifest) and shard 3's Arrow footer garbled (same
    size, so only reading the footer can tell)."""
    c = copy_shards(w, tmp_path / "broken")
    p1 = c.shard_path(1)
    p1.write_bytes(p1.read_bytes()[:-100])
    p3 = c.shard_path(3)
    data = bytearray(p3.read_bytes())
    data[-10:-6] = b"\xff\xff\xff\x7f"  # the footer length: points before the start of the file
    p3.write_bytes(bytes(data))
    return c


def _rows_of(*shard_ids: int) -> list[int]:
    return [global_of(k, r) for k in shard_ids for r in range(ROWS_PER_SHARD[k])]


def _env() -> dict[str, str]:
    # The repo for audiopipe, trainers/ for the core trainer fixture (`from core import ...`).
    path = os.pathsep.join([str(ROOT), str(ROOT / "trainers"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path,
            "OMP_NUM_THREADS": "1"}


def test_fail_is_one_named_line_before_anything_is_planned(shards, tmp_path):
    c = _break(shards, tmp_path)
    with pytest.raises(CorruptShardError) as e:
        make_loader(c.root, ["mel"], max_frames=1500, rank=0, world_size=1)
    msg = str(e.value)
    assert "\n" not in msg
    assert "2 of 5 shards corrupt" in msg and "on_corrupt='skip'" in msg
    assert "shard-000001" in msg and "manifest says" in msg  # the truncated one, with both sizes
    assert "shard-000003" in msg and "unreadable Arrow file" in msg  # the garbled footer


def test_skip_drops_the_rows_before_planning_and_says_so_once(shards, tmp_path, caplog):
    c = _break(shards, tmp_path)
    good = _rows_of(0, 2, 4)
    with caplog.at_level(logging.WARNING, logger="audiopipe.reader.skipped"):
        # passes=1: one pass, so every intact row is read exactly once (the default plans several on this corpus)
        loaders = [make_loader(c.root, ["mel"], max_frames=1500, seed=1, rank=r, world_size=2, on_corrupt="skip",
                               passes=1) for r in (0, 1)]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # once per opened dataset (here one per rank), naming each shard and its rows
    assert all("skipping 16 rows" in m and "shard-000001" in m and "9 rows" in m and "shard-000003" in m
               and "7 rows" in m for m in warned)
    diag = loaders[0].dataset.diagnostics()
    assert [(s["name"], s["rows"]) for s in diag["skipped_shards"]] == [("shard-000001", 9), ("shard-000003", 7)]
    assert diag["skipped_rows"] == 16
    # Every rank gets the same batch count, and together they read every intact row once, correctly.
    assert len(loaders[0]) == len(loaders[1]) > 0
    seen = []
    for loader in loaders:
        for batch in loader:
            for j, i in enumerate(batch["index"]):
                t = shards.rows[i]["arrays"]["mel"].shape[1]
                np.testing.assert_array_equal(batch["mel"][j, :, :t].numpy(), shards.rows[i]["arrays"]["mel"])
            seen += batch["index"]
    assert sorted(seen) == good
    # A subset and lengths given by the caller are filtered the same way.
    subset = np.array(_rows_of(1, 2), dtype=np.int64)
    loader = make_loader(c.root, ["mel"], max_frames=1500, subset=subset, lengths=np.full(subset.size, 10),
                         rank=0, world_size=1, on_corrupt="skip", passes=1)
    assert sorted(i for b in loader for i in b["index"]) == _rows_of(2)
    with pytest.raises(CorruptShardError, match="shard-000001 was skipped as corrupt"):
        loader.dataset[global_of(1, 0)]


# Both 2-rank scenarios of this module run in one torchrun (a launch costs the launcher's and two ranks' imports):
# ranks that disagree on which shards are corrupt, then an evaluation loader on rank 0 alone.
_RANKS = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from audiopipe.reader.loader import make_loader

    broken, intact, out = sys.argv[1:4]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Rank 0 sees a broken copy, rank 1 an intact one (node-local copies that differ).
    loader = make_loader((broken, intact)[rank], ["mel"], max_frames=1500, seed=2, on_corrupt="skip", passes=1)
    seen = [i for b in loader for i in b["index"]]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump({"len": len(loader), "seen": seen,
                   "skipped": [s["name"] for s in loader.dataset.diagnostics()["skipped_shards"]]}, f)
    dist.barrier()
    flag = torch.zeros(1)
    if rank == 0:
        # An evaluation loader on rank 0 alone: it must not wait for rank 1 in a collective.
        loader = make_loader(broken, ["mel"], max_frames=1500, rank=0, world_size=1, on_corrupt="skip")
        flag += len(loader)
        dist.send(flag, dst=1)
    else:
        dist.recv(flag, src=0)  # blocks until rank 0 is done: a hidden all_reduce there would never end
    json.dump({"len": float(flag)}, open(f"{out}/alone{rank}.json", "w"))
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def two_ranks(shards, tmp_path_factory) -> Path:
    """The folder where _RANKS's ranks left their findings, run on a broken copy (rank 0) and the intact set."""
    tmp = tmp_path_factory.mktemp("corrupt_ranks")
    c = _break(shards, tmp)
    script = tmp / "ranks.py"
    script.write_text(_RANKS)
    run_torchrun(script, str(c.root), str(shards.root), str(tmp))
    return tmp


def test_skip_under_torchrun_plans_the_union_of_what_any_rank_found(two_ranks):
    r0, r1 = (json.loads((two_ranks / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["skipped"] == r1["skipped"] == ["shard-000001", "shard-000003"]
    assert r0["len"] == r1["len"]
    assert sorted(r0["seen"] + r1["seen"]) == _rows_of(0, 2, 4)


_TRUNCATE = textwrap.dedent("""
    import os, sys
    from audiopipe.reader.loader import make_loader

    def run(root, victim, workers):
        loader = make_loader(root, ["mel"], max_frames=1500, num_workers=workers, rank=0, world_size=1, seed=0)
        loader.set_epoch(0)
        for batch in loader:  # one full epoch: every shard is mapped (in the workers too, which stay alive)
            pass
        os.truncate(victim, 4096)  # rewritten in place under its readers: the mapped pages beyond are gone
        loader.set_epoch(1)
        try:
            for batch in loader:
                pass
        except Exception as e:
            print(workers, type(e).__name__, str(e).strip().splitlines()[-1], flush=True)
            return
        print(workers, "no error", flush=True)

    run(sys.argv[1], sys.argv[2], 2)  # in a DataLoader worker, then in the training process itself
    run(sys.argv[3], sys.argv[4], 0)
""")


def test_a_shard_truncated_after_it_was_mapped_is_a_named_error_not_sigbus(shards, tmp_path):
    a, b = copy_shards(shards, tmp_path / "a"), copy_shards(shards, tmp_path / "b")
    assert a.shard_path(1).stat().st_size > 8 * 4096  # most of its rows lie beyond the cut
    script = tmp_path / "truncate.py"
    script.write_text(_TRUNCATE)
    r = subprocess.run([sys.executable, str(script), str(a.root), str(a.shard_path(1)), str(b.root),
                        str(b.shard_path(3))], capture_output=True, text=True, timeout=180, env=_env())
    # A SIGBUS in this process shows as returncode -7; in a worker, as a DataLoader "bus error" RuntimeError.
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and "bus error" not in r.stdout.lower(), r.stdout
    for line, workers, shard in zip(lines, (2, 0), ("shard-000001", "shard-000003")):
        assert line.startswith(f"{workers} CorruptShardError ") and f"shard {shard} (" in line, line
        assert "changed size after it was mapped" in line, line


def test_open_mappings_are_bounded_and_reopened_on_demand(shards):
    ds = ShardDataset(shards.root, ["mel"], max_open=2)
    order = [i for k in (0, 1, 2, 3, 4, 0, 1) for i in _rows_of(k)]
    fds = len(os.listdir("/proc/self/fd"))
    for i in order:
        item = ds[i]
        np.testing.assert_array_equal(item["mel"], shards.rows[i]["arrays"]["mel"])
        assert ds.diagnostics()["open_mappings"] <= 2
        assert len(os.listdir("/proc/self/fd")) <= fds + 2
    del item
    mapped = [k for k in range(len(ROWS_PER_SHARD)) if mapped_ranges(shards.shard_path(k))]
    assert mapped == [0, 1]  # evicted shards are unmapped once no view of them is left
    assert ds.diagnostics()["mappings_made"] == 7  # 0 and 1 were mapped again after eviction
    with pytest.raises(ValueError, match="max_open"):
        ShardDataset(shards.root, ["mel"], max_open=0)


_MANY = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from audiopipe.reader.loader import make_loader

    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))  # inherited by the DataLoader workers
    root = sys.argv[1]
    loader = make_loader(root, ["mel"], max_frames=600, num_workers=2, rank=0, world_size=1, seed=4, passes=1)
    loader.set_epoch(0)
    expect = np.load(sys.argv[2])
    seen = []
    for batch in loader:
        for j, i in enumerate(batch["index"]):
            t = int(batch["mel_lengths"][j])
            # row i was written as a constant: its global index, in every bin and frame
            assert t > 0 and (batch["mel"][j, :, :t].numpy() == expect[i]).all(), i
        seen += batch["index"]
    assert sorted(seen) == list(range(expect.size)), (len(seen), expect.size)
    print("OK", len(seen))
""")


def test_two_thousand_shards_under_ulimit_256_with_two_workers(tmp_path):
    from audiopipe.decode.audio import resampler_info
    from audiopipe.index.lengths import build_index
    from audiopipe.shard.checksum import sha256_file
    from audiopipe.shard.manifest import assemble_manifest
    from audiopipe.shard.writer import ArrayColumn, write_arrow
    from reader_helpers import SPECS

    root = tmp_path / "many"
    mel = SPECS["mel"]
    features = {"mel": {**mel.to_dict(), "hash": mel.config_hash}}
    n, per = 4000, 2
    # Row i is the constant i, so a row read from the wrong shard or position cannot pass.
    rows = [{"id": f"u{i:05d}", "speaker": f"s{i % 7}", "text": "", "source": f"u{i}.wav",
             "duration": (3 + i % 5) * 256 / 24000, "arrays": {"mel": np.full((100, 3 + i % 5), i, np.float32)},
             "scalars": {}} for i in range(n)]
    # The real writer once (it fsyncs, ~10 ms a file here), then its record batch cut into 2-row shards
    # with pyarrow's IPC writer: the same schema and layout, 2,000 files in about a second.
    whole = tmp_path / "whole.arrow"
    write_arrow(whole, rows, [ArrayColumn(mel.name, mel.dtype, mel.channels)], [], {"features": features, "job": "t"})
    with pa.memory_map(str(whole)) as mm:
        batch = pa.ipc.open_file(mm).get_batch(0)
        records = []
        for k in range(n // per):
            name = f"shard-{k:06d}"
            path = root / "arrow" / f"{name}.arrow"
            path.parent.mkdir(parents=True, exist_ok=True)
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as w:
                w.write_batch(batch.slice(k * per, per))
            records.append({"name": name, "rows": per, "duration": sum(r["duration"] for r in rows[k * per:][:per]),
                            "rejects": [], "arrow": {"path": f"arrow/{name}.arrow", "bytes": path.stat().st_size,
                                                     "sha256": sha256_file(path)}})
    index = build_index(root, [r["arrow"]["path"] for r in records])
    assemble_manifest(root, records, features, resampler_info(), {"presets": ["test"]}, n, 0, index)
    np.save(tmp_path / "expect.npy", np.arange(n, dtype=np.float32))
    script = tmp_path / "many.py"
    script.write_text(_MANY)
    r = subprocess.run([sys.executable, str(script), str(root), str(tmp_path / "expect.npy")], capture_output=True,
                       text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["OK", str(n)]


def test_the_trainer_flag_reaches_the_loader(shards, tmp_path):
    c = _break(shards, tmp_path)
    base = [sys.executable, str(HERE / "core_trainer_fixture.py"), "--shards", str(c.root), "--batch-frames", "1500",
            "--max-steps", "2", "--log-every", "1", "--warmup-steps", "1"]
    failed = subprocess.run(base + ["--out", str(tmp_path / "fail")], capture_output=True, text=True, timeout=180,
                            env=_env())
    # Without the flag: the trainer stops at open with the loader's one line, not a traceback.
    assert failed.returncode != 0 and "Traceback" not in failed.stderr, failed.stderr[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("train: error:") and "2 of 5 shards corrupt" in last, failed.stderr[-3000:]
    skipped = subprocess.run(base + ["--out", str(tmp_path / "skip"), "--on-corrupt", "skip"], capture_output=True,
                             text=True, timeout=180, env=_env())
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    assert "skipping 16 rows" in skipped.stderr
    log = [json.loads(line) for line in (tmp_path / "skip" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]


def test_the_webdataset_reader_does_not_scan_the_arrow_shards(tmp_path):
    """make_wds_loader reads tars and only the manifest and index beside them (a job streaming from object
    storage copies just those): the open-time Arrow scan must not refuse a folder without arrow/."""
    from audiopipe.reader.wds import make_wds_loader

    w = write_shards(tmp_path / "s", rows_per_shard=(4, 3), mel_frames=(5, 30))
    for k in range(2):
        w.shard_path(k).unlink()
    loader = make_wds_loader(w.root, ["mel"], max_frames=600, seed=0)
    seen = [i for batch in loader for i in batch["index"]]
    assert sorted(seen) == list(range(7))


# ---- the length index and the buffer lengths are checked, not trusted ----------------------------------------


def _rewrite_index(root: Path, change, fix_checksum: bool) -> None:
    """index.arrow with its `row` column changed by `change(rows)`; the manifest's checksums made to match when
    fix_checksum (so only the row-by-row check can tell), else left as they were."""
    from audiopipe.shard.checksum import file_checksum

    path = root / "index.arrow"
    t = pa.ipc.open_file(pa.BufferReader(path.read_bytes())).read_all()  # in memory: the file is rewritten
    rows = t.column("row").to_numpy().copy()
    t = t.set_column(t.column_names.index("row"), "row", pa.array(change(rows), pa.int32()))
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    if fix_checksum:
        m = json.loads((root / "manifest.json").read_text())
        m["index"] = {"path": "index.arrow", "sha256": file_checksum(path, "sha256"),
                      "xxh3_128": file_checksum(path, "xxh3_128")}
        (root / "manifest.json").write_text(json.dumps(m))


def _permute_shard_1(rows):
    a = sum(ROWS_PER_SHARD[:1])
    rows[a:a + ROWS_PER_SHARD[1]] = rows[a:a + ROWS_PER_SHARD[1]][::-1]
    return rows


def _out_of_range(rows):
    rows[3] = 10_000
    return rows


@pytest.mark.parametrize("change, fix, says", [
    (_permute_shard_1, True, r"index\.arrow is corrupt: entry 5 points at shard 1 row 8, where shard 1 row 0 belongs"),
    (_out_of_range, True, r"index\.arrow is corrupt: entry 3 points at shard 0 row 10000"),
    (_permute_shard_1, False, r"index\.arrow fails the manifest's xxh3_128 check"),
], ids=["permuted-rows", "out-of-range", "checksum"])
def test_a_permuted_or_out_of_range_index_is_a_named_error(shards, tmp_path, change, fix, says):
    from audiopipe.reader.errors import CorruptIndexError

    c = copy_shards(shards, tmp_path / "c")
    _rewrite_index(c.root, change, fix)
    with pytest.raises(CorruptIndexError, match=says):
        make_loader(c.root, ["mel"], max_frames=1500, rank=0, world_size=1)
    with pytest.raises(CorruptIndexError, match=says):  # the files baseline reads the index too
        ShardDataset(c.root, ["mel"], check_shards=False)


@pytest.mark.parametrize("column, says", [
    ("id", r"index\.arrow is corrupt: entry 0 says id '.+', shard .+ row 0 holds '.+'"),
    ("mel_frames", r"index\.arrow is corrupt: entry 0 says \d+ mel frames, shard .+ row 0 holds \d+"),
], ids=["ids", "frames"])
def test_an_index_whose_ids_or_frames_disagree_with_the_shards_is_named_by_loader_and_verify(shards, tmp_path,
                                                                                              column, says):
    """The red team's case: ids (or frame counts) swapped in index.arrow and the manifest rehashed. Both the
    loader and `verify` passed it, and the loader paired one id with another utterance's mel."""
    from audiopipe.reader.errors import CorruptIndexError
    from audiopipe.shard.verify import verify

    c = copy_shards(shards, tmp_path / "c")
    rewrite_index_column(c.root, column, swap_first_two)
    loader = make_loader(c.root, ["mel"], max_frames=100_000, rank=0, world_size=1, prefetch=0, shuffle=False)
    loader.set_epoch(0)
    with pytest.raises(CorruptIndexError, match=says):
        list(loader)
    report = verify(c.root, tars=False)
    assert not report.ok and any("index.arrow: entry 0 says" in f for f in report.failures), report.failures


def _shrink_offsets_buffer(path: Path, feature: str = "mel") -> None:
    """Set the length of `feature`'s offsets buffer in the record-batch header to 16 bytes (same file size)."""
    import struct

    from audiopipe.reader import ipc_layout

    data = bytearray(path.read_bytes())
    flen = ipc_layout.footer_length(bytes(data[-10:]))
    block = ipc_layout.record_batch_blocks(bytes(data[len(data) - 10 - flen:len(data) - 10]))[0]
    schema = pa.ipc.open_file(pa.BufferReader(bytes(data))).schema
    head = bytes(data[block.offset:block.offset + block.metadata_length])
    cols = ipc_layout.columns(schema, ipc_layout.batch_layout(block, head))
    off, n = cols[feature].buffers[1]
    needle = struct.pack("<qq", off - block.offset - block.metadata_length, n)
    at = head.find(needle)
    assert at > 0 and head.count(needle) == 1
    data[block.offset + at + 8:block.offset + at + 16] = struct.pack("<q", 16)
    path.write_bytes(bytes(data))


def test_a_shrunk_buffer_length_is_a_named_error(shards, tmp_path):
    c = copy_shards(shards, tmp_path / "c")
    _shrink_offsets_buffer(c.shard_path(1))
    with pytest.raises(CorruptShardError, match=r"1 of 5 shards corrupt: shard shard-000001 .*unreadable Arrow file "
                                                r"\(.*too small"):
        make_loader(c.root, ["mel"], max_frames=1500, rank=0, world_size=1)
    # Without the open-time scan, mapping the shard names it (it was a bare numpy ValueError).
    ds = ShardDataset(c.root, ["mel"], check_shards=False)
    with pytest.raises(CorruptShardError, match=r"shard shard-000001 .*is unreadable: .*too small"):
        ds.__getitems__([global_of(1, 0)])


def test_a_shrunk_buffer_length_is_a_named_error_from_s3(shards, tmp_path, s3):
    from s3server import upload

    from audiopipe.reader.remote_dataset import RemoteShardDataset

    server, bucket = s3
    c = copy_shards(shards, tmp_path / "c")
    _shrink_offsets_buffer(c.shard_path(1))
    url = upload(server, c.root, f"{bucket}/shrunk")
    with pytest.raises(CorruptShardError, match=r"shard shard-000001 .*unreadable Arrow file \(column mel: buffer 1 "
                                                r"is 16 bytes"):
        RemoteShardDataset(url, ["mel"])
    ds = RemoteShardDataset(url, ["mel"], check_shards=False)
    with pytest.raises(CorruptShardError, match=r"shard shard-000001 .*is unreadable: column mel: buffer 1"):
        ds.__getitems__([global_of(1, 0)])


def test_a_loader_of_one_rank_runs_no_collective(two_ranks):
    r0, r1 = (json.loads((two_ranks / f"alone{r}.json").read_text()) for r in (0, 1))
    assert r0["len"] == r1["len"] > 0
