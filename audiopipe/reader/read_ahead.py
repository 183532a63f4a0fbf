"""Rows of the batches to come, handed to a dataset's `willneed()` on a background thread of this process.

make_loader's sampler announces each batch a few steps before it is read (its `prefetch`); the dataset's
willneed() then starts reading those rows (madvise for a local mapping, ranged GETs from s3://) while the
current batch is copied, and the announcing thread pays nothing: the hint runs on this thread.

A hint costs ~8 us per row even when the row is cached, and finding out whether it is costs as much (mincore).
So unless `every_time`, each row is hinted only the first time it comes (the first epoch, when the cache is cold):
a local corpus that fits in half the RAM stays cached after that. A corpus larger than that, and any s3://
corpus (a fetched range is consumed by its batch), is hinted every time.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any

import numpy as np

from audiopipe.after_fork import reset_after_fork


def _loop(ref: "weakref.ref[Any]", q: queue.SimpleQueue) -> None:
    while (indices := q.get()) is not None:
        ds = ref()
        if ds is None:
            return
        try:
            ds.willneed(indices)
        except Exception:  # advice only: it must not kill the process; the read itself reports any error
            pass
        del ds


class ReadAhead:
    """announce(ds, indices): ds.willneed(indices) on this process's read-ahead thread, started on first use.

    The thread holds the dataset weakly and ends when the dataset is collected (its mappings are released)."""

    def __init__(self, rows: int, every_time: bool):
        self.rows, self.every_time = rows, every_time
        self.hinted: np.ndarray | None = None  # rows hinted once already (unless every_time)
        self._queue: queue.SimpleQueue | None = None
        reset_after_fork(self, ReadAhead._forget_thread)

    def _forget_thread(self) -> None:  # threads do not survive a fork: a child starts its own
        self._queue = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_queue": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        reset_after_fork(self, ReadAhead._forget_thread)

    def announce(self, ds: Any, indices: Any) -> None:
        idx = np.asarray(indices, dtype=np.int64).reshape(-1) % max(self.rows, 1)
        if not self.every_time:
            if self.hinted is None:
                self.hinted = np.zeros(self.rows, dtype=bool)
            idx = idx[~self.hinted[idx]]
            if idx.size == 0:
                return
            self.hinted[idx] = True
        if self._queue is None:
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_loop, args=(weakref.ref(ds), q), daemon=True,
                             name="audiopipe-read-ahead").start()
            weakref.finalize(ds, q.put, None)
            self._queue = q
        self._queue.put(idx)
