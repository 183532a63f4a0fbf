"""audiopipe tokens: GPT-SoVITS name2semantic import (parse, join, report) and k-means units, both written as a
sidecar shard folder that make_loader reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from audiopipe.index.lengths import LengthIndex
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.loader import make_loader
from audiopipe.shard.manifest import read_manifest
from audiopipe.tokens.cli import add_arguments, run
from audiopipe.tokens.store import read_report
from audiopipe.tokens.kmeans import Codebook, inertia, kmeans_fit, resolve_feature, stack_frames
from audiopipe.tokens.semantic import join_names, read_name2semantic, utterance_name

from corpora import make_asterisk_corpus
from shard_helpers import shard

FEATS = [("pcm", {"sample_rate": 16000}), ("kaldi_fbank", {})]


@pytest.fixture(scope="module")
def ast_shards(tmp_path_factory):
    """12 real Asterisk prompts: pcm @16 kHz, Kaldi fbank and ARPAbet phones (the gpt_sovits + eres2net data)."""
    corpus = tmp_path_factory.mktemp("ast12")
    make_asterisk_corpus(corpus, n=12)
    out = tmp_path_factory.mktemp("ast12_shards")
    shard(corpus, out, FEATS, phones=True, shard_bytes=150_000)  # several shards, so the join crosses files
    return out


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two BLAS threads on a busy shared 2-core machine spin far more than they compute.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return run(p.parse_args([str(a) for a in argv]))


def loaded_by_id(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every row of a token folder through the real loader: {id: {semantic, phones}} (padding cut off)."""
    loader = make_loader(folder, ["semantic", "phones"], max_frames=4000, shuffle=False)
    got = {}
    for b in loader:
        for i, utt in enumerate(b["id"]):
            got[utt] = {f: b[f][i, :int(b[f"{f}_lengths"][i])].numpy().copy() for f in ("semantic", "phones")}
    return got


# ----------------------------------------------------------------------------- name2semantic file

def test_reads_merged_and_part_files(tmp_path):
    merged = tmp_path / "6-name2semantic.tsv"
    merged.write_bytes("\ufeffitem_name\tsemantic_audio\r\na.wav\t1 2 3\r\n\r\nb.c.wav\t1023 0\r\n"
                       "a.wav\t1 2 3\n".encode())  # BOM, CRLF, blank line, an identical repeat
    t = read_name2semantic(merged)
    assert list(t) == ["a.wav", "b.c.wav"]
    assert t["a.wav"].tolist() == [1, 2, 3] and t["b.c.wav"].tolist() == [1023, 0]
    part = tmp_path / "6-name2semantic-0.tsv"  # what 3-get-semantic.py writes: no header, no final newline
    part.write_text("x.wav\t5 6", encoding="utf-8")
    assert read_name2semantic(part)["x.wav"].tolist() == [5, 6]


@pytest.mark.parametrize("body, message", [
    ("item_name\tsemantic_audio\na.wav 1 2 3\n", r":2: expected 'item_name<TAB>tokens', found 1"),
    ("a.wav\t1 2\nb.wav\t1 x 3\n", r":2: 'b.wav' has a token that is not an integer: 'x'"),
    ("a.wav\t\n", r":1: 'a.wav' has no tokens"),
    ("a.wav\t1 2\nb.wav\t3\na.wav\t1 5\n", r":3: 'a.wav' appears again \(first on line 1\) with different"),
    ("item_name\tsemantic_audio\n", "no token lines"),
])
def test_bad_name2semantic_lines_are_named(tmp_path, body, message):
    f = tmp_path / "bad.tsv"
    f.write_text(body, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_name2semantic(f)


def test_join_by_basename_reports_every_unmatched_name():
    ids = ["spk0/utt000", "spk1/utt000", "wavs/a", "wavs/b.c", "wavs/d", "wavs/e"]
    names = ["utt000.wav", "a.wav", "b.c.wav", "zzz.wav", "e.wav", "e.flac"]
    assert utterance_name("some/dir\\b.c.wav") == "b.c" and utterance_name("b.c") == "b.c"
    j = join_names(names, ids)
    assert j.rows == {2: "a.wav", 3: "b.c.wav"}
    assert j.unmatched_names == ["zzz.wav"]
    assert j.ambiguous == {"utt000.wav": ["spk0/utt000", "spk1/utt000"]}  # never guessed
    assert j.collisions == {"e": ["e.wav", "e.flac"]}
    assert j.rows_without_tokens == [0, 1, 4, 5]


def test_name2semantic_import_joins_reports_and_loads(ast_shards, tmp_path, capsys):
    idx = LengthIndex.open(ast_shards)
    ids = idx.table.column("id").to_pylist()
    rng = np.random.default_rng(0)
    want = {}
    lines = ["item_name\tsemantic_audio"]
    for utt, dur in list(zip(ids, idx.duration))[2:]:  # the first two rows get no tokens
        toks = rng.integers(0, 1024, size=max(1, round(float(dur) * 25)))
        want[utt] = toks
        lines.append(f"{Path(utt).name}.wav\t{' '.join(map(str, toks))}")
    lines += ["not_in_corpus.wav\t1 2 3", "also_missing.wav\t4"]
    tsv = tmp_path / "6-name2semantic.tsv"
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "tokens"

    assert cli("--shards", ast_shards, "--out", out, "--name2semantic", tsv) == 0
    printed = capsys.readouterr().out
    assert f"joined {len(ids) - 2} of {len(ids)} shard rows" in printed
    assert "tsv names with no shard row: 2: not_in_corpus.wav, also_missing.wav" in printed
    assert "shard rows without tokens: 2 (listed in rejects.jsonl)" in printed

    rep = read_report(out)
    assert rep["unmatched_names"] == ["not_in_corpus.wav", "also_missing.wav"] and rep["matched"] == len(ids) - 2
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rejects) == sorted(ids[:2])
    assert {r["reason"] for r in rejects} == {"no_semantic_tokens"}
    m = read_manifest(out)
    assert m["totals"]["discovered"] == len(ids) and m["totals"]["written"] == len(ids) - 2
    assert m["features"]["semantic"]["kind"] == "sovits_semantic" and m["job"]["source"] == "name2semantic"
    from audiopipe.shard.checksum import file_checksum

    for sh in m["shards"]:  # the checksums taken while writing are those of the files on disk
        f = out / sh["arrow"]["path"]
        assert sh["arrow"]["bytes"] == f.stat().st_size and sh["arrow"]["xxh3_128"] == file_checksum(f)

    parent = ShardDataset(ast_shards, ["phones"])
    got = loaded_by_id(out)
    assert set(got) == set(want)
    for g, utt in enumerate(ids[2:], start=2):
        np.testing.assert_array_equal(got[utt]["semantic"], want[utt])
        np.testing.assert_array_equal(got[utt]["phones"], parent[g]["phones"])

    # --require-all turns the same unmatched names into a failing exit code; --overwrite replaces the folder.
    assert cli("--shards", ast_shards, "--out", out, "--name2semantic", tsv, "--require-all", "--overwrite") == 1
    with pytest.raises(ValueError, match="not empty; pass --overwrite"):
        cli("--shards", ast_shards, "--out", out, "--name2semantic", tsv)


def test_name2semantic_refusals(ast_shards, tmp_path):
    tsv = tmp_path / "t.tsv"
    tsv.write_text("nobody.wav\t1 2 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no tsv name matched a shard row"):
        cli("--shards", ast_shards, "--out", tmp_path / "o1", "--name2semantic", tsv)
    assert read_report(tmp_path / "o1")["unmatched_names"] == ["nobody.wav"]  # the details stay on disk
    with pytest.raises(ValueError, match="not the --shards folder"):
        cli("--shards", ast_shards, "--out", ast_shards, "--name2semantic", tsv)
    first = LengthIndex.open(ast_shards).table.column("id")[0].as_py()
    tsv.write_text(f"{Path(first).name}.wav\t1 2 5000\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"ids outside 0\.\.1023"):
        cli("--shards", ast_shards, "--out", tmp_path / "o2", "--name2semantic", tsv)
    (tmp_path / "o3").mkdir()
    (tmp_path / "o3" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=r"holds files a token folder does not \(notes.txt\)"):
        cli("--shards", ast_shards, "--out", tmp_path / "o3", "--name2semantic", tsv, "--overwrite")
    with pytest.raises(SystemExit):  # argparse: one source, not two
        cli("--shards", ast_shards, "--out", tmp_path / "o3", "--name2semantic", tsv, "--kmeans", "8")


# ----------------------------------------------------------------------------- k-means

def blobs(seed: int = 0, n: int = 3000, k: int = 8, d: int = 12) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4, size=(k, d))
    return (centers[rng.integers(0, k, n)] + rng.normal(0, 1, size=(n, d))).astype(np.float32)


def random_partition_inertia(x: np.ndarray, k: int, seed: int = 0) -> float:
    lab = np.random.default_rng(seed).integers(0, k, len(x))
    means = np.stack([x[lab == j].mean(0) for j in range(k)])
    return float(((x - means[lab]) ** 2).sum(1).mean())


def test_kmeans_is_seeded_and_beats_random_assignment():
    x = blobs()
    c1, i1 = kmeans_fit(x, 8, seed=3, steps=60, batch_size=512)
    c2, i2 = kmeans_fit(x, 8, seed=3, steps=60, batch_size=512)
    np.testing.assert_array_equal(c1, c2)
    assert i1 == i2 == pytest.approx(inertia(x, c1))
    # Random labels with their own means (the best centers for that assignment): k-means must do far better.
    assert i1 < 0.2 * random_partition_inertia(x, 8)
    # Within 10 % of a full-batch k-means reference (noise variance per dim is 1, so ~12 is the optimum).
    sk = pytest.importorskip("sklearn.cluster")
    ref = sk.KMeans(8, n_init=4, random_state=0).fit(x).inertia_ / len(x)
    assert i1 <= 1.1 * ref


def test_stack_frames_layout_and_cmn():
    feat = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)  # 2 channels, 9 frames
    v = stack_frames(feat, 4)
    assert v.shape == (2, 8)  # 9 // 4 vectors of 4 frames x 2 channels; the 9th frame is dropped
    centred = feat - feat.mean(1, keepdims=True)
    np.testing.assert_allclose(v[1], centred[:, 4:8].T.reshape(-1))  # frame-major: f4c0 f4c1 f5c0 ...


def test_kmeans_needs_a_float_feature_with_channels(tmp_path):
    m = {"features": {"pcm": {"name": "pcm", "kind": "pcm", "channels": 0, "dtype": "int16"}}}
    with pytest.raises(ValueError, match="no feature 'fbank'.*gpt_sovits,eres2net"):
        resolve_feature(m, "fbank", tmp_path)
    with pytest.raises(ValueError, match="k-means needs a float"):
        resolve_feature(m, "pcm", tmp_path)


def test_kmeans_feature_auto_picks_what_the_shards_hold(tmp_path):
    def spec(name, kind, channels=80, dtype="float32"):
        return name, {"name": name, "kind": kind, "channels": channels, "dtype": dtype}

    f5 = {"features": dict([spec("mel", "vocos_mel", 100), spec("pcm", "pcm", 0, "int16")])}  # the f5tts preset
    assert resolve_feature(f5, "auto", tmp_path)["name"] == "mel"
    both = {"features": dict([spec("mel", "vocos_mel", 100), spec("fbank", "kaldi_fbank"), spec("f0", "f0", 0)])}
    assert resolve_feature(both, "auto", tmp_path)["name"] == "fbank"  # a filterbank first
    odd = {"features": dict([spec("codes", "encodec", 8, "int16"), spec("emb", "custom", 4)])}
    assert resolve_feature(odd, "auto", tmp_path)["name"] == "emb"  # any float [C, T] feature
    none = {"features": dict([spec("pcm", "pcm", 0, "int16")])}
    with pytest.raises(ValueError, match="no float \\[channels, T\\] feature"):
        resolve_feature(none, "auto", tmp_path)


def test_kmeans_tokens_on_real_speech_load_and_reuse_the_codebook(ast_shards, tmp_path, capsys):
    out = tmp_path / "km"
    assert cli("--shards", ast_shards, "--out", out, "--kmeans", "16", "--steps", "40", "--batch-size", "512") == 0
    printed = capsys.readouterr().out
    assert "kmeans-fbank-16: k-means units, NOT GPT-SoVITS semantic tokens" in printed
    m = read_manifest(out)
    spec = m["features"]["semantic"]
    assert spec["kind"] == "kmeans-fbank-16" and spec["params"]["stack"] == 4
    assert spec["sample_rate"] / spec["hop_length"] == 25.0
    assert m["totals"]["written"] == m["totals"]["discovered"]

    parent = LengthIndex.open(ast_shards)
    fb_frames = dict(zip(parent.table.column("id").to_pylist(), parent.frames("fbank")))
    got = loaded_by_id(out)
    assert set(got) == set(fb_frames)
    for utt, g in got.items():
        assert len(g["semantic"]) == fb_frames[utt] // 4
        assert 0 <= g["semantic"].min() and g["semantic"].max() < 16

    # On the real vectors too, the fit is far better than a random partition.
    cb = Codebook.load(out / "kmeans.npz")
    ds = ShardDataset(ast_shards, ["fbank"])
    x = (np.concatenate([stack_frames(ds[i]["fbank"], 4) for i in range(len(ds))]) - cb.mean) / cb.std
    assert inertia(x, cb.centers) < 0.8 * random_partition_inertia(x, 16)

    # The saved codebook tokenises the same shards to the same tokens (how a dev split gets the same units).
    out2 = tmp_path / "km_reuse"
    assert cli("--shards", ast_shards, "--out", out2, "--codebook", out / "kmeans.npz") == 0
    again = loaded_by_id(out2)
    for utt in got:
        np.testing.assert_array_equal(again[utt]["semantic"], got[utt]["semantic"])
    assert read_manifest(out2)["features"]["semantic"]["hash"] == spec["hash"]
