"""make_loader(prefetch=K): batches built ahead in a thread, exact resume, no leaked thread, errors surface."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest
import torch

from audiopipe.reader.errors import CorruptShardError
from audiopipe.reader.loader import make_loader
from audiopipe.reader import prefetch as prefetch_mod
from audiopipe.reader.prefetch import PrefetchIterator
from reader_helpers import write_shards

ROWS = (40, 35, 50, 25)
BUDGET = 1500


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("prefetch") / "shards", ROWS, seed=4, tars=False)


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "audiopipe-prefetch"]


def _wait_no_thread(timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while _prefetch_threads() and time.monotonic() - t0 < timeout:
        gc.collect()
        time.sleep(0.02)
    assert not _prefetch_threads(), "a prefetch thread outlived its iterator"


def _yielded(loader) -> int:
    """Batches the sampler has handed out in this pass (0 before the thread's first draw)."""
    active = loader.sampler._active
    return active.yielded if active is not None else 0


def _wait_yielded(loader, n: int, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while _yielded(loader) < n and time.monotonic() - t0 < timeout:
        time.sleep(0.01)
    assert _yielded(loader) >= n


def _summary(batch: dict) -> tuple:
    """What identifies a batch's content: its rows and the bytes of its padded mel."""
    return tuple(batch["index"]), batch["mel"].numpy().tobytes(), batch["mel_mask"].numpy().tobytes()


def test_prefetch_yields_the_same_batches_as_without(shards):
    plain = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=2)
    ahead = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=2, prefetch=3)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        ahead.set_epoch(epoch)
        # Summarised at once: the ring rule (a batch lives until ring_size more are built) holds for both.
        want = [_summary(b) for b in plain]
        got = [_summary(b) for b in ahead]
        assert got == want and len(got) == len(ahead)
    del plain, ahead  # their look-aheads run on into epoch 2 while the loaders live
    _wait_no_thread()


@pytest.mark.parametrize("stop_at", [0, 1, 5])
def test_resume_counts_consumed_not_prefetched_batches(shards, stop_at):
    k = 4
    ref = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=9)
    ref.set_epoch(1)
    full = [_summary(b) for b in ref]
    del ref  # its look-ahead would run on into epoch 2
    assert len(full) > stop_at + k  # K batches really are in flight when we stop

    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=9, prefetch=k)
    loader.set_epoch(1)
    it = iter(loader)
    taken = [_summary(next(it)) for _ in range(stop_at)]
    # The thread filled its queue: more yielded than consumed (before the first take, only the first batch is
    # built: it goes to the consumer alone).
    _wait_yielded(loader, stop_at + k if stop_at else 1)
    state = loader.state_dict()  # no consumed_batches given: the loader knows what was consumed
    assert state["segments"][-1] == [1, stop_at]
    del it
    _wait_no_thread()
    assert loader.state_dict() == state  # still right once the iterator is gone (a `break` out of the loop)

    resumed = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=9, prefetch=k)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)
    rest = [_summary(b) for b in resumed]
    assert taken + rest == full


def test_thread_ends_when_the_pass_is_abandoned_or_restarted(shards):
    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=1, prefetch=2)
    for _ in loader:
        break  # the for loop drops its iterator
    _wait_no_thread()
    it = iter(loader)
    next(it)
    it2 = iter(loader)  # a new pass closes the previous one's thread, even while `it` is still referenced
    assert not it.alive or (it.look._thread.join(5) is None and not it.alive)
    next(it2)
    del it, it2
    _wait_no_thread()
    # A finished pass leaves its thread running on into the next epoch while the loader lives; no longer.
    assert sum(1 for _ in loader) == len(loader)
    assert _prefetch_threads()
    del loader
    _wait_no_thread()


class _Boom(Exception):
    pass


def test_an_error_in_the_thread_reaches_the_consumer():
    def source():
        yield {"x": torch.zeros(2)}
        raise _Boom("row 7 is corrupt")

    it = PrefetchIterator(source(), 2)
    assert next(it)["x"].shape == (2,)
    with pytest.raises(_Boom, match="row 7 is corrupt") as info:  # its own type: `except` clauses keep working
        next(it)
    assert any("prefetch thread" in note for note in info.value.__notes__)
    with pytest.raises(StopIteration):
        next(it)
    _wait_no_thread()


def test_a_corrupt_shard_surfaces_through_prefetch(shards, tmp_path):
    from reader_helpers import copy_shards

    w = copy_shards(shards, tmp_path / "s")
    loader = make_loader(w.root, ["mel"], max_frames=BUDGET, seed=0, prefetch=2)
    # Truncated after the loader checked it at open: the batch thread meets it, and its error reaches the loop.
    with open(w.shard_path(2), "r+b") as f:
        f.truncate(1000)
    with pytest.raises(CorruptShardError, match="shard"):
        for _ in loader:
            pass
    _wait_no_thread()


def test_the_thread_builds_while_the_consumer_sleeps(shards):
    """Overlap is real: with the consumer asleep, the next K batches get built (ring slots stay distinct)."""
    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=5, prefetch=3)
    it = iter(loader)
    first = next(it)
    _wait_yielded(loader, 1 + 3)
    ptrs = {first["mel"].data_ptr()} | {next(it)["mel"].data_ptr() for _ in range(3)}
    assert len(ptrs) == 4  # K + 1 batches alive at once never share a buffer
    del it
    _wait_no_thread()


def test_a_batch_the_consumer_moved_on_from_is_freed_by_the_prefetch_thread(shards):
    """`batch = next(it)` frees the previous batch (tensors, id and text lists: ~60 us on a cold cache); with
    prefetch that happens in the prefetch thread, so it is not counted as, nor adds to, the training thread's wait.
    A batch the consumer still holds is never freed under it."""
    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=7, prefetch=2)
    freed: dict[int, str] = {}
    it = iter(loader)
    kept = None
    for k in range(5):
        batch = next(it)
        weakref.finalize(batch["mel"], lambda k=k: freed.__setitem__(k, threading.current_thread().name))
        if k == 1:
            kept = batch  # held by the consumer: must stay intact
            want = _summary(batch)
        time.sleep(0.05)  # a step: the thread wakes, builds, and drops what the consumer moved on from
    deadline = time.monotonic() + 5
    while len(freed) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert {k: freed.get(k) for k in (0, 2, 3)} == dict.fromkeys((0, 2, 3), "audiopipe-prefetch")
    assert 1 not in freed and _summary(kept) == want
    del it, batch
    _wait_no_thread()


def test_bad_prefetch_and_device_arguments(shards):
    with pytest.raises(ValueError, match="prefetch must be an integer >= 0"):
        make_loader(shards.root, ["mel"], max_frames=BUDGET, prefetch=-1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            make_loader(shards.root, ["mel"], max_frames=BUDGET, device="cuda")


def test_device_alone_builds_one_batch_ahead_without_overwriting_a_held_batch(shards, monkeypatch):
    copies, copied = [0], threading.Event()
    copy = prefetch_mod._copy_to_device

    def counted(*args, **kwargs):
        out = copy(*args, **kwargs)
        copies[0] += 1
        if copies[0] >= 3:
            copied.set()
        return out

    monkeypatch.setattr(prefetch_mod, "_copy_to_device", counted)
    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=6, device="cpu")
    plain = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=6)
    assert loader.collate.ring_size >= 3  # 1 queued + 1 being built + 1 held
    it = iter(loader)
    held = next(it)
    want = next(iter(plain))
    # The held batch, the queued one, and the one after: built and copied (the thread then blocks on the full queue).
    assert copied.wait(timeout=60), f"the thread copied {copies[0]} batches, not 3"
    assert _summary(held) == _summary(want)
    del it
    _wait_no_thread()


def test_device_hands_over_tensors_on_that_device(shards):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=2, prefetch=2, device=device)
    plain = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=2)
    if device == "cuda":
        assert loader.collate.pin_memory
    for got, want in zip(loader, plain):
        assert got["mel"].device.type == device and got["mel_mask"].device.type == device
        np.testing.assert_array_equal(got["mel"].cpu().numpy(), want["mel"].numpy())
        assert got["index"] == want["index"]
    del loader
    _wait_no_thread()


def test_prefetch_over_worker_processes_yields_the_same_batches(shards):
    plain = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=8, num_workers=2)
    ahead = make_loader(shards.root, ["mel"], max_frames=BUDGET, seed=8, num_workers=2, prefetch=2)
    want = [_summary(b) for b in plain]
    got = [_summary(b) for b in ahead]
    assert got == want
    it = iter(ahead)
    next(it)
    state = ahead.state_dict()
    del it
    _wait_no_thread()
    assert state["segments"][-1] == [1, 1]
