"""Chaos: lose a Ray worker node at random points of `audiopipe shard --ray-address`, under CPU stress, N times.
Each run must end byte-identical to an uninterrupted run, or in one line saying to rerun whose rerun is; the
points, the ways a node is lost and the command: docs/extraction.md ("Chaos").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results_io import ROOT, child_env, host, output_args, write_results

sys.path.insert(0, str(ROOT / "tests"))
from ray_cluster import Cluster, Stress, job_env  # noqa: E402  (tests/: the harness the cluster tests share)
from shard_helpers import done_shards, tree_digest  # noqa: E402

SHARD_KB = 60
POINTS = ("before_first_shard", "mid_group", "during_index")
MODES = ("raylet", "node")


def shard_cmd(corpus: Path, out: Path, address: str | None) -> list[str]:
    """The job on the cluster at `address`, or (None) in this process's engine-free path: the bytes are the same."""
    return [sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", str(corpus), "--out", str(out), "--features",
            "mel,f0", "--shard-size", f"{SHARD_KB}kB", "--no-progress",
            *(["--ray-address", address] if address else ["--workers", "0"])]


def chaos_run(cluster: Cluster, corpus: Path, out: Path, clean: dict[str, str], n_shards: int, point: str,
              mode: str, rng: random.Random, timeout: float = 300.0) -> dict:
    """One job that loses the worker node at `point`; returns what happened, with `outcome` checked."""
    t0 = time.monotonic()
    cmd, env = shard_cmd(corpus, out, cluster.address), job_env(cluster)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    target = rng.randint(1, max(1, n_shards - 4))
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline and proc.poll() is None:
        done = done_shards(out)
        if point == "before_first_shard":
            ready = (out / ".audiopipe.lock").exists() and done == 0
        elif point == "mid_group":  # the node holding a shard; past 2 more shards, mid-job whatever it holds
            ready = (done >= target and cluster.busy_on_worker()) or (target + 2 <= done < n_shards)
        else:
            ready = done >= n_shards and not (out / "manifest.json").exists()
        if ready:
            seen = {"done": done, "manifest": (out / "manifest.json").exists(), "busy": cluster.busy_on_worker()}
            cluster.lose_worker(mode)
            break
        time.sleep(0.005)  # polling the output folder, not waiting for an effect
    killed = seen is not None
    seen = seen or {"done": done_shards(out), "manifest": (out / "manifest.json").exists(), "busy": False}
    result = {"point": point, "mode": mode, "killed": killed, "at_kill": seen, "error_line": None}

    def end(rc: int, outcome: str, stderr: str) -> dict:
        return dict(result, rc=rc, outcome=outcome, stderr_tail=stderr[-1500:] if outcome.startswith("FAIL") else "",
                    seconds=round(time.monotonic() - t0, 2))

    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return end(-9, "FAIL: the job hung", proc.communicate()[1])
    if proc.returncode == 0:
        return end(0, "identical" if tree_digest(out) == clean else "FAIL: exit 0, other bytes", stderr)
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]  # the one `audiopipe: error:` line, or FAIL
    if len(lines) != 1 or not lines[0].startswith("audiopipe: error: ") or "rerun" not in lines[0] \
            or "Traceback" in stderr:
        return end(proc.returncode, "FAIL: not one line saying to rerun", stderr)
    result["error_line"] = lines[0]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if r.returncode != 0:
        return end(proc.returncode, "FAIL: the rerun failed", r.stderr)
    return end(proc.returncode, "rerun_identical" if tree_digest(out) == clean else "FAIL: rerun exit 0, other bytes",
               stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--stress", type=int, default=1, help="CPU-spinning processes beside the job (default 1)")
    p.add_argument("--seed", type=int, default=None, help="default: a random one, recorded in the JSON")
    output_args(p)
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2 ** 32)
    rng = random.Random(seed)
    res = {"host": host(a.machine), "command": " ".join(sys.argv), "seed": seed, "stress_processes": a.stress,
           "runs_asked": a.runs, "load_average_1m": [], "runs": [], "failed": 0}
    with (tempfile.TemporaryDirectory(prefix="audiopipe-chaos-", ignore_cleanup_errors=True) as tmp,
          contextlib.ExitStack() as cleanup):
        from corpora import make_espeak_corpus

        work = Path(tmp)
        make_espeak_corpus(work / "corpus", speakers=4, per_speaker=6)
        r = subprocess.run(shard_cmd(work / "corpus", work / "clean", None), capture_output=True, text=True,
                           cwd=ROOT, env=child_env(), timeout=600)
        if r.returncode != 0:
            raise SystemExit(f"the uninterrupted run failed:\n{r.stderr}")
        clean = tree_digest(work / "clean")
        res["shards"] = n_shards = len(json.loads((work / "clean" / "manifest.json").read_text())["shards"])
        cluster = Cluster().start()
        cleanup.callback(cluster.stop)  # before the folder goes (the inner context ends first)
        with Stress(a.stress):
            for i in range(a.runs):
                point, mode = rng.choice(POINTS), rng.choice(MODES)
                run = chaos_run(cluster, work / "corpus", work / f"out-{i}", clean, n_shards, point, mode, rng)
                res["runs"].append(run)
                res["load_average_1m"].append(round(os.getloadavg()[0], 2))
                print(f"run {i}: {point} ({mode}): {run['outcome']} in {run['seconds']} s, at kill {run['at_kill']}",
                      flush=True)
                save(res, a.json)  # after every run: a benchmark stopped midway keeps what it measured
                shutil.rmtree(work / f"out-{i}", ignore_errors=True)
                cluster.clear_worker()
                if i + 1 < a.runs:
                    cluster.add_worker()
    print(f"{len(res['runs']) - res['failed']} of {a.runs} runs identical, or one line + an identical rerun")
    return 0 if res["failed"] == 0 and len(res["runs"]) == a.runs else 1


def save(res: dict, path: Path | None) -> None:
    runs = res["runs"]
    res.update(failed=sum(r["outcome"].startswith("FAIL") for r in runs), node_lost_in=sum(r["killed"] for r in runs),
               outcomes={k: sum(r["outcome"] == k for r in runs) for k in ("identical", "rerun_identical")},
               node_lost_while_it_held_a_shard=sum(r["at_kill"]["busy"] for r in runs))
    res.pop("load_average_end", None)  # write_results records the load at this write
    write_results(res, path, lambda _: None, None)


if __name__ == "__main__":
    sys.exit(main())
