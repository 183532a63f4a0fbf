"""`audiopipe shard --timings FILE`: where a run's wall time went, from the driver's phases and the workers' own
stamps (real Ray, the session's local cluster)."""

from __future__ import annotations

import json

from audiopipe.cli import main
from audiopipe.shard.manifest import read_manifest


def test_timings_name_every_shard_task_inside_the_extraction_phase(asterisk_corpus, tmp_path, capsys):
    out, timings = tmp_path / "out", tmp_path / "timings.json"
    args = ["shard", "--corpus", str(asterisk_corpus.root), "--out", str(out), "--features", "mel",
            "--workers", "2", "--shard-size", "200KB", "--no-tar", "--no-progress", "--timings", str(timings)]
    assert main(args) == 0
    t = json.loads(timings.read_text())
    ph = t["phases"]
    order = ["planned", "started", "tasks_done", "records", "index", "manifest"]
    assert [ph[p] for p in order] == sorted(ph[p] for p in order) and ph["planned"] > 0
    shards = [s["name"] for s in read_manifest(out)["shards"]]
    assert len(shards) >= 3
    assert sorted(task["name"] for task in t["tasks"]) == shards  # one entry per shard built, no other
    for task in t["tasks"]:
        # Worker stamps on the driver's clock: every task ran between the start of extraction and its end.
        assert ph["started"] - 0.05 <= task["start"] < task["end"] <= ph["tasks_done"] + 0.05, task
        assert isinstance(task["pid"], int)
    # The done records on disk carry no timestamps (reruns and kill -9 stay byte-identical).
    assert all("start" not in json.loads(p.read_text()) for p in (out / "done").glob("*.json"))

    assert main(args) == 0  # a finished output: nothing built, nothing timed
    assert json.loads(timings.read_text()) == {}
    capsys.readouterr()
