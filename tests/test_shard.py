"""The shard stage end to end, on real Ray, real Arrow files and real tars."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from audiopipe.index.lengths import LengthIndex
from audiopipe.shard.manifest import read_manifest
from audiopipe.shard.run import JobError
from audiopipe.shard.verify import verify
from shard_helpers import shard, tree_digest

FEATS = [("vocos_mel", {}), ("f0", {"sample_rate": 16000, "hop_length": 160}), ("kaldi_fbank", {}),
         ("pcm", {"sample_rate": 16000})]


@pytest.fixture(scope="module")
def synth_shards(synthetic_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("synth_shards")
    summary = shard(synthetic_corpus.root, out, FEATS, shard_bytes=200_000)
    return synthetic_corpus, out, summary


def test_every_utterance_written_with_exact_frame_counts(synth_shards):
    corpus, out, summary = synth_shards
    m = read_manifest(out)
    t = m["totals"]
    assert t["discovered"] == len(corpus.utterances) == t["written"] + t["rejected"]
    assert t["rejected"] == 0 and summary.written == len(corpus.utterances)
    assert len(m["shards"]) > 1, "a small shard size must give several shards"
    assert set(m["features"]) == {"mel", "f0", "voiced", "fbank", "pcm"}
    idx = LengthIndex.open(out)
    assert sorted(idx.table.column("id").to_pylist()) == sorted(u.id for u in corpus.utterances)
    by_id = {u.id: u for u in corpus.utterances}
    for sh in m["shards"]:
        with pa.memory_map(str(out / sh["arrow"]["path"])) as src:
            table = pa.ipc.open_file(src).read_all()
        assert table.num_rows == sh["rows"]
        for i in range(table.num_rows):
            u = by_id[table.column("id")[i].as_py()]
            n24 = round(u.num_samples * 24000 / u.sample_rate)
            n16 = round(u.num_samples * 16000 / u.sample_rate)
            assert abs(table.column("mel_frames")[i].as_py() - (n24 // 256 + 1)) <= 1
            assert table.column("f0_frames")[i].as_py() == table.column("voiced_frames")[i].as_py()
            assert abs(table.column("pcm_frames")[i].as_py() - n16) <= 1
            mel = np.asarray(table.column("mel")[i].values).reshape(100, -1)
            assert mel.shape[1] == table.column("mel_frames")[i].as_py() and np.isfinite(mel).all()
            assert table.column("speaker")[i].as_py() == u.speaker
            assert table.column("text")[i].as_py() == u.text


def test_tones_keep_their_pitch_through_the_shards(synth_shards):
    corpus, out, _ = synth_shards
    idx = LengthIndex.open(out)
    m = read_manifest(out)
    ids = idx.table.column("id").to_pylist()
    tones = [u for u in corpus.utterances if u.kind == "tone"]
    assert tones
    for u in tones:
        k = ids.index(u.id)
        sh = m["shards"][int(idx.shard[k])]
        with pa.memory_map(str(out / sh["arrow"]["path"])) as src:
            t = pa.ipc.open_file(src).read_all()
        r = int(idx.row[k])
        f0 = np.asarray(t.column("f0")[r].values)
        voiced = np.asarray(t.column("voiced")[r].values).astype(bool)
        assert voiced.mean() > 0.6
        assert abs(np.median(f0[voiced]) - u.f0) / u.f0 < 0.02


def test_tar_holds_the_same_samples_without_pickles(synth_shards):
    _, out, _ = synth_shards
    m = read_manifest(out)
    sh = m["shards"][0]
    with tarfile.open(out / sh["tar"]["path"]) as tar:
        names = tar.getnames()
        exts = {n.split(".", 1)[1] for n in names}
        assert exts == {"json", "mel.npy", "f0.npy", "voiced.npy", "fbank.npy", "flac"}
        first = names[0].split(".", 1)[0]
        meta = json.loads(tar.extractfile(f"{first}.json").read())
        mel = np.load(io.BytesIO(tar.extractfile(f"{first}.mel.npy").read()), allow_pickle=False)
        pcm, sr = sf.read(io.BytesIO(tar.extractfile(f"{first}.flac").read()), dtype="int16")
    assert mel.shape == (100, meta["mel_frames"]) and sr == 16000 and len(pcm) == meta["pcm_frames"]
    assert verify(out).ok


def test_rerun_on_finished_output_is_a_noop(synth_shards):
    corpus, out, _ = synth_shards
    before = tree_digest(out)
    t0 = time.monotonic()
    s = shard(corpus.root, out, FEATS, shard_bytes=200_000)
    assert s.up_to_date and time.monotonic() - t0 < 5
    assert tree_digest(out) == before


def test_a_rerun_with_nothing_to_do_leaves_the_plans_utterances_unparsed(synth_shards, monkeypatch):
    # plan.json holds every utterance (over 100 MB of JSON at 500,000): a rerun with nothing to do reads its
    # fields and unit names only, so that it stays a matter of seconds whatever the corpus. json.loads is
    # json.loads itself, recording what it is given (json.load goes through it too).
    corpus, out, _ = synth_shards
    parsed: list[str] = []
    real = json.loads

    def loads(s, *a, **kw):
        parsed.append(s if isinstance(s, str) else bytes(s).decode())
        return real(s, *a, **kw)

    monkeypatch.setattr(json, "loads", loads)
    assert shard(corpus.root, out, FEATS, shard_bytes=200_000).up_to_date
    assert parsed and not any('"utterances"' in p for p in parsed), [p[:80] for p in parsed]


def test_an_output_made_with_sha256_resumes_under_the_default_checksum(synth_shards, tmp_path):
    # Shards made with sha256 (an older audiopipe, or --checksum sha256) and a run interrupted before the last
    # shard: the rerun under the default keeps the finished ones (the checksum is not part of the job's
    # identity), writes the rest with xxh3-128, and the mixed set verifies and loads with every check.
    from dataclasses import replace

    from audiopipe.reader.arrow_dataset import ShardDataset
    from audiopipe.shard.checksum import checksum_of
    from audiopipe.shard.run import run_job
    from shard_helpers import make_job

    corpus, _, _ = synth_shards
    out = tmp_path / "s"
    job = make_job(corpus.root, out, FEATS, shard_bytes=200_000)
    run_job(replace(job, checksum="sha256"), workers=0, show_progress=False)  # see shard_helpers.shard
    m = read_manifest(out)
    assert {checksum_of(sh[k]).algorithm for sh in m["shards"] for k in ("arrow", "tar")} == {"sha256"}
    last = m["shards"][-1]
    for rel in (last["arrow"]["path"], last["tar"]["path"], f"done/{last['name']}.json", "manifest.json"):
        (out / rel).unlink()
    s = run_job(job, workers=0, show_progress=False)
    assert not s.up_to_date
    m = read_manifest(out)
    algorithms = [checksum_of(sh["arrow"]).algorithm for sh in m["shards"]]
    assert algorithms == ["sha256"] * (len(algorithms) - 1) + ["xxh3_128"]
    assert verify(out).ok
    ShardDataset(out, ["mel"], verify="checksum")  # every shard hashed by its own algorithm, none corrupt


def test_other_settings_into_same_output_are_refused(synth_shards):
    corpus, out, _ = synth_shards
    with pytest.raises(JobError, match="other settings"):
        shard(corpus.root, out, [("vocos_mel", {})], shard_bytes=200_000)


def test_broken_inputs_become_rejects_with_reasons(broken_corpus, tmp_path):
    out = tmp_path / "shards"
    s = shard(broken_corpus.root, out, [("vocos_mel", {}), ("f0", {})], max_duration=20.0)
    m = read_manifest(out)
    rejects = [json.loads(l) for l in (out / "rejects.jsonl").read_text().splitlines()]
    got = {Path(r["source"]).name: r["reason"] for r in rejects}
    for name, reason in broken_corpus.expected.items():
        if reason is None:
            assert name not in got, f"{name} should be written, was rejected: {got.get(name)}"
        else:
            assert got.get(name) == reason, f"{name}: expected {reason}, got {got.get(name)}"
    assert all(r["detail"] for r in rejects)
    t = m["totals"]
    assert t["discovered"] == t["written"] + t["rejected"] == len(broken_corpus.expected)
    assert t["written"] == sum(v is None for v in broken_corpus.expected.values())
    assert s.reject_reasons and verify(out).ok


def test_real_speech_f5tts_preset_verifies(asterisk_corpus, tmp_path):
    out = tmp_path / "shards"
    s = shard(asterisk_corpus.root, out, [("vocos_mel", {})])
    assert s.written == len(asterisk_corpus.utterances) and s.rejected == 0
    assert verify(out).ok
    idx = LengthIndex.open(out)
    assert idx.table.column("speaker").to_pylist() == [""] * len(idx)
    assert np.allclose(idx.duration.sum(), sum(u.num_samples / u.sample_rate for u in asterisk_corpus.utterances),
                       rtol=1e-4)


def test_verify_names_the_corrupted_shard(synth_shards, tmp_path):
    _, out, _ = synth_shards
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    m = read_manifest(bad)
    target = bad / m["shards"][1]["arrow"]["path"]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    rep = verify(bad)
    assert not rep.ok and any(m["shards"][1]["name"] in f and "checksum" in f for f in rep.failures)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "audiopipe.cli", *args], capture_output=True, text=True,
                          **kw)


@pytest.mark.parametrize("args, message", [
    (["--corpus", "/nonexistent/wavs"], "corpus folder not found"),
    (["--preset", "nope"], "unknown preset nope"),
    (["--features", "mel,zzz"], "unknown feature"),
    (["--out", "/proc/audiopipe-cannot-write"], "cannot write to output folder"),
    (["--preset", "ns2"], "needs codec weights"),
    (["--workers", "-1"], "--workers -1: must be at least 0"),
    (["--nice", "25"], "--nice 25: must be between -20 and 19"),
])
def test_bad_command_lines_get_one_clear_line(args, message, synthetic_corpus, tmp_path, capsys):
    from audiopipe.cli import main

    base = {"--corpus": str(synthetic_corpus.root), "--out": str(tmp_path / "o")}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    assert main(["shard", *[x for kv in base.items() for x in kv], "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and err.startswith("audiopipe: error:")


def test_a_bad_command_line_prints_no_traceback(tmp_path):
    r = _cli("shard", "--corpus", str(tmp_path / "missing"), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"audiopipe: error: corpus folder not found: {tmp_path / 'missing'}"


def test_inspect_prints_counts_and_writes_a_histogram(synth_shards, tmp_path, capsys):
    from audiopipe.cli import main

    _, out, _ = synth_shards
    png = tmp_path / "d.png"
    assert main(["inspect", str(out), "--plot", str(png)]) == 0
    stdout = capsys.readouterr().out
    assert "utterances" in stdout and "speakers" in stdout and "mel" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _textgrid(intervals: list[tuple[float, float, str]], xmax: float) -> str:
    items = "\n".join(f'        intervals [{i + 1}]:\n            xmin = {a}\n            xmax = {b}\n'
                      f'            text = "{t}"' for i, (a, b, t) in enumerate(intervals))
    return ('File type = "ooTextFile"\nObject class = "TextGrid"\n\nxmin = 0\nxmax = ' f"{xmax}\n"
            "tiers? <exists>\nsize = 1\nitem []:\n    item [1]:\n        class = \"IntervalTier\"\n"
            f'        name = "phones"\n        xmin = 0\n        xmax = {xmax}\n'
            f"        intervals: size = {len(intervals)}\n{items}\n")


def test_phones_come_from_g2p_or_from_an_mfa_textgrid_with_exact_durations(espeak_corpus, tmp_path):
    corpus = tmp_path / "c"
    shutil.copytree(espeak_corpus.root / "spk0", corpus / "spk0")
    wavs = sorted((corpus / "spk0").glob("*.wav"))[:3]
    for w in sorted((corpus / "spk0").glob("*.wav"))[3:]:
        w.unlink()
    dur = sf.info(str(wavs[0])).duration
    cut = [0.0, 0.2, 0.5, 0.9, dur]
    (wavs[0].with_suffix(".TextGrid")).write_text(
        _textgrid([(cut[0], cut[1], ""), (cut[1], cut[2], "DH"), (cut[2], cut[3], "AH0"), (cut[3], cut[4], "sil")], dur))
    (wavs[1].with_suffix(".TextGrid")).write_text("this is not a TextGrid")
    out = tmp_path / "shards"
    shard(corpus, out, [("f0", {"sample_rate": 24000, "hop_length": 320})], phones=True)
    from audiopipe.text.en_phones import PHONES, ids_to_phones
    from audiopipe.reader.arrow_dataset import ShardDataset

    m = read_manifest(out)
    assert m["phones"]["vocab"] == list(PHONES)
    rejects = [json.loads(l) for l in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["bad_textgrid"] and wavs[1].stem in rejects[0]["source"]
    ds = ShardDataset(out, ["f0", "phones", "durations"])
    items = {ds[i]["id"]: ds[i] for i in range(len(ds))}
    aligned = items[f"spk0/{wavs[0].stem}"]
    assert ids_to_phones(aligned["phones"].tolist()) == ["sil", "DH", "AH0", "sil"]
    assert aligned["durations"].sum() == aligned["f0"].shape[-1] and (aligned["durations"] > 0).all()
    g2p_only = items[f"spk0/{wavs[2].stem}"]
    assert g2p_only["durations"].size == 0 and g2p_only["phones"].size > 5
    assert verify(out).ok


def test_default_shard_size_gives_small_corpora_several_shards():
    from audiopipe.shard.plan import AUTO_MAX_BYTES, AUTO_MIN_BYTES, PlannedUtt, auto_shard_bytes, plan_units

    bps = 37_500.0  # vocos mel: 100 bins x 93.75 frames/s x 4 bytes
    small = [PlannedUtt(f"u{i:05d}", "", "", "", "", 5.0) for i in range(2000)]  # 2.8 h, ~375 MB of mels
    size = auto_shard_bytes(small, bps)
    assert size == AUTO_MIN_BYTES and len(plan_units(small, bps, size)) >= 20
    huge = [PlannedUtt(f"u{i:07d}", "", "", "", "", 5.0) for i in range(200_000)]  # 278 h, ~37 GB
    assert auto_shard_bytes(huge, bps) == AUTO_MAX_BYTES
    assert plan_units(small, bps, size) == plan_units(list(small), bps, auto_shard_bytes(small, bps))


_NICE_PROBE = """
import json, os, sys
from shard_helpers import make_job
from audiopipe.shard.run import run_job
import ray
run_job(make_job(sys.argv[1], sys.argv[2], [("vocos_mel", {})]), workers=1, show_progress=False, nice=int(sys.argv[3]),
        engine="ray")
seen = ray.get([ray.remote(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote() for _ in range(2)])
print(json.dumps(seen))
"""


def test_workers_run_at_the_niceness_asked_for_not_rays_15(asterisk_corpus, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), *sys.path]))
    r = subprocess.run([sys.executable, "-c", _NICE_PROBE, str(asterisk_corpus.root), str(tmp_path / "o"), "3"],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [3, 3]
    h = _cli("shard", "--help", timeout=60).stdout
    assert "--nice" in h and "15" in h
