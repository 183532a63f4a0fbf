"""Per-length-bucket batch budgets (audiopipe/sampler/bucket_budget.py) read from a file and planned by the sampler."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.bucket_budget import FORMAT, Bucket, BucketBudget, BucketBudgetError

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# What a calibration on a GPU writes: short batches may hold many items, long ones fewer frames.
SYNTHETIC = {"format": FORMAT,
             "buckets": [{"max_len": 100, "max_frames": 6000, "max_items": 80},
                         {"max_len": 300, "max_frames": 9000, "max_items": 64},
                         {"max_len": 800, "max_frames": 8000, "max_items": 64}],
             "source": {"model": "synthetic", "device": "none"}}


@pytest.fixture
def budget_file(tmp_path):
    path = tmp_path / "budget.json"
    path.write_text(json.dumps(SYNTHETIC))
    return path


def lengths_of(seed: int, n: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.round(np.exp(rng.normal(np.log(120), 0.8, n))).astype(np.int64)
    x[rng.random(n) < 0.01] = 0  # a few empty ones: dropped and counted as with one budget
    return x


def limit(m: np.ndarray) -> np.ndarray:
    """By hand: a batch whose longest item has m frames holds min(max_frames // m, max_items) of its bucket, and
    never more than a batch at the top of a shorter bucket may (the running minimum); 0 beyond the last bucket."""
    out = []
    for x in np.atleast_1d(m).tolist():
        caps = [min(b["max_frames"] // min(x, b["max_len"]), b["max_items"])
                for b in SYNTHETIC["buckets"] if b["max_len"] < x or b is first_bucket_holding(x)]
        out.append(min(caps) if x <= SYNTHETIC["buckets"][-1]["max_len"] else 0)
    return np.asarray(out)


def first_bucket_holding(x: int) -> dict | None:
    return next((b for b in SYNTHETIC["buckets"] if x <= b["max_len"]), None)


def test_file_round_trip_and_capacities_by_hand(budget_file, tmp_path):
    b = BucketBudget.read(budget_file)
    assert b.buckets[1] == Bucket(300, 9000, 64) and b.source["model"] == "synthetic"
    m = np.arange(1, 900)
    assert np.array_equal(b.capacities(m), limit(m))
    # A bucket that alone would allow more (9000 // 101 = 89 > 60 = 6000 // 100) is held to the shorter one's.
    assert b.capacities(np.array([100, 101]))[1] == 60
    assert b.longest_alone() == 800 and list(b.fits_alone(np.array([800, 801]))) == [True, False]
    assert b.max_frames == 9000
    # cost <= max_frames exactly when the batch is valid, as with one global budget
    caps = b.capacities(m)
    assert np.all(b.cost(caps, m)[caps > 0] <= b.max_frames)
    assert np.all(b.cost(caps + 1, m) > b.max_frames)
    again = BucketBudget.read(b.write(tmp_path / "copy.json"))
    assert again == b and again.to_dict() == SYNTHETIC
    assert b.capped(10).capacities(np.array([5]))[0] == 10


@pytest.mark.parametrize("doc, says", [
    ({"format": "other"}, "not a bucket budget"),
    ({"format": FORMAT, "buckets": []}, "non-empty list"),
    ({"format": FORMAT, "buckets": [{"max_len": 10, "max_frames": 100}]}, "needs max_len, max_frames and max_items"),
    ({"format": FORMAT, "buckets": [{"max_len": 10, "max_frames": 100, "max_items": 0}]}, "max_items must be"),
    ({"format": FORMAT, "buckets": [{"max_len": 20, "max_frames": 100, "max_items": 5},
                                    {"max_len": 20, "max_frames": 100, "max_items": 5}]}, "rise strictly"),
    ([1, 2], "not a bucket budget"),
])
def test_bad_files_are_one_line_errors(tmp_path, doc, says):
    path = tmp_path / "b.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BucketBudgetError, match=says) as e:
        BucketBudget.read(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    path.write_text("{not json")
    with pytest.raises(BucketBudgetError, match="not readable JSON"):
        BucketBudget.read(path)
    with pytest.raises(BucketBudgetError, match="no such file"):
        BucketBudget.read(tmp_path / "missing.json")


@FAST
@given(seed=st.integers(0, 2**16), world=st.integers(1, 4), max_items=st.sampled_from([None, 8]))
def test_sampler_keeps_every_batch_within_its_bucket_and_every_item_once(seed, world, max_items):
    budget = BucketBudget.from_dict(SYNTHETIC)
    lengths = lengths_of(seed)
    seen: Counter = Counter()
    for rank in range(world):
        s = BucketBatchSampler(lengths, budget, max_items=max_items, seed=seed, rank=rank, world_size=world)
        for batch in s:
            m = int(lengths[batch].max())
            allowed = int(limit(np.array([m]))[0])
            assert 1 <= len(batch) <= (min(allowed, max_items) if max_items else allowed)
            seen.update(batch)
    d = s.diagnostics
    too_long = np.flatnonzero(lengths > 800)
    assert d.dropped_too_long == too_long.size and set(d.too_long_indices) == set(too_long)
    kept = np.flatnonzero((lengths > 0) & (lengths <= 800))
    assert set(seen) == set(kept.tolist())
    assert sum(seen.values()) == kept.size + d.repeated
    assert d.max_fill <= 1.0


def test_short_buckets_get_bigger_batches_than_one_global_budget():
    """The point of per-bucket budgets: one global budget that fits every bucket (the smallest bucket's frames)
    makes more, smaller batches of the short items than the per-bucket budget does."""
    lengths = lengths_of(1)
    lengths = lengths[(lengths > 0) & (lengths <= 800)]
    per_bucket = BucketBatchSampler(lengths, BucketBudget.from_dict(SYNTHETIC), seed=0)
    global_ = BucketBatchSampler(lengths, min(b["max_frames"] for b in SYNTHETIC["buckets"]), seed=0)
    assert per_bucket.diagnostics.num_batches < 0.9 * global_.diagnostics.num_batches
    short = [len(b) for b in per_bucket if lengths[b].max() <= 50]
    assert max(short) == 80  # the first bucket's own item limit, unreachable under a 6000-frame global budget


def test_state_carries_the_buckets_and_resumes_exactly(budget_file):
    lengths = lengths_of(2)
    budget = BucketBudget.read(budget_file)
    s = BucketBatchSampler(lengths, budget, seed=3)
    full = list(s)
    state = s.state_dict(consumed_batches=5)
    assert state["config"]["buckets"] == [[100, 6000, 80], [300, 9000, 64], [800, 8000, 64]]
    t = BucketBatchSampler(lengths, BucketBudget.read(budget_file), seed=3)
    t.load_state_dict(json.loads(json.dumps(state)))
    assert list(t) == full[5:]
    other = dict(SYNTHETIC, buckets=[dict(b, max_frames=b["max_frames"] - 1) for b in SYNTHETIC["buckets"]])
    u = BucketBatchSampler(lengths, BucketBudget.from_dict(other), seed=3)
    with pytest.raises(ValueError, match="another sampler config"):
        u.load_state_dict(state)


def test_quadratic_is_refused_with_a_bucket_budget():
    with pytest.raises(ValueError, match="leave quadratic at 0"):
        BucketBatchSampler(np.array([10, 20]), BucketBudget.from_dict(SYNTHETIC), quadratic=1e-3)


def test_make_loader_and_the_trainers_flag_plan_with_a_bucket_budget(tmp_path, budget_file):
    """make_loader takes the budget where max_frames goes; core's --bucket-budget reads the file into it, and a
    bad file ends a trainer in one line."""
    import core
    from test_reader import write_shards

    shards = write_shards(tmp_path / "shards", (30, 25), seed=5, mel_frames=(20, 700), tars=False)
    from audiopipe.reader.loader import make_loader

    loader = make_loader(shards.root, ["mel"], max_frames=BucketBudget.read(budget_file), seed=1, passes=1)
    seen = []
    for batch in loader:
        n, m = batch["mel"].shape[0], int(batch["mel_lengths"].max())
        assert n <= limit(np.array([m]))[0]
        seen += batch["index"]
    lengths = np.array([r["arrays"]["mel"].shape[1] for r in shards.rows])
    assert sorted(seen) == np.flatnonzero(lengths <= 800).tolist()
    assert loader.sampler.budget.max_frames == 9000  # what shared memory is sized by: the largest bucket

    cfg, _ = core.parse_args("t", argv=["--shards", str(shards.root), "--bucket-budget", str(budget_file),
                                        "--out", str(tmp_path / "run")])
    made = core._make_loader(cfg, core.Dist(), ["mel"], None, None, {}, tmp_path / "run")
    assert isinstance(made.sampler.budget, BucketBudget) and made.sampler.budget.buckets[0].max_items == 80
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    cfg, _ = core.parse_args("t", argv=["--shards", str(shards.root), "--bucket-budget", str(tmp_path / "bad.json"),
                                        "--out", str(tmp_path / "run2"), "--max-steps", "1"])
    with pytest.raises(SystemExit, match=r"test: error: bucket budget .*bad.json: not a bucket budget"):
        core.train(__import__("torch").nn.Linear(1, 1), lambda m, b: None, cfg, core.Dist(), features=["mel"],
                   log_name="test")
