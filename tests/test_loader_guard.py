"""The loader regression guard: the default make_loader against a plain numpy copy of the same batches, in the same
process (audiopipe/bench/guard.py). Prints the ratio against the committed one and fails only below half of it:
a busy machine slows both sides, a real regression in the loader's own cost does not."""

from __future__ import annotations

import json
from pathlib import Path

from audiopipe.bench.guard import measure, write_guard_corpus

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "loader_guard.json"


def test_loader_throughput_against_the_reference_loop(tmp_path_factory):
    committed = json.loads(COMMITTED.read_text())["ratio"]
    shards = write_guard_corpus(tmp_path_factory.mktemp("guard") / "shards")
    got = measure(shards, rounds=9)
    print(f"loader/reference = {got['ratio']:.3f} (committed {committed:.3f}, fails below {committed / 2:.3f}; "
          f"wall-time ratio {got['wall_ratio']:.3f}, load {got['load_avg'][0]:.1f})")
    assert got["ratio"] >= committed / 2, (
        f"make_loader's CPU time per epoch is {1 / got['ratio']:.1f}x the reference loop's, where the committed "
        f"figure is {1 / committed:.1f}x: a regression in the loader's own cost (CPU s per epoch: loader "
        f"{got['loader']['cpu']}, reference {got['reference']['cpu']})")
