"""The extraction hot path (audiopipe.shard.build) without Ray: shared STFTs, and its output against the
features computed one by one."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pyarrow as pa
import torch

from audiopipe.corpus.discover import discover
from audiopipe.decode.audio import DecodeLimits, load_audio, resample
from audiopipe.features.energy import Energy
from audiopipe.features.mel import VocosMel
from audiopipe.shard.build import build_shard
from audiopipe.shard.job import Job
from audiopipe.shard.plan import PlannedUtt, WorkUnit


def _unit(root, n=6) -> WorkUnit:
    utts = [PlannedUtt(u.id, u.path, u.source, u.speaker, u.text, u.duration) for u in discover(root).utterances]
    return WorkUnit("shard-000000", 0, utts[:n])


def test_a_mel_and_an_energy_of_one_framing_share_one_stft(espeak_corpus, tmp_path, monkeypatch):
    unit = _unit(espeak_corpus.root)
    job = Job(corpus=str(espeak_corpus.root), out=str(tmp_path), presets=["custom"],
              features=[("vocos_mel", {}), ("energy", {})], limits=asdict(DecodeLimits()), write_tar=False)
    calls = []
    real_stft = torch.stft

    def counting_stft(*a, **k):
        calls.append(1)
        return real_stft(*a, **k)

    monkeypatch.setattr(torch, "stft", counting_stft)
    rec = build_shard(unit, job)
    monkeypatch.undo()
    assert rec["rows"] == len(unit.utterances) and len(calls) == len(unit.utterances)

    with pa.memory_map(str(tmp_path / rec["arrow"]["path"])) as src:
        t = pa.ipc.open_file(src).read_all()
    mel, energy = VocosMel(), Energy()
    for i, u in enumerate(unit.utterances):
        assert t.column("id")[i].as_py() == u.id
        wav, sr = load_audio(u.path)
        x = resample(wav, sr, 24000)
        assert np.array_equal(np.asarray(t.column("mel")[i].values).reshape(100, -1), mel(x)["mel"])
        assert np.array_equal(np.asarray(t.column("energy")[i].values), energy(x)["energy"])


def test_shard_checksums_are_taken_while_writing(espeak_corpus, tmp_path, monkeypatch):
    # The done record's sizes and sha256 come from the bytes as they were written: no file is read back
    # (reading a shard back cost ~2 % of a worker), and they equal what a reader computes from disk.
    import audiopipe.shard.build as build
    import audiopipe.shard.checksum as checksum
    from audiopipe.shard.checksum import sha256_file

    def no_reread(path, *a, **k):
        raise AssertionError(f"{path} was read back to hash it")

    for mod in (build, checksum):
        if hasattr(mod, "sha256_file"):
            monkeypatch.setattr(mod, "sha256_file", no_reread)
    unit = _unit(espeak_corpus.root, n=4)
    job = Job(corpus=str(espeak_corpus.root), out=str(tmp_path), presets=["f5tts"],
              features=[("vocos_mel", {})], limits=asdict(DecodeLimits()), write_tar=True)
    rec = build_shard(unit, job)
    monkeypatch.undo()
    assert rec["rows"] == 4
    for kind in ("arrow", "tar"):
        path = tmp_path / rec[kind]["path"]
        assert rec[kind]["bytes"] == path.stat().st_size
        assert rec[kind]["sha256"] == sha256_file(path)
