"""`audiopipe shard` as the program ends without the interpreter's module teardown (audiopipe.cli._leave), and
must still end the way the interpreter would: worker processes told to stop and joined, exit handlers run,
output flushed, the exit code kept.

The case that matters: the local engine lets go of its worker pool without waiting (shutdown(wait=False), and
drops it), so when the job returns a worker may still be busy (a warm-up in flight) and the pool's stop not yet
sent. Run the atexit handlers before the pool's exit hook has sent it, and the queue that carries it is closed
first: the worker waits for work and the process for the worker, for ever (`shard --workers 2` on a 60-file
corpus hung in 2 of 3 runs that way).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import multiprocessing, sys, time
from concurrent.futures import ProcessPoolExecutor

if __name__ == "__main__":
    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(sys.argv[1]))
    pool.submit(time.sleep, 0).result()  # the worker is up
    print("worker", *pool._processes, flush=True)
    pool.submit(time.sleep, 1.0)  # still running when the job lets go of the pool
    pool.shutdown(wait=False, cancel_futures=True)
    del pool  # as the engine does: nothing of the job holds the pool any more
    print("job done", end="")  # left in the buffer: _leave must flush it
    from audiopipe.cli import _leave
    _leave(3)
"""


@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_the_fast_exit_stops_and_joins_a_busy_worker_pool_and_keeps_code_and_output(start):
    r = subprocess.run([sys.executable, "-c", _CHILD, start], capture_output=True, text=True, timeout=120,
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 3, r.stderr
    first, last = r.stdout.splitlines()
    assert last == "job done", r.stdout
    worker = int(first.split()[1])
    assert not Path(f"/proc/{worker}").exists(), "the worker process was left behind"
    assert "Traceback" not in r.stderr, r.stderr
