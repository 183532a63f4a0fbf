"""plan.json is written unit by unit: it reads back as the same units, and writing it never holds the whole text
(at a million utterances that text and its bytes would be over a gigabyte on top of the plan)."""

from __future__ import annotations

import json
import tracemalloc

from audiopipe.shard.plan import PlannedUtt, WorkUnit, plan_units, write_plan


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
