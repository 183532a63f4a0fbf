"""Which shards of a job are accounted for: every unit ends reported (its done record in hand), resubmitted, or
a named failure, whatever the engine (Ray tasks, local worker processes, this process).

A group of units is sent as one task that reports each shard as it is finished. A task can end without
reporting all of its units: a Ray generator task whose worker saw itself orphaned by a lost node, a local worker
process that died. Such units are neither built nor failed, and must not be taken for either: `settle` hands
them back to be sent again, a bounded number of times, and names them as failures after that. `missing` is
what the job checks before it writes an index: a unit never settled is an error in the engine, said in one line.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from audiopipe.errors import Failed
from audiopipe.shard.plan import WorkUnit

# How often a unit that a task ended without reporting is sent again (on top of the engine's own retries of a
# failed task). Each resend goes to whatever workers are left, so a node lost once costs one resend.
RESENDS = 3


@dataclass
class Ledger:
    units: list[WorkUnit]
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {"record", "task"}
    failures: dict[str, str] = field(default_factory=dict)  # name -> cause, one line
    resends: Counter = field(default_factory=Counter)  # name -> times resent

    def report(self, item: dict[str, Any], group: list[WorkUnit]) -> WorkUnit:
        """A task reported a finished shard; returns its unit. A report for a unit outside the task's group is an
        engine error, never silently counted."""
        name = item["record"]["name"]
        unit = next((u for u in group if u.name == name), None)
        if unit is None:
            raise Failed(f"a shard task reported {name}, which it was not given")
        self.reports.setdefault(name, item)  # a retried task reports its finished shards again: count once
        return unit

    def open_units(self, group: list[WorkUnit]) -> list[WorkUnit]:
        """The units of `group` neither reported nor failed."""
        return [u for u in group if u.name not in self.reports and u.name not in self.failures]

    def settle(self, group: list[WorkUnit], error: BaseException | str | None = None) -> list[WorkUnit]:
        """A task of `group` has ended (with `error`, or normally). Its open units are failed with that error
        (the engine's own retries are spent); without one they are returned to be sent again, up to RESENDS
        times each, then failed as never reported."""
        left = self.open_units(group)
        if error is not None:
            cause = error if isinstance(error, str) else _one_line(error)
            for u in left:
                self.failures[u.name] = cause
            return []
        again = []
        for u in left:
            if self.resends[u.name] < RESENDS:
                self.resends[u.name] += 1
                again.append(u)
            else:
                self.failures[u.name] = (f"its task ended {RESENDS + 1} times without reporting it "
                                         f"(workers lost or killed)")
        return again

    def missing(self) -> list[str]:
        """Units neither reported nor failed: after the engine has finished, always empty."""
        return [u.name for u in self.units if u.name not in self.reports and u.name not in self.failures]

    def failure_line(self) -> str:
        """One line for a job with failures: how many, the first cause in full, and what to do."""
        first = next(u.name for u in self.units if u.name in self.failures)
        return (f"{len(self.failures)} of {len(self.units)} shards failed after retries, first {first}: "
                f"{self.failures[first]}; the finished shards are kept, rerun the same command to build the rest")


def _one_line(e: BaseException) -> str:
    """`Type: last line of the message` (a Ray task error carries the worker's traceback before it)."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[-1] if text else ''}".rstrip(": ")
