"""One name per feature (audiopipe/features/names.py): every command and public function that takes a feature
name takes the column name (mel, fbank, ...) and the computing class's name (vocos_mel, kaldi_fbank) alike, the
latter with one note. The walk below covers each of them; a new one fails the inventory test until added."""

from __future__ import annotations

import argparse
import inspect
import warnings

import pytest

import audiopipe as ap
from audiopipe.cli import PLUGGED, build_parser, main
from audiopipe.corpus.demo import VOICES, place_prompts
from audiopipe.features.names import FeatureAlias

# commands and public functions that take a feature name, each walked below
COMMANDS = {"shard": "--features", "export-hf": "--features", "export-lhotse": "--features", "tokens": "--feature",
            "bench-loader": "--feature"}
FUNCTIONS = {"shard": ["features"], "make_loader": ["features", "length_feature", "collate_features"],
             "open_dataset": ["features"], "export_hf": ["features"], "export_lhotse": ["features"]}
# PadCollator pads whatever keys its items hold (item_transform may add new ones): item keys, not feature names.
NOT_FEATURE_NAMES = {"PadCollator"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 real prompts (2 voices) sharded by the command line with the alias names: mel, fbank and pcm."""
    corpus = tmp_path_factory.mktemp("names_corpus")
    for v in VOICES[:2]:
        place_prompts(v, corpus / v.speaker, 3)
    out = tmp_path_factory.mktemp("names_shards") / "s"
    assert main(["shard", "--corpus", str(corpus), "--out", str(out), "--features", "vocos_mel,kaldi_fbank,pcm",
                 "--workers", "0"]) == 0
    return out


def _sub(command: str) -> argparse.ArgumentParser:
    p = build_parser([command])
    return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[command]


def test_the_walk_covers_every_command_and_function_that_takes_a_feature_name():
    commands = {c: o for c in ["shard", "verify", "inspect", *PLUGGED] for a in _sub(c)._actions
                for o in a.option_strings if o in ("--feature", "--features")}
    assert commands == COMMANDS
    functions = {}
    for name in ap.__all__:
        obj = getattr(ap, name)
        if name == "__version__" or name in NOT_FEATURE_NAMES or not callable(obj):
            continue
        try:
            params = [p for p in inspect.signature(obj).parameters if "feature" in p]
        except ValueError:  # a builtin exception class
            continue
        if params:
            functions[name] = params
    assert functions == FUNCTIONS


def _aliases_noted(call, *args, **kwargs):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = call(*args, **kwargs)
    return out, [str(x.message) for x in w if issubclass(x.category, FeatureAlias)]


def test_shard_takes_both_names_and_notes_the_alias(shards, capsys, tmp_path):
    from audiopipe.shard.api import build_job
    from audiopipe.shard.manifest import read_manifest

    assert sorted(s["kind"] for s in read_manifest(shards)["features"].values()) == \
        ["kaldi_fbank", "pcm", "vocos_mel"]
    job, notes = _aliases_noted(build_job, shards.parent, tmp_path / "a", features="vocos_mel,kaldi_fbank")
    plain, none = _aliases_noted(build_job, shards.parent, tmp_path / "b", features=["mel", "fbank"])
    assert job.features == plain.features and none == []
    assert notes == ["feature 'vocos_mel' is 'mel'; 'mel' is its name everywhere",
                     "feature 'kaldi_fbank' is 'fbank'; 'fbank' is its name everywhere"]
    with pytest.raises(ap.AudiopipeError, match="unknown feature mfcc; choose from mel, slaney_mel, fbank, f0"):
        build_job(shards.parent, tmp_path / "c", features="mfcc")
    # the command line prints the note as one line, in its own words
    assert main(["shard", "--corpus", str(shards.parent), "--out", str(tmp_path / "d"), "--features",
                 "kaldi_fbank,mfcc"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "audiopipe: note: feature 'kaldi_fbank' is 'fbank'; 'fbank' is its name everywhere",
        "audiopipe: error: unknown feature mfcc; choose from mel, slaney_mel, fbank, f0, energy, pcm"]


def test_the_loader_and_the_dataset_read_both_names(shards):
    loader, notes = _aliases_noted(ap.make_loader, shards, ["vocos_mel", "kaldi_fbank"], max_frames=4000,
                                   length_feature="vocos_mel", collate_features=["vocos_mel", "kaldi_fbank"],
                                   shuffle=False)
    batch = next(iter(loader))
    plain = next(iter(ap.make_loader(shards, ["mel", "fbank"], max_frames=4000, shuffle=False)))
    assert batch["id"] == plain["id"] and (batch["fbank"] == plain["fbank"]).all()
    assert "vocos_mel" not in batch and len(notes) >= 2
    ds, notes = _aliases_noted(ap.open_dataset, shards, ["kaldi_fbank"])
    assert set(ds[0]) >= {"fbank"} and notes == [
        "feature 'kaldi_fbank' is read as the column 'fbank'; 'fbank' is its name everywhere"]


def test_the_exports_take_both_names(shards, tmp_path, capsys):
    a, notes = _aliases_noted(ap.export_hf, shards, tmp_path / "a", features=["kaldi_fbank"])
    b = ap.export_hf(shards, tmp_path / "b", features=["fbank"])
    assert a["arrays"] == b["arrays"] == {"fbank": 80} and notes
    c = ap.export_lhotse(shards, tmp_path / "c", features=["vocos_mel"], audio="none")
    assert set(c["arrays"]) == {"mel"}
    assert main(["export-hf", "--shards", str(shards), "--out", str(tmp_path / "d"), "--features", "vocos_mel"]) == 0
    assert "audiopipe: note: feature 'vocos_mel' is read as the column 'mel'" in capsys.readouterr().err


def test_tokens_and_bench_loader_take_both_names(shards, tmp_path):
    from audiopipe.bench.loader_bench import _corpus_info
    from audiopipe.shard.manifest import read_manifest
    from audiopipe.tokens.kmeans import resolve_feature

    m = read_manifest(shards)
    assert resolve_feature(m, "kaldi_fbank", shards) == resolve_feature(m, "fbank", shards)
    assert resolve_feature(m, "vocos_mel", shards)["name"] == "mel"
    assert _corpus_info(shards, "vocos_mel") == _corpus_info(shards, "mel")
