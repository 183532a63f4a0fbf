"""Reading shards back for the English corpus tests: every row's id, speaker, text, kept columns and pcm."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa


def shard_rows(out: Path) -> dict[str, dict]:
    """{id: row} over every Arrow shard of a finished output (pcm as int16 numpy)."""
    m = json.loads((out / "manifest.json").read_text())
    rows = {}
    for e in m["shards"]:
        with pa.memory_map(str(out / e["arrow"]["path"])) as src:
            for r in pa.ipc.open_file(src).read_all().to_pylist():
                if "pcm" in r:
                    r["pcm"] = np.asarray(r["pcm"], np.int16)
                rows[r["id"]] = r
    return rows


def assert_rows_match(rows: dict[str, dict], expected: dict, *, text: bool = True, pcm: bool = True) -> None:
    """Every expected utterance was written once, with its own samples, speaker and text."""
    assert sorted(rows) == sorted(expected)
    for uid, e in expected.items():
        r = rows[uid]
        assert r["speaker"] == e.speaker, uid
        if text:
            assert r["text"] == e.text, uid
        if pcm:
            assert len(r["pcm"]) == len(e.pcm), (uid, len(r["pcm"]), len(e.pcm))
            diff = np.abs(r["pcm"].astype(np.int32) - e.pcm.astype(np.int32))
            assert int(diff.max(initial=0)) <= e.tol, (uid, int(diff.max()))
