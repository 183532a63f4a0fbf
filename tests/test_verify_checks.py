"""verify's semantic checks, which run column by column over a whole shard: each damaged record is named, once,
with its shard and id, and an intact set passes. The damage is written into a real shard whose checksum is then
updated, so only the semantic checks can see it."""

from __future__ import annotations

import io
import json
import shutil
import tarfile

import numpy as np
import pyarrow as pa
import pytest

from audiopipe.shard.checksum import file_checksum
from audiopipe.shard.manifest import read_manifest
from audiopipe.shard.run import run_job
from audiopipe.shard.verify import verify
from shard_helpers import make_job

FEATS = [("vocos_mel", {}), ("f0", {"sample_rate": 16000, "hop_length": 160}), ("kaldi_fbank", {})]


@pytest.fixture(scope="module")
def shards(synthetic_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify_checks")
    job = make_job(synthetic_corpus.root, out, FEATS, shard_bytes=1_000_000)
    job.write_tar = False
    run_job(job, workers=0, show_progress=False)
    return out


def _rewrite(out, shard_no: int, change) -> list[str]:
    """Apply change(columns) to one shard's Arrow file, keep its schema, fix its checksum; the shard's ids."""
    m = read_manifest(out)
    entry = m["shards"][shard_no]["arrow"]
    path = out / entry["path"]
    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
    cols = {n: table.column(n).combine_chunks() for n in table.column_names}
    change(cols)
    new = pa.Table.from_arrays([cols[n] for n in table.column_names], schema=table.schema)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(new)
    entry["bytes"] = path.stat().st_size
    for algorithm in ("xxh3_128", "sha256"):
        if algorithm in entry:
            entry[algorithm] = file_checksum(path, algorithm)
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return table.column("id").to_pylist()


def _set_values(cols, name: str, row: int, value: float, count: int = 1) -> None:
    """Put `value` into the first `count` values of one row of a list column (a fresh copy of the column)."""
    col = cols[name]
    offsets = col.offsets.to_numpy()
    values = col.values.to_numpy(zero_copy_only=False).copy()
    values[offsets[row]:offsets[row] + count] = value
    cols[name] = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values))


def test_an_intact_set_passes_and_every_record_is_counted(shards):
    rep = verify(shards, tars=False)
    assert rep.ok, rep.failures
    assert rep.records == read_manifest(shards)["totals"]["written"]


def test_each_damaged_record_is_named_once_in_row_order(shards, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    m = read_manifest(bad)
    assert len(m["shards"]) > 1 and m["shards"][0]["rows"] >= 3
    shard_name = m["shards"][0]["name"]

    def damage(cols):
        _set_values(cols, "mel", 0, np.nan)  # row 0: a NaN in its mel
        f0 = cols["f0"].values.to_numpy(zero_copy_only=False)
        voiced = cols["voiced"].values.to_numpy(zero_copy_only=False)
        row1 = slice(cols["f0"].offsets.to_numpy()[1], cols["f0"].offsets.to_numpy()[2])
        k = row1.start + int(np.flatnonzero(voiced[row1])[0])  # a voiced frame of row 1
        values = f0.copy()
        values[k] = 9000.0  # far above fmax
        cols["f0"] = pa.LargeListArray.from_arrays(cols["f0"].offsets, pa.array(values))
        _set_values(cols, "fbank", 1, np.inf, count=3)  # row 1 too: its fbank holds inf
        frames = cols["mel_frames"].to_numpy(zero_copy_only=False).copy()
        frames[2] += 1  # row 2: the mel no longer holds the frames its row says
        cols["mel_frames"] = pa.array(frames, cols["mel_frames"].type)

    ids = _rewrite(bad, 0, damage)
    rep = verify(bad, tars=False)
    assert rep.records == read_manifest(bad)["totals"]["written"]
    f = rep.failures
    # The record whose mel length was changed (row 2) also no longer matches the index's frame count.
    assert len(f) == 5 and f[4].startswith("index.arrow: entry ") and "the index does not describe" in f[4], f
    assert f[0] == f"{shard_name} {ids[0]}: mel contains NaN or inf"
    assert f[1].startswith(f"{shard_name} {ids[1]}: f0 outside [") and f[1].endswith("Hz on voiced frames")
    assert f[2] == f"{shard_name} {ids[1]}: fbank contains NaN or inf"
    assert f[3].startswith(f"{shard_name} {ids[2]}: mel holds ") and "values, expected 100x" in f[3]


def test_a_frame_count_that_disagrees_with_the_duration_is_named(shards, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(shards, bad)
    shard_name = read_manifest(bad)["shards"][-1]["name"]

    def stretch(cols):
        durations = cols["duration"].to_numpy(zero_copy_only=False).copy()
        durations[-1] += 0.5  # the last row now claims half a second more than its arrays hold
        cols["duration"] = pa.array(durations, cols["duration"].type)

    ids = _rewrite(bad, -1, stretch)
    f = verify(bad, tars=False).failures
    assert [x.split(": ", 1)[0] for x in f] == [f"{shard_name} {ids[-1]}"] * 4, f
    assert [x.split(": ", 1)[1].split()[0] for x in f] == ["f0", "fbank", "mel", "voiced"]
    assert all(" frames but " in x and " s implies " in x for x in f)


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256"])
def test_the_mapped_checksum_is_the_streamed_one(shards, tmp_path, algorithm):
    from audiopipe.shard.verify import _mapped_checksum

    arrow = shards / read_manifest(shards)["shards"][0]["arrow"]["path"]
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    for path in (arrow, empty):
        assert _mapped_checksum(path, algorithm) == file_checksum(path, algorithm)


# ---------------------------------------------------------------- the tar against its Arrow twin

@pytest.fixture(scope="module")
def tar_shards(synthetic_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("verify_tars")
    run_job(make_job(synthetic_corpus.root, out, [("vocos_mel", {}), ("kaldi_fbank", {})], shard_bytes=1_000_000),
            workers=0, show_progress=False)
    return out


def _counting_np_load(monkeypatch) -> list[int]:
    """np.load itself, counted (verify decodes a .npy member only when its bytes are not the writer's)."""
    calls = [0]
    real = np.load

    def load(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    monkeypatch.setattr(np, "load", load)
    return calls


def _rewrite_member(out, suffix: str, change) -> str:
    """Replace the payload of the first member ending in `suffix` of shard 0's tar by change(array) saved with
    np.save (a tar written by tarfile, the manifest's checksum made to match); the member's name."""
    m = read_manifest(out)
    entry = m["shards"][0]["tar"]
    path = out / entry["path"]
    with tarfile.open(path) as tar:
        members = [(i, tar.extractfile(i).read()) for i in tar.getmembers()]
    name = next(i.name for i, _ in members if i.name.endswith(suffix))
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if info.name == name:
                buf = io.BytesIO()
                np.save(buf, change(np.load(io.BytesIO(data))))
                data = buf.getvalue()
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    entry["bytes"] = path.stat().st_size
    for algorithm in ("xxh3_128", "sha256"):
        if algorithm in entry:
            entry[algorithm] = file_checksum(path, algorithm)
    (out / "manifest.json").write_text(json.dumps(m, indent=1))
    return name


def test_an_intact_tar_is_compared_without_decoding_a_member(tar_shards, monkeypatch):
    # np.load parses every header with ast.literal_eval: on small records (the frame energy, ~4 kB an
    # utterance with its tar) that alone cost more than the rest of verify together.
    calls = _counting_np_load(monkeypatch)
    rep = verify(tar_shards)
    assert rep.ok, rep.failures
    assert rep.records == read_manifest(tar_shards)["totals"]["written"] and calls[0] == 0


def test_a_member_stored_another_way_is_decoded_and_passes_a_changed_one_is_named(tar_shards, tmp_path,
                                                                                     monkeypatch):
    other = tmp_path / "other"
    shutil.copytree(tar_shards, other)
    _rewrite_member(other, ".mel.npy", np.asfortranarray)  # the same values, other bytes (column-major)
    calls = _counting_np_load(monkeypatch)
    rep = verify(other)
    assert rep.ok and calls[0] == 1, rep.failures

    changed = tmp_path / "changed"
    shutil.copytree(tar_shards, changed)

    def bump(a):
        a = a.copy()
        a.flat[0] += 1.0
        return a

    name = _rewrite_member(changed, ".fbank.npy", bump)
    shard_name = read_manifest(changed)["shards"][0]["name"]
    assert verify(changed).failures == [f"{shard_name} tar {name}: differs from the Arrow record"]
