"""export-hf: shards of real speech -> a `save_to_disk` folder that datasets memory-maps as it is (load_from_disk,
Dataset.from_file), features typed Array2D, pcm as an Audio column; every row checked against the shards."""

from __future__ import annotations

import argparse
import io
import json
import os

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from audiopipe.export.errors import ExportError
from audiopipe.cli import main as cli_main
from audiopipe.export.hf import add_arguments, export_hf, run
from export_helpers import mixed, whole, shard_items, shard_order

datasets = pytest.importorskip("datasets")
from datasets import Array2D, Audio, Value  # noqa: E402
from datasets.table import MemoryMappedTable  # noqa: E402


@pytest.fixture(scope="module")
def exported(mixed, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf_export") / "ds"
    return out, export_hf(mixed.shards, out)


def test_load_from_disk_maps_the_exported_files_without_copying(mixed, exported):
    out, summary = exported
    files = sorted(str(p) for p in out.glob("data-*.arrow"))
    manifest = json.loads((mixed.shards / "manifest.json").read_text())
    assert len(files) == summary["files"] == len(manifest["shards"]) > 1
    data_bytes = sum(os.path.getsize(f) for f in files)
    before = pa.total_allocated_bytes()
    ds = datasets.load_from_disk(str(out))
    table = ds.data.table  # every column, as one pyarrow table
    column = table.column("fbank")
    assert column.num_chunks == len(files)
    # The loader memory-maps the export itself: its cache files are the exported files, each block a
    # MemoryMappedTable, and materialising the whole table allocates next to nothing (it is the mapping).
    assert sorted(c["filename"] for c in ds.cache_files) == files
    assert all(isinstance(block, MemoryMappedTable) for row in ds.data.blocks for block in row)
    assert table.nbytes > data_bytes / 2 and pa.total_allocated_bytes() - before < data_bytes / 20
    one = datasets.Dataset.from_file(files[0])  # the call that failed on the shards themselves
    assert one.cache_files == [{"filename": files[0]}] and isinstance(one.data, MemoryMappedTable)
    assert one.features == ds.features


def test_every_row_matches_the_shards(mixed, exported):
    out, _ = exported
    ds = datasets.load_from_disk(str(out))
    assert ds.features["fbank"] == Array2D(shape=(None, 80), dtype="float32")
    assert ds.features["mel"] == Array2D(shape=(None, 100), dtype="float32")
    assert ds.features["energy"] == datasets.Sequence(Value("float32"))
    assert ds.features["audio"] == Audio(sampling_rate=24000)
    assert all(ds.features[c] == Value("string") for c in ("id", "text", "speaker", "source", "language", "pnc"))
    assert ds["id"] == shard_order(mixed.shards)
    items = shard_items(mixed.shards, ("pcm", "fbank", "mel", "energy"))
    # Audio decoding needs torchcodec in datasets >= 4: read the stored bytes, as a loader without it does.
    rows = ds.cast_column("audio", Audio(decode=False)).with_format("numpy")
    for i in range(len(rows)):
        row = rows[i]
        uid = str(row["id"])
        e, it = mixed.expected[uid], items[uid]
        assert (row["text"], row["speaker"], row["language"], row["pnc"]) == (e.text, e.speaker, "en", e.extra["pnc"])
        assert row["duration"] == np.float32(it["duration"]) and row["source"] == it["source"]
        pcm, sr = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="int16")
        assert sr == 24000 and np.array_equal(pcm, e.pcm) and np.array_equal(pcm, it["pcm"])
        for name in ("fbank", "mel", "energy"):
            assert row[name].dtype == np.float32 and np.array_equal(row[name], it[name].T)  # [T, C], or [T]


def test_audio_paths_or_no_audio(whole, mixed, tmp_path):
    out = tmp_path / "src"
    assert export_hf(whole.shards, out)["audio"] == "source"
    ds = datasets.load_from_disk(str(out)).cast_column("audio", Audio(decode=False))
    items = shard_items(whole.shards, ("fbank",))
    assert ds.features["audio"] == Audio(sampling_rate=None, decode=False)
    for row in ds:
        e = whole.expected[row["id"]]
        assert row["audio"]["bytes"] is None and row["audio"]["path"] == str(whole.corpus / items[row["id"]]["source"])
        assert np.array_equal(sf.read(row["audio"]["path"], dtype="int16")[0], e.pcm)
    none = tmp_path / "none"
    export_hf(mixed.shards, none, audio="none", features=["mel"])
    ds = datasets.Dataset.from_file(str(sorted(none.glob("data-*.arrow"))[0]))
    assert "audio" not in ds.column_names and "fbank" not in ds.column_names and "mel" in ds.column_names


def test_refusals_and_overwrite(mixed, tmp_path, capsys):
    out = tmp_path / "ds"
    with pytest.raises(ExportError, match=r"has no feature f0 \(it has pcm, fbank, mel, energy\)"):
        export_hf(mixed.shards, out, features=["f0"])
    with pytest.raises(ExportError, match="cannot point at"):
        export_hf(mixed.shards, out, audio="source")
    assert list(tmp_path.iterdir()) == []  # the failed export left nothing, temporaries included
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(["--shards", str(mixed.shards), "--out", str(out), "--audio", "none",
                             "--no-progress"])) == 0
    assert capsys.readouterr().out.startswith(f"exported 14 rows to {out} as ")
    assert cli_main(["export-hf", "--shards", str(mixed.shards), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--overwrite" in err[0]
    assert cli_main(["export-hf", "--shards", str(mixed.shards), "--out", str(out), "--no-progress", "--overwrite",
                 "--features", "fbank"]) == 0
    assert datasets.load_from_disk(str(out)).column_names == ["id", "speaker", "text", "source", "duration",
                                                              "audio", "fbank", "language", "pnc"]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
