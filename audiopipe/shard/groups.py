"""Shard tasks of several shards, so that a worker computes while the disk (or the network) finishes a shard.

A task that builds one shard ends waiting for its files' fsyncs: 9 % of a worker's time with tars on this
project's 2-core VM (0.50 s of 5.65 s over 56 shards, 1 worker, docs/extraction.md). A task that builds a
group of consecutive shards computes shard i+1 while shard i's files are fsync'd and renamed (on s3://:
uploaded), and only its last shard's wait is left. Each shard is still reported on its own, with its done
record, the moment it counts as finished: progress and durability are per shard as before.

Groups shrink towards the end of the job (guided self-scheduling: a group takes at most 1/(2W) of the shards
left for W workers, and at most MAX_GROUP), so the last tasks are single shards and the workers finish
together. A retried group skips the shards its failed attempt finished (`finished_record`).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Iterator

from audiopipe.errors import AudiopipeError
from audiopipe.shard.job import Job
from audiopipe.shard.output import finished_record, start_unit
from audiopipe.shard.plan import WorkUnit

# Bounds what a task holds (one shard's rows at a time, so memory is not the limit) and what a lost node
# takes with it; 8 already leaves 1/8 of the waits.
MAX_GROUP = 8


def group_units(units: list[WorkUnit], workers: int, max_group: int = MAX_GROUP) -> list[list[WorkUnit]]:
    """Consecutive units in groups of decreasing size: ceil(left / 2W), between 1 and max_group."""
    groups: list[list[WorkUnit]] = []
    i = 0
    while i < len(units):
        size = max(1, min(max_group, math.ceil((len(units) - i) / (2 * max(1, workers)))))
        groups.append(units[i:i + size])
        i += size
    return groups


def build_group(units: list[WorkUnit], job: Job, staging: str | None = None,
                orphaned: Callable[[], bool] | None = None, **kw: Any) -> Iterator[dict[str, Any]]:
    """Build `units` in order, yielding for each, once it is finished, {"record": its done record, "task": its
    span}. A span runs from the start of the shard's compute to the start of the next one's (the next one's
    then includes finishing this one), so the spans of a task tile its time; "cpu" is this process's CPU time
    over the span.

    orphaned: asked before each shard; once true (the job that sent the task is gone, or the node's raylet) the
    group stops there, the shard in flight gets no done record, and `Orphaned` is raised: a job killed with kill -9
    must not go on writing its folder beside the run that replaces it (a Ray worker is not in the driver's
    process group), and a task that stopped early must never look finished to a driver that is still alive (a
    lost node's raylet), which then sends its unreported shards again."""
    pending: tuple[Any, dict[str, Any], float] | None = None  # (the shard being finished, its span, CPU at start)
    for unit in units:
        if orphaned is not None and orphaned():
            if pending is not None:
                pending[0].abort()
            raise Orphaned(f"the worker building {unit.name} lost its job or its node; stopped before it")
        started, cpu = time.time(), time.process_time()
        try:
            rec = finished_record(job, unit.name)  # on a retry, the failed attempt may have finished it
            current = _Finished(rec) if rec is not None else start_unit(unit, job, staging, **kw)
        except BaseException:
            if pending is not None:  # the shard before is complete: report it, then fail this one
                yield _report(*pending, started, cpu)
            raise
        if pending is not None:
            yield _report(*pending, started, cpu)
        pending = (current, {"name": unit.name, "pid": os.getpid(), "start": started}, cpu)
    if pending is not None:
        yield _report(*pending)


class Orphaned(AudiopipeError, RuntimeError):
    """A group stopped because the process that runs it was orphaned (see build_group)."""


class _Finished:
    """A shard an earlier attempt finished: its record in hand, nothing to wait for."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def finish(self) -> dict[str, Any]:
        return self.record

    def abort(self) -> None:
        pass


def _report(shard: Any, span: dict[str, Any], cpu0: float, end: float | None = None,
            cpu_end: float | None = None) -> dict[str, Any]:
    """Finish `shard` (wait for its files, write its done record) and say so; the span ends at `end`, or now."""
    record = shard.finish()
    end = time.time() if end is None else end
    cpu_end = time.process_time() if cpu_end is None else cpu_end
    return {"record": record, "task": {**span, "end": end, "cpu": cpu_end - cpu0}}
