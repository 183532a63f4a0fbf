"""plan.json is written unit by unit: it reads back as the same units, and writing it never holds the whole text
(at a million utterances that text and its bytes would be over a gigabyte on top of the plan)."""

from __future__ import annotations

import json
import tracemalloc

from audiopipe.shard.plan import PlannedUtt, WorkUnit, plan_summary, plan_units, write_plan


def _units(n: int) -> list[WorkUnit]:
    utts = [PlannedUtt(f"spk{i % 97:03d}/wavs/u{i:07d}", f"/data/corpus/spk{i % 97:03d}/wavs/u{i:07d}.wav",
                       f"spk{i % 97:03d}/wavs/u{i:07d}.wav", f"spk{i % 97:03d}", f"sentence number {i} é",
                       0.5 + (i % 35) / 10, {"gender": "f"} if i % 3 else {}) for i in range(n)]
    return plan_units(utts, 32_000.0, 2_000_000, seed=0)


def test_the_file_reads_back_as_the_plan_and_its_units(tmp_path):
    units = _units(3_000)
    plan = {"job_identity": "x", "discovered": 3_000, "discovery_rejects": [], "notes": ["a note"], "hint": ""}
    write_plan(tmp_path / "plan.json", plan, units)
    back = json.loads((tmp_path / "plan.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in back.items() if k != "units"} == plan
    assert [WorkUnit.from_dict(u) for u in back["units"]] == units
    write_plan(tmp_path / "empty.json", plan, [])
    assert json.loads((tmp_path / "empty.json").read_text())["units"] == []


def test_writing_holds_one_unit_at_a_time(tmp_path):
    units = _units(40_000)
    plan = {"job_identity": "x", "discovered": 40_000, "discovery_rejects": [], "notes": [], "hint": ""}
    tracemalloc.start()
    try:
        write_plan(tmp_path / "plan.json", plan, units)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = (tmp_path / "plan.json").stat().st_size
    assert size > 8_000_000
    # one json.dumps of the whole plan peaks at about twice the file (its text, then its UTF-8 bytes)
    assert peak < size / 4, (peak, size)


def test_a_rerun_reads_the_fields_and_unit_names_without_the_utterances(tmp_path):
    # A rerun with nothing to do needs the plan's identity and its units' names only: at 50,000 utterances
    # plan_summary holds a line at a time (a full parse would hold about a kilobyte of objects an utterance).
    units = _units(50_000)
    units[0].utterances[0].text = 'a "quoted" \\ text: {"index": 1, "name": "shard-999999", "utterances": ['
    plan = {"job_identity": "x", "discovered": 50_000, "discovery_rejects": [{"reason": "r", "path": 'p"q'}],
            "notes": ["é"], "hint": ""}
    path = tmp_path / "plan.json"
    write_plan(path, plan, units)
    tracemalloc.start()
    try:
        with open(path, encoding="utf-8") as f:
            fields, names = plan_summary(f)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert fields == plan and names == [u.name for u in units]
    assert peak < path.stat().st_size / 20, (peak, path.stat().st_size)
    write_plan(tmp_path / "empty.json", plan, [])
    assert plan_summary(open(tmp_path / "empty.json", encoding="utf-8")) == (plan, [])
    # Not in write_plan's layout (one json.dumps of the whole, as older versions wrote it; or cut short): None,
    # and the caller parses the file.
    whole = json.dumps({**plan, "units": [u.to_dict() for u in units[:3]]}, indent=1)
    assert plan_summary(whole.splitlines(keepends=True)) is None
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert plan_summary(lines[:-2]) is None
