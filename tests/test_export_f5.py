"""export-f5: shards -> F5-TTS's prepared folder (mel.arrow, raw.arrow, duration.json, vocab.txt), read back."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from audiopipe.export.f5 import (F5_MEL_HASH, MEL_SCHEMA, OUTPUTS, RAW_SCHEMA, ExportError, _clean_text,
                                 add_arguments, export_f5, main, run)
from audiopipe.reader.arrow_dataset import ShardDataset
from shard_helpers import shard


@pytest.fixture(scope="module")
def shards(asterisk_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("f5_export_shards")
    shard(asterisk_corpus.root, out, [("vocos_mel", {})], shard_bytes=1_000_000)  # several shards
    return out


@pytest.fixture(scope="module")
def exported(shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("f5_export") / "Asterisk_char"
    return out, export_f5(shards, out, batch_rows=7)  # several record batches too


def _stream(path: Path) -> tuple[pa.Schema, list[pa.RecordBatch]]:
    with pa.memory_map(str(path)) as src:
        reader = pa.ipc.open_stream(src)  # datasets' ArrowWriter writes the IPC stream format
        return reader.schema, list(reader)


def _shard_rows(shards: Path) -> list[dict]:
    ds = ShardDataset(shards, ["mel"], meta_columns=("id", "text", "source", "duration"))
    return [ds[i] for i in range(len(ds))]


def test_mel_arrow_holds_the_shard_mels_exactly(shards, exported, asterisk_corpus):
    out, summary = exported
    rows = _shard_rows(shards)
    assert len(json.loads((shards / "manifest.json").read_text())["shards"]) > 1
    schema, batches = _stream(out / "mel.arrow")
    assert schema.equals(MEL_SCHEMA) and len(batches) > 1
    table = pa.Table.from_batches(batches)
    assert table.num_rows == len(rows) == summary["rows"] == len(asterisk_corpus.utterances)
    for i, r in enumerate(rows):
        mel = np.asarray(table.column("mel_spec")[i].values.flatten()).reshape(100, -1)
        assert mel.dtype == np.float32 and mel.shape == r["mel"].shape
        np.testing.assert_array_equal(mel, r["mel"])
        assert table.column("text")[i].as_py() == r["text"]
        assert table.column("duration")[i].as_py() == float(r["duration"])
        path = table.column("audio_path")[i].as_py()
        assert path == str(asterisk_corpus.root / r["source"]) and os.path.exists(path)
    assert summary["audio_found"] == len(rows) and summary["outside_f5_duration_range"] == 0


def test_raw_arrow_duration_json_and_vocab(shards, exported):
    out, summary = exported
    rows = _shard_rows(shards)
    schema, batches = _stream(out / "raw.arrow")
    assert schema.equals(RAW_SCHEMA)
    raw = pa.Table.from_batches(batches)
    mel = pa.Table.from_batches(_stream(out / "mel.arrow")[1])
    assert raw.equals(mel.select(["audio_path", "text", "duration"]))
    durations = json.loads((out / "duration.json").read_text())["duration"]
    assert durations == raw.column("duration").to_pylist() == [float(r["duration"]) for r in rows]
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab[-1] == "" and vocab[0] == " "  # F5's char tokenizer asserts vocab[" "] == 0
    vocab = vocab[:-1]
    assert len(vocab) == len(set(vocab)) == summary["vocab_size"]
    assert set(vocab) == {c for r in rows for c in r["text"]} | {" "}
    assert vocab[1:] == sorted(vocab[1:])
    assert not [p for p in out.iterdir() if p.name not in OUTPUTS], "temporary files left behind"


def test_datasets_reads_it_as_f5_does(shards, exported):
    datasets = pytest.importorskip("datasets")
    torch = pytest.importorskip("torch")
    out, _ = exported
    rows = _shard_rows(shards)
    ds = datasets.Dataset.from_file(str(out / "mel.arrow"))  # what F5's load_dataset(audio_type="mel") calls
    assert len(ds) == len(rows)
    assert set(ds.column_names) >= {"audio_path", "text", "duration", "mel_spec"}
    # F5's vocab reader: line i -> id i, "char[:-1]" strips the newline.
    with open(out / "vocab.txt", encoding="utf-8") as f:
        vocab_map = {line[:-1]: i for i, line in enumerate(f)}
    assert vocab_map[" "] == 0
    for i, r in enumerate(rows):
        row = ds[i]
        mel = torch.tensor(row["mel_spec"])  # F5's CustomDataset with preprocessed_mel=True
        assert mel.dtype == torch.float32 and tuple(mel.shape) == r["mel"].shape
        assert torch.equal(mel, torch.from_numpy(np.array(r["mel"])))
        assert row["text"] == r["text"] and row["duration"] == float(r["duration"])
        assert all(c in vocab_map for c in row["text"])
    raw = datasets.Dataset.from_file(str(out / "raw.arrow"))
    assert raw[0] == {k: ds[0][k] for k in ("audio_path", "text", "duration")}


def test_existing_output_is_kept_unless_overwrite(shards, tmp_path):
    out = tmp_path / "f5"
    export_f5(shards, out)
    before = (out / "mel.arrow").read_bytes()
    with pytest.raises(ExportError, match="already has mel.arrow"):
        export_f5(shards, out)
    export_f5(shards, out, overwrite=True, batch_rows=3)
    assert (out / "mel.arrow").stat().st_size > 0 and sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    # Same rows and values whatever the record batch size.
    assert pa.Table.from_batches(_stream(out / "mel.arrow")[1]).equals(
        pa.ipc.open_stream(pa.py_buffer(before)).read_all())


def test_refuses_shards_without_the_f5_mel(synthetic_corpus, tmp_path):
    other = tmp_path / "mel80"
    shard(synthetic_corpus.root, other, [("vocos_mel", {"n_mels": 80})])
    with pytest.raises(ExportError, match=F5_MEL_HASH):
        export_f5(other, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ExportError, match="not found"):
        export_f5(tmp_path / "nowhere", tmp_path / "out")


def test_cli_entry_points(shards, tmp_path, capsys):
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert run(p.parse_args(["--shards", str(shards), "--out", str(tmp_path / "a")])) == 0
    assert "exported" in capsys.readouterr().out
    assert main(["--shards", str(shards), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error:") and "--overwrite" in err[0]
    assert main(["--shards", str(shards), "--out", str(tmp_path / "a"), "--overwrite", "--no-progress"]) == 0
    assert "export-f5" not in capsys.readouterr().err  # --no-progress: no bar
    assert main(["--shards", str(shards), "--out", str(tmp_path / "b")]) == 0
    assert "export-f5: 100%" in capsys.readouterr().err  # the bar, in utterances


def test_a_folder_holding_other_files_is_refused(shards, tmp_path, capsys):
    """Only a new or empty folder, or an earlier export (with overwrite), is written into; nothing is written
    beside someone else's files, with or without overwrite."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    for overwrite in (False, True):
        with pytest.raises(ExportError, match=r"holds other files \(notes.txt\).*choose another out=$"):
            export_f5(shards, out, overwrite=overwrite)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert main(["--shards", str(shards), "--out", str(out)]) == 2
    assert "choose another --out" in capsys.readouterr().err


def test_newlines_in_transcripts_become_spaces():
    assert _clean_text("one\ntwo\r\nthree\rfour") == ("one two three four", True)
    assert _clean_text("plain text.") == ("plain text.", False)
