"""Shard tasks of several shards (audiopipe.shard.groups), without Ray: the group sizes, each shard reported
only once it is finished while the next one is already computed, and a retry that skips what a failed attempt
finished, on a local folder and on a real S3 server."""

from __future__ import annotations

import json
import os
from dataclasses import asdict

import pytest

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits
from audiopipe.shard.groups import MAX_GROUP, Orphaned, build_group, group_units
from audiopipe.shard.job import Job
from audiopipe.shard.plan import PlannedUtt, WorkUnit

pytest_plugins = ["s3server"]


def _units(root, n_units: int, per_unit: int = 2) -> list[WorkUnit]:
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(root).utterances]
    assert len(utts) >= n_units * per_unit
    return [WorkUnit(f"shard-{i:06d}", i, utts[i * per_unit:(i + 1) * per_unit]) for i in range(n_units)]


def _job(root, out) -> Job:
    return Job(corpus=str(root), out=str(out), presets=["f5tts"], features=[("vocos_mel", {})],
               limits=asdict(DecodeLimits()), write_tar=True)


def test_groups_shrink_to_single_shards_at_the_end_and_keep_the_order():
    units = [WorkUnit(f"shard-{i:06d}", i, []) for i in range(56)]
    # One worker: ceil(left / 2) capped at 8, so 48 shards in groups of 8, then 4, 2, 1, 1.
    assert [len(g) for g in group_units(units, 1)] == [8] * 6 + [4, 2, 1, 1]
    for workers in (1, 2, 3, 16, 100):
        groups = group_units(units, workers)
        assert [u for g in groups for u in g] == units  # every unit once, in plan order
        sizes = [len(g) for g in groups]
        assert sizes == sorted(sizes, reverse=True) and max(sizes) <= MAX_GROUP
        # The last 2W tasks (or all of them) are single shards: the workers run out of work together.
        assert set(sizes[-min(len(sizes), 2 * workers):]) == {1}
    assert group_units([], 4) == []


def test_a_shard_is_reported_once_finished_while_the_next_is_already_computed(espeak_corpus, tmp_path):
    units = _units(espeak_corpus.root, 3)
    out = tmp_path / "out"
    reported = []
    for item in build_group(units, _job(espeak_corpus.root, out)):
        rec = item["record"]
        i = len(reported)
        assert rec["name"] == units[i].name
        # Finished: its files under their names with the sizes it gives, then its done record.
        assert json.loads((out / "done" / f"{rec['name']}.json").read_text()) == rec
        for kind in ("arrow", "tar"):
            assert (out / rec[kind]["path"]).stat().st_size == rec[kind]["bytes"]
        if i + 1 < len(units):
            # The next shard was computed and written before this one was reported (its files' fsyncs ran
            # meanwhile), so no done record of it yet.
            nxt = units[i + 1].name
            assert any(nxt in p.name for p in (out / "arrow").iterdir())
            assert any(nxt in p.name for p in (out / "wds").iterdir())
            assert not (out / "done" / f"{nxt}.json").exists()
        reported.append(item["task"])
    assert [t["name"] for t in reported] == [u.name for u in units]
    # The spans tile the task: each ends where the next begins.
    assert all(a["end"] == b["start"] for a, b in zip(reported, reported[1:]))
    assert all(t["end"] > t["start"] and t["cpu"] > 0 and t["pid"] == os.getpid() for t in reported)


def _files_of(out, names):
    return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and any(n in p.name for n in names)}


def test_a_retried_group_skips_the_shards_its_failed_attempt_finished(espeak_corpus, tmp_path):
    units = _units(espeak_corpus.root, 3)
    out = tmp_path / "out"
    job = _job(espeak_corpus.root, out)
    # A real write error on the third shard: its tar's temporary name is taken by a folder.
    blocker = out / "wds" / f".{units[2].name}.tar.tmp-{os.getpid()}"
    blocker.mkdir(parents=True)
    got = []
    with pytest.raises(IsADirectoryError):
        for item in build_group(units, job):
            got.append(item["record"]["name"])
    # The shard before the failing one was reported (finished) before the error came out.
    assert got == [units[0].name, units[1].name]
    assert not (out / "done" / f"{units[2].name}.json").exists()
    first = _files_of(out, [units[0].name, units[1].name])
    assert len(first) == 6  # Arrow file, tar and done record of each

    blocker.rmdir()
    again = [item["record"] for item in build_group(units, job)]
    assert [r["name"] for r in again] == [u.name for u in units]
    assert _files_of(out, [units[0].name, units[1].name]) == first  # not rebuilt: the same files, untouched
    for r in again:
        assert json.loads((out / "done" / f"{r['name']}.json").read_text()) == r


def test_a_retried_group_on_s3_skips_only_what_is_really_there(espeak_corpus, tmp_path, s3):
    from audiopipe.storage.s3 import filesystem, parse_s3
    from audiopipe.storage.upload import put_bytes

    _, bucket = s3
    units = _units(espeak_corpus.root, 2)
    job = _job(espeak_corpus.root, f"{bucket}/run")
    first = [item["record"] for item in build_group(units, job, staging=str(tmp_path / "staging"))]
    root = parse_s3(job.out)
    # Shard 1's tar replaced by other bytes (by another writer: no checksum metadata): shard 1 is built again,
    # shard 0 is taken from its done record without a byte written.
    put_bytes(root.child(first[1]["tar"]["path"]), b"not the tar")
    fs = filesystem()
    before = {k: fs.get_file_info(root.child(first[0][k]["path"]).path).mtime for k in ("arrow", "tar")}
    again = [item["record"] for item in build_group(units, job, staging=str(tmp_path / "staging"))]
    assert again == first
    assert {k: fs.get_file_info(root.child(first[0][k]["path"]).path).mtime for k in ("arrow", "tar")} == before
    with fs.open_input_stream(root.child(first[1]["tar"]["path"]).path) as f:
        assert len(f.read()) == first[1]["tar"]["bytes"]
    assert not any((tmp_path / "staging").iterdir())  # every staged shard removed after its upload


def test_an_orphaned_group_stops_before_its_next_shard_and_leaves_no_done_record_for_the_one_in_flight(
        espeak_corpus, tmp_path):
    # A Ray worker outlives a job killed with kill -9 (it is not in the driver's process group): once it sees
    # itself orphaned, the group must stop writing the folder that the next run takes over.
    units = _units(espeak_corpus.root, 3)
    out = tmp_path / "out"
    reported = []
    # It raises rather than ending quietly: a task that ends early must never look finished (a driver still
    # alive, whose node's raylet died, sends what it left again).
    with pytest.raises(Orphaned, match=units[2].name):
        for item in build_group(units, _job(espeak_corpus.root, out), orphaned=lambda: len(reported) >= 1):
            reported.append(item["record"]["name"])
    assert reported == [units[0].name]  # shard 1 was in flight when the job went away, shard 2 never started
    assert sorted(p.name for p in (out / "done").iterdir()) == [f"{units[0].name}.json"]
    assert not any(units[2].name in p.name for p in out.rglob("*"))
    # Shard 1's files are complete under their names (no temporary left), but without a done record it counts as
    # unfinished: the next run builds it again.
    assert not any(p.name.startswith(".") for p in out.rglob("*"))


def test_an_orphaned_group_on_s3_uploads_nothing_more_of_the_shard_in_flight(espeak_corpus, tmp_path, s3):
    # As on a local folder: once the job is gone, the shard in flight must not get its done record (nor more of
    # its objects), even when its upload was still queued behind others (a slow network).
    import threading

    import audiopipe.shard.output as output
    from s3server import object_keys

    _, bucket = s3
    units = _units(espeak_corpus.root, 3)
    job = _job(espeak_corpus.root, f"{bucket}/orphan")
    reported, gate, asked = [], threading.Event(), []

    def orphaned() -> bool:
        asked.append(len(reported))
        if len(asked) == 2:  # before shard 1: fill both upload threads, so that its upload waits in the queue
            for _ in range(2):
                output._UPLOADS.submit(gate.wait, 60)
        if reported:  # the job went away after shard 0 was reported; let the queue move once abort() is called
            threading.Timer(0.5, gate.set).start()
            return True
        return False

    with pytest.raises(Orphaned):
        for item in build_group(units, job, staging=str(tmp_path / "staging"), orphaned=orphaned):
            reported.append(item["record"]["name"])
    assert gate.is_set() and reported == [units[0].name]
    keys = sorted(object_keys(job.out))
    # Shard 0 complete; of shard 1 (in flight) nothing at all, shard 2 never started.
    assert keys == sorted([f"arrow/{units[0].name}.arrow", f"wds/{units[0].name}.tar",
                           f"done/{units[0].name}.json"]), keys
    assert not any((tmp_path / "staging").iterdir())  # its staged files removed all the same
