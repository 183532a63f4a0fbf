"""Shard tasks on this machine without Ray: the command's own process, plus worker processes when more than one
worker is asked for. The engine of small local jobs and of `--workers 0` (this process only, for debugging:
breakpoints and tracebacks land where you are).

Starting Ray costs seconds of wall time and CPU on a small machine (its servers, agents and workers start
beside the job), more than a small job takes to extract. Here the driver builds shards itself, warming up
(imports, compiled kernels) while the corpus is discovered in a thread, and with N workers N-1 more processes
join it: forked from the warm driver once the plan is made (the command line), or, in a program with threads
of its own, spawned at the start to warm up beside the discovery (see LocalEngine.start). The shards are built
by the same code as on Ray (audiopipe.shard.groups), so the output is byte-identical.

A failed group is retried (up to RETRIES times, on any process); a worker process that dies (killed, out of
memory) breaks the pool, which is started again and its units retried. A worker whose driver is gone, however
it ended (SIGKILL included), is killed by the kernel at once (Linux's parent-death signal, set as the worker
starts); elsewhere it stops before its next shard (its parent changed), as a Ray worker does.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict
from typing import Any

from audiopipe.shard.job import Job
from audiopipe.shard.ledger import Ledger
from audiopipe.shard.plan import WorkUnit
from audiopipe.shard.progress import Progress
from audiopipe.shard.worker import THREAD_ENV, prepare_worker, warm_worker

RETRIES = 3  # as a Ray task's max_retries


class LocalEngine:
    name = "local"

    def __init__(self, workers: int, nice: int) -> None:
        """workers: 0 or 1, this process alone; N > 1, this process and N-1 worker processes."""
        self.workers, self.nice = max(1, workers), nice
        self.helpers = self.workers - 1
        self._pool: ProcessPoolExecutor | None = None
        self._warmups: list[Future] = []
        self._t_sent = 0.0
        self._job_dict: dict[str, Any] = {}

    def start(self, job: Job) -> float:
        """Decide how the worker processes start. In a process with no other thread (the command line), they
        are forked from this one once it is warm and the plan is made (`launch`): they start with everything
        imported and every kernel loaded, in milliseconds, instead of importing torch & co. again each (seconds
        of CPU per worker, taken from the job on a small machine). Elsewhere (a caller's program with threads
        of its own, which a fork would copy mid-work) they are fresh interpreters (spawn), started now so that
        they import and warm while the corpus is discovered. Returns 0: there is no Ray to start."""
        self._job_dict = job.to_dict()
        self._fork = self.helpers > 0 and _single_threaded()
        if self.helpers and not self._fork:
            self._new_pool(fork=False)
        return 0.0

    def launch(self) -> None:
        """Start the forked workers (see start); called with the plan made, before anything starts a thread."""
        if self.helpers and self._pool is None:
            self._new_pool(fork=self._fork and _single_threaded())

    def _new_pool(self, fork: bool) -> None:
        for k, v in THREAD_ENV.items():  # before the workers start: they read it when they import numpy & co.
            os.environ.setdefault(k, v)
        self._pool = ProcessPoolExecutor(self.helpers, mp_context=multiprocessing.get_context(
            "fork" if fork else "spawn"), initializer=die_with_parent, initargs=(os.getpid(),))
        self._t_sent = time.monotonic()
        # A forked worker is as warm as this process; a spawned one warms up first, and gets work once done.
        self._warmups = [] if fork else [self._pool.submit(warm_worker, self._job_dict, self.nice)
                                         for _ in range(self.helpers)]
        self._forked = fork

    def warm_here(self, job: Job) -> None:
        """Warm this process, which builds shards too (its imports overlap the workers' and the discovery)."""
        t = time.monotonic()
        self._keep_threads()
        warm_worker(job.to_dict(), self.nice)
        self._warm_here_s = time.monotonic() - t

    def _keep_threads(self) -> None:
        """Remember this process's torch threads, set to one while it builds shards and given back by close()
        (a caller of `shard()` goes on with its own settings)."""
        if not hasattr(self, "_threads"):
            import torch

            self._threads = torch.get_num_threads()

    def await_warmups(self) -> float:
        """Nothing waits for the worker processes: this process starts building at once, and each worker gets
        groups once its warm-up is done (a worker slow to start, on a busy machine, holds no work back).
        Returns the seconds this process spent warming itself."""
        return getattr(self, "_warm_here_s", 0.0)

    def _ready(self) -> int:
        """Worker processes ready for work: all of them when forked warm, else those whose warm-up is done."""
        if getattr(self, "_forked", False):
            return self.helpers
        return sum(f.done() for f in self._warmups)

    def slots(self, job: Job) -> int:
        return self.workers

    def close(self) -> None:
        if hasattr(self, "_threads"):
            import torch

            torch.set_num_threads(self._threads)
        self._drop_pool()

    def _drop_pool(self) -> None:
        if self._pool is not None:
            # Every group is accounted for when this is called: the processes exit on their own, and nothing
            # of the job waits for them (a process's exit, freeing torch & co., takes a while on a busy machine).
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def run(self, job: Job, todo: list[WorkUnit], ledger: Ledger, progress: Progress,
            staging: str | None) -> None:
        """Build `todo` until every unit is reported or failed in `ledger`: groups go to the worker processes
        (two queued each once it is warm, so none waits for the driver) and to this process, from one queue in
        plan order."""
        from audiopipe.shard.groups import group_units

        encode, codec_spec = _codec(job)
        queue: deque[tuple[list[WorkUnit], int]] = deque((g, 0) for g in group_units(todo, self.workers))
        running: dict[Future, tuple[list[WorkUnit], int]] = {}

        def handle(group: list[WorkUnit], attempt: int, reports: list[dict], error: BaseException | None) -> None:
            for item in reports:
                progress.add(ledger.report(item, group).duration)
            if error is not None and attempt < RETRIES and ledger.open_units(group):
                queue.appendleft((ledger.open_units(group), attempt + 1))
                return
            left = ledger.open_units(group)
            again = ledger.settle(group, error)
            if error is not None:
                progress.add(sum(u.duration for u in left))
            if again:
                queue.appendleft((again, attempt))

        def collect(block: bool) -> None:
            if not running:
                return
            done, _ = wait(list(running), timeout=progress.tick if block else 0, return_when=FIRST_COMPLETED)
            broken = False
            for f in done:
                group, attempt = running.pop(f)
                try:
                    reports, error = f.result()
                except BrokenProcessPool as e:  # a worker process died: every queued group of the pool with it
                    reports, error, broken = [], e, True
                handle(group, attempt, reports, error)
            if broken:
                self._drop_pool()
                self._new_pool(fork=False)
            progress.refresh()

        def feed() -> None:
            while self._pool is not None and queue and len(running) < 2 * self._ready():
                group, attempt = queue.popleft()
                try:
                    f = self._pool.submit(_build, [u.to_dict() for u in group], self._job_dict, self.nice,
                                          staging, os.getpid())
                except BrokenProcessPool:  # a worker died while idle: start the pool again, this group waits
                    queue.appendleft((group, attempt))
                    self._drop_pool()
                    self._new_pool(fork=False)  # threads run by now (uploads, fsyncs): never fork then
                    return
                running[f] = (group, attempt)

        try:
            self._keep_threads()
            prepare_worker(self.nice)
            self.launch()
            feed()
            while queue or running:
                collect(block=False)
                feed()
                if queue:  # this process builds the next group itself
                    group, attempt = queue.popleft()
                    reports: list[dict] = []
                    error = None
                    try:
                        from audiopipe.shard.groups import build_group

                        for item in build_group(group, job, staging, encode=encode, codec_spec=codec_spec):
                            reports.append(item)
                            progress.add(ledger.report(item, group).duration)
                            collect(block=False)
                            feed()
                    except Exception as e:
                        error = e
                    handle(group, attempt, [], error)
                else:
                    collect(block=True)
        finally:
            self.close()


def die_with_parent(parent: int) -> None:
    """Run first in a worker process: the kernel sends it SIGKILL when the driver dies, however it died. Without
    this, a worker whose driver was killed waits on its task pipe forever (its siblings hold the pipe's other end
    open, so no end of file ever comes). The worker's files are written under temporary names, so a kill at any
    point leaves nothing a rerun takes for finished. Linux only (prctl); elsewhere the per-shard parent check
    stays."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the driver died before the signal was set: no signal will come
        os._exit(1)


def _single_threaded() -> bool:
    import threading

    return threading.active_count() == 1


def _codec(job: Job):
    """The codec stage in this process (one model, encoding one clip at a time, as a CPU actor does)."""
    if not job.codec:
        return None, None
    from audiopipe.shard.codec_stage import CodecWorker

    worker = CodecWorker(asdict(job.codec))
    return worker.encode, worker.spec()


def _build(group: list[dict], job_dict: dict, nice: int, staging: str | None,
           parent: int) -> tuple[list[dict], BaseException | None]:
    """A worker process builds a group; returns what it reported, and the error that stopped it (if any)."""
    from audiopipe.shard.groups import build_group

    prepare_worker(nice)
    reports: list[dict] = []
    try:
        for item in build_group([WorkUnit.from_dict(u) for u in group], Job.from_dict(job_dict), staging,
                                orphaned=lambda: os.getppid() != parent):
            reports.append(item)
    except Exception as e:
        return reports, _picklable(e)
    return reports, None


def _picklable(e: Exception) -> Exception:
    """The error as it can cross back to the driver: itself when it pickles, else a RuntimeError saying it."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")
