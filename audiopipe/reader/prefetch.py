"""Build the next batches in a background thread while the training step runs (make_loader's `prefetch=K`).

With `num_workers=0` a batch is read, copied and padded on the training thread, so the accelerator idles
while it is built. A `PrefetchIterator` runs the DataLoader's iterator in one daemon thread, K batches
ahead. The copy-and-pad kernel is compiled with `nogil=True` and numpy releases the GIL in its big copies,
so the thread really runs in parallel with a step that releases the GIL (CUDA kernel launches and syncs,
a CPU GEMM, time.sleep).

With a CUDA `device`, the collator writes into pinned buffers and the thread copies each batch to the
device on its own side stream and waits for that copy (only the thread waits): the consumer gets tensors
already on the device, and the pinned buffer is free for the next batch. Each device tensor is then
marked as used by the consumer's stream (`record_stream`), so the caching allocator does not hand its
memory to the side stream while the step still reads it.

The hand-over is built to cost the training thread as little as possible (issue 10.3: a 20 ms step left
0.67-0.80 % of its time waiting although every batch was ready): a C `SimpleQueue` instead of `queue.Queue`
(whose get runs its Python under a Condition, ~35 us right after a step, with cold caches), a bare lock as
the "room again" signal, and the previous batch freed in this thread rather than by the consumer's
`batch = next(it)` (~60 us). bench_datawait.py measures it (docs/bench-loader.md).

Rules that keep it exact and leak-free:
- `consumed` counts the batches handed to the consumer, never the ones built ahead: the loader's
  `state_dict()` saves that count, so a resume yields exactly the batches not yet trained on.
- The thread holds no reference to the iterator object: when the iterator is dropped (or `close()`d, or the
  loader starts another pass), the thread sees the stop flag within 50 ms and ends.
- An exception in the thread is raised in the consumer as it is (its own type, so `except CorruptShardError`
  works with or without prefetch, with a note saying it was raised while building a batch ahead), never a hang;
  a thread that dies without a word is a `PrefetchError`.
"""

from __future__ import annotations

import collections
import queue
import threading
import weakref
from typing import Any, Callable, Iterator

import torch

from audiopipe.errors import AudiopipeError, InvalidValue

_POLL_S = 0.05  # how often a blocked put/get looks at the stop flag / the thread's liveness


class Progress:
    """Batches handed to the consumer in one pass; kept by the loader, so it outlives a dropped iterator."""

    def __init__(self) -> None:
        self.consumed = 0


class PrefetchError(AudiopipeError, RuntimeError):
    """The prefetch thread ended without finishing the pass and without an error to raise."""


class _End:
    pass


_END = object()  # what next(source, _END) returns at the end of the pass


def _signal(space: Any) -> None:
    """Tell the producer a batch was taken: `space` is a lock held while no signal is pending."""
    try:
        space.release()
    except RuntimeError:  # already released: a signal is pending, one is enough
        pass


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc


def _copy_to_device(batch: Any, device: torch.device, stream: Any) -> Any:
    """Every tensor of the batch dict on `device`; on CUDA copied on `stream`, which this call waits for."""
    if not isinstance(batch, dict):
        return batch
    if stream is None:
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    with torch.cuda.stream(stream):
        out = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    # Waiting here (this thread only, GIL released) makes the hand-over safe by construction: the consumer
    # never sees a batch whose copy is still running, and the pinned source buffer may be rewritten at once.
    stream.synchronize()
    return out


def _produce(passes: Iterator[Iterator], out: queue.SimpleQueue, space: Any, depth: int, stop: threading.Event,
             device: torch.device | None, stream: Any, spent: collections.deque, ends: list[int]) -> None:
    """Thread body: build the batches of each pass `passes` yields into `out`, an _End after each, until `passes`
    ends, a batch fails or `stop` is set. At most `depth` batches wait in `out` (an _End takes no room: ends[0]
    counts those put, ends[1] those taken), and one more is built and waits for room (the thread waits on `space`,
    a lock the consumer releases after each take), as a queue.Queue(maxsize=depth) would hold them."""

    def room(limit: int = depth) -> bool:
        while out.qsize() - (ends[0] - ends[1]) >= limit:
            if stop.is_set():
                return False
            space.acquire(timeout=_POLL_S)  # a take releases it; the timeout re-checks the stop flag
            spent.clear()
        return not stop.is_set()

    first = True
    try:
        for source in passes:
            while not stop.is_set():
                spent.clear()  # the batches the consumer moved on from: freed here, not on the training thread
                batch = next(source, _END)
                if batch is _END:
                    ends[0] += 1
                    out.put(_End())
                    break
                if device is not None and not stop.is_set():
                    batch = _copy_to_device(batch, device, stream)
                if not room():
                    return
                out.put(batch)
                # The very first batch goes to the consumer alone: building the second at once held the GIL the
                # consumer's wake-up needed (time to the first batch). The second then overlaps the first step.
                if first:
                    first = False
                    if not room(1):
                        return
            if stop.is_set():
                return
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        out.put(_Failed(exc))


def _stop(stop: threading.Event, thread: threading.Thread, space: Any) -> None:
    stop.set()
    _signal(space)  # wake a thread waiting for room now, not at its next poll
    if thread is not threading.current_thread():
        thread.join(timeout=5.0)


class LookAhead:
    """One background thread that builds the batches of successive passes, `depth` batches ahead of the consumer.

    `passes` yields one iterator of batches per pass. When it yields another after the pass in progress (the
    loader's next epoch), the thread runs on into it while the consumer takes the last batches of this one:
    the epoch boundary is then no different from any other step. Batches are taken by a PrefetchIterator per pass.
    """

    def __init__(self, passes: Iterator[Iterator], depth: int, device: torch.device | str | None = None):
        if depth < 1:
            raise InvalidValue(f"prefetch depth must be >= 1 batch, got {depth!r}")
        self.depth = int(depth)
        self.device = torch.device(device) if device is not None else None
        stream = None
        if self.device is not None and self.device.type == "cuda":
            stream = torch.cuda.Stream(device=self.device)
        # The hand-over is the C-implemented SimpleQueue plus a bare lock as the "room again" signal: queue.Queue's
        # get runs ~30 lines of Python under its Condition, and the consumer runs them right after its step, with
        # caches the batch copy has just evicted: ~0.1 ms per batch, 0.5 % of a 20 ms step (issue 10.3).
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._space = threading.Lock()
        self._space.acquire()  # held: no signal pending
        # The batch handed out last is kept until the next one is: then this thread's reference moves to `spent`,
        # which the prefetch thread clears. The consumer's `batch = next(it)` then only drops a reference, and
        # freeing the previous batch (its tensors, its lists of ids and texts: ~60 us, caches cold after a step)
        # happens in the prefetch thread, not inside the training thread's wait for the next batch.
        self.held: Any = None
        self.spent: collections.deque = collections.deque()
        self._ends = [0, 0]  # pass ends put by the thread, taken by the consumer (each written by one side)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_produce, name="audiopipe-prefetch", daemon=True,
                                        args=(passes, self._queue, self._space, self.depth, self._stop, self.device,
                                              stream, self.spent, self._ends))
        self._thread.start()
        # Ends the thread when this object is garbage collected (the thread holds neither it nor its iterators).
        self._finalizer = weakref.finalize(self, _stop, self._stop, self._thread, self._space)

    def take(self) -> Any:
        """The next item in pass order: a batch, an _End or a _Failed."""
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.close()
                    raise PrefetchError("the prefetch thread ended without finishing the pass") from None
        if isinstance(item, _End):
            self._ends[1] += 1
        _signal(self._space)
        if self.held is not None:
            self.spent.append(self.held)
            self.held = None
        return item

    def close(self) -> None:
        """Stop the thread; the batches built ahead are dropped."""
        self._finalizer()
        self.held = None
        self.spent.clear()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def ready(self) -> int:
        """Batches built and waiting to be taken (the ends of passes not counted)."""
        return self._queue.qsize() - (self._ends[0] - self._ends[1])

    @property
    def running(self) -> bool:
        """Not stopped and not ended: what it builds next is still the next batch in pass order."""
        return not self._stop.is_set() and self._thread.is_alive()


class PrefetchIterator:
    """Yields one pass's batches, built `depth` batches ahead in a background thread (optionally on `device`).

    Given `source`, it runs its own LookAhead over that one pass. Given `look`, it takes the next pass of a
    LookAhead that may already have built its first batches (the loader's next epoch). Dropped or closed before
    the pass ends, it stops the thread; a pass that ends leaves the thread running on into the next one.
    """

    def __init__(self, source: Iterator | None = None, depth: int = 2, device: torch.device | str | None = None, *,
                 look: LookAhead | None = None, on_first: Callable[[], None] | None = None):
        self.look = look if look is not None else LookAhead(iter([source]), depth, device)
        self._on_first = on_first  # called once the first batch is in the consumer's hands
        self.depth, self.device = self.look.depth, self.look.device
        self.progress = Progress()
        self.finished = False
        # Dropped mid-pass: the thread stops (it holds no reference to this iterator, so this finalizer runs).
        self._finalizer = weakref.finalize(self, self.look.close)

    def __iter__(self) -> PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self.finished:
            raise StopIteration
        item = self.look.take()
        if isinstance(item, _End):
            self.finished = True
            self._finalizer.detach()  # the pass is over: the thread may run on into the next one,
            self.look = None  # for as long as its owner (the loader) keeps it, not this spent iterator
            raise StopIteration
        if isinstance(item, _Failed):
            self.close()
            item.exc.add_note("(raised in audiopipe's prefetch thread, while building a batch ahead of the step)")
            raise item.exc
        if self.device is not None and self.device.type == "cuda" and isinstance(item, dict):
            current = torch.cuda.current_stream(self.device)
            for v in item.values():
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    v.record_stream(current)
        self.progress.consumed += 1
        self.look.held = item
        if self._on_first is not None:
            self._on_first, on_first = None, self._on_first
            on_first()
        return item

    @property
    def consumed(self) -> int:
        return self.progress.consumed

    def close(self) -> None:
        """Stop the thread if this pass is not over (the batches built ahead are dropped; `consumed` stays what
        the consumer took)."""
        if not self.finished:
            self.finished = True
            self._finalizer()

    @property
    def alive(self) -> bool:
        return self.look is not None and self.look.alive
