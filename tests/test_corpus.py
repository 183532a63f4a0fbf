"""Corpus discovery: layouts, transcripts, speakers, manifests, rejects, ordering."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.corpus.discover import Discovery, audio_extensions, discover
from audiopipe.corpus.transcripts import TranscriptError
from audiopipe.decode.audio import DecodeLimits, RejectError, check_header, load_audio
from corpora import harmonic_tone


def put(path: Path, seconds: float = 0.5, sr: int = 16000, f0: float = 200.0, **kw) -> Path:
    """Write a short valid tone at path (folders created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, harmonic_tone(f0, seconds, sr), sr, **kw)
    return path


def summary(d: Discovery) -> list[tuple[str, str, str]]:
    return [(u.id, u.speaker, u.text) for u in d.utterances]


def reasons(d: Discovery) -> dict[str, str]:
    return {r.source: r.reason for r in d.rejects}


# ---------------------------------------------------------------------------------------------------------------
# the built corpora


def test_asterisk_ljspeech_layout(asterisk_corpus):
    d = discover(asterisk_corpus.root)
    assert d.rejects == []
    assert summary(d) == [(u.id, u.speaker, u.text) for u in asterisk_corpus.utterances]
    assert len(d.utterances) == 40
    assert all(u.text and u.sample_rate == 8000 and u.channels == 1 for u in d.utterances)
    for u, e in zip(d.utterances, asterisk_corpus.utterances):
        assert u.num_samples == e.num_samples
        assert u.duration == pytest.approx(e.num_samples / 8000)
        assert u.source == e.id + ".wav" and os.path.isabs(u.path) and u.path.endswith(u.source)


def test_synthetic_multi_speaker_ljspeech_and_sidecars(synthetic_corpus):
    d = discover(synthetic_corpus.root)
    assert d.rejects == []
    assert summary(d) == [(u.id, u.speaker, u.text) for u in synthetic_corpus.utterances]
    assert {u.speaker for u in d.utterances} == {"spk_a", "spk_b", "spk_c", "chirps"}
    # metadata.csv has id|raw|normalized: the normalized column wins
    assert d.utterances[3].text == "tone 100 hertz"
    rates = {u.id: u.sample_rate for u in d.utterances}
    assert rates["spk_b/wavs/tone_200"] == 22050 and rates["chirps/chirp_120_480_48k"] == 48000


def test_espeak_speaker_folders_and_sidecars(espeak_corpus):
    d = discover(espeak_corpus.root)
    assert d.rejects == []
    assert summary(d) == [(u.id, u.speaker, u.text) for u in espeak_corpus.utterances]
    assert sorted({u.speaker for u in d.utterances}) == ["spk0", "spk1", "spk2", "spk3"]


def test_every_broken_file_gets_its_reason(broken_corpus):
    limits = DecodeLimits()
    d = discover(broken_corpus.root)  # must not raise
    got: dict[str, str | None] = dict(reasons(d))
    for u in d.utterances:
        try:
            check_header(u, limits)
            wav, sr = load_audio(u.path, limits)
            assert wav.dtype == np.float32 and wav.ndim == 1 and sr == u.sample_rate
            got[u.source] = None
        except RejectError as e:
            assert e.detail, f"{u.source}: empty detail"
            got[u.source] = e.reason
    assert got == broken_corpus.expected
    # the .txt file is neither audio nor a reject; every audio file is accounted for
    assert d.discovered == len(broken_corpus.expected)
    assert any(r is None for r in got.values()) and "valid_opus.opus" in got


def test_reject_details_say_why(broken_corpus):
    d = discover(broken_corpus.root)
    detail = {r.source: r.detail for r in d.rejects}
    assert "0 bytes" in detail["empty.wav"]
    assert "not_audio.wav" in detail["not_audio.wav"]
    u = next(u for u in d.utterances if u.source == "truncated_wav.wav")
    with pytest.raises(RejectError, match="20800 frames the header declares"):
        load_audio(u.path)


def test_a_named_pipe_with_an_audio_name_is_a_reject_not_a_hang(tmp_path):
    """libsndfile's open of a FIFO blocks until a writer appears: discovery (and decoding) must refuse it first."""
    import threading

    put(tmp_path / "spk" / "good.wav")
    for name in ("pipe.wav", "pipe.flac"):  # the direct WAV header read and libsndfile's path
        os.mkfifo(tmp_path / "spk" / name)
    found: list[Discovery] = []
    t = threading.Thread(target=lambda: found.append(discover(tmp_path)), daemon=True)
    t.start()
    t.join(60)
    if t.is_alive():  # release the blocked open(s) so the test process can end, then fail
        for name in ("pipe.wav", "pipe.flac"):
            fd = os.open(tmp_path / "spk" / name, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail("discovery hung on a named pipe")
    d = found[0]
    assert [u.source for u in d.utterances] == ["spk/good.wav"]
    assert {r.source: (r.reason, r.detail) for r in d.rejects} == {
        f"spk/{n}": ("unreadable", "not a regular file (a named pipe, socket or device)")
        for n in ("pipe.wav", "pipe.flac")}
    with pytest.raises(RejectError, match="not a regular file"):
        load_audio(str(tmp_path / "spk" / "pipe.flac"))


# ---------------------------------------------------------------------------------------------------------------
# layouts and speaker rules


def test_vctk_like_layout(tmp_path):
    root = tmp_path / "VCTK" / "wav48"
    for spk in ("p225", "p226"):
        for i in (1, 2):
            put(root / spk / f"{spk}_{i:03d}.wav", sr=48000)
    d = discover(root)
    assert summary(d) == [("p225/p225_001", "p225", ""), ("p225/p225_002", "p225", ""),
                          ("p226/p226_001", "p226", ""), ("p226/p226_002", "p226", "")]
    # rooted one level higher, the first folder is wav48: dir:1 picks the speaker
    d = discover(tmp_path / "VCTK", speaker="dir:1")
    assert [u.speaker for u in d.utterances] == ["p225", "p225", "p226", "p226"]
    assert d.utterances[0].id == "wav48/p225/p225_001"


def test_libritts_like_layout_and_sidecar_preference(tmp_path):
    folder = tmp_path / "19" / "198"
    put(folder / "19_198_000000_000000.wav", sr=24000)
    (folder / "19_198_000000_000000.normalized.txt").write_text("Normalized text.")
    (folder / "19_198_000000_000000.original.txt").write_text("Original TEXT!")
    put(folder / "19_198_000000_000001.wav", sr=24000)
    (folder / "19_198_000000_000001.original.txt").write_text("  only   the\noriginal ")
    d = discover(tmp_path)
    assert summary(d) == [("19/198/19_198_000000_000000", "19", "Normalized text."),
                          ("19/198/19_198_000000_000001", "19", "only the original")]
    assert [u.speaker for u in discover(tmp_path, speaker="dir:1").utterances] == ["198", "198"]
    assert [u.speaker for u in discover(tmp_path, speaker="dir:5").utterances] == ["", ""]
    assert [u.speaker for u in discover(tmp_path, speaker="none").utterances] == ["", ""]


def test_voxceleb_like_layout(tmp_path):
    put(tmp_path / "id10001" / "1zcIwhmdeo4" / "00001.wav")
    put(tmp_path / "id10002" / "7w0IBEWc9Qw" / "00001.wav")
    d = discover(tmp_path)
    assert [(u.id, u.speaker) for u in d.utterances] == [("id10001/1zcIwhmdeo4/00001", "id10001"),
                                                         ("id10002/7w0IBEWc9Qw/00001", "id10002")]


def test_files_directly_in_root_have_no_speaker(tmp_path):
    put(tmp_path / "a.wav")
    (tmp_path / "a.lab").write_text("label text")
    put(tmp_path / "sub" / "b.wav")
    d = discover(tmp_path)
    assert summary(d) == [("a", "", "label text"), ("sub/b", "sub", "")]


def test_transcript_precedence_sidecar_over_metadata(tmp_path):
    put(tmp_path / "wavs" / "x1.wav")
    put(tmp_path / "wavs" / "x2.wav")
    put(tmp_path / "wavs" / "x3.wav")
    (tmp_path / "wavs" / "x1.txt").write_text("from the sidecar")
    (tmp_path / "wavs" / "x3.txt").write_text("   \n")  # empty sidecar counts as absent
    (tmp_path / "metadata.csv").write_text("x1|from csv|\nx2.wav|raw two|normalized two\nx3|from csv three\n")
    d = discover(tmp_path)
    assert summary(d) == [("wavs/x1", "", "from the sidecar"), ("wavs/x2", "", "normalized two"),
                          ("wavs/x3", "", "from csv three")]


def test_metadata_csv_in_root_with_subfolder_ids(tmp_path):
    put(tmp_path / "spk1" / "u1.wav")
    put(tmp_path / "spk2" / "u1.wav")
    (tmp_path / "metadata.csv").write_text("spk1/u1|first\nspk2/u1|second\n")
    assert summary(discover(tmp_path)) == [("spk1/u1", "spk1", "first"), ("spk2/u1", "spk2", "second")]


def test_huggingface_audiofolder_metadata_csv(tmp_path):
    put(tmp_path / "data" / "a.wav")
    put(tmp_path / "data" / "b.flac")
    (tmp_path / "metadata.csv").write_text('file_name,transcription\ndata/a.wav,"hello, world"\ndata/b.flac,bee\n')
    assert summary(discover(tmp_path)) == [("data/a", "data", "hello, world"), ("data/b", "data", "bee")]


def test_malformed_metadata_csv_is_a_clear_error(tmp_path):
    put(tmp_path / "wavs" / "a.wav")
    (tmp_path / "metadata.csv").write_text("a|fine\nthis line has no separator\n")
    with pytest.raises(TranscriptError, match=r"metadata\.csv:2: expected LJSpeech"):
        discover(tmp_path)


def test_undecodable_sidecar_rejects_only_its_file(tmp_path):
    put(tmp_path / "a.wav")
    put(tmp_path / "b.wav")
    (tmp_path / "a.txt").write_bytes(b"\xff\xfe\xfa not utf-8")
    d = discover(tmp_path)
    assert reasons(d) == {"a.wav": "bad_transcript"} and [u.id for u in d.utterances] == ["b"]


# ---------------------------------------------------------------------------------------------------------------
# duplicates, ordering, symlinks, filters


def test_duplicate_id_rejects_the_second(tmp_path):
    put(tmp_path / "a.wav")
    put(tmp_path / "a.flac")
    put(tmp_path / "b.wav")
    d = discover(tmp_path)
    assert [u.source for u in d.utterances] == ["a.flac", "b.wav"]
    assert [(r.source, r.reason) for r in d.rejects] == [("a.wav", "duplicate_id")]
    assert "a.flac" in d.rejects[0].detail


def test_unreadable_file_does_not_block_its_duplicate(tmp_path):
    (tmp_path / "a.flac").write_bytes(b"garbage")
    put(tmp_path / "a.wav")
    d = discover(tmp_path)
    assert [u.source for u in d.utterances] == ["a.wav"] and reasons(d) == {"a.flac": "unreadable"}


def test_order_is_deterministic_whatever_the_creation_order(tmp_path):
    names = [f"s{i % 3}/u{i:02d}.wav" for i in range(12)] + ["z.wav", "A.wav", "s1/sub/deep.flac"]
    results = []
    for trial in range(2):
        root = tmp_path / f"t{trial}"
        shuffled = names[:]
        random.Random(trial).shuffle(shuffled)
        for n in shuffled:
            put(root / n, seconds=0.35)
        results.append([(u.id, u.source, u.speaker) for u in discover(root).utterances])
    assert results[0] == results[1]
    ids = [r[0] for r in results[0]]
    assert ids == sorted(ids) and len(ids) == len(names)


def test_symlinks_followed_without_loops(tmp_path):
    root = tmp_path / "root"
    put(root / "spk" / "a.wav")
    outside = put(tmp_path / "elsewhere" / "b.wav")
    (root / "spk" / "b.wav").symlink_to(outside)
    (root / "spk" / "loop").symlink_to(root, target_is_directory=True)  # would recurse forever
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "spk" / "dangling.wav").symlink_to(tmp_path / "nope.wav")
    d = discover(root)
    assert [u.id for u in d.utterances] == ["linked/b", "spk/a", "spk/b"]
    assert d.utterances[2].path == str(root / "spk" / "b.wav")  # the link's path, not its target
    assert reasons(d) == {"spk/dangling.wav": "missing"}


def test_hidden_entries_and_extension_filter(tmp_path):
    put(tmp_path / "a.wav")
    put(tmp_path / "b.flac")
    put(tmp_path / "C.WAV")
    (tmp_path / "._a.wav").write_bytes(b"\x00\x05\x16\x07 resource fork")
    put(tmp_path / ".cache" / "x.wav")
    assert [u.id for u in discover(tmp_path).utterances] == ["C", "a", "b"]
    assert [u.id for u in discover(tmp_path, exts=[".WAV"]).utterances] == ["C", "a"]
    assert discover(tmp_path).rejects == []


def test_extension_list_comes_from_libsndfile():
    exts = audio_extensions()
    for e in ("wav", "flac", "ogg", "opus", "aiff", "aif"):
        assert e in exts
    assert ("mp3" in exts) == ("MP3" in sf.available_formats())
    assert "raw" not in exts and "txt" not in exts and "csv" not in exts


def test_bad_arguments(tmp_path):
    with pytest.raises(NotADirectoryError, match="not a directory"):
        discover(tmp_path / "nope")
    with pytest.raises(ValueError, match="dir:N"):
        discover(tmp_path, speaker="folder")
    with pytest.raises(ValueError, match="exts is empty"):
        discover(tmp_path, exts=[])


# ---------------------------------------------------------------------------------------------------------------
# manifests


def _manifest_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    put(root / "spk1" / "a.wav")
    (root / "spk1" / "a.txt").write_text("sidecar a")
    put(root / "spk1" / "b.wav")
    put(root / "spk2" / "c.wav")
    put(root / "unlisted.wav")
    return root


def _rows(root: Path, outside: Path, rel: str = "") -> list[dict]:
    """Manifest rows; `rel` leads relative paths from the manifest's folder to the root."""
    return [
        {"path": f"{rel}spk1/a.wav", "text": "manifest a", "lang": "en"},  # manifest text beats the sidecar
        {"audio": f"{rel}spk1/b.wav", "speaker": "alice", "lang": "fr"},
        {"path": str(root / "spk2" / "c.wav"), "id": "custom/c", "text": ""},  # absolute; empty text = absent
        {"path": f"{rel}spk9/missing.wav"},
        {"path": str(outside)},  # outside the root, no id
        {"path": str(outside), "id": "ext/out", "lang": "de"},
    ]


def test_manifest_jsonl(tmp_path):
    root = _manifest_corpus(tmp_path)
    outside = put(tmp_path / "other" / "out.wav")
    manifest = root / "list.jsonl"
    manifest.write_text("\n".join(json.dumps(r) for r in _rows(root, outside)) + "\n\n")
    d = discover(root, manifest=manifest)
    assert summary(d) == [("custom/c", "spk2", ""), ("ext/out", "", ""),
                          ("spk1/a", "spk1", "manifest a"), ("spk1/b", "alice", "")]
    by_id = {u.id: u for u in d.utterances}
    assert by_id["spk1/a"].extra == {"lang": "en"} and by_id["ext/out"].extra == {"lang": "de"}
    assert by_id["ext/out"].path == str(outside)
    assert reasons(d) == {"spk9/missing.wav": "missing", str(outside): "outside_root"}
    assert "unlisted" not in by_id  # only listed files are used
    assert d.discovered == 6


def test_manifest_csv_and_tsv(tmp_path):
    root = _manifest_corpus(tmp_path)
    outside = put(tmp_path / "other" / "out.wav")
    rows = _rows(root, outside, rel="corpus/")  # the manifest sits beside the corpus folder
    cols = ["path", "audio", "id", "text", "speaker", "lang"]
    for ext, sep in (("csv", ","), ("tsv", "\t")):
        lines = [sep.join(cols)] + [sep.join(str(r.get(c, "")) for c in cols) for r in rows]
        manifest = tmp_path / f"list.{ext}"
        manifest.write_text("\n".join(lines) + "\n")
        d = discover(root, manifest=manifest)
        assert summary(d) == [("custom/c", "spk2", ""), ("ext/out", "", ""),
                              ("spk1/a", "spk1", "manifest a"), ("spk1/b", "alice", "")], ext
        assert {u.id: u.extra for u in d.utterances}["spk1/b"] == {"lang": "fr"}
        assert sorted(reasons(d).values()) == ["missing", "outside_root"]


@pytest.mark.parametrize("uid, why", [
    ("../x", "'.' or '..' path segment"), ("a/../../x", "'.' or '..' path segment"), ("./x", "'.' or '..'"),
    ("/x", "is absolute"), ("/etc/passwd", "is absolute"), ("a\\b", "backslash"), ("a//b", "empty path segment"),
    ("a/", "empty path segment"), ("nul\x00", "U+0000"), ("tab\there", "U+0009"), ("del\x7f", "U+007F"),
])
def test_unsafe_manifest_ids_are_rejected_bad_id_with_the_line(uid, why, tmp_path):
    root = _manifest_corpus(tmp_path)
    m = tmp_path / "ids.jsonl"
    m.write_text(json.dumps({"path": "corpus/spk1/a.wav", "id": "fine/v1.2"}) + "\n"
                 + json.dumps({"path": "corpus/spk1/b.wav", "id": uid}) + "\n")
    d = discover(root, manifest=m)
    assert [u.id for u in d.utterances] == ["fine/v1.2"]  # dots are fine: the sample key escapes them
    assert reasons(d) == {"spk1/b.wav": "bad_id"}
    assert f"ids.jsonl:2: id {uid!r}" in d.rejects[0].detail and why in d.rejects[0].detail


def test_manifest_duplicates_and_errors(tmp_path):
    root = _manifest_corpus(tmp_path)
    m = tmp_path / "dup.jsonl"
    m.write_text(json.dumps({"path": str(root / "spk1/a.wav")}) + "\n" +
                 json.dumps({"path": str(root / "spk1/b.wav"), "id": "spk1/a"}) + "\n")
    d = discover(root, manifest=m)
    assert [u.source for u in d.utterances] == ["spk1/a.wav"]
    assert reasons(d) == {"spk1/b.wav": "duplicate_id"}

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"path": str(root / "spk1/a.wav")}) + '\n{oops\n{"text": "no path"}\n')
    d = discover(root, manifest=bad)  # one bad line is one reject naming it; the other rows are read
    assert [u.source for u in d.utterances] == ["spk1/a.wav"]
    assert sorted((r.reason, r.detail.split(": ")[0].rsplit("/", 1)[-1]) for r in d.rejects) == \
        [("bad_json", "bad.jsonl:2"), ("bad_value", "bad.jsonl:3")]
    nopath = tmp_path / "nopath.csv"
    nopath.write_text("file,text\na.wav,hi\n")
    with pytest.raises(TranscriptError, match="'path' or 'audio' column"):
        discover(root, manifest=nopath)
    with pytest.raises(FileNotFoundError, match="manifest not found"):
        discover(root, manifest=tmp_path / "absent.jsonl")
    with pytest.raises(TranscriptError, match="unknown manifest type"):
        (tmp_path / "m.xml").write_text("<x/>")
        discover(root, manifest=tmp_path / "m.xml")


def test_utterance_round_trips_through_dict(synthetic_corpus):
    from audiopipe.corpus.records import Utterance

    u = discover(synthetic_corpus.root).utterances[0]
    assert Utterance(**json.loads(json.dumps(u.to_dict()))) == u
    r = u.reject("too_short", "x")
    assert r.to_dict() == {"path": u.path, "source": u.source, "reason": "too_short", "detail": "x"}


def test_discovery_reads_headers_only(tmp_path):
    # a header that promises more than the file holds is still discovered (decode finds the truncation)
    src = put(tmp_path / "full.wav", seconds=1.0)
    data = src.read_bytes()
    (tmp_path / "cut.wav").write_bytes(data[: len(data) // 2])
    src.unlink()
    shutil.copy(tmp_path / "cut.wav", tmp_path / "copy.wav")
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["copy", "cut"] and d.rejects == []


def test_unlistable_folder_is_reported_not_skipped(tmp_path, monkeypatch):
    put(tmp_path / "ok" / "a.wav")
    locked = tmp_path / "locked"
    put(locked / "b.wav")
    # A folder this user may not list, simulated (chmod 0 does not stop root, who runs CI): os.walk lists with
    # os.scandir, which refuses that one folder as the kernel would.
    real_scandir = os.scandir

    def scandir(path=".", *a, **k):
        if os.fspath(path) == str(locked):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path, *a, **k)

    monkeypatch.setattr(os, "scandir", scandir)
    d = discover(tmp_path)
    assert [u.id for u in d.utterances] == ["ok/a"]
    assert [(r.source, r.reason) for r in d.rejects] == [("locked/", "unreadable")]
    assert "cannot list the folder" in d.rejects[0].detail


def test_manifest_through_a_symlinked_root(tmp_path):
    real = tmp_path / "real"
    put(real / "spk" / "a.wav")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"path": str(real / "spk" / "a.wav")}) + "\n")
    d = discover(tmp_path / "alias", manifest=m)  # root via the link, listed path via the real folder
    assert [(u.id, u.source, u.speaker) for u in d.utterances] == [("spk/a", "spk/a.wav", "spk")]
