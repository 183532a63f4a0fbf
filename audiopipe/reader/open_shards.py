"""The shards a dataset holds open in this process: at most `max_open`, the least recently used closed beyond it.

A shard is opened the first time one of its rows is asked for, once per process: a forked DataLoader worker
forgets its parent's (audiopipe/after_fork.py) and opens its own. Each open shard holds a file descriptor
(a mapping) or its small buffers (s3://); evicting one costs only opening it again when it is next read.
Before its rows are handed out, a shard's `check()` runs under the lock, so a check never races a close.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from audiopipe.after_fork import reset_after_fork
from audiopipe.errors import InvalidValue


class OpenShards:
    def __init__(self, max_open: int):
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise InvalidValue(f"max_open must be a positive number of shards, got {max_open!r}")
        self.max_open = max_open
        self._forget()
        reset_after_fork(self, OpenShards._forget)

    def _forget(self) -> None:
        self._open: OrderedDict[int, Any] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()  # the read-ahead thread opens shards too
        self.opened = 0  # shards opened in this process, reopened ones after an eviction included

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker opens its own
        return {"max_open": self.max_open}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_open = state["max_open"]
        self._forget()
        reset_after_fork(self, OpenShards._forget)

    def __len__(self) -> int:
        return len(self._open)

    def get(self, k: int, open_shard: Callable[[int], Any]) -> Any:
        """Shard k, opened with open_shard(k) unless it is open already, and checked unchanged (`check()`)."""
        with self._lock:
            sh = self._open.get(k)
            if sh is None:
                sh = self._open[k] = open_shard(k)
                self.opened += 1
                while len(self._open) > self.max_open:
                    self._open.popitem(last=False)[1].close()
            else:
                self._open.move_to_end(k)
            sh.check()
        return sh

    def drop(self, k: int, sh: Any) -> None:
        """Forget shard k if `sh` is still what is open for it (the next get opens it again)."""
        with self._lock:
            if self._open.get(k) is sh:
                del self._open[k]
