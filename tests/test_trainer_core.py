"""trainers/core.py under real torchrun: two ranks, dropout, checkpoint, resume bit-exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shard_helpers import shard

HERE = Path(__file__).resolve().parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def mel_shards(synthetic_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("core_shards")
    shard(synthetic_corpus.root, out, [("vocos_mel", {})])
    return out


def _run(shards: Path, out: Path, *extra: str) -> None:
    args = ["--shards", str(shards), "--out", str(out), "--log-every", "1", "--warmup-steps", "2", "--lr", "1e-3",
            "--batch-frames", "1200", "--max-steps", "6", *extra]
    r = subprocess.run(TORCHRUN + [str(HERE / "core_trainer_fixture.py"), *args], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr[-3000:]


def test_two_rank_resume_is_bit_exact_with_dropout(mel_shards, tmp_path):
    # One straight run of 6 steps that also checkpoints at step 3; then a second run resumes from step 3.
    _run(mel_shards, tmp_path / "straight", "--ckpt-every", "3")
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "ckpt-00000003.pt").write_bytes((tmp_path / "straight" / "ckpt-00000003.pt").read_bytes())
    (resumed / "log.jsonl").write_text("".join((tmp_path / "straight" / "log.jsonl").read_text().splitlines(True)[:3]))
    _run(mel_shards, resumed, "--ckpt-every", "3", "--resume")
    a = torch.load(tmp_path / "straight" / "ckpt-00000006.pt", weights_only=True)
    b = torch.load(resumed / "ckpt-00000006.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert len(b["rng"]) == 2 and not torch.equal(b["rng"][0]["torch"], b["rng"][1]["torch"])
    log = [json.loads(l) for l in (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()]
    straight = [json.loads(l) for l in (tmp_path / "straight" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log[3:]] == [4, 5, 6]
    assert [r["loss"] for r in log[3:]] == [r["loss"] for r in straight[3:]]
    for rec in straight:
        assert rec["world"] == 2 and 0.0 <= rec["data_wait_share"] < 1.0 and rec["padding_ratio"] >= 0
        assert rec["step_time"] > 0 and rec["frames_per_s"] > 0
