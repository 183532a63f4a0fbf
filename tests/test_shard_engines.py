"""Where shards are built (audiopipe.shard.run): this process (`--workers 0`), local worker processes, or Ray;
the same bytes from each; planned resources that always let a job progress; options and results that are
refused in one line (numbers that are not finite or not ordered, a run that writes nothing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audiopipe.cli import main
from audiopipe.shard.api import shard
from audiopipe.shard.job import JobError
from audiopipe.shard.ray_setup import local_cores
from shard_helpers import tree_digest

ROOT = Path(__file__).resolve().parent.parent


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audiopipe.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=timeout)


def test_this_process_local_processes_and_ray_write_the_same_bytes(asterisk_corpus, tmp_path):
    digests, summaries = {}, {}
    for label, kw in (("here", dict(workers=0)), ("local", dict(workers=2, engine="local")),
                      ("ray", dict(workers=2, engine="ray"))):
        s = shard(asterisk_corpus.root, tmp_path / label, features="vocos_mel,f0", shard_size=200_000, **kw)
        digests[label], summaries[label] = tree_digest(tmp_path / label), s
    assert summaries["here"].shards >= 10 and summaries["here"].written == len(asterisk_corpus.utterances)
    assert digests["here"] == digests["local"] == digests["ray"]
    assert [summaries[k].engine for k in ("here", "local", "ray")] == ["local", "local", "ray"]
    assert summaries["here"].workers == 1 and summaries["here"].ray_start_s == 0
    # With --workers 0 nothing but this process built a shard.
    assert {t["pid"] for t in summaries["here"].timeline["tasks"]} == {os.getpid()}


def test_local_worker_processes_build_what_this_process_builds(asterisk_corpus, tmp_path):
    # The engine itself, its workers awaited (on a busy machine the job gives them work only once they are
    # warm, so a whole job may never use them): the shards they build are those this process builds.
    from concurrent.futures import wait

    from audiopipe.shard.api import build_job
    from audiopipe.shard.groups import group_units
    from audiopipe.shard.ledger import Ledger
    from audiopipe.shard.local_engine import LocalEngine
    from audiopipe.shard.plan import WorkUnit
    from audiopipe.shard.progress import Progress
    from audiopipe.shard.run import make_plan

    here = shard(asterisk_corpus.root, tmp_path / "here", features="vocos_mel", shard_size=100_000, workers=0)
    job = build_job(asterisk_corpus.root, tmp_path / "engine", features="vocos_mel", shard_size=100_000)
    units = [WorkUnit.from_dict(u) for u in make_plan(job, None, "auto")["units"]]
    assert len(units) == here.shards and len(group_units(units, 2)) >= 4
    engine = LocalEngine(2, 0)
    engine.start(job)
    wait(engine._warmups)
    ledger = Ledger(units)
    engine.run(job, units, ledger, Progress(0, False), None)
    assert ledger.missing() == [] and ledger.failures == {}
    pids = {r["task"]["pid"] for r in ledger.reports.values()}
    assert os.getpid() in pids and len(pids) == 2  # this process and its worker process both built shards
    for name, r in ledger.reports.items():  # a done record holds each file's size and checksum
        assert r["record"] == json.loads((tmp_path / "here" / "done" / f"{name}.json").read_text())


def test_auto_takes_ray_for_a_job_larger_than_the_local_engine_takes(asterisk_corpus, tmp_path, monkeypatch):
    import audiopipe.shard.run as run

    here = shard(asterisk_corpus.root, tmp_path / "here", features="pcm", shard_size=100_000, workers=0)
    monkeypatch.setattr(run, "LOCAL_MAX_AUDIO_S_PER_WORKER", 1.0)  # a 2-minute corpus is "large" now
    s = shard(asterisk_corpus.root, tmp_path / "auto", features="pcm", shard_size=100_000, workers=2)
    assert s.engine == "ray" and any(n.startswith("Ray engine: ") for n in s.notes), s.lines()
    assert s.shards == here.shards and tree_digest(tmp_path / "auto") == tree_digest(tmp_path / "here")


def _worker_processes(pid: int) -> list[int]:
    """The local engine's worker processes under `pid`: forked from it (the same command line), or spawned."""
    parent = Path(f"/proc/{pid}/cmdline").read_bytes()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and (cmd == parent or b"spawn_main" in cmd):
                out.append(int(d.name))
    return out


def test_a_local_worker_process_that_dies_is_replaced_and_the_job_ends_identical(asterisk_corpus, tmp_path):
    args = ["shard", "--corpus", str(asterisk_corpus.root), "--features", "mel", "--shard-size", "100kB",
            "--no-progress", "--engine", "local", "--workers", "2"]
    assert main([*args, "--out", str(tmp_path / "clean"), "--workers", "0"]) == 0
    n = len(json.loads((tmp_path / "clean" / "manifest.json").read_text())["shards"])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "audiopipe.cli", *args, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 240
    done = lambda: len(list((out / "done").glob("shard-*.json"))) if (out / "done").is_dir() else 0  # noqa: E731
    while not (done() >= 2 and _worker_processes(proc.pid)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)
    victims = _worker_processes(proc.pid)
    at_kill = done()
    for pid in victims:  # out of memory, say: the kernel's SIGKILL
        os.kill(pid, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert at_kill < n, "the worker must die mid-job"
    assert victims
    assert tree_digest(out) == tree_digest(tmp_path / "clean")


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting for a reaper has ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_driver_leaves_no_worker_behind(asterisk_corpus, tmp_path):
    """SIGKILL to the driver of a local-engine job: its worker processes, blocked on their task pipe (their
    siblings hold its other end, so no end of file comes), used to live on for good. The parent-death signal
    ends them within 5 s."""
    args = ["shard", "--corpus", str(asterisk_corpus.root), "--features", "mel", "--shard-size", "100kB",
            "--no-progress", "--engine", "local", "--workers", "2", "--out", str(tmp_path / "out")]
    proc = subprocess.Popen([sys.executable, "-m", "audiopipe.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 240
    while not (workers := _worker_processes(proc.pid)):
        assert proc.poll() is None, "the job ended before its workers started"
        assert time.monotonic() < deadline, "no worker started"
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    while any(_alive(w) for w in workers) and time.monotonic() - killed < 5:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "a worker outlived its driver by 5 s"


def _tiny_speech(root: Path, espeak_corpus, n: int = 3) -> Path:
    for u in espeak_corpus.utterances[:n]:
        spk, utt = u.id.split("/")
        (root / spk).mkdir(parents=True, exist_ok=True)
        for ext in (".wav", ".txt"):
            shutil.copy(espeak_corpus.root / spk / (utt + ext), root / spk / (utt + ext))
    return root


def test_a_codec_stage_with_one_worker_on_ray_progresses(espeak_corpus, tmp_path):
    # The CPU codec actor used to take the embedded Ray's only CPU: no shard task could ever start, and the job
    # waited forever without a word. It has a CPU of its own now.
    corpus = _tiny_speech(tmp_path / "c", espeak_corpus)
    args = ["shard", "--corpus", str(corpus), "--preset", "ns2", "--codec-random-init", "--no-progress"]
    ray_job = subprocess.Popen([sys.executable, "-m", "audiopipe.cli", *args, "--out", str(tmp_path / "ray"),
                                "--workers", "1", "--engine", "ray"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    # Meanwhile (the Ray job spends seconds starting its cluster), the same job in this process, the model
    # loaded here: the same bytes.
    assert main([*args, "--out", str(tmp_path / "here"), "--workers", "0"]) == 0
    out, err = ray_job.communicate(timeout=400)
    assert ray_job.returncode == 0, err
    assert "discovered 3, written 3" in out and "ray engine, 1 worker" in out
    assert tree_digest(tmp_path / "here") == tree_digest(tmp_path / "ray")


def test_workers_are_capped_by_the_cpus_and_by_the_shards_and_it_is_said(asterisk_corpus, tmp_path, capsys):
    cores = local_cores()
    corpus = tmp_path / "c"
    shutil.copytree(asterisk_corpus.root, corpus, symlinks=False)
    assert main(["shard", "--corpus", str(corpus), "--out", str(tmp_path / "o"), "--features", "pcm",
                 "--workers", "10000", "--no-progress", "--engine", "local"]) == 0
    out = capsys.readouterr().out
    assert f"--workers 10000: this machine has {cores} CPU" in out and f"using {cores}" in out
    # One shard (a small corpus, the default size): one worker has work, and the summary says so.
    assert "1 shard to build: 1 of the" in out or cores == 1
    assert re.search(rf"local engine, {cores} workers?", out)


@pytest.mark.parametrize("flag, value, message", [
    ("--min-duration", "nan", "--min-duration nan: must be a finite number"),
    ("--max-duration", "-1", "--max-duration -1.0: must be more than 0"),
    ("--max-duration", "inf", "--max-duration inf: must be a finite number"),
    ("--min-duration", "40", "--min-duration 40 must be less than --max-duration 30 (seconds)"),
    ("--silence-dbfs", "6", "--silence-dbfs 6.0: must be at most 0"),
    ("--max-channels", "0", "--max-channels 0: must be at least 1"),
    ("--codec-batch-size", "0", "--codec-batch-size 0: must be at least 1"),
    ("--shard-size", "0", "--shard-size 0: must be at least 1"),
    ("--workers", "-2", "--workers -2: must be at least 0"),
])
def test_numeric_options_that_are_not_finite_or_not_ordered_get_one_line(flag, value, message, synthetic_corpus,
                                                                        tmp_path, capsys):
    assert main(["shard", "--corpus", str(synthetic_corpus.root), "--out", str(tmp_path / "o"), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error: ") and message in err[0], err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_the_python_entry_point_checks_the_same_and_returns_the_summary(synthetic_corpus, tmp_path):
    with pytest.raises(JobError, match="min_duration=nan: must be a finite number"):
        shard(synthetic_corpus.root, tmp_path / "o", min_duration=float("nan"))
    with pytest.raises(JobError, match="unknown engine"):
        shard(synthetic_corpus.root, tmp_path / "o", engine="spark")
    import torch

    torch.set_num_threads(2)
    s = shard(synthetic_corpus.root, tmp_path / "o", features=["pcm"], workers=0)
    assert s.written == len(synthetic_corpus.utterances) and s.engine == "local" and not s.up_to_date
    assert torch.get_num_threads() == 2  # one while it built shards here, the caller's own again after
    assert shard(synthetic_corpus.root, tmp_path / "o", features=["pcm"], workers=0).up_to_date


def test_a_run_that_writes_nothing_exits_non_zero_in_one_line(synthetic_corpus, tmp_path, capsys):
    # Every clip rejected (all shorter than the minimum): the rejects are written, nothing else, and one line.
    out = tmp_path / "o"
    assert main(["shard", "--corpus", str(synthetic_corpus.root), "--out", str(out), "--features", "pcm",
                 "--min-duration", "25", "--max-duration", "30", "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    n = len(synthetic_corpus.utterances)
    assert len(err) == 1 and err[0].startswith(f"audiopipe: error: nothing written: {n} utterances discovered, "
                                               f"all rejected (too_short {n}; see "), err
    assert len((out / "rejects.jsonl").read_text().splitlines()) == n
    assert not (out / "manifest.json").exists()
    # A rerun says the same (no manifest declares an empty set complete).
    assert main(["shard", "--corpus", str(synthetic_corpus.root), "--out", str(out), "--features", "pcm",
                 "--min-duration", "25", "--max-duration", "30", "--workers", "0", "--no-progress"]) == 2
    assert "nothing written" in capsys.readouterr().err
    # A folder without audio: one line too.
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.md").write_text("no audio here\n")
    assert main(["shard", "--corpus", str(empty), "--out", str(tmp_path / "o2"), "--workers", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"audiopipe: error: nothing to shard in {empty}: no audio files "
                                                f"under {empty}"), err
    assert not (tmp_path / "o2" / "manifest.json").exists()


def test_the_discovery_hint_is_said_when_discovery_gives_one(tmp_path, capsys, monkeypatch):
    # Discovery may say what it saw instead (e.g. data files that need --manifest); the line carries it.
    import audiopipe.corpus.discover as discover_mod

    real = discover_mod.discover

    def with_hint(*a, **k):
        d = real(*a, **k)
        d.hint = "found 3 parquet files: use --manifest"
        return d

    monkeypatch.setattr(discover_mod, "discover", with_hint)
    empty = tmp_path / "empty"
    empty.mkdir()
    sf.write(empty / "x.wav", np.zeros(160, np.float32), 16000)  # 10 ms: rejected as too short
    # --features pcm: no transcripts wanted, so no note about their absence before the error line.
    assert main(["shard", "--corpus", str(empty), "--out", str(tmp_path / "o"), "--workers", "0",
                 "--features", "pcm"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("; found 3 parquet files: use --manifest"), err
