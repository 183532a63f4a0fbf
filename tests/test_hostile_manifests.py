"""Per-row isolation for every manifest kind: one bad row of a lhotse Shar folder, a lhotse manifest, a NeMo
manifest, a CSV or a Hugging Face table is one reject naming the file and line, never the whole job; a second
lhotse recording of the same id is a reject, not a silent drop; a NeMo id is never changed silently; and what a
job writes about a rejected table cell holds no object address, so identical runs write identical files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from audiopipe.cli import main
from audiopipe.corpus.discover import discover
from audiopipe.corpus.options import CorpusOptions

SR = 16000


def _wavs(root: Path, n: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        t = np.arange(int(0.4 * SR)) / SR
        p = root / f"a{i}.wav"
        sf.write(p, (0.3 * np.sin(2 * np.pi * (200 + 40 * i) * t)).astype(np.float32), SR, subtype="PCM_16")
        out.append(p)
    return out


def _rejects(d) -> list[tuple[str, str]]:
    return sorted((r.reason, r.detail) for r in d.rejects)


def test_one_bad_shar_cut_is_one_reject_naming_its_line(tmp_path):
    pytest.importorskip("lhotse")
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    wavs = _wavs(tmp_path / "audio", 3)
    recs = RecordingSet.from_recordings(Recording.from_file(p, recording_id=f"r{i}") for i, p in enumerate(wavs))
    sups = SupervisionSet.from_segments(SupervisionSegment(f"r{i}", f"r{i}", 0.0, recs[f"r{i}"].duration,
                                                           text=f"text {i}", speaker="s") for i in range(3))
    shar = tmp_path / "shar"
    shar.mkdir()
    CutSet.from_manifests(recordings=recs, supervisions=sups).to_shar(shar, fields={"recording": "wav"},
                                                                      shard_size=10)
    cuts_file = shar / "cuts.000000.jsonl.gz"
    lines = gzip.decompress(cuts_file.read_bytes()).decode().splitlines()
    bad = json.loads(lines[1])
    bad["supervisions"][0]["text"] = ["a", "list"]  # the red team's cut: text is a list
    lines[1] = json.dumps(bad)
    lines.insert(2, "{not json")
    cuts_file.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    d = discover(tmp_path, manifest=shar)
    assert sorted(u.id for u in d.utterances) == ["r0-0", "r2-2"]
    got = _rejects(d)
    assert [r for r, _ in got] == ["bad_json", "bad_value"], got
    assert "cuts.000000.jsonl.gz:3: not JSON" in got[0][1]
    assert got[1][1].startswith("cuts.000000.jsonl.gz:2: cut r1-1: ") and "list" in got[1][1]
    assert d.discovered == 4


def test_a_lhotse_line_lhotse_cannot_parse_and_a_duplicate_recording_id_are_rejects(tmp_path):
    pytest.importorskip("lhotse")
    from lhotse import Recording

    wavs = _wavs(tmp_path / "audio", 4)
    lines = [json.dumps(Recording.from_file(p, recording_id=f"r{i}").to_dict()) for i, p in enumerate(wavs)]
    lines[3] = lines[3].replace('"r3"', '"r1"')  # two recordings of one id: 4 listed
    lines.append('{"id": "x", "sources": "not a list", "sampling_rate": 16000}')
    m = tmp_path / "c_recordings_all.jsonl"
    m.write_text("\n".join(lines) + "\n")
    d = discover(tmp_path, manifest=m)
    assert sorted(u.id for u in d.utterances) == ["r0", "r1", "r2"]
    got = _rejects(d)
    assert [r for r, _ in got] == ["bad_value", "duplicate_id"], got
    assert got[0][1].startswith("c_recordings_all.jsonl:5: lhotse cannot read this line")
    assert got[1][1] == ("c_recordings_all.jsonl:4: recording id 'r1' is listed already (c_recordings_all.jsonl:2)"
                         "; the first is kept")
    assert d.discovered == 5


def test_nemo_bad_lines_and_changed_ids_are_rejects(tmp_path):
    wavs = _wavs(tmp_path, 4)
    rows = [{"audio_filepath": p.name, "duration": 0.4, "text": f"t{i}", "id": f"n{i}"} for i, p in enumerate(wavs)]
    rows[1]["id"] = "n1\nsecond line"
    rows[2]["id"] = "n2 "
    del rows[3]["audio_filepath"]
    lines = [json.dumps(r) for r in rows] + ['["a list"]', '{"audio_filepath": ']
    m = tmp_path / "train_manifest.json"
    m.write_text("\n".join(lines) + "\n")
    d = discover(tmp_path, manifest=m)
    assert [u.id for u in d.utterances] == ["n0"]
    got = _rejects(d)
    assert [r for r, _ in got] == ["bad_id", "bad_id", "bad_json", "bad_json", "bad_value"], got
    assert [detail.split(": ")[0].rsplit("/", 1)[-1] for _, detail in got] == \
        ["train_manifest.json:2", "train_manifest.json:3", "train_manifest.json:5", "train_manifest.json:6",
         "train_manifest.json:4"]
    assert d.discovered == 6


def test_a_long_csv_cell_is_a_row_like_any_other(tmp_path):
    wavs = _wavs(tmp_path, 2)
    long_text = "word " * 40_000  # 200 KB, past csv's default cell limit
    m = tmp_path / "list.csv"
    m.write_text(f"path,text\n{wavs[0].name},\"{long_text}\"\n{wavs[1].name},short\n")
    d = discover(tmp_path, manifest=m)
    assert sorted(u.id for u in d.utterances) == ["a0", "a1"] and not d.rejects
    assert len([u for u in d.utterances if u.id == "a0"][0].text) == len(long_text.strip())


def _parquet(path: Path, cells: list[bytes]) -> None:
    pq.write_table(pa.table({"audio": pa.array(cells, pa.binary()), "text": [f"t{i}" for i in range(len(cells))],
                             "id": [f"h{i}" for i in range(len(cells))]}), path)


def test_rejects_and_plan_of_a_bad_table_cell_are_byte_identical_between_runs(tmp_path):
    wavs = _wavs(tmp_path / "audio", 2)
    _parquet(tmp_path / "d.parquet", [wavs[0].read_bytes(), b"RIFF not audio at all" * 10, wavs[1].read_bytes()])
    d = discover(tmp_path, manifest=tmp_path / "d.parquet", options=CorpusOptions(audio_column="audio"))
    assert [r.reason for r in d.rejects] == ["unreadable"] and " at 0x" not in d.rejects[0].detail
    files = []
    for run in ("a", "b"):
        out = tmp_path / run
        assert main(["shard", "--corpus", str(tmp_path), "--manifest", str(tmp_path / "d.parquet"), "--audio-column",
                     "audio", "--features", "pcm", "--out", str(out), "--no-progress", "--workers", "0"]) == 0
        files.append({n: (out / n).read_bytes() for n in ("rejects.jsonl", "plan.json")})
    assert files[0] == files[1]
    assert b"0x" not in files[0]["rejects.jsonl"]
