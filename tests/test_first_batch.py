"""What the first batch waits for (issue 10.2): counted, not timed (the times are in benchmarks/bench_open.py).

- the sampler plans and deals the first epoch from the length histograms: the grouping of the items by length
  (a sort of every item) runs beside it, and only a drawn batch's items are looked up;
- the lengths are fingerprinted when a state is saved or loaded, not when the sampler is built;
- make_loader's first batch is built before the copy kernel starts loading (the load holds the GIL).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from audiopipe.sampler import bucket
from audiopipe.sampler.bucket import BucketBatchSampler
from audiopipe.sampler.deal import deal
from audiopipe.sampler.plan import BatchBudget
from audiopipe.sampler.pools import EpochPlan, LengthOrder


class _Untouchable:
    """A by_len that must not be needed: result() fails the test."""

    def result(self):
        raise AssertionError("by_len was needed")


def test_epoch_is_planned_and_dealt_without_the_items_grouped_by_length():
    lengths = np.random.default_rng(4).integers(40, 1500, 50_000)
    budget = BatchBudget(20_000)
    order = LengthOrder.build(lengths, budget.longest_alone())
    blind = LengthOrder(order.values, order.counts, order.starts, _Untouchable())
    rng = np.random.default_rng(5)
    plan = EpochPlan(blind, budget, 16, rng)
    plan.split_to_efficiency(0.97)
    d = deal(plan.table, plan, budget, 8, rng)
    assert d.steps.shape[0] > 0 and plan.items_computed == 0
    with pytest.raises(AssertionError, match="by_len was needed"):
        d.batch(d.steps[0, 0])
    # The same plan over the real grouping gives every kept item exactly once.
    full = EpochPlan(order, budget, 16, np.random.default_rng(5))
    items = np.concatenate([full.batch(r) for r in full.table])
    assert np.array_equal(np.sort(items), np.arange(lengths.size))


def test_a_million_lengths_are_grouped_on_a_thread_with_the_same_order():
    from audiopipe.sampler import pools

    lengths = np.random.default_rng(6).integers(0, 3000, 1_000_000)
    order = LengthOrder.build(lengths, 2500)
    assert lengths.size >= pools.BACKGROUND_SORT_FROM and not isinstance(order._by_len, np.ndarray)
    keep = np.flatnonzero((lengths > 0) & (lengths <= 2500))
    assert np.array_equal(order.by_len, keep[np.argsort(lengths[keep], kind="stable")])


def test_lengths_are_fingerprinted_for_a_state_only(monkeypatch):
    calls = []

    class CountingHashlib:
        @staticmethod
        def sha256(data):
            calls.append(len(data))
            return hashlib.sha256(data)

    monkeypatch.setattr(bucket, "hashlib", CountingHashlib)
    lengths = np.random.default_rng(7).integers(30, 900, 20_000)
    s = BucketBatchSampler(lengths, 9_000, seed=3, rank=1, world_size=4)
    it = iter(s)
    next(it)
    assert calls == []  # building and the first batch hash nothing
    state = s.state_dict(consumed_batches=1)
    assert calls == [lengths.size * 8]
    assert state["lengths_sha256"] == hashlib.sha256(lengths.astype(np.int64).tobytes()).hexdigest()[:16]
    # The refusal stays exact: one length changed is another fingerprint.
    other = lengths.copy()
    other[12_345] += 1
    with pytest.raises(ValueError, match="saved for other lengths"):
        BucketBatchSampler(other, 9_000, seed=3, rank=1, world_size=4).load_state_dict(state)
    resumed = BucketBatchSampler(lengths, 9_000, seed=3, rank=1, world_size=4)
    resumed.load_state_dict(state)
    assert list(resumed) == list(it)
    # The sampler's lengths are its own, read-only: what was hashed lazily cannot have changed.
    with pytest.raises(ValueError):
        s.lengths[0] = 1


def test_make_loader_first_batch_is_built_before_the_copy_kernel_loads(tmp_path):
    """In a fresh process: the kernel load begins only once the first batch is collated (it held the GIL while
    the first batch was planned and read, 2-3x its time), and the batches are the same bytes either way."""
    from reader_helpers import write_shards

    w = write_shards(tmp_path / "s", (6, 5), seed=3, tars=False)
    script = textwrap.dedent(f"""
        import threading
        import numpy as np
        from audiopipe.collate import kernels
        from audiopipe.reader.arrow_dataset import ShardDataset
        from audiopipe.reader.loader import make_loader

        events, state, waiting = [], threading.Condition(), []
        load = kernels._load_kernels
        def recorded_load(*args, **kwargs):
            with state:
                events.append("kernel load")
                state.notify_all()
            return load(*args, **kwargs)
        kernels._load_kernels = recorded_load

        class Watched(type(kernels._warm["go"])):  # says when the load thread starts waiting for its release
            def wait(self, timeout=None):
                with state:
                    waiting.append(1)
                    state.notify_all()
                return super().wait(timeout)
        kernels._warm["go"] = Watched()

        def slow_transform(batch):
            # Until the load thread has either begun loading (the old loader) or is held until its release (a
            # failure deadline, not a pause: one of the two happens at once after make_loader started it).
            with state:
                assert state.wait_for(lambda: events or waiting, timeout=60), "the load thread never ran"
            events.append("first batch built")
            return batch

        ds = ShardDataset({str(w.root)!r}, ["mel"])
        def check(batch):  # before the next batch: the collator reuses its buffers
            for row, i in enumerate(batch["index"]):
                mel = ds[i]["mel"]
                assert np.array_equal(batch["mel"][row, :, :mel.shape[1]].numpy(), mel)
                assert not batch["mel"][row, :, mel.shape[1]:].any()

        loader = make_loader({str(w.root)!r}, ["mel"], max_frames=4000, seed=0, batch_transform=slow_transform)
        it = iter(loader)
        check(next(it))  # copied with numpy
        kernels.wait_for_kernels()
        batches = 1
        for batch in it:  # copied by the kernel
            check(batch)
            batches += 1
        # The prefetch thread may build the second batch while the load starts: only the first is ordered.
        print("FIRST", events[0], "LOADED AFTER IT", events.index("kernel load") > 0, "READY",
              kernels.kernels_ready(), "BATCHES", batches)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "FIRST first batch built LOADED AFTER IT True READY True BATCHES" in out.stdout, out.stdout
    assert int(out.stdout.split("BATCHES")[1]) > 1


class _Blocked:
    """A sort that has not finished: done() is False, and waiting for it fails the test."""

    def done(self):
        return False

    def result(self):
        raise AssertionError("waited for the sort")


def test_first_batch_items_while_the_sort_runs_are_the_sorted_ones(monkeypatch):
    from audiopipe.sampler import pools

    monkeypatch.setattr(pools, "SCAN_PASSES_UP_TO", 2)
    lengths = np.random.default_rng(8).integers(0, 2500, 300_000)  # some empty, some too long: left out
    budget = BatchBudget(38_400)
    order = LengthOrder.build(lengths, 2000)
    running = LengthOrder.build(lengths, 2000)  # its sort on a thread; replaced by one that never ends
    assert not isinstance(running._by_len, np.ndarray)
    running._by_len = _Blocked()
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    plan, blind = EpochPlan(order, budget, 16, rng_a), EpochPlan(running, budget, 16, rng_b)
    d = deal(plan.table, plan, budget, 4, rng_a)
    d_blind = deal(blind.table, blind, budget, 4, rng_b)
    assert np.array_equal(d.steps, d_blind.steps)
    seen: set[int] = set()

    def lengths_of(b):
        return set(plan.lengths_at(*d.table[b]).tolist())

    # The first batch and the two read ahead with it, each in one pass whatever its lengths; the third shares
    # the first one's lengths: no pass.
    first, second = d.steps[0, 0], d.steps[1, 0]
    for b in (first, second, first):
        assert np.array_equal(d.batch(b), d_blind.batch(b))
        seen |= lengths_of(b)
    assert running._scans == 2
    # Past SCAN_PASSES_UP_TO passes, a sort is cheaper than more passes: lookups of new lengths wait for it.
    other = next(b for b in d.steps.ravel().tolist() if not lengths_of(b) <= seen)
    with pytest.raises(AssertionError, match="waited for the sort"):
        d_blind.batch(other)
