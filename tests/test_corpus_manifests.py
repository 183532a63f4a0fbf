"""Manifests other tools write, read as `--manifest`: lhotse (its own recipes and writers as the oracle: recordings
+ supervisions, CutSet, Shar), Hugging Face datasets (`save_to_disk`, `to_parquet`, Arrow files), NeMo
(long-form offsets) and Common Voice; and the runs that used to write nothing, or the wrong audio, without a
word. Every case is sharded and every row's samples, text and speaker are checked."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf

from audiopipe.cli import main
from audiopipe.corpus.discover import discover
from audiopipe.corpus.options import CorpusOptions
from audiopipe.decode.audio import DecodeLimits
from audiopipe.decode.segments import RecordingCache
from audiopipe.features.pcm import float_to_int16
from corpora_en import SR, Expect, make_commonvoice, make_libritts, make_long, make_vctk, write, write_nemo
from en_helpers import assert_rows_match, shard_rows

PCM = ["--features", "pcm", "--workers", "2", "--no-progress"]


def reasons(d):
    return {r.source: r.reason for r in d.rejects}


@pytest.fixture(scope="module")
def long_form(tmp_path_factory, speech_pool):
    root = tmp_path_factory.mktemp("long")
    paths, segs = make_long(root, speech_pool)
    return root, paths, segs


def seg_expect(segs) -> dict[str, Expect]:
    return {s.id: Expect(s.speaker, s.text, s.pcm, {}) for s in segs}


# ----------------------------------------------------------------------------------------------- NeMo

def test_nemo_long_form_offsets_cut_the_recording(long_form, tmp_path):
    root, paths, segs = long_form
    manifest = root / "train_manifest.json"
    write_nemo(manifest, segs, root)
    d = discover(root, manifest=manifest)
    assert d.rejects == []
    got = {(u.extra["start_frame"], u.extra["end_frame"]): u for u in d.utterances}
    for s in segs:  # each row is its own stretch of the recording, never the whole recording
        u = got[(round(s.start * SR), round((s.start + s.duration) * SR))]
        assert (u.text, u.speaker, u.num_samples, u.extra["language"]) == (s.text, s.speaker, len(s.pcm), "en")
    assert any("not written to the shards: pnc" in n for n in d.notes)  # an unknown column is named, not dropped
    cache = RecordingCache(d.utterances)
    for u in d.utterances:  # every stretch, from one decode per recording
        wav, sr = cache.load(u, DecodeLimits())
        assert sr == SR and np.array_equal(float_to_int16(wav), next(s.pcm for s in segs if s.text == u.text))
    assert cache.decodes == len(paths)
    out = tmp_path / "out"
    assert main(["shard", "--manifest", str(manifest), *PCM, "--out", str(out)]) == 0
    rows = shard_rows(out)
    by_start = {(r["text"], len(r["pcm"])): r for r in rows.values()}
    assert len(rows) == len(segs)
    for s in segs:
        r = by_start[(s.text, len(s.pcm))]
        assert np.array_equal(r["pcm"], s.pcm) and r["speaker"] == s.speaker


def test_nemo_whole_files_and_rounded_durations(long_form, tmp_path):
    root, paths, segs = long_form
    manifest = tmp_path / "m.jsonl"
    rows = [{"audio_filepath": str(p), "duration": round(sf.info(str(p)).duration, 2), "text": f"rec {k}"}
            for k, p in paths.items()]
    rows.append({"audio_filepath": str(paths["rec0"]), "offset": 1.0, "duration": 999.0, "text": "past the end"})
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    d = discover(root, manifest=manifest)
    assert {u.id: u.text for u in d.utterances} == {"long/rec0": "rec rec0", "long/rec1": "rec rec1"}
    assert all("start_frame" not in u.extra for u in d.utterances)  # 0 to the (rounded) end: the whole file
    assert [r.reason for r in d.rejects] == ["bad_segment"]


# ----------------------------------------------------------------------------------------------- Common Voice

def test_common_voice_tsv_paths_under_clips(tmp_path, speech_pool):
    root = tmp_path / "cv-corpus" / "en"
    expected = make_commonvoice(root, speech_pool)
    out = tmp_path / "out"
    assert main(["shard", "--manifest", str(root / "validated.tsv"), "--keep-columns", "gender,up_votes", *PCM,
                 "--out", str(out)]) == 0
    rows = shard_rows(out)
    assert_rows_match(rows, expected)  # client_id as speaker; the sentence with a lone quote kept as it is
    assert all(r["gender"] == "female_feminine" and r["up_votes"] == "2" for r in rows.values())


# ----------------------------------------------------------------------------------------------- lhotse

def test_lhotse_libritts_recipe_manifests(tmp_path, speech_pool, capsys):
    from lhotse.recipes import prepare_libritts

    corpus = tmp_path / "LibriTTS"
    expected = make_libritts(corpus, speech_pool)
    prepare_libritts(corpus, dataset_parts=["dev-clean"], output_dir=tmp_path / "data")
    recs = tmp_path / "data" / "libritts_recordings_dev-clean.jsonl.gz"
    sups = tmp_path / "data" / "libritts_supervisions_dev-clean.jsonl.gz"
    out = tmp_path / "out"
    assert main(["shard", "--corpus", str(corpus), "--manifest", str(recs), "--manifest", str(sups),
                 "--keep-columns", "orig_text,snr,gender", *PCM, "--out", str(out)]) == 0
    want = {k.rsplit("/", 1)[1]: e for k, e in expected.items() if k.startswith("dev-clean/")}
    rows = shard_rows(out)
    assert_rows_match(rows, want)
    for uid, e in want.items():
        assert (rows[uid]["orig_text"], rows[uid]["gender"], float(rows[uid]["snr"])) == \
            (e.extra["original_text"], e.extra["gender"], e.extra["snr"])
    # recordings alone: whole files without text, and the supervisions file is named
    d = discover(corpus, manifest=recs)
    assert {u.text for u in d.utterances} == {""}
    assert any(f"add manifest='{sups}'" in n for n in d.notes)
    with pytest.raises(ValueError, match="give the recordings manifest too"):
        discover(corpus, manifest=sups)


def test_lhotse_vctk_recipe_manifests(tmp_path, speech_pool):
    from lhotse.recipes import prepare_vctk

    corpus = tmp_path / "VCTK-Corpus-0.92"
    expected = make_vctk(corpus, speech_pool)["mic1"]
    prepare_vctk(corpus, output_dir=tmp_path / "data", use_edinburgh_vctk_url=True, mic_id="mic1")
    d = discover(corpus, manifest=[tmp_path / "data" / "vctk_recordings_all.jsonl.gz",
                                   tmp_path / "data" / "vctk_supervisions_all.jsonl.gz"])
    # lhotse's recipe leaves out what has no transcript (p315): the rest, once each, with text and speaker
    want = {k.split("/")[1]: (e.speaker, e.text) for k, e in expected.items() if e.text}
    assert {u.id: (u.speaker, u.text) for u in d.utterances} == want


def _lhotse_long(long_form):
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    root, paths, segs = long_form
    recs = RecordingSet.from_recordings(Recording.from_file(p, recording_id=k) for k, p in paths.items())
    sups = SupervisionSet.from_segments(
        SupervisionSegment(s.id, s.recording, s.start, s.duration, channel=0, text=s.text, speaker=s.speaker,
                           language="English", custom={"emotion": "calm"}) for s in segs)
    return recs, sups


def test_lhotse_supervisions_are_segments_of_their_recording(long_form, tmp_path):
    recs, sups = _lhotse_long(long_form)
    root, paths, segs = long_form
    recs.to_file(tmp_path / "recs.jsonl.gz")
    sups.to_file(tmp_path / "sups.jsonl")  # gzipped or not: lhotse reads both
    out = tmp_path / "out"
    assert main(["shard", "--corpus", str(root), "--manifest", str(tmp_path / "recs.jsonl.gz"), "--manifest",
                 str(tmp_path / "sups.jsonl"), *PCM, "--out", str(out)]) == 0
    assert_rows_match(shard_rows(out), seg_expect(segs))
    sups.filter(lambda s: s.recording_id == "rec0").to_file(tmp_path / "sups0.jsonl")
    d = discover(root, manifest=[tmp_path / "recs.jsonl.gz", tmp_path / "sups0.jsonl"])
    assert {u.id for u in d.utterances} == {s.id for s in segs if s.recording == "rec0"}
    assert "1 lhotse recordings have no supervision and are left out" in d.notes


def test_lhotse_relative_paths_are_read_from_the_current_folder(long_form, tmp_path, monkeypatch):
    from lhotse import Recording, RecordingSet

    root, paths, segs = long_form
    monkeypatch.chdir(root)  # where `lhotse prepare` ran: its paths are relative to here
    RecordingSet.from_recordings([Recording.from_file("long/rec0.wav", recording_id="rec0")]).to_file(
        tmp_path / "recs.jsonl")
    assert [u.path for u in discover(root, manifest=tmp_path / "recs.jsonl").utterances] == [str(paths["rec0"])]
    monkeypatch.chdir(tmp_path)
    d = discover(root, manifest=tmp_path / "recs.jsonl")
    assert [r.reason for r in d.rejects] == ["missing"] and "from where `lhotse prepare` ran" in d.rejects[0].detail


def test_lhotse_cutset_and_shar(long_form, tmp_path):
    from lhotse import CutSet

    recs, sups = _lhotse_long(long_form)
    root, paths, segs = long_form
    cuts = CutSet.from_manifests(recordings=recs, supervisions=sups).trim_to_supervisions()
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    d = discover(root, manifest=tmp_path / "cuts.jsonl.gz")
    assert {u.id: (u.text, u.speaker, u.num_samples) for u in d.utterances} == \
        {c.id: (c.supervisions[0].text, c.supervisions[0].speaker, len(s.pcm))
         for c in cuts for s in segs if s.id == c.supervisions[0].id}
    shar = tmp_path / "shar"
    shar.mkdir()
    cuts.to_shar(shar, fields={"recording": "flac"}, shard_size=2)
    out = tmp_path / "out"
    assert main(["shard", "--corpus", str(tmp_path), "--manifest", str(shar), *PCM, "--out", str(out)]) == 0
    rows = shard_rows(out)
    want = {c.id: Expect(c.supervisions[0].speaker, c.supervisions[0].text, s.pcm, {})
            for c in cuts for s in segs if s.id == c.supervisions[0].id}
    assert_rows_match(rows, want)  # each cut's audio read in place from the Shar tars
    assert all("#" in r["source"] and ".tar#" in r["source"] for r in rows.values())


def test_lhotse_refuses_what_it_cannot_read_as_one_local_file(long_form, tmp_path):
    from lhotse import AudioSource, Recording, RecordingSet, SupervisionSegment, SupervisionSet

    root, paths, segs = long_form
    base = Recording.from_file(paths["rec0"], recording_id="ok")
    url = Recording(id="url", sources=[AudioSource("url", [0], "https://example.com/a.wav")],
                    sampling_rate=SR, num_samples=SR, duration=1.0)
    cmd = Recording(id="cmd", sources=[AudioSource("command", [0], "sox a.flac -t wav -")],
                    sampling_rate=SR, num_samples=SR, duration=1.0)
    fast = base.perturb_speed(1.1, affix_id=False).with_path_prefix("")
    fast.id = "fast"
    RecordingSet.from_recordings([base, url, cmd, fast]).to_file(tmp_path / "r.jsonl")
    SupervisionSet.from_segments([SupervisionSegment(f"{r}-0", r, 0.0, 0.5, text="x") for r in
                                  ("ok", "url", "cmd", "fast", "ghost")]).to_file(tmp_path / "s.jsonl")
    d = discover(root, manifest=[tmp_path / "r.jsonl", tmp_path / "s.jsonl"])
    assert [u.id for u in d.utterances] == ["ok-0"]
    assert sorted(r.reason for r in d.rejects) == ["lhotse_missing_recording", "lhotse_source", "lhotse_source",
                                                   "lhotse_transform"]


# ----------------------------------------------------------------------------------------------- Hugging Face

@pytest.fixture(scope="module")
def hf_rows(speech_pool):
    """Rows of a dataset with an Audio column of embedded bytes (WAV and FLAC), text, speaker and metadata."""
    rows = {"audio": [], "sentence": [], "speaker_id": [], "gender": [], "embedding": []}
    expected = {}
    for v, clips in enumerate(speech_pool):
        for k, c in enumerate(clips[:2]):
            buf = io.BytesIO()
            sf.write(buf, c.pcm, SR, format="FLAC" if k else "WAV", subtype="PCM_16")
            name = f"v{v}_utt{k}"
            rows["audio"].append({"bytes": buf.getvalue(), "path": f"{name}.{'flac' if k else 'wav'}"})
            rows["sentence"].append(c.text)
            rows["speaker_id"].append(f"v{v}")
            rows["gender"].append("female" if v % 2 else "male")
            rows["embedding"].append([0.5] * 8)
            expected[name] = Expect(f"v{v}", c.text, c.pcm, {})
    return rows, expected


def _dataset(rows):
    import datasets

    datasets.disable_progress_bars()
    return datasets.Dataset.from_dict(rows).cast_column("audio", datasets.Audio())


def test_hugging_face_save_to_disk_parquet_and_arrow(hf_rows, tmp_path, capsys):
    import datasets

    rows, expected = hf_rows
    ds = _dataset(rows)
    ds.save_to_disk(str(tmp_path / "disk"))
    ds.to_parquet(str(tmp_path / "parquet" / "train-00000-of-00001.parquet"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dict"))
    arrow = datasets.load_from_disk(str(tmp_path / "disk")).cache_files[0]["filename"]
    for manifest in (tmp_path / "disk", tmp_path / "parquet", arrow):
        d = discover(tmp_path, manifest=manifest)
        assert {u.id: (u.speaker, u.text) for u in d.utterances} == \
            {k: (e.speaker, e.text) for k, e in expected.items()}, manifest
        assert all(u.path.endswith((".arrow", ".parquet")) and "cell_row" in u.extra for u in d.utterances)
        assert any("not written to the shards: embedding, gender" in n for n in d.notes)
    dd = discover(tmp_path, manifest=tmp_path / "dict")
    assert sorted(u.id for u in dd.utterances) == sorted([f"train/{k}" for k in expected] +
                                                         [f"test/{k}" for k in list(expected)[:2]])
    out = tmp_path / "out"
    files_before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["shard", "--manifest", str(tmp_path / "parquet"), "--keep-columns", "gender", *PCM,
                 "--out", str(out)]) == 0
    rows_out = shard_rows(out)
    assert_rows_match(rows_out, expected)  # decoded from the table's bytes in the workers
    assert {r["gender"] for r in rows_out.values()} == {"male", "female"}
    # nothing was unpacked beside the dataset: only the output folder is new
    assert sorted(p.name for p in tmp_path.rglob("*") if out not in p.parents and p != out) == files_before
    out2 = tmp_path / "out2"
    assert main(["shard", "--manifest", str(tmp_path / "disk"), *PCM, "--out", str(out2)]) == 0
    assert_rows_match(shard_rows(out2), expected)
    assert "text from 'sentence', speaker from 'speaker_id'" in capsys.readouterr().err


def test_hugging_face_audio_paths_and_named_columns(tmp_path, speech_pool):
    import datasets

    paths, texts, expected = [], [], {}
    for k, c in enumerate(speech_pool[0][:3]):
        p = tmp_path / "wavs" / f"a{k}.wav"
        write(p, c.pcm)
        paths.append(str(p))
        texts.append(c.text)
        expected[f"a{k}"] = c
    ds = datasets.Dataset.from_dict({"clip": paths, "words": texts}).cast_column("clip", datasets.Audio())
    ds.to_parquet(str(tmp_path / "d.parquet"))
    with pytest.raises(ValueError, match="no column 'transcript' \\(text_column=\\)"):
        discover(tmp_path, manifest=tmp_path / "d.parquet", options=CorpusOptions(text_column="transcript"))
    d = discover(tmp_path, manifest=tmp_path / "d.parquet", options=CorpusOptions(text_column="words"))
    assert {u.id: (u.text, u.path) for u in d.utterances} == \
        {f"a{k}": (c.text, paths[k]) for k, c in enumerate(speech_pool[0][:3])}  # ids: the files' names


def test_parquet_row_groups_are_read_once_each_per_shard(hf_rows, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, expected = hf_rows
    table = pa.table({"audio": pa.array(rows["audio"]), "sentence": rows["sentence"], "speaker_id": rows["speaker_id"]})
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=3)  # no Hugging Face features: name the column
    with pytest.raises(ValueError, match="no column typed Audio"):
        discover(tmp_path, manifest=tmp_path / "plain.parquet")
    d = discover(tmp_path, manifest=tmp_path / "plain.parquet", options=CorpusOptions(audio_column="audio"))
    assert {u.extra["cell_group"] for u in d.utterances} == {0, 1, 2}
    cache = RecordingCache(d.utterances)
    for u in d.utterances:
        wav, sr = cache.load(u, DecodeLimits())
        assert sr == SR and np.array_equal(float_to_int16(wav), expected[u.id].pcm)
    assert cache.row_group_reads == 3


# ----------------------------------------------------------------------------------------------- loud failures

def test_a_folder_of_parquet_given_as_corpus_exits_non_zero_with_a_hint(hf_rows, tmp_path, capsys):
    rows, _ = hf_rows
    _dataset(rows).to_parquet(str(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet"))
    capsys.readouterr()
    code = main(["shard", "--corpus", str(tmp_path / "ds"), *PCM, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code != 0 and len(err.splitlines()) == 1
    assert "found 1 parquet files" in err and f"use --manifest {tmp_path / 'ds' / 'data'}" in err
    d = discover(tmp_path / "ds")
    assert d.discovered == 0 and f"use manifest='{tmp_path / 'ds' / 'data'}'" in d.hint  # Python's words


def test_every_input_refused_gives_a_hint(tmp_path, speech_pool):
    root = tmp_path / "cv"
    make_commonvoice(root, speech_pool)
    (root / "clips").rename(root / "mp3")  # the TSV's paths no longer lead anywhere
    d = discover(root, manifest=root / "validated.tsv")
    assert d.utterances == [] and {r.reason for r in d.rejects} == {"missing"}
    assert d.hint.startswith(f"all {len(d.rejects)} inputs were refused (missing {len(d.rejects)})")


def test_manifest_kinds_can_be_mixed_and_ids_stay_unique(long_form, tmp_path):
    root, paths, segs = long_form
    nemo = root / "mixed_nemo.json"
    write_nemo(nemo, segs[:2], root)
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"path": str(paths["rec1"]), "text": "whole", "id": "whole"}) + "\n")
    d = discover(root, manifest=[nemo, plain])
    assert sorted(u.text for u in d.utterances) == sorted([segs[0].text, segs[1].text, "whole"])


def test_gzipped_plain_manifest(tmp_path, speech_pool):
    import gzip

    write(tmp_path / "a.wav", speech_pool[0][0].pcm)
    with gzip.open(tmp_path / "list.jsonl.gz", "wt") as f:
        f.write(json.dumps({"path": "a.wav", "text": "hello"}) + "\n")
    d = discover(tmp_path, manifest=tmp_path / "list.jsonl.gz")
    assert [(u.id, u.text) for u in d.utterances] == [("a", "hello")]


def test_keep_columns_names_are_checked(tmp_path, capsys):
    for bad, why in (("pcm", "already a column"), ("pcm_frames", "not a column name"), ("a-b", "not a column")):
        assert main(["shard", "--corpus", str(tmp_path), "--features", "pcm", "--keep-columns", bad,
                     "--out", str(tmp_path / "o")]) == 2
        assert why in capsys.readouterr().err


def test_float_to_int16_is_what_the_pool_holds(speech_pool):
    # the expected samples are what a 16-bit file decodes to: the comparison above is exact, not approximate
    c = speech_pool[0][0]
    buf = io.BytesIO()
    sf.write(buf, c.pcm, SR, format="WAV", subtype="PCM_16")
    buf.seek(0)
    assert np.array_equal(float_to_int16(sf.read(buf, dtype="float32")[0]), c.pcm)
