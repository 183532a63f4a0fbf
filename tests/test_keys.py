"""Sample keys are unique and safe: adversarial names through the real `audiopipe shard`, read back with tarfile
and webdataset's public API; bad manifest ids are refused with `bad_id`, case-only twins with `duplicate_key`."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import unicodedata
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
from hypothesis import given, settings
from hypothesis import strategies as st

from audiopipe.cli import main
from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits
from audiopipe.shard.job import Job
from audiopipe.shard.keys import fold, key_to_id, member_name_problem, sample_key
from audiopipe.shard.plan import PlannedUtt, unique_keys
from audiopipe.shard.run import make_plan
from audiopipe.shard.writer import ArrayColumn, write_tar

NFC_E = unicodedata.normalize("NFC", "é")
NFD_E = unicodedata.normalize("NFD", "é")
# Files whose ids come from their paths (no id column): all must be written, each under its own key, except the
# later of each case/normalisation-only twin pair (in id order), which is rejected `duplicate_key`.
FILES = ["spk/a.b.flac", "spk/a_b.flac", "spk/a%2Eb.wav", "spk/with space.wav", "spk/ünï çødé.wav",
         "spk/A.wav", "spk/a.wav", f"spk/{NFD_E}.wav", f"spk/{NFC_E}.wav", "spk/x\\y.wav", "spk/v1.2.3.wav",
         "spk/dots.in/dir.x.wav"]
TWIN_LOSERS = {"spk/a.wav": "spk/A", f"spk/{NFC_E}.wav": f"spk/{NFD_E}"}
# Rows with an explicit id: (id, file, expected reject reason or None)
ID_ROWS = [("../x", "ids/f1.wav", "bad_id"), ("/x", "ids/f2.wav", "bad_id"), ("a\\b", "ids/f3.wav", "bad_id"),
           ("a/./b", "ids/f4.wav", "bad_id"), ("bell\x07", "ids/f5.wav", "bad_id"), ("a//b", "ids/f6.wav", "bad_id"),
           ("ids/v1.2", "ids/f7.wav", None), ("dup/one", "ids/f8.wav", None), ("dup/one", "ids/f9.wav", "duplicate_id")]


def _tone(path: Path, f0: float) -> None:
    sr = 16000
    t = np.arange(int(0.5 * sr)) / sr
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (0.4 * np.sin(2 * np.pi * f0 * t)).astype(np.float32), sr,
             format="FLAC" if path.suffix == ".flac" else "WAV", subtype="PCM_16")


def _build(root: Path) -> Path:
    # Each file its own pitch, so two samples merged under one key would show as wrong audio.
    for i, rel in enumerate(FILES + [f for _, f, _ in ID_ROWS]):
        _tone(root / rel, 110.0 + 15 * i)
    manifest = root / "list.jsonl"
    rows = [{"path": rel} for rel in FILES] + [{"path": f, "id": i} for i, f, _ in ID_ROWS]
    manifest.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return manifest


def _written_ids() -> set[str]:
    ids = {rel.rsplit(".", 1)[0] for rel in FILES if rel not in TWIN_LOSERS}
    return ids | {i for i, _, reason in ID_ROWS if reason is None}


@pytest.fixture(scope="module")
def adversarial(tmp_path_factory):
    """One corpus with every adversarial name, sharded once by the real CLI (one embedded Ray start)."""
    root = tmp_path_factory.mktemp("adversarial")
    manifest = _build(root)
    out = tmp_path_factory.mktemp("adversarial_out")
    # The CLI's own entry point, in-process: it shares the test session's embedded Ray (one start for the suite).
    assert main(["shard", "--corpus", str(root), "--manifest", str(manifest), "--features", "pcm,kaldi_fbank",
                 "--shard-size", "150kB", "--workers", "2", "--no-progress", "--out", str(out)]) == 0
    return root, manifest, out


def test_every_written_sample_has_its_own_key_in_tarfile_and_arrow(adversarial):
    _, _, out = adversarial
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["shards"]) >= 2  # keys must be unique over the set, not only inside one tar
    arrow_ids, names = [], []
    for sh in m["shards"]:
        with pa.memory_map(str(out / sh["arrow"]["path"])) as src:
            arrow_ids += pa.ipc.open_file(src).read_all().column("id").to_pylist()
        with tarfile.open(out / sh["tar"]["path"]) as tar:
            for member in tar:
                assert member.isfile() and member_name_problem(member.name) is None, member.name
                assert not os.path.isabs(member.name) and ".." not in member.name.split("/")
                names.append(member.name)
    assert sorted(arrow_ids) == sorted(_written_ids())
    assert len(names) == len(set(names)) == 3 * len(arrow_ids)  # json + flac + fbank.npy each
    keys = {n.rsplit("/", 1)[0] + "/" + n.rsplit("/", 1)[1].split(".", 1)[0] for n in names}
    assert keys == {sample_key(i) for i in arrow_ids}
    assert len({fold(k) for k in keys}) == len(keys)  # safe on a case-insensitive disk too


def test_webdataset_reads_every_sample_distinct_with_its_own_audio(adversarial):
    import webdataset as wds

    _, _, out = adversarial
    m = json.loads((out / "manifest.json").read_text())
    urls = [str(out / sh["tar"]["path"]) for sh in m["shards"]]
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    keys = [s["__key__"] for s in samples]
    assert len(keys) == len(set(keys)) == len(_written_ids())
    pitch = {}
    for s in samples:
        meta = json.loads(s["json"])
        assert key_to_id(s["__key__"]) == meta["id"]
        assert set(s) >= {"json", "flac", "fbank.npy"}
        wav, sr = sf.read(io.BytesIO(s["flac"]))
        spectrum = np.abs(np.fft.rfft(wav))
        pitch[meta["id"]] = round(float(np.argmax(spectrum)) * sr / len(wav))
    # a.b and a_b: two different tones, not one sample twice
    assert abs(pitch["spk/a.b"] - pitch["spk/a_b"]) >= 10


def test_bad_ids_colliding_ids_and_case_twins_are_rejected_with_reasons(adversarial):
    root, _, out = adversarial
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    by_source = {r["source"]: r for r in rejects}
    want = {f: reason for _, f, reason in ID_ROWS if reason}
    want.update({f: "duplicate_key" for f in TWIN_LOSERS})
    assert {s: r["reason"] for s, r in by_source.items()} == want
    for rel, first in TWIN_LOSERS.items():
        assert repr(first) in by_source[rel]["detail"]  # names the file that kept the key
    assert "'dup/one'" in by_source["ids/f9.wav"]["detail"]
    t = json.loads((out / "manifest.json").read_text())["totals"]
    assert t["discovered"] == len(FILES) + len(ID_ROWS) == t["written"] + t["rejected"]


def test_verify_passes_and_the_keys_are_decided_at_plan_time(adversarial):
    root, manifest, out = adversarial
    assert main(["verify", str(out)]) == 0
    # A rerun's plan (same corpus, same job) is the same: same utterances, same rejects, so the same keys.
    saved = json.loads((out / "plan.json").read_text())
    job = Job.from_dict({**saved["job"], "out": str(out)})
    again = make_plan(job, str(manifest), "auto", [])
    assert [u["id"] for unit in again["units"] for u in unit["utterances"]] == \
        [u["id"] for unit in saved["units"] for u in unit["utterances"]]
    assert again["discovery_rejects"] == saved["discovery_rejects"]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30))
def test_the_key_escape_is_injective_dot_free_and_reversible(utt_id):
    key = sample_key(utt_id)
    assert "." not in key and "\\" not in key and key_to_id(key) == utt_id


def test_escape_does_not_collide_with_names_that_look_escaped():
    ids = ["a.b", "a_b", "a%2Eb", "a%252Eb", "a%2eb", ".", "..", "%", "%%"]
    assert len({sample_key(i) for i in ids}) == len(ids)
    assert sample_key("..") == "%2E%2E"  # a '..' segment cannot survive into a member name


@pytest.mark.parametrize("bad", ["/abs", "a//b", "", "a/"])
def test_writer_refuses_an_id_that_would_leave_the_archive(bad, tmp_path):
    row = {"id": bad, "speaker": "", "text": "", "source": "x.wav", "duration": 0.1,
           "arrays": {"f": np.zeros(3, np.float32)}, "scalars": {}}
    with pytest.raises(ValueError, match="cannot be a tar member name"):
        write_tar(tmp_path / "s.tar", [row], [ArrayColumn("f", "float32", 0)], [], None)
    assert not any(tmp_path.iterdir())  # no half tar, no temporary


def test_walked_case_twins_keep_one_key_and_reject_the_other(tmp_path):
    # The same rule without a manifest (discovery walks the folder), checked at plan time without Ray.
    for i, rel in enumerate(["s/Hello.wav", "s/hello.wav", "s/HELLO.wav", "s/h.e.wav", "s/h_e.wav"]):
        _tone(tmp_path / "c" / rel, 150.0 + 20 * i)
    disc = discover(tmp_path / "c")
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in disc.utterances]
    kept, rejects = unique_keys(utts)
    assert [u.id for u in kept] == ["s/HELLO", "s/h.e", "s/h_e"]
    assert {r["source"]: r["reason"] for r in rejects} == {"s/Hello.wav": "duplicate_key",
                                                           "s/hello.wav": "duplicate_key"}
    assert all("'s/HELLO'" in r["detail"] for r in rejects)
    job = Job(str(tmp_path / "c"), str(tmp_path / "o"), ["custom"], [("pcm", {})], asdict(DecodeLimits()))
    plan = make_plan(job, None, "auto", [])
    assert sorted(r["reason"] for r in plan["discovery_rejects"]) == ["duplicate_key", "duplicate_key"]
    assert plan["discovered"] == 5


def test_verify_names_unsafe_and_repeated_tar_members(adversarial, tmp_path):
    # A tar from elsewhere (or an older audiopipe) with an absolute member and a key written twice; the manifest
    # is updated to the new bytes so that the member checks, not the checksum, must catch it.
    from audiopipe.shard.checksum import checksum_of, file_checksum

    _, _, src = adversarial
    out = tmp_path / "s"
    shutil.copytree(src, out)
    m = json.loads((out / "manifest.json").read_text())
    entry = m["shards"][0]["tar"]
    path = out / entry["path"]
    with tarfile.open(path) as tar:
        first = tar.getmembers()[0]
        blob = tar.extractfile(first).read()
    with tarfile.open(path, "a") as tar:
        for name in (first.name, "/etc/evil.json"):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    algorithm = checksum_of(entry).algorithm
    entry.update({"bytes": path.stat().st_size, algorithm: file_checksum(path, algorithm)})
    (out / "manifest.json").write_text(json.dumps(m))
    assert main(["verify", str(out)]) == 1
    from audiopipe.shard.verify import verify

    failures = verify(out).failures
    assert any(f"{first.name}: appears twice" in f for f in failures), failures
    assert any("'/etc/evil.json': unsafe member (is absolute)" in f for f in failures), failures


def test_verify_refuses_to_compare_tars_of_the_old_key_rule(adversarial, tmp_path):
    _, _, src = adversarial
    out = tmp_path / "s"
    shutil.copytree(src, out)
    m = json.loads((out / "manifest.json").read_text())
    m["format_version"] = 1
    (out / "manifest.json").write_text(json.dumps(m))
    from audiopipe.shard.verify import verify

    assert [f for f in verify(out).failures] == [
        "manifest.json: format_version 1, this audiopipe writes 2 (sample keys changed in version 2); reshard, "
        "or verify the Arrow shards alone (tars=False; `audiopipe verify --no-tar`)"]
    assert verify(out, tars=False).ok
