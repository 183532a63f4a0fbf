"""The pieces of the second GPU proof that decide what it measures: the bundle's re-sliced F5 speech (real samples,
each once, LibriTTS-like lengths), the features' equal-length batches, and the grown corpus, which must give full
batches where a weight on one folder does not. The whole quick run is rehearsed in tests/test_gpu_proof.py."""

from __future__ import annotations

import argparse
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "trainers"))


def _read(path: Path) -> bytes:
    with wave.open(str(path), "rb") as w:
        return w.readframes(w.getnframes())


def test_reslice_keeps_every_sample_once_in_items_of_librispeech_like_length(tmp_path):
    from audiopipe.corpus.demo import ASTERISK_SOUNDS, usable_asterisk_prompts

    import gpu_bundle

    if not ASTERISK_SOUNDS.is_dir():
        pytest.skip("asterisk-core-sounds-en-wav not installed (make sysdeps)")
    prompts = [(ASTERISK_SOUNDS / f"{n}.wav", t) for n, t in usable_asterisk_prompts()[:60]]
    count, seconds = gpu_bundle.reslice(tmp_path, "allison", prompts, seed=0)
    items = sorted((tmp_path / "allison").glob("slice_*.wav"))
    assert len(items) == count and 1 < count < len(prompts)
    # The items, in order, are the prompts in the seeded order, joined: every sample once, nothing else.
    order = np.random.default_rng(0).permutation(len(prompts)).tolist()
    assert b"".join(_read(p) for p in items) == b"".join(_read(prompts[i][0]) for i in order)
    assert " ".join((p.with_suffix(".txt")).read_text().strip() for p in items) == " ".join(prompts[i][1] for i in order)
    lengths = [gpu_bundle.wav_seconds(p) for p in items]
    assert abs(sum(lengths) - seconds) < 1e-6
    assert min(lengths[:-1]) >= 1.0 and np.median(lengths) > 2 * np.median([gpu_bundle.wav_seconds(p) for p, _ in prompts])


def test_equal_length_batches_cut_each_group_to_its_shortest_clip():
    import bench_gpu_features as bgf

    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) for n in (900, 100, 500, 520, 480, 1000, 60)]
    cut, plan = bgf.equal_lengths(clips, 3)
    assert sorted(i for b in plan for i in b) == list(range(len(clips)))
    assert [[len(clips[i]) for i in b] for b in plan] == [[1000, 900, 520], [500, 480, 100], [60]]
    assert [{len(cut[i]) for i in b} for b in plan] == [{520}, {100}, {60}]
    assert all(np.array_equal(cut[i], clips[i][: len(cut[i])]) for i in range(len(clips)))  # cut from the start
    assert bgf.padding_efficiency(cut, plan) == 1.0
    assert bgf.padding_efficiency(clips, plan) == pytest.approx(3560 / (3 * 1000 + 3 * 500 + 60))


def test_a_grown_corpus_packs_full_batches_where_a_weight_on_one_folder_does_not(tmp_path, f5_shards):
    """Copies as corpora of their own names are distinct items in one plan; a weight k repeats each item in
    rounds that the sampler packs one by one, so a small corpus gives part-full batches in every round."""
    import torch

    import core
    import gpu_proof
    import gpu_proof2
    import train_f5tts as f5

    a = argparse.Namespace(work=tmp_path, quick=True)

    def batches(shards: str, weights: str | None) -> list[int]:
        cfg = core.RunConfig(shards=shards, weights=weights, out=str(tmp_path / "run"), batch_frames=budget,
                             max_items=64, prefetch=0, seed=0)
        loader = core._make_loader(cfg, core.Dist(device=torch.device("cpu")), ["mel"], None, {"mel": f5.MEL_HASH},
                                   {}, tmp_path)
        loader.set_epoch(0)
        return [int(b["mel_lengths"].sum()) for b in loader]

    from audiopipe.reader.arrow_dataset import ShardDataset

    total = int(ShardDataset(str(f5_shards), ["mel"]).lengths("mel").sum())
    budget = int(total * 0.7)  # one copy: a full batch and a part-full one
    grown = batches(",".join(map(str, gpu_proof2.grown(a, Path(f5_shards), 8))), None)
    flags = gpu_proof.repeated(a, Path(f5_shards), 8)  # --shards FOLDER,LINK --weights 4,4
    weighted = batches(flags[1], flags[3])
    assert sum(grown) == sum(weighted) == 8 * total  # the same frames an epoch either way
    assert len(grown) < len(weighted)  # ... in fewer, fuller batches
    assert np.mean(grown) > 1.2 * np.mean(weighted)


def test_3d_speakers_rule_decodes_and_perturbs_the_whole_file_for_every_crop(tmp_path):
    """The speaker_cores part's baseline takes 3D-Speaker's path per item: the whole file decoded and
    speed-perturbed (not only the crop's samples), a 3 s crop (a short file zero-padded), speakerlab's own FBank
    (the side venv's, as the oracle), class speaker + speakers * speed; each item at audiopipe's speed for it."""
    import soundfile as sf

    import gpu_proof2
    from speaker_data import SpeakerCrops
    from upstream_oracle import run_upstream

    rng = np.random.default_rng(1)
    lengths = (5 * 16000 + 123, 2 * 16000 - 7)  # one longer than a 3 s crop, one shorter
    files = []
    for i, n in enumerate(lengths):
        files.append(str(tmp_path / f"{i}.wav"))
        sf.write(files[-1], (0.1 * rng.standard_normal(n)).astype(np.float32), 16000, subtype="PCM_16")
    speaker = np.array([0, 1] * 8)  # 16 items: the two files, eight times each (as the grown corpus lists them)
    rule = gpu_proof2.SpeakerlabRule(files, speaker, 2, seed=0)
    crops = SpeakerCrops(speaker, seed=0)
    items = [rule[g] for g in range(len(speaker))]
    speeds = [crops({"index": g, "pcm": np.zeros(lengths[g % 2], np.int16)})["speed"] for g in range(len(speaker))]
    assert set(speeds) == {0, 1, 2}  # every path taken: 1.0 (no resampling), 0.9 and 1.1
    for g, (item, k) in enumerate(zip(items, speeds)):
        n = lengths[g % 2]
        assert item["decoded"] == n  # the whole file, for every crop
        assert abs(item["perturbed"] - n / rule.speeds[k]) <= 1  # the whole file perturbed, not the crop
        assert item["label"] == speaker[g] + 2 * k
        assert tuple(item["fbank"].shape) == (298, 80)  # 3 s at 25/10 ms
    # speakerlab's FBank on the crops the rule cut: the unperturbed short file is the file itself, zero-padded.
    short = [g for g, k in enumerate(speeds) if k == 0 and g % 2 == 1]
    assert short
    pcm, _ = sf.read(files[1], dtype="float32")
    np.save(tmp_path / "crops.npy", np.pad(pcm, (0, 48000 - len(pcm)))[None])
    run_upstream("speakerlab_fbank.py", tmp_path / "crops.npy", tmp_path / "fbank.npy")
    want = np.load(tmp_path / "fbank.npy")[0]
    for g in short:
        np.testing.assert_allclose(items[g]["fbank"].numpy(), want, atol=2e-4)
