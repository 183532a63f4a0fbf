"""State that must not cross a fork: threads, locks, thread pools, client connections, mappings a child makes anew.

A DataLoader worker is a fork of the training process. It inherits every object but none of the threads that
served them, and a lock another thread held at the fork stays held in the child for ever. An object that owns
such state registers, once, how to reset it:

    reset_after_fork(self, type(self)._forget_threads)

and every registered reset runs in the child right after the fork (os.register_at_fork), before any of the
child's own code: no object compares process ids on its hot path. An object made by unpickling (a spawned
worker) starts fresh in its __setstate__ and registers there.

The registry holds its objects weakly: registering keeps nothing alive, and a collected object is forgotten.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Any, Callable, TypeVar

T = TypeVar("T")
_log = logging.getLogger(__name__)
_resets: dict[int, tuple[weakref.ref, Callable[[Any], None]]] = {}


def reset_after_fork(obj: T, reset: Callable[[T], None]) -> None:
    """Call reset(obj) in every child forked from now on, for as long as obj lives (one reset per object: a
    second call replaces the first)."""
    key = id(obj)

    def forget(_ref: weakref.ref, key: int = key) -> None:
        entry = _resets.get(key)
        if entry is not None and entry[0] is _ref:  # not an object registered since under the same id
            del _resets[key]

    _resets[key] = (weakref.ref(obj, forget), reset)


def _in_child() -> None:
    for ref, reset in list(_resets.values()):
        obj = ref()
        if obj is None:
            continue
        try:
            reset(obj)
        except Exception:  # one object's failure must not leave the others with their parent's state
            _log.exception("resetting %r after fork failed", obj)


os.register_at_fork(after_in_child=_in_child)
