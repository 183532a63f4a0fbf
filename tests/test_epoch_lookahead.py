"""make_loader's look-ahead runs on from epoch e into e+1: the boundary is no different from any other step, and
the batches, state_dict and resume are exactly those of the epochs one after the other."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from audiopipe.reader.loader import make_loader
from reader_helpers import write_shards

ROWS = (40, 35, 50, 25)
BUDGET = 1500


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("lookahead") / "shards", ROWS, seed=4, tars=False)


def _summary(batch: dict) -> tuple:
    return tuple(batch["index"]), batch["mel"].numpy().tobytes(), batch["mel_mask"].numpy().tobytes()


def _epoch(loader, epoch: int) -> list[tuple]:
    loader.set_epoch(epoch)
    return [_summary(b) for b in loader]


def _built_ahead(loader) -> int:
    """Batches of the next epoch the look-ahead has drawn from the sampler (0 when it has not run on)."""
    up = loader._upcoming
    return up[0][1].yielded if up else 0


def _wait(cond, timeout: float = 10.0) -> bool:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < timeout:
        time.sleep(0.002)
    return bool(cond())


def _no_thread() -> bool:
    gc.collect()
    return not [t for t in threading.enumerate() if t.name == "audiopipe-prefetch"]


def test_batches_across_boundaries_are_those_of_each_epoch(shards):
    """Each epoch's batches (rows and padded bytes) equal a loader's without a look-ahead, while the next epoch's
    first batches were built before set_epoch asked for it."""
    plain = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=3, prefetch=0)
    ahead = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=3, prefetch=2)
    for epoch in range(4):
        want = _epoch(plain, epoch)
        ahead.set_epoch(epoch)
        it = iter(ahead)
        got = [_summary(next(it)) for _ in range(len(want))]
        assert next(it, None) is None
        assert got == want
        del it
        # The pass is over: the thread has gone on into epoch + 1 before it is asked for.
        assert _wait(lambda: _built_ahead(ahead) >= 2), "the look-ahead did not run on into the next epoch"
    del plain, ahead
    assert _wait(_no_thread, 5.0), "a look-ahead outlived its loader"


@pytest.mark.parametrize("world_size", [1, 2])
def test_resume_mid_epoch_after_the_next_epoch_was_built_ahead(shards, world_size):
    """A state saved inside epoch 1 (whose first batches were built while epoch 0 ended) resumes exactly, per rank;
    so does a state saved at the end of epoch 0 while epoch 1 is already being built."""
    def loaders(**kw):
        return [make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=5, rank=r, world_size=world_size, **kw)
                for r in range(world_size)]

    for rank, (ref, run) in enumerate(zip(loaders(prefetch=0), loaders(prefetch=3))):
        full0, full1 = _epoch(ref, 0), _epoch(ref, 1)
        assert _epoch(run, 0) == full0
        end_of_0 = run.state_dict()
        assert _wait(lambda: _built_ahead(run) >= 3)
        run.set_epoch(1)
        it = iter(run)
        taken = [_summary(next(it)) for _ in range(2)]
        state = run.state_dict()
        assert state["epoch"] == 1 and state["segments"][-1] == [world_size, 2], rank
        resumed = loaders(prefetch=3)[rank]
        resumed.load_state_dict(state)
        resumed.set_epoch(1)
        assert taken + [_summary(b) for b in resumed] == full1
        # The end of epoch 0, saved while epoch 1 was built ahead: nothing of epoch 0 is left, epoch 1 is whole.
        again = loaders(prefetch=3)[rank]
        again.load_state_dict(end_of_0)
        again.set_epoch(0)
        assert [_summary(b) for b in again] == []
        assert _epoch(again, 1) == full1
        del it


def test_a_state_loaded_while_the_next_epoch_is_built_drops_it(shards):
    """load_state_dict (or set_epoch to another epoch) stops a look-ahead that built the next epoch: what follows
    is exactly the resumed or selected epoch."""
    ref = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=6, prefetch=0)
    full0, full2 = _epoch(ref, 0), _epoch(ref, 2)
    run = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=6, prefetch=2)
    run.set_epoch(0)
    it = iter(run)
    taken = [_summary(next(it)) for _ in range(3)]
    mid0 = run.state_dict()
    rest = [_summary(b) for b in it]
    assert taken + rest == full0
    assert _wait(lambda: _built_ahead(run) >= 2)
    run.load_state_dict(mid0)  # back into epoch 0 while epoch 1 is built ahead
    run.set_epoch(0)
    assert [_summary(b) for b in run] == rest
    assert _wait(lambda: _built_ahead(run) >= 2)
    assert _epoch(run, 2) == full2  # epoch 1 skipped: its batches built ahead are dropped
    assert _epoch(run, 2) == full2  # the same epoch again: a fresh pass from its start


class _EpochTag:
    """A batch transform that stamps the epoch it was told; built ahead, it must already see the next epoch."""

    def __init__(self):
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __call__(self, batch: dict) -> dict:
        batch["epoch"] = self.epoch
        return batch


def test_transforms_see_the_epoch_of_the_batch_built_ahead(shards):
    tag = _EpochTag()
    run = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=7, prefetch=2, batch_transform=tag)
    for epoch in range(3):
        run.set_epoch(epoch)
        assert {b["epoch"] for b in run} == {epoch}
    assert _wait(lambda: _built_ahead(run) >= 2) and tag.epoch == 3
    run.set_epoch(7)  # not the epoch built ahead: dropped, and the transform follows the loader's epoch
    assert tag.epoch == 7 and {b["epoch"] for b in run} == {7}


def test_every_boundary_batch_is_ready_before_the_step_asks_as_inside_an_epoch(shards):
    """Epochs of 5 batches, 20 epochs, a step of fixed length: a batch counts as ready when the look-ahead holds it
    before the step that precedes it ends. That step lasts 2 ms and then until the batch is ready, 10 s at most:
    a busy machine only slows the test down, and a look-ahead that stops at the boundary never gets it ready."""
    kw = {"max_frames": BUDGET, "max_items": 1, "subset": np.arange(5), "seed": 3,  # 5 batches of one row:
          "passes": 1}  # one pass (5 rows are a small corpus: the default would plan several)
    plain = make_loader(shards.root, ["mel"], prefetch=0, **kw)
    run = make_loader(shards.root, ["mel"], prefetch=2, **kw)
    assert len(run) == 5
    ready: dict[str, list[bool]] = {"boundary": [], "inside": []}
    first = None
    for epoch in range(20):
        want = _epoch(plain, epoch)
        run.set_epoch(epoch)
        it = iter(run)
        look = run._look
        first = first or look
        assert look is first  # one look-ahead for the whole run
        got = []
        for j in range(5):
            got.append(_summary(next(it)))
            time.sleep(0.002)  # the step
            if epoch < 19 or j < 4:  # the batch asked for next: this epoch's, or the next epoch's first
                ready["boundary" if j == 4 else "inside"].append(_wait(lambda: look.ready() >= 1))
        assert next(it, None) is None and got == want
    assert len(ready["boundary"]) == 19 and len(ready["inside"]) == 80
    assert all(ready["inside"]) and all(ready["boundary"])
