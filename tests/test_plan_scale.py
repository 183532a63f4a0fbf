"""The lazy epoch plan (sampler/pools.py): packing from histograms equals packing the items, a batch's items
are computed only when it is drawn, and resume / re-plan hold on corpora whose pools hold many batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.plan import BatchBudget, capacities, pack_runs, pack_sorted
from audiopipe.sampler.pools import EpochPlan, LengthOrder

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("positional_per_run", [0, 1 << 40])  # walking runs / searching positions
@given(st.lists(st.integers(1, 400), max_size=400), st.integers(20, 3000), st.sampled_from([0.0, 1e-3, 2e-4]),
       st.sampled_from([None, 1, 3, 16]))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_packing_runs_of_a_histogram_cuts_where_packing_the_sorted_items_does(positional_per_run, monkeypatch, lengths,
                                                                              max_frames, quadratic, max_items):
    from audiopipe.sampler import plan

    monkeypatch.setattr(plan, "POSITIONAL_PER_RUN", positional_per_run)
    budget = BatchBudget(max_frames, quadratic, max_items)
    lengths = np.asarray(lengths, dtype=np.int64)
    lengths = lengths[budget.fits_alone(lengths)]
    order = np.argsort(lengths, kind="stable")
    want = np.cumsum([b.size for b in pack_sorted(order, lengths, budget)], dtype=np.int64)
    values, counts = np.unique(lengths, return_counts=True)
    assert np.array_equal(pack_runs(counts, capacities(values, budget)), want)


@pytest.mark.parametrize("background", [False, True])  # sorted at once / on a thread
@given(st.lists(st.integers(0, 300), max_size=300), st.integers(1, 400))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_length_order_is_a_stable_sort_of_the_kept_items(background, monkeypatch, lengths, longest):
    from audiopipe.sampler import pools

    monkeypatch.setattr(pools, "BACKGROUND_SORT_FROM", 0 if background else 1 << 40)
    lengths = np.asarray(lengths, dtype=np.int64)
    order = LengthOrder.build(lengths, longest)
    keep = np.flatnonzero((lengths > 0) & (lengths <= longest))
    assert np.array_equal(order.by_len, keep[np.argsort(lengths[keep], kind="stable")])
    assert np.array_equal(np.repeat(order.values, order.counts), np.sort(lengths[keep]))


@pytest.mark.parametrize("compiled", [False, True])
@given(st.lists(st.integers(0, 300), min_size=1, max_size=200), st.data())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_length_order_of_a_selection_with_repeats(compiled, monkeypatch, lengths, data):
    from audiopipe.sampler import pools

    # A per-epoch selection (weighted mixing): some items drawn twice, some not at all, in any order.
    monkeypatch.setattr(pools, "COMPILED_SORT_FROM", 1 if compiled else 1 << 40)
    lengths = np.asarray(lengths, dtype=np.int64)
    items = np.asarray(data.draw(st.lists(st.integers(0, lengths.size - 1), max_size=300)), dtype=np.int64)
    order = LengthOrder.build(lengths, 250, items)
    keep = items[(lengths[items] > 0) & (lengths[items] <= 250)]
    assert order.by_len.tolist() == keep[np.argsort(lengths[keep], kind="stable")].tolist()


@pytest.mark.parametrize("compiled", [False, True])
def test_length_order_counting_sort_spans_several_chunks(compiled, monkeypatch):
    from audiopipe.sampler import pools

    # More items than one chunk of the numpy sort (4M): the cursor carries over between chunks. The compiled
    # sort (used from 8M items) must give the same order.
    monkeypatch.setattr(pools, "COMPILED_SORT_FROM", 1 if compiled else 1 << 40)
    lengths = np.random.default_rng(0).integers(0, 300, 4_300_000)
    order = LengthOrder.build(lengths, 250)
    keep = np.flatnonzero((lengths > 0) & (lengths <= 250))
    assert np.array_equal(order.by_len, keep[np.argsort(lengths[keep], kind="stable")])


@FAST
@given(st.integers(0, 2**16), st.integers(0, 600), st.integers(1, 20), st.integers(200, 3000),
       st.sampled_from([None, 4]))
def test_epoch_plan_rows_hold_every_kept_item_once_with_the_lengths_the_histograms_say(seed, n, pools, max_frames,
                                                                                      max_items):
    rng = np.random.default_rng(seed)
    lengths = np.maximum(np.round(np.exp(rng.normal(np.log(max_frames / 12), 0.8, n))), 1).astype(np.int64)
    budget = BatchBudget(max_frames, 0.0, max_items)
    order = LengthOrder.build(lengths, budget.longest_alone())
    plan = EpochPlan(order, budget, pools, np.random.default_rng(seed))
    batches = [plan.batch(r) for r in plan.table]
    assert sorted(i for b in batches for i in b.tolist()) == sorted(order.by_len.tolist())
    sizes, longest, frames = plan.stats(plan.table)
    for (p, a, b), items, size, m, f in zip(plan.table, batches, sizes, longest, frames):
        assert np.array_equal(lengths[items], plan.lengths_at(p, a, b))  # sorted inside the batch too
        assert size == items.size and m == lengths[items].max() and f == lengths[items].sum()
        assert budget.cost(size, m) <= max_frames and (max_items is None or size <= max_items)


def test_first_batch_computes_only_its_own_items():
    lengths = np.random.default_rng(1).integers(50, 1900, 200_000)
    s = BucketBatchSampler(lengths, 38_400, seed=1, rank=5, world_size=16)
    first = next(iter(s))
    plan = s._plan(0)
    d = s._deal(0, ())
    assert d.table[d.steps[0, 5], 0] < plan.num_pools  # drawn from a pool, not from the leftovers
    # Planning packs the leftover pool from its lengths alone: no item is looked up but the batch drawn.
    assert plan.items_computed == len(first)
    # A batch of the leftover pool looks its items up then, all pools' last batches at once.
    explicit = np.flatnonzero(d.table[:, 0] == plan.num_pools)
    assert explicit.size
    assert len(d.batch(explicit[0])) and plan.items_computed > len(first)
    # The whole epoch's batches, materialised, are what the ranks get: every item once.
    every = sorted(i for r in range(16) for b in BucketBatchSampler(lengths, 38_400, seed=1, rank=r, world_size=16)
                   for i in b)
    assert every == list(range(lengths.size))


def test_resume_and_replan_on_a_corpus_with_many_batches_per_pool():
    # 200k items: pools of ~300 batches, whose chunked run packing the small hypothesis corpora never reach.
    lengths = np.random.default_rng(2).integers(50, 1900, 200_000)
    world = 16
    full = [list(BucketBatchSampler(lengths, 38_400, seed=2, rank=r, world_size=world)) for r in range(world)]
    steps = len(full[0])
    for k in (1, steps // 2, steps - 1):
        probe = BucketBatchSampler(lengths, 38_400, seed=2, rank=0, world_size=world)
        it = iter(probe)
        for _ in range(k):
            next(it)
        state = json.loads(json.dumps(probe.state_dict()))
        for r in (0, 7, world - 1):
            resumed = BucketBatchSampler(lengths, 38_400, seed=2, rank=r, world_size=world)
            resumed.load_state_dict(state)
            assert list(resumed) == full[r][k:]
        # Another world size: the remaining batches re-dealt, nothing lost or repeated, none over budget.
        rest = []
        for r in range(5):
            t = BucketBatchSampler(lengths, 38_400, seed=2, rank=r, world_size=5)
            t.load_state_dict(state)
            rest.append(list(t))
        assert len({len(b) for b in rest}) == 1
        done = [i for r in range(world) for b in full[r][:k] for i in b]
        assert sorted(done + [i for bs in rest for b in bs for i in b]) == list(range(lengths.size))
        assert max(len(b) * lengths[b].max() for bs in rest for b in bs) <= 38_400


def test_a_state_of_the_previous_plan_is_refused_with_what_to_do():
    s = BucketBatchSampler(np.arange(1, 50), 100, rank=0, world_size=1)
    state = {**s.state_dict(), "format": "audiopipe.BucketBatchSampler/2"}
    with pytest.raises(ValueError, match=r"older audiopipe .* restart the epoch"):
        BucketBatchSampler(np.arange(1, 50), 100, rank=0, world_size=1).load_state_dict(state)


@pytest.mark.parametrize("quadratic", [0.0, 1e-4, 1 / 2000, 3.7e-3])
@pytest.mark.parametrize("max_frames", [1, 7, 38_400, 1_000_003])
def test_longest_alone_is_the_fits_alone_boundary(max_frames, quadratic):
    budget = BatchBudget(max_frames, quadratic)
    m = budget.longest_alone()
    assert budget.fits_alone(m) or m == 0
    assert not budget.fits_alone(m + 1)


def test_the_first_batch_path_never_imports_pandas(tmp_path):
    # pyarrow's to_numpy() imports pandas on its first call (1-3 s): that alone was most of make_loader's time
    # to the first batch (issue 10.2). A fresh process, as a trainer starts.
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        from bench_open import build
    finally:
        sys.path.remove(str(bench))
    root = build(tmp_path, 2000)
    code = (
        "import sys\n"
        "from audiopipe.reader.loader import make_loader\n"
        "from audiopipe.index.lengths import LengthIndex\n"
        f"LengthIndex.open({str(root)!r}).frames('voiced')\n"
        f"batch = next(iter(make_loader({str(root)!r}, ['voiced'], max_frames=38_400, seed=0, rank=0, world_size=1)))\n"
        "assert len(batch['id']) > 0\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_bench_plan_scale_case_resumes_to_the_same_batch_and_reports_every_figure():
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        from bench_plan_scale import child, lengths_of
    finally:
        sys.path.remove(str(bench))
    import time

    from audiopipe.sampler.bucket import BucketBatchSampler

    lengths = lengths_of(2_500_000, "short_clip", 0)
    assert lengths.size == 2_500_000 and not np.array_equal(lengths[:1000], lengths[1_000_000:1_001_000])
    t0 = time.perf_counter()
    out = child(30_000, 16)  # libritts_like lengths, 38,400 frames; raises if the resumed batch differs
    wall = time.perf_counter() - t0
    assert out["utterances"] == 30_000 and out["steps_per_rank"] > 2 and out["resume_step"] == out["steps_per_rank"] // 2
    assert out["items_computed_for_first_batch"] < 30_000 // 10
    # The four timed parts are disjoint spans of the call, so they fit in the wall time the test measured around
    # it (a figure in the wrong unit, or one counted twice, does not).
    parts = [out[k] for k in ("build_s", "first_batch_s", "resume_build_s", "resume_s")]
    assert all(p > 0 for p in parts) and sum(parts) <= wall
    # Counts from the plan itself: rank 8 of 16's first batch and its number of steps.
    again = BucketBatchSampler(lengths_of(30_000, "libritts_like", 0), 38_400, seed=0, rank=8, world_size=16)
    assert out["first_batch_items"] == len(next(iter(again))) and out["steps_per_rank"] == len(again)
    assert out["peak_rss_mb"] >= out["peak_rss_to_first_batch_mb"] >= out["rss_after_lengths_mb"]
