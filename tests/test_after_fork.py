"""audiopipe/after_fork.py: the one place that resets, in a forked child, the state an object must not carry over."""

from __future__ import annotations

import gc
import os

from audiopipe import after_fork


class _Owner:
    def __init__(self) -> None:
        self.state = "parent's"

    def forget(self) -> None:
        self.state = "reset"


class _Broken:
    def fail(self) -> None:
        raise RuntimeError("this reset fails")


def _in_child(report) -> str:
    """Fork, run report() in the child, and return what it wrote to the pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its fork handlers have run before this line
        try:
            os.write(w, report().encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_a_registered_reset_runs_in_the_child_only_and_one_failure_does_not_stop_the_others():
    broken, owner = _Broken(), _Owner()
    after_fork.reset_after_fork(broken, _Broken.fail)  # registered first: its failure is logged, not raised
    after_fork.reset_after_fork(owner, _Owner.forget)
    assert _in_child(lambda: owner.state) == "reset"
    assert owner.state == "parent's"  # the parent keeps its state


def test_the_registry_keeps_nothing_alive_and_forgets_a_collected_object():
    owner = _Owner()
    after_fork.reset_after_fork(owner, _Owner.forget)
    key = id(owner)
    assert key in after_fork._resets
    del owner
    gc.collect()
    assert key not in after_fork._resets
