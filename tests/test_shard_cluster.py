"""`audiopipe shard --ray-address` on a real 2-node Ray cluster on this machine with token authentication, losing
its worker node mid-job under CPU stress (the harness of benchmarks/bench_chaos.py, which runs it 10+ times), and
mid-job to an s3:// --out (a real S3 server on 127.0.0.1, tests/s3server.py).

Each node is its own `ray start` (own raylet, object store and workers), on free ports and in a private temp
folder, so the tests run beside other Ray sessions. Every run must end byte-identical to an uninterrupted run,
or in one line that says to rerun whose rerun is byte-identical; the outcome of each is checked in full.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from audiopipe.shard.manifest import read_manifest
from shard_helpers import shard, tree_digest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_chaos import SHARD_KB, chaos_run, shard_cmd  # noqa: E402
from ray_cluster import Cluster, Stress, job_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["s3server"]


@pytest.fixture(scope="module")
def cluster(s3_server):
    """Its nodes start with the S3 server's AWS_* environment, which each node's workers inherit from its `ray
    start`, as on a real cluster (the local-folder tests do not read it)."""
    c = Cluster(env=s3_server.env()).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def clean(espeak_corpus, tmp_path_factory):
    """The uninterrupted run, built in this process (`workers=0`): the bytes never depend on the engine."""
    out = tmp_path_factory.mktemp("cluster_clean") / "out"
    shard(espeak_corpus.root, out, [("vocos_mel", {}), ("f0", {})], shard_bytes=SHARD_KB * 1024, workers=0)
    n = len(read_manifest(out)["shards"])
    assert n >= 8
    return tree_digest(out), n


# The original defect: the raylet alone SIGKILLed mid-group orphans the node's workers, whose tasks then ended
# early and looked finished; and a node lost before any shard. The moment (which shard, how the node dies in the
# second) is drawn at random; the seed is printed on failure.
@pytest.mark.parametrize("point, mode", [("mid_group", "raylet"), ("before_first_shard", "node")])
def test_losing_the_worker_node_under_cpu_stress_ends_identical_or_in_one_line_and_an_identical_rerun(
        point, mode, cluster, clean, espeak_corpus, tmp_path):
    digest, n_shards = clean
    seed = random.SystemRandom().randrange(2 ** 32)
    try:
        with Stress(1):
            r = chaos_run(cluster, espeak_corpus.root, tmp_path / "out", digest, n_shards, point, mode,
                          random.Random(seed), timeout=300)
    finally:
        cluster.clear_worker()
        cluster.add_worker()
    assert r["killed"], f"the node was never lost (seed {seed}): {r}"
    if point == "mid_group":
        assert 1 <= r["at_kill"]["done"] < n_shards, r
    else:
        assert r["at_kill"]["done"] == 0, r
    assert r["outcome"] in ("identical", "rerun_identical"), f"seed {seed}: {r}"
    if r["outcome"] == "rerun_identical":
        assert r["rc"] == 2 and "rerun the same command" in r["error_line"], r


def test_a_job_joins_with_a_token_file_and_without_a_token_is_refused_in_one_line(cluster, clean, espeak_corpus,
                                                                                  tmp_path):
    digest, _ = clean
    # The token in a file named by RAY_AUTH_TOKEN_PATH, RAY_AUTH_MODE unset: the job finds it and joins.
    token_file = tmp_path / "token"
    token_file.write_text(cluster.token)
    env = {k: v for k, v in job_env(cluster).items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    cmd = shard_cmd(espeak_corpus.root, tmp_path / "with_file", cluster.address)
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, RAY_AUTH_TOKEN_PATH=str(token_file)),
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    assert tree_digest(tmp_path / "with_file") == digest

    # No token anywhere (a home without ~/.ray/auth_token): one line that says what to set, at once.
    home = tmp_path / "home"
    home.mkdir()
    r = subprocess.run(shard_cmd(espeak_corpus.root, tmp_path / "without", cluster.address), capture_output=True,
                       text=True, env=dict(env, HOME=str(home)), cwd=ROOT, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("audiopipe: error: the Ray cluster at") and "RAY_AUTH_TOKEN" in lines[0]
    assert cluster.token not in r.stderr + r.stdout
    assert not (tmp_path / "without" / "done").exists()


def test_a_worker_node_lost_mid_job_to_s3_loses_no_object(cluster, clean, espeak_corpus, s3):
    """--out s3://: each worker uploads from its own staging; SIGKILL of the worker node mid-job, while it builds
    a shard, loses nothing: the job ends 0 and the objects are the uninterrupted local run's bytes."""
    from s3server import object_digests, object_keys

    digest, n_shards = clean
    out = f"{s3[1]}/cluster"
    proc = subprocess.Popen(shard_cmd(espeak_corpus.root, out, cluster.address), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=job_env(cluster), cwd=ROOT)
    try:
        deadline = time.monotonic() + 180
        while not (sum(k.startswith("done/") for k in object_keys(out)) >= n_shards // 4
                   and cluster.busy_on_worker()):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the worker node never held a shard past a quarter of the job"
            time.sleep(0.02)
        cluster.lose_worker("node")
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.clear_worker()
        cluster.add_worker()
    assert proc.returncode == 0 and "Traceback" not in stderr, stderr
    assert object_digests(out) == digest
