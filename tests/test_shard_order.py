"""Exchangeable shards: utterances go into shards in a seeded pseudo-random order (audiopipe/shard/plan.py), so a
shard is a random sample of the corpus, not one speaker's stretch of ids; the order is deterministic (reruns
byte-identical) and recorded in the manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audiopipe.shard.plan import PlannedUtt, order_record, plan_units, shard_order
from shard_helpers import shard, tree_digest


def _utts(n: int, speakers: int = 10) -> list[PlannedUtt]:
    # Ids sort speaker by speaker, as most corpora's do: id order puts one speaker's utterances together.
    return [PlannedUtt(f"spk{i * speakers // n:02d}/utt{i:05d}", f"{i}.wav", f"{i}.wav", f"spk{i * speakers // n:02d}",
                       "", 2.0) for i in range(n)]


def test_shards_mix_speakers_and_the_order_is_a_pure_function_of_seed_and_ids():
    utts = _utts(2000)
    by_id = plan_units(utts, 1000.0, 100_000, seed=None)  # 50 utterances a shard
    mixed = plan_units(utts, 1000.0, 100_000, seed=0)
    assert len(by_id) == len(mixed) == 40
    speakers = lambda units: [len({u.speaker for u in w.utterances}) for w in units]  # noqa: E731
    assert max(speakers(by_id)) <= 2  # id order: one speaker (two at a boundary) per shard
    assert min(speakers(mixed)) >= 8  # seeded order: nearly every speaker in every shard
    # Deterministic, whatever order the utterances came in; another seed, another order.
    again = plan_units(list(reversed(utts)), 1000.0, 100_000, seed=0)
    assert [[u.id for u in w.utterances] for w in again] == [[u.id for u in w.utterances] for w in mixed]
    other = plan_units(utts, 1000.0, 100_000, seed=1)
    assert [u.id for u in other[0].utterances] != [u.id for u in mixed[0].utterances]
    # An utterance's place depends on its id alone: adding utterances keeps the others' relative order.
    base = [u.id for u in shard_order(utts[:1000], 0)]
    grown = [u.id for u in shard_order(utts, 0)]
    assert [i for i in grown if i in set(base)] == base
    assert order_record(0) == {"order": "shuffled", "seed": 0, "key": "xxh3_64(utf-8 id, seed), then id"}
    assert order_record(None) == {"order": "id"}
    with pytest.raises(ValueError, match="seed must be an integer"):
        shard_order(utts, -1)


def test_a_shard_job_records_the_order_and_reruns_byte_identical(synthetic_corpus, tmp_path):
    feats = [("vocos_mel", {})]
    a, b = tmp_path / "a", tmp_path / "b"
    shard(synthetic_corpus.root, a, feats, shard_bytes=60_000)
    shard(synthetic_corpus.root, b, feats, shard_bytes=60_000, workers=2)  # another engine, the same bytes
    assert tree_digest(a) == tree_digest(b)
    m = json.loads((a / "manifest.json").read_text())
    assert m["shard_order"] == {"order": "shuffled", "seed": 0, "key": "xxh3_64(utf-8 id, seed), then id"}
    from audiopipe.index.lengths import LengthIndex

    ids = LengthIndex.open(a).table.column("id").to_pylist()
    assert len(m["shards"]) > 1 and ids != sorted(ids)  # not id order
    assert ids == [u.id for u in shard_order([_as_planned(i) for i in ids], 0)]


def _as_planned(i: str) -> PlannedUtt:
    return PlannedUtt(i, "", "", "", "", 0.0)
