"""The job's ledger (audiopipe.shard.ledger): every unit ends reported, sent again, or a named failure, never
lost between the three. Its engines are tested on real Ray and real processes elsewhere (test_shard_cluster.py,
test_shard_engines.py); these pin its rules."""

from __future__ import annotations

import pytest

from audiopipe.shard.ledger import RESENDS, Ledger
from audiopipe.shard.plan import PlannedUtt, WorkUnit


def _units(n: int) -> list[WorkUnit]:
    return [WorkUnit(f"shard-{i:06d}", i, [PlannedUtt(f"u{i}", "", "", "", "", 1.0 + i)]) for i in range(n)]


def _item(u: WorkUnit) -> dict:
    return {"record": {"name": u.name}, "task": {"name": u.name}}


def test_a_task_that_ends_early_has_its_unreported_units_sent_again_then_failed_by_name():
    units = _units(4)
    ledger = Ledger(units)
    group = units[:3]
    ledger.report(_item(group[0]), group)
    # The task ended normally after one report (an orphaned worker, a lost node): two units are open, and
    # neither built nor failed. They go back to be sent again, RESENDS times, then are failures by name.
    assert ledger.settle(group) == group[1:]
    assert sorted(ledger.missing()) == [u.name for u in units[1:]]
    for _ in range(RESENDS - 1):
        assert ledger.settle(group[1:]) == group[1:]
    assert ledger.settle(group[1:]) == []
    assert set(ledger.failures) == {group[1].name, group[2].name}
    assert "without reporting" in ledger.failures[group[1].name]
    assert ledger.missing() == [units[3].name]  # never sent: still open, and the job would refuse to go on
    line = ledger.failure_line()
    assert line.startswith(f"2 of 4 shards failed after retries, first {group[1].name}: ") and "rerun" in line
    assert "\n" not in line


def test_an_error_fails_the_open_units_of_its_group_only_and_a_repeated_report_counts_once():
    units = _units(3)
    ledger = Ledger(units)
    ledger.report(_item(units[0]), units)
    ledger.report(_item(units[0]), units)  # a retried generator reports its finished shard again
    assert list(ledger.reports) == [units[0].name]
    err = RuntimeError("Traceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device")
    assert ledger.settle(units, err) == []
    assert ledger.failures == {u.name: "RuntimeError: OSError: [Errno 28] No space left on device"
                               for u in units[1:]}
    assert ledger.missing() == []


def test_a_report_of_a_unit_the_task_was_not_given_is_an_error_not_a_count():
    units = _units(2)
    ledger = Ledger(units)
    with pytest.raises(RuntimeError, match="was not given"):
        ledger.report(_item(units[1]), units[:1])
    assert ledger.reports == {}
