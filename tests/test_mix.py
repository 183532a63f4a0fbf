"""Weighted mixing of corpora (issue 11.2): make_loader([a, b], weights=[1, 3]) and --shards a,b --weights 1,3.

Sampler level (synthetic lengths, no audio): every kept item is seen floor(w) or floor(w)+1 times per epoch,
the extra draw comes within half an utterance of the weight's fractional hours, per-corpus shares of the epoch's
hours come within 1 % of what the weights ask, the same on every rank and every resume, exact mid-epoch resume,
and a re-deal under another world size that loses and repeats nothing. Loader level (real Arrow shards): the
batches hold the right rows of each corpus, the one-line errors (weights, config mismatch, a weight on a corpus
with nothing to plan). Trainer level: two ranks under real torchrun on --shards a,s3://.../b --weights 1,2 (one
corpus on a real S3 server), resumed bit-exactly from a mid-run checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audiopipe.reader.errors import ConfigMismatch
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.loader import make_loader
from audiopipe.reader.mixture import check_same_features
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.corpus_weights import CorpusWeights, check_weights
from launch import run_group
from shard_helpers import shard
from reader_helpers import write_shards

HERE = Path(__file__).resolve().parent
pytest_plugins = ["s3server"]
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SECONDS_PER_FRAME = 0.01


def _corpora(sizes, seed=0, spans=None):
    """Lengths of several synthetic corpora, back to back, and each position's corpus number."""
    rng = np.random.default_rng(seed)
    spans = spans or [(20, 1500)] * len(sizes)
    lengths = np.concatenate([rng.integers(lo, hi, n) for n, (lo, hi) in zip(sizes, spans)]).astype(np.int64)
    corpus = np.repeat(np.arange(len(sizes)), sizes)
    return lengths, corpus


def _sampler(lengths, corpus, weights, *, seed=0, rank=0, world=1, max_frames=4000):
    mix = CorpusWeights(corpus, lengths * SECONDS_PER_FRAME, weights, [f"c{k}" for k in range(len(weights))],
                        seed=seed)
    return BucketBatchSampler(lengths, max_frames, seed=seed, rank=rank, world_size=world, epoch_items=mix), mix


def _epoch(lengths, corpus, weights, epoch, world, seed=0):
    """Every rank's batches of one epoch, and rank 0's sampler."""
    out = []
    for r in range(world):
        s, _ = _sampler(lengths, corpus, weights, seed=seed, rank=r, world=world)
        s.set_epoch(epoch)
        out.append(list(s))
        if r == 0:
            first = s
    return out, first


# ---- sampler level -----------------------------------------------------------------------------------------

@FAST
@given(sizes=st.lists(st.integers(1, 60), min_size=1, max_size=3),
       weights=st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.7, 2.0, 3.0]), min_size=3, max_size=3),
       epoch=st.integers(0, 3), world=st.integers(1, 3), seed=st.integers(0, 5))
def test_every_item_is_seen_as_often_as_its_weight_says(sizes, weights, epoch, world, seed):
    weights = weights[:len(sizes)]
    if not any(weights):
        weights[0] = 1.0
    lengths, corpus = _corpora(sizes, seed)
    ranks, s0 = _epoch(lengths, corpus, weights, epoch, world, seed)
    assert len({len(r) for r in ranks}) == 1  # equal batches per rank
    assert all(len(set(b)) == len(b) for r in ranks for b in r)  # copies of an utterance never share a batch
    seen = Counter(i for r in ranks for b in r for i in b)
    items = Counter(s0.epoch_items(epoch).tolist())
    # The sampler plans exactly the weights' items (plus copies only when items < ranks, counted).
    assert all(seen[i] >= n for i, n in items.items())
    assert sum(seen.values()) == sum(items.values()) + s0.diagnostics.repeated
    for k, w in enumerate(weights):
        members = np.flatnonzero(corpus == k)
        counts = np.array([items[int(i)] for i in members])
        full, frac = int(np.floor(w)), w - np.floor(w)
        assert set(counts.tolist()) <= {full, full + 1}
        extra_s = float(lengths[members[counts == full + 1]].sum()) * SECONDS_PER_FRAME
        target = frac * float(lengths[members].sum()) * SECONDS_PER_FRAME
        # The fractional part is drawn by hours: within half an utterance of the target.
        assert abs(extra_s - target) <= lengths[members].max() * SECONDS_PER_FRAME / 2 + 1e-9


def test_per_corpus_hour_shares_are_within_one_percent_of_the_weights():
    """Three corpora of different sizes and length spreads, weights 1, 2.5 and 0.4, planned for 4 ranks: the
    share of the epoch's planned hours each corpus gets (read from the batches themselves) is within 1 %
    (relative) of weight * hours / sum(weight * hours), every epoch; and the loader's record says the same."""
    sizes, weights = [20000, 6000, 3000], [1.0, 2.5, 0.4]
    lengths, corpus = _corpora(sizes, 7, spans=[(50, 600), (200, 1500), (400, 3000)])
    hours = np.array([lengths[corpus == k].sum() for k in range(3)], dtype=np.float64)
    target = np.array(weights) * hours / (np.array(weights) * hours).sum()
    for epoch in (0, 1):
        ranks, s0 = _epoch(lengths, corpus, weights, epoch, world=4, seed=3)
        flat = np.array([i for r in ranks for b in r for i in b])
        got = np.bincount(corpus[flat], weights=lengths[flat], minlength=3)
        got /= got.sum()
        assert np.all(np.abs(got - target) <= 0.01 * target), (got, target)
        shares = s0.epoch_items.shares(epoch)
        assert [x.occurrences for x in shares] == np.bincount(corpus[flat], minlength=3).tolist()
        assert np.allclose([x.share for x in shares], got, rtol=1e-9)
        assert [x.full_repeats for x in shares] == [1, 2, 0] and shares[2].extra_items < sizes[2]


def test_the_draw_is_a_function_of_seed_and_epoch_only():
    """Identical on every rank and every fresh process (new objects), a new half every epoch, another with
    another seed."""
    lengths, corpus = _corpora([200, 300], 1)
    draw = lambda seed, epoch: _sampler(lengths, corpus, [0.5, 1.5], seed=seed)[1](epoch)  # noqa: E731
    assert np.array_equal(draw(0, 0), draw(0, 0))
    assert not np.array_equal(np.sort(draw(0, 0)), np.sort(draw(0, 1)))
    assert not np.array_equal(np.sort(draw(0, 0)), np.sort(draw(1, 0)))
    ranks, _ = _epoch(lengths, corpus, [0.5, 1.5], 2, world=3)
    again, _ = _epoch(lengths, corpus, [0.5, 1.5], 2, world=3)
    assert [[b for b in r] for r in ranks] == [[b for b in r] for r in again]


def test_a_mid_epoch_resume_continues_with_exactly_the_remaining_batches():
    lengths, corpus = _corpora([150, 90], 2)
    weights = [1.0, 2.5]
    for rank in (0, 1):
        s, _ = _sampler(lengths, corpus, weights, seed=4, rank=rank, world=2)
        s.set_epoch(1)
        full = list(s)
        it = iter(s)
        for _ in range(3):
            next(it)
        state = json.loads(json.dumps(s.state_dict(consumed_batches=3)))
        fresh, _ = _sampler(lengths, corpus, weights, seed=4, rank=rank, world=2)
        fresh.load_state_dict(state)
        assert list(fresh) == full[3:]


def test_a_resume_under_another_world_size_loses_and_repeats_nothing():
    """2 ranks train 4 steps of a mixed epoch; 3 ranks finish it: together exactly the epoch's items."""
    lengths, corpus = _corpora([150, 90], 3)
    weights = [0.5, 2.0]
    before = []
    for r in range(2):
        s, _ = _sampler(lengths, corpus, weights, seed=5, rank=r, world=2)
        s.set_epoch(0)
        before += [i for b in list(s)[:4] for i in b]
        state = json.loads(json.dumps(s.state_dict(consumed_batches=4)))
    after = []
    counts = set()
    for r in range(3):
        s, mix = _sampler(lengths, corpus, weights, seed=5, rank=r, world=3)
        s.load_state_dict(state)
        mine = list(s)
        counts.add(len(mine))
        after += [i for b in mine for i in b]
    assert len(counts) == 1
    assert Counter(before + after) == Counter(mix(0).tolist())


def test_a_state_saved_under_other_weights_is_refused():
    lengths, corpus = _corpora([50, 50], 4)
    s, _ = _sampler(lengths, corpus, [1.0, 2.0])
    s.set_epoch(0)
    state = s.state_dict(consumed_batches=0)
    other, _ = _sampler(lengths, corpus, [1.0, 3.0])
    with pytest.raises(ValueError, match="another sampler config.*epoch_items"):
        other.load_state_dict(state)


@pytest.mark.parametrize("weights, says", [
    ([1.0], "1 weights for 2 corpora (a, b): give one weight per corpus"),
    ([1.0, -2.0], "weight -2.0 of corpus b must be a finite number >= 0"),
    ([1.0, float("nan")], "weight nan of corpus b must be a finite number >= 0"),
    ([0, 0], "all weights are 0 (a, b): an epoch would hold nothing"),
    (["1", "x"], "weight 'x' of corpus b is not a number"),
    (None, "corpus b is listed twice: list it once and give it the sum of the weights"),
], ids=["count", "negative", "nan", "all-zero", "not-a-number", "twice"])
def test_bad_weights_are_one_line_errors(weights, says):
    with pytest.raises(ValueError) as e:
        check_weights(weights, ["a", "b"] if weights is not None else ["b", "a", "b"])
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_a_weight_on_a_corpus_with_nothing_to_plan_is_refused():
    corpus = np.array([0, 0, 0])  # corpus 1 is empty
    with pytest.raises(ValueError, match=r"^corpus b has weight 2 but no utterance to train on"):
        CorpusWeights(corpus, np.ones(3), [1, 2], ["a", "b"])
    CorpusWeights(corpus, np.ones(3), [1, 0], ["a", "b"])  # weight 0: left out, fine


# ---- loader level (real Arrow shards) ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    return write_shards(root / "a", (5, 4), seed=1, tars=False), write_shards(root / "b", (3, 6), seed=2, tars=False)


def test_the_loader_reads_each_corpus_as_often_as_weighted(two):
    a, b = two
    loader = make_loader([a.root, b.root], ["mel"], max_frames=2000, weights=[1, 2.5], seed=3)
    rows = a.rows + b.rows
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        seen = Counter()
        for batch in loader:
            for j, (i, corpus) in enumerate(zip(batch["index"], batch["corpus"])):
                seen[i] += 1
                assert corpus == str(a.root if i < len(a.rows) else b.root)
                assert batch["id"][j] == rows[i]["id"]
                want = rows[i]["arrays"]["mel"]
                got = batch["mel"][j, :, : batch["mel_lengths"][j]].numpy()
                assert np.array_equal(got, want)
        assert all(seen[i] == 1 for i in range(len(a.rows)))
        counts = [seen[i] for i in range(len(a.rows), len(rows))]
        assert set(counts) == {2, 3}
        shares = loader.mix.shares(epoch)
        assert shares[1].extra_items == counts.count(3) and shares[1].full_repeats == 2
        assert loader.mix_summary().startswith(f"epoch {epoch} mix: {a.root}: weight 1, 9 items")


def test_workers_and_prefetch_read_the_same_mix(two):
    a, b = two
    kw = dict(max_frames=2000, weights=[1, 2.5], seed=3)
    plain = make_loader([a.root, b.root], ["mel"], **kw)
    busy = make_loader([a.root, b.root], ["mel"], num_workers=2, prefetch=2, **kw)
    for loader in (plain, busy):
        loader.set_epoch(1)
    assert [bt["index"] for bt in busy] == [bt["index"] for bt in plain]


def test_different_phone_tables_do_not_mix(two):
    """Phone ids index the manifest's table: two corpora with different tables would mean different phones under
    one id. (The shards here have no phones column: the check reads the manifests, given two tables.)"""
    a, b = two
    ds = [ShardDataset(a.root, ["mel"]), ShardDataset(b.root, ["mel"])]
    ds[0].manifest["phones"] = {"vocab": ["AA", "AE", "AH"]}
    ds[1].manifest["phones"] = {"vocab": ["a1", "a2"]}
    with pytest.raises(ConfigMismatch, match=r"^feature 'phones' differs between corpora a and b: their phone "
                                             r"tables differ \(3 vs 2 symbols\)"):
        check_same_features(ds, ["a", "b"], ["mel", "phones"])
    check_same_features(ds, ["a", "b"], ["mel"])  # not read: not compared
    ds[1].manifest["phones"] = {"vocab": ["AA", "AE", "AH"]}
    check_same_features(ds, ["a", "b"], ["mel", "phones"])


def test_a_mix_of_one_corpus_at_weight_one_is_the_plain_plan(two):
    """The hook changes nothing by itself: [a] with weight 1 gives the plain loader's batches, every epoch."""
    a, _ = two
    # passes=1: a mix plans one pass an epoch; the plain loader would plan several on this small corpus.
    plain = make_loader(a.root, ["mel"], max_frames=1500, seed=2, world_size=2, rank=1, passes=1)
    mixed = make_loader([a.root], ["mel"], max_frames=1500, seed=2, world_size=2, rank=1, weights=[1])
    for epoch in (0, 3):
        plain.set_epoch(epoch)
        mixed.set_epoch(epoch)
        assert list(mixed.sampler) == list(plain.sampler)


def test_one_folder_is_read_exactly_as_before(two):
    a, _ = two
    plain = make_loader(a.root, ["mel"], max_frames=2000, seed=3)
    assert plain.mix is None and plain.sampler.epoch_items is None and plain.mix_summary() is None
    assert "epoch_items" not in plain.state_dict()["config"]
    with pytest.raises(ValueError, match="weights= goes with a list of shard folders"):
        make_loader(a.root, ["mel"], max_frames=2000, weights=[2])


def test_a_subset_of_the_union_is_weighted_per_corpus(two):
    """subset= holds global indices over the union; the weights count only the subset's items."""
    a, b = two
    subset = np.array([0, 2, 4, 9, 10, 11], dtype=np.int64)  # 3 from a, 3 from b
    loader = make_loader([a.root, b.root], ["mel"], max_frames=2000, weights=[1, 2], subset=subset)
    loader.set_epoch(0)
    seen = Counter(i for batch in loader for i in batch["index"])
    assert seen == Counter({0: 1, 2: 1, 4: 1, 9: 2, 10: 2, 11: 2})


def test_a_corpus_too_long_for_the_budget_cannot_carry_a_weight(two, tmp_path):
    a, _ = two
    long = write_shards(tmp_path / "long", (3,), seed=5, mel_frames=(900, 1000), tars=False)
    with pytest.raises(ValueError, match=rf"^corpus {long.root} has weight 1 but no utterance to train on"):
        make_loader([a.root, long.root], ["mel"], max_frames=800)
    with pytest.raises(ValueError, match="2 weights for 1 corpora"):
        make_loader([a.root], ["mel"], max_frames=800, weights=[1, 1])


# ---- real extraction: config mismatch, and two ranks under torchrun ------------------------------------------

@pytest.fixture(scope="module")
def halves(synthetic_corpus, tmp_path_factory):
    """The synthetic corpus cut in two corpora (spk_a + spk_b, spk_c + chirps), each sharded with vocos mel."""
    root = tmp_path_factory.mktemp("halves")
    out = []
    for name, parts in (("a", ("spk_a", "spk_b")), ("b", ("spk_c", "chirps"))):
        src = root / f"{name}_src"
        for p in parts:
            shutil.copytree(synthetic_corpus.root / p, src / p)
        shard(src, root / name, [("vocos_mel", {})])
        out.append(root / name)
    return out


def test_corpora_extracted_with_other_mel_settings_do_not_mix(halves, tmp_path):
    a, b = halves
    other = tmp_path / "b_fmin"
    shard(b.parent / "b_src", other, [("vocos_mel", {"fmin": 30.0})])
    with pytest.raises(ConfigMismatch) as e:
        make_loader([a, other], ["mel"], max_frames=2000)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"feature 'mel' differs between corpora {a} (config ") and f"and {other} (config " in msg
    assert "params.fmin 0.0 vs 30.0" in msg


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
FIXTURE = HERE / "core_trainer_fixture.py"
ENV = dict(os.environ, OMP_NUM_THREADS="1",
           PYTHONPATH=os.pathsep.join([str(HERE.parent / "trainers"), *filter(None, [os.environ.get("PYTHONPATH")])]))


def _train(shards: str, out: Path, env: dict[str, str], *extra: str):
    r = run_group(TORCHRUN + [str(FIXTURE), "--shards", shards, "--weights", "1,2", "--out", str(out),
                              "--log-every", "1", "--warmup-steps", "2", "--batch-frames", "1200",
                              "--max-steps", "4", "--ckpt-every", "2", *extra], timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r, [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_two_ranks_train_on_a_weighted_mix_of_a_folder_and_an_s3_prefix_and_resume_exactly(halves, s3, tmp_path):
    """--shards a,s3://.../b --weights 1,2 under torchrun, b read from a real S3 server on 127.0.0.1: rank 0
    reports the mix (a once, b twice), both ranks train, and a run resumed from the step-2 checkpoint logs exactly
    the straight run's losses for steps 3 and 4 and ends with the same weights."""
    from s3server import upload

    a, b = halves
    server, bucket = s3
    url = upload(server, b, f"{bucket}/b")
    shards, env = f"{a},{url}", {**ENV, **server.env()}
    r, straight = _train(shards, tmp_path / "straight", env)
    assert f"epoch 0 mix: {a}: weight 1, 6 items" in r.stdout and "-> x1 = " in r.stdout
    assert f"{url}: weight 2, 6 items" in r.stdout and "-> x2 = " in r.stdout
    assert [x["step"] for x in straight] == [1, 2, 3, 4] and all(x["world"] == 2 for x in straight)
    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copy(tmp_path / "straight" / "ckpt-00000002.pt", resumed_dir)
    r2, resumed = _train(shards, resumed_dir, env, "--resume")
    assert "resumed from ckpt-00000002.pt at step 2" in r2.stdout
    assert [x["step"] for x in resumed] == [3, 4]
    assert [x["loss"] for x in resumed] == [x["loss"] for x in straight[2:]]
    want = torch.load(tmp_path / "straight" / "ckpt-00000004.pt", weights_only=True)["model"]
    got = torch.load(resumed_dir / "ckpt-00000004.pt", weights_only=True)["model"]
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_trainer_flags_refuse_bad_mixes_in_one_line(capsys, tmp_path, monkeypatch):
    import core

    for argv, says in ((["--shards", "a", "--weights", "2"], "--weights goes with several --shards"),
                       (["--shards", "a,b", "--weights", "1"], "--weights: 1 weights for 2 corpora (a, b)"),
                       (["--shards", "a,b", "--weights", "1,-1"], "--weights: weight '-1' of corpus b must be"),
                       (["--shards", "a,,b"], "has an empty entry"),
                       (["--shards", "a,b", "--reader", "files"], "mixing several (--shards a,b) needs --reader mmap")):
        with pytest.raises(SystemExit):
            core.parse_args("t", argv=argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert says in err[-1] and err[-1].startswith("t: error: ") or says in err[-1], err
    for name in ("x", "y"):  # shard folders as far as the flags can tell
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    cfg, _ = core.parse_args("t", argv=["--shards", "x, y", "--weights", "1,0.5"])
    assert core.shard_dirs(cfg) == ["x", "y"]
