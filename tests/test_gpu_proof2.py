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
