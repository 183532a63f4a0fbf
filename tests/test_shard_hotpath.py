"""The extraction hot path (audiopipe.shard.build) without Ray: shared STFTs, and its output against the
features computed one by one."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pyarrow as pa
import torch

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits, load_audio, resample
from audiopipe.features.energy import Energy
from audiopipe.features.mel import VocosMel
from audiopipe.shard.build import build_shard
from audiopipe.shard.job import Job
from audiopipe.shard.plan import PlannedUtt, WorkUnit


def _unit(root, n=6) -> WorkUnit:
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(root).utterances]
    return WorkUnit("shard-000000", 0, utts[:n])


def test_a_mel_and_an_energy_of_one_framing_share_one_stft(espeak_corpus, tmp_path, monkeypatch):
    unit = _unit(espeak_corpus.root)
    job = Job(corpus=str(espeak_corpus.root), out=str(tmp_path), presets=["custom"],
              features=[("vocos_mel", {}), ("energy", {})], limits=asdict(DecodeLimits()), write_tar=False)
    calls = []
    real_stft = torch.stft

    def counting_stft(*a, **k):
        calls.append(1)
        return real_stft(*a, **k)

    monkeypatch.setattr(torch, "stft", counting_stft)
    rec = build_shard(unit, job)
    monkeypatch.undo()
    assert rec["rows"] == len(unit.utterances) and len(calls) == len(unit.utterances)

    with pa.memory_map(str(tmp_path / rec["arrow"]["path"])) as src:
        t = pa.ipc.open_file(src).read_all()
    mel, energy = VocosMel(), Energy()
    for i, u in enumerate(unit.utterances):
        assert t.column("id")[i].as_py() == u.id
        wav, sr = load_audio(u.path)
        x = resample(wav, sr, 24000)
        assert np.array_equal(np.asarray(t.column("mel")[i].values).reshape(100, -1), mel(x)["mel"])
        assert np.array_equal(np.asarray(t.column("energy")[i].values), energy(x)["energy"])


def test_shard_checksums_are_taken_while_writing(espeak_corpus, tmp_path, monkeypatch):
    # The done record's sizes and checksums come from the bytes as they were written: no file is read back
    # (reading a shard back cost ~2 % of a worker), and they equal what a reader computes from disk, with
    # the algorithm the job asks for (xxh3-128 by default, sha256 on request).
    import audiopipe.shard.build as build
    import audiopipe.shard.checksum as checksum
    from audiopipe.shard.checksum import file_checksum

    def no_reread(path, *a, **k):
        raise AssertionError(f"{path} was read back to hash it")

    for algorithm in ("xxh3_128", "sha256"):
        for mod in (build, checksum):
            for fn in ("file_checksum", "sha256_file"):
                if hasattr(mod, fn):
                    monkeypatch.setattr(mod, fn, no_reread)
        unit = _unit(espeak_corpus.root, n=4)
        out = tmp_path / algorithm
        job = Job(corpus=str(espeak_corpus.root), out=str(out), presets=["f5tts"],
                  features=[("vocos_mel", {})], limits=asdict(DecodeLimits()), write_tar=True, checksum=algorithm)
        rec = build_shard(unit, job)
        monkeypatch.undo()
        assert rec["rows"] == 4
        for kind in ("arrow", "tar"):
            path = out / rec[kind]["path"]
            assert set(rec[kind]) == {"path", "bytes", algorithm}
            assert rec[kind]["bytes"] == path.stat().st_size
            assert rec[kind][algorithm] == file_checksum(path, algorithm)


def _count_fsyncs(monkeypatch) -> dict[str, int]:
    import os
    import stat

    counts = {"file": 0, "folder": 0}
    real = os.fsync

    def counting(fd):  # called from the writer's background threads too: a dict update is enough
        counts["folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"] += 1
        return real(fd)

    monkeypatch.setattr(os, "fsync", counting)
    return counts


def test_a_shard_fsyncs_its_two_data_files_and_no_folder(espeak_corpus, tmp_path, monkeypatch):
    # Each fsync is a journal commit (2-8 ms on this VM): with a folder fsync per file, a shard of 20 short
    # utterances spent ~15 % of its time waiting on the disk. The folders are fsync'd once per job instead
    # (LocalOutput.sync, before the manifest), a staged shard that is uploaded and deleted is not fsync'd, and
    # neither is a done record (its loss only means building the shard again; build.write_done_record).
    unit = _unit(espeak_corpus.root, n=3)
    job = Job(corpus=str(espeak_corpus.root), out=str(tmp_path / "a"), presets=["f5tts"],
              features=[("vocos_mel", {})], limits=asdict(DecodeLimits()), write_tar=True)
    counts = _count_fsyncs(monkeypatch)
    rec = build_shard(unit, job)
    assert counts == {"file": 2, "folder": 0}  # Arrow file and tar
    counts.update(file=0, folder=0)
    staged = build_shard(unit, Job(**{**job.__dict__, "out": str(tmp_path / "b")}), sync=False)
    assert counts == {"file": 0, "folder": 0}
    monkeypatch.undo()
    for kind in ("arrow", "tar"):  # the same bytes either way, every file in place under its name
        assert (tmp_path / "a" / rec[kind]["path"]).read_bytes() == (tmp_path / "b" / staged[kind]["path"]).read_bytes()
    assert sorted(p.name for p in (tmp_path / "a").rglob("*")) == ["arrow", "done", "shard-000000.arrow",
                                                                  "shard-000000.json", "shard-000000.tar", "wds"]

    from audiopipe.shard.output import LocalOutput

    counts = _count_fsyncs(monkeypatch)
    LocalOutput(tmp_path / "a").sync()
    assert counts == {"file": 0, "folder": 3}


def test_a_failed_write_leaves_no_file_under_its_name(tmp_path):
    from audiopipe.storage.atomic import AtomicBatch

    files = AtomicBatch()
    with files.path(tmp_path / "x" / "a.bin") as tmp:
        tmp.write_bytes(b"a")
    try:
        with files.path(tmp_path / "x" / "b.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    except RuntimeError:
        pass
    files.commit()
    assert [p.name for p in (tmp_path / "x").iterdir()] == ["a.bin"]


_FIRST_SHARD = r"""
import sys, json, tempfile
from dataclasses import asdict
from pathlib import Path
from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits
from audiopipe.shard.build import build_shard
from audiopipe.shard.job import Job
from audiopipe.shard.plan import PlannedUtt, WorkUnit
from audiopipe.shard.worker import load_table_support as _load_table_support, warm_worker as _warm_worker
root, out = sys.argv[1], sys.argv[2]
utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(root).utterances][:2]
job = Job(corpus=root, out=out, presets=["f5tts"], features=[("vocos_mel", {})], limits=asdict(DecodeLimits()))
_warm_worker(job.to_dict(), 0)
before = set(sys.modules)
rec = build_shard(WorkUnit("shard-000000", 0, utts), job)
worker_new = sorted(set(sys.modules) - before)
_load_table_support()
from audiopipe.index.lengths import build_index
before = set(sys.modules)
build_index(Path(out), [rec["arrow"]["path"]])
print(json.dumps({"worker": worker_new, "driver": sorted(set(sys.modules) - before)}))
"""


def test_warm_ups_leave_nothing_to_import_for_the_first_shard_and_the_index(espeak_corpus, tmp_path):
    # pyarrow imports pandas when a process builds its first Table (~0.5 s): that used to land on every
    # worker's first shard task and on the driver's index, after the shards, inside the extraction phase.
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FIRST_SHARD, str(espeak_corpus.root), str(tmp_path)],
                       capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    new = json.loads(r.stdout.strip().splitlines()[-1])
    assert new == {"worker": [], "driver": []}, new


def _tarfile_reference(path, rows, cols):
    """What write_tar wrote before it wrote members itself: tarfile, PAX format, fixed metadata, np.save."""
    import io
    import json
    import tarfile

    from audiopipe.shard.keys import sample_key
    from audiopipe.shard.writer import sample_json

    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for row in rows:
            members = [("json", json.dumps(sample_json(row, cols, []), sort_keys=True, ensure_ascii=False).encode())]
            for c in cols:
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(row["arrays"][c.name]), allow_pickle=False)
                members.append((f"{c.name}.npy", buf.getvalue()))
            for ext, blob in members:
                info = tarfile.TarInfo(f"{sample_key(row['id'])}.{ext}")
                info.size, info.mtime, info.mode = len(blob), 0, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(blob))


def test_tar_members_written_directly_are_tarfiles_bytes(tmp_path):
    # The tar is written member by member without tarfile's copies (header, the feature's own memory,
    # padding); its bytes must stay those of tarfile, including PAX headers for non-ASCII and long names,
    # empty arrays, non-contiguous arrays and an empty shard.
    from audiopipe.shard.checksum import file_checksum
    from audiopipe.shard.writer import ArrayColumn, write_tar

    rng = np.random.default_rng(0)
    cols = [ArrayColumn("mel", "float32", 100), ArrayColumn("codes", "int16", 16), ArrayColumn("phones", "int16", 0)]
    rows = []
    for i, uid in enumerate(["spk/a.b", "ünï/côdé", "x" * 140, "中文/句子", "plain"]):
        t = int(rng.integers(1, 700))
        rows.append({"id": uid, "speaker": "é", "text": "héllo 中", "source": f"/c/{uid}.wav", "duration": 1.2345,
                     "scalars": {}, "arrays": {"mel": rng.standard_normal((100, t)).astype(np.float32),
                                               "codes": rng.integers(0, 1024, (t, 16)).astype(np.int16).T,
                                               "phones": np.zeros(i % 2 * 5, np.int16)}})
    for n in (0, 1, len(rows)):
        digest = write_tar(tmp_path / "new.tar", rows[:n], cols, [], None)
        _tarfile_reference(tmp_path / "ref.tar", rows[:n], cols)
        assert (tmp_path / "new.tar").read_bytes() == (tmp_path / "ref.tar").read_bytes(), n
        assert digest.entry("t") == {"path": "t", "bytes": (tmp_path / "ref.tar").stat().st_size,
                                     "xxh3_128": file_checksum(tmp_path / "ref.tar")}


def test_a_failed_tar_waits_for_the_arrow_files_background_commit(espeak_corpus, tmp_path, monkeypatch):
    # When the tar fails (a full disk, say), build_shard raises only once the Arrow file's fsync and rename
    # are over: no thread of a failed task may still write into --out while Ray retries it.
    import audiopipe.shard.build as build
    import audiopipe.storage.atomic as atomic

    real_finish = atomic.AtomicBatch._finish

    def slow_finish(self, tmp, path):
        import time

        time.sleep(0.3)
        return real_finish(self, tmp, path)

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.AtomicBatch, "_finish", slow_finish)
    monkeypatch.setattr(build, "write_tar", full_disk)
    job = Job(corpus=str(espeak_corpus.root), out=str(tmp_path), presets=["f5tts"],
              features=[("vocos_mel", {})], limits=asdict(DecodeLimits()), write_tar=True)
    try:
        build_shard(_unit(espeak_corpus.root, n=2), job)
        raise AssertionError("the tar's error was swallowed")
    except OSError:
        pass
    # Nothing in flight once it raised: the Arrow file is complete under its name, no temporary, no done record.
    assert sorted(p.name for p in (tmp_path / "arrow").iterdir()) == ["shard-000000.arrow"]
    assert not (tmp_path / "done").exists()
