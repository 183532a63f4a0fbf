"""Corpus layouts (Kaldi data dir with segments, AISHELL-3, Emilia) on small Mandarin corpora spoken by espeak-ng,
and a shard run that stores GPT-SoVITS phone ids with the symbol table in the manifest."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits, load_audio
from audiopipe.decode.segments import RecordingCache
from audiopipe.text.frontend import gpt_sovits_phones
from audiopipe.text.symbols import gpt_sovits_symbols, symbols_to_ids

from corpora_zh import SPEAKERS, make_aishell3, make_emilia, make_kaldi
from audiopipe.shard.build import build_shard
from audiopipe.shard.run import run_job
from shard_helpers import make_job


@pytest.fixture(scope="module")
def kaldi(tmp_path_factory):
    root = tmp_path_factory.mktemp("kaldi") / "data" / "train"
    root.mkdir(parents=True)
    return root, make_kaldi(root)


@pytest.fixture(scope="module")
def aishell(tmp_path_factory):
    root = tmp_path_factory.mktemp("aishell3")
    return root, make_aishell3(root)


@pytest.fixture(scope="module")
def emilia(tmp_path_factory):
    root = tmp_path_factory.mktemp("emilia")
    return root, make_emilia(root)


def reasons(d) -> dict[str, str]:
    return {r.source: r.reason for r in d.rejects}


# ----------------------------------------------------------------------------- Kaldi

def test_kaldi_data_dir_with_segments(kaldi):
    root, expected = kaldi
    d = discover(root)  # detected from wav.scp
    assert [u.id for u in d.utterances] == sorted(expected)
    for u in d.utterances:
        rec, text, start, end = expected[u.id]
        assert (u.text, u.speaker, u.extra["recording"]) == (text, rec.split("-")[0], rec)
        assert (u.extra["start_frame"], u.extra["end_frame"]) == (start, end)  # segments' seconds -> frames
        assert u.num_samples == end - start and u.duration == pytest.approx((end - start) / u.sample_rate)
        assert u.source == f"audio/{rec}.wav"
    assert reasons(d) == {"wav.scp#piped": "kaldi_pipe", "wav.scp#archived": "kaldi_ark",
                          "segments#ghost-0": "kaldi_missing_recording", "segments#late-0": "bad_segment"}
    pipe = next(r for r in d.rejects if r.reason == "kaldi_pipe")
    assert "wav.scp:" in pipe.detail and "not run" in pipe.detail


def test_unsafe_layout_ids_are_rejected_bad_id(kaldi, tmp_path):
    """Utterance ids from a layout's own index files become tar member names like manifest ids do: an id that
    would escape the archive or name an absolute path is refused, the rest of the corpus is kept."""
    root, expected = kaldi
    copy = tmp_path / "kaldi"
    shutil.copytree(root, copy)
    rec = next(iter(expected.values()))[0]
    with open(copy / "segments", "a", encoding="utf-8") as f:
        for uid in ("../evil", "/abs", "a\\b", "x/./y"):
            f.write(f"{uid} {rec} 0.5 1.5\n")
    d = discover(copy)
    assert sorted(u.id for u in d.utterances) == sorted(expected)
    bad = sorted(r.detail.split("'")[1] for r in d.rejects if r.reason == "bad_id")
    assert bad == sorted(["../evil", "/abs", "a\\\\b", "x/./y"]), d.rejects


def test_segments_decode_each_recording_once(kaldi):
    root, expected = kaldi
    utts = discover(root).utterances
    cache = RecordingCache(utts)
    for u in utts:
        wav, sr = cache.cut(u, DecodeLimits())
        whole, _ = sf.read(u.path, dtype="float32")
        _, _, start, end = expected[u.id]
        np.testing.assert_array_equal(wav, whole[start:end])
    assert cache.decodes == len(SPEAKERS)  # 6 segments, 2 recordings, each opened once
    assert cache._open == {}  # every recording closed after its last segment


def test_malformed_kaldi_line_names_file_and_line(tmp_path):
    (tmp_path / "wav.scp").write_text("onlyanid\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"wav.scp:1"):
        discover(tmp_path)


def test_layout_choice(kaldi, tmp_path):
    root, _ = kaldi
    with pytest.raises(ValueError, match="does not look like a aishell3 corpus"):
        discover(root, layout="aishell3")
    walked = discover(root, layout="files")  # plain walking: whole recordings, ids from paths
    assert sorted(u.id for u in walked.utterances) == [f"audio/{s}-rec{r}" for r, (s, _, _) in enumerate(SPEAKERS)]


def test_kaldi_shard_with_chinese_phones_and_export(kaldi, tmp_path):
    from audiopipe.export.f5 import export_f5, summary_lines

    root, expected = kaldi
    out = tmp_path / "out"
    job = make_job(root, out, [("pcm", {"sample_rate": 16000}), ("vocos_mel", {})], phones=True,
                   presets=("gpt_sovits",))
    job.language = "zh"
    summary = run_job(job, workers=2, show_progress=False)
    assert summary.written == len(expected)
    assert summary.reject_reasons == {"kaldi_pipe": 1, "kaldi_ark": 1, "kaldi_missing_recording": 1,
                                      "bad_segment": 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["phones"]["vocab"] == list(gpt_sovits_symbols()) and manifest["phones"]["language"] == "zh"
    table = pa.concat_tables(pa.ipc.open_file(pa.memory_map(str(out / e["arrow"]["path"]))).read_all()
                             for e in manifest["shards"])
    for row in table.to_pylist():
        _, text, start, end = expected[row["id"]]
        assert row["text"] == text
        assert row["phones"] == symbols_to_ids(gpt_sovits_phones(text, "zh"))
        assert len(row["pcm"]) == pytest.approx((end - start) * 16000 / 22050, abs=2)
    # F5's raw.arrow can only point at the whole recording of a segment: said, not left silent.
    s = export_f5(out, tmp_path / "f5")
    assert s["rows_sharing_audio"] == len(expected)
    assert any("cuts of longer recordings" in line for line in summary_lines(s))


# ----------------------------------------------------------------------------- AISHELL-3

def test_aishell3_layout(aishell):
    root, expected = aishell
    (root / "train" / "content.txt").open("a", encoding="utf-8").write("SSB00059999.wav\t好 hao3\n")
    d = discover(root)
    assert {u.id: (u.speaker, u.text, u.extra["pinyin"]) for u in d.utterances} == expected
    assert reasons(d) == {"train/wav/SSB0005/SSB00059999.wav": "missing"}
    split_only = discover(root / "train")  # the split folder works as a root too
    assert len(split_only.utterances) == len(expected)


# ----------------------------------------------------------------------------- Emilia

def test_emilia_layout_and_per_line_language(emilia):
    root, expected = emilia
    d = discover(root)
    assert {u.id: (u.speaker, u.text, u.extra["language"]) for u in d.utterances} == expected
    assert all(u.source.endswith(".mp3") and u.extra["dnsmos"] == 3.2 for u in d.utterances)
    assert list(reasons(d).values()) == ["missing"]
    en = next(u for u in d.utterances if u.extra["language"] == "en")
    # --language auto: the line's tag picks the English G2P (ARPAbet inside GPT-SoVITS's table)
    assert gpt_sovits_phones(en.text, "auto", en.extra["language"]) == ["HH", "AH0", "L", "OW1", "W", "ER1", "L",
                                                                           "D", "."]


def test_emilia_tar_distribution_read_in_place(emilia, tmp_path):
    import tarfile

    from audiopipe.decode.members import load_member

    src, expected = emilia
    root = tmp_path / "Emilia"
    (root / "ZH").mkdir(parents=True)
    rows = [json.loads(x) for x in (src / "ZH" / "ZH_B00000.jsonl").read_text(encoding="utf-8").splitlines()]
    with tarfile.open(root / "ZH" / "ZH-B000000.tar", "w") as tf:  # WebDataset: <key>.mp3 + <key>.json
        for row in rows:
            if (src / "ZH" / row["wav"]).exists():
                tf.add(src / "ZH" / row["wav"], arcname=f"{row['id']}.mp3")
            meta = tmp_path / f"{row['id']}.json"
            meta.write_text(json.dumps({k: v for k, v in row.items() if k != "wav"}, ensure_ascii=False))
            tf.add(meta, arcname=f"{row['id']}.json")
    d = discover(root)
    assert {u.id: (u.speaker, u.text, u.extra["language"]) for u in d.utterances} == expected
    assert list(reasons(d).values()) == ["missing"]  # the JSON whose MP3 is not in the tar
    for u in d.utterances:
        assert u.source == f"ZH/ZH-B000000.tar#{u.id}.mp3" and u.path == str(root / "ZH" / "ZH-B000000.tar")
        wav, sr = load_member(u)
        ref, ref_sr = load_audio(src / "ZH" / next(r["wav"] for r in rows if r["id"] == u.id))
        assert sr == ref_sr and len(wav) == u.num_samples
        np.testing.assert_array_equal(wav, ref)  # the same bytes, decoded as the unpacked file would be
    assert not any(p.suffix == ".mp3" for p in root.rglob("*"))  # nothing was unpacked


def test_emilia_tar_members_shard_with_per_line_language(emilia, tmp_path):
    """build_shard (in process) decodes tar members in place; --language auto follows each line's tag."""
    import tarfile

    from audiopipe.shard.plan import PlannedUtt, WorkUnit

    src, expected = emilia
    root = tmp_path / "Emilia"
    root.mkdir()
    rows = [json.loads(x) for x in (src / "ZH" / "ZH_B00000.jsonl").read_text(encoding="utf-8").splitlines()]
    with tarfile.open(root / "EN-ZH-B000000.tar", "w") as tf:
        for row in rows:
            if (src / "ZH" / row["wav"]).exists():
                tf.add(src / "ZH" / row["wav"], arcname=f"{row['id']}.mp3")
                info = tarfile.TarInfo(f"{row['id']}.json")
                data = json.dumps(row, ensure_ascii=False).encode()
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    d = discover(root)
    job = make_job(root, tmp_path / "out", [("pcm", {"sample_rate": 16000})], phones=True)
    job.language = "auto"
    unit = WorkUnit("shard-000000", 0, [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration,
                                                   dict(u.extra)) for u in d.utterances])
    rec = build_shard(unit, job)
    assert rec["rows"] == len(expected) and rec["rejects"] == []
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "out" / "arrow" / "shard-000000.arrow"))).read_all()
    for row in table.to_pylist():
        _, text, lang = expected[row["id"]]
        assert row["phones"] == symbols_to_ids(gpt_sovits_phones(text, lang))
        assert row["source"].startswith("EN-ZH-B000000.tar#")


def test_cli_layout_and_language_errors_are_one_line(kaldi, tmp_path, capsys):
    from audiopipe.cli import main

    root, _ = kaldi
    assert main(["shard", "--corpus", str(root), "--out", str(tmp_path / "o"), "--layout", "emilia",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("audiopipe: error:") and "does not look like a emilia corpus" in err and "\n" not in err
    assert main(["shard", "--corpus", str(root), "--preset", "ns2", "--language", "zh",
                 "--codec-random-init"]) == 2
    assert "takes --language en only" in capsys.readouterr().err
