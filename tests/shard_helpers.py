"""Small helpers shared by the shard/loader tests: build a job and run it in this process."""

from __future__ import annotations

import hashlib
from dataclasses import asdict
from pathlib import Path

from audiopipe.decode.audio import DecodeLimits
from audiopipe.shard.job import CodecSettings, Job
from audiopipe.shard.run import run_job


def make_job(corpus: Path, out: Path, features, *, shard_bytes: int = 256 << 20, trim=None, phones=False,
             codec: CodecSettings | None = None, align_to=None, presets=("custom",), **limits) -> Job:
    return Job(corpus=str(corpus), out=str(out), presets=list(presets), features=list(features),
               limits=asdict(DecodeLimits(**limits)), trim=trim, phones=phones, codec=codec, align_to=align_to,
               shard_bytes=shard_bytes)


def shard(corpus: Path, out: Path, features, workers: int = 0, **kw):
    """Build in this process by default: the bytes never depend on the engine (tests/test_shard_engines.py,
    test_shard_cluster.py), and a test process has threads (pytest-xdist's), so worker processes would be spawned
    interpreters importing torch & co. again, seconds of CPU each, for corpora that take a second to build."""
    return run_job(make_job(corpus, out, features, **kw), workers=workers, show_progress=False)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every regular file under root (relative path -> digest)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def done_shards(out: Path) -> int:
    """Shards whose done record is in place (not the records still being written, dot-prefixed)."""
    d = out / "done"
    return len([p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith(".")]) if d.is_dir() else 0
