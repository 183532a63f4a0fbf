"""A `scheme://` argument is refused in one line, never taken for a local folder called `s3:`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from audiopipe.cli import main
from audiopipe.storage.paths import UnsupportedURL, require_local, url_scheme

pytest_plugins = ["s3server"]

CASES = [
    ["shard", "--corpus", "s3://bucket/wavs", "--out", "out"],  # the corpus is read from a local folder only
    ["shard", "--corpus", ".", "--out", "gs://bucket/shards"],  # --out, verify and inspect take s3:// alone
    ["shard", "--corpus", ".", "--out", "s3://bucket/shards", "--staging", "s3://bucket/tmp"],
    ["verify", "az://bucket/shards"],
    ["inspect", "gs://bucket/shards"],
    ["bench-loader", "--shards", "gs://bucket/shards"],
    ["export-f5", "--shards", "shards", "--out", "hf://x/y"],
    ["tokens", "--shards", "az://c/shards", "--out", "tok", "--kmeans", "8"],
]


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(a[:1] + a[-1:]) for a in CASES])
def test_cli_refuses_urls_in_one_line(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("audiopipe: error:") and ":// is not supported" in err[0], err
    assert list(tmp_path.iterdir()) == []  # no local folder named after the URL, nothing written


def test_shard_out_url_writes_nothing_locally(tmp_path):
    # The original bug: `--out s3://b/o` became the local folder `s3:/b/o` and the job ran. Through the real CLI;
    # s3:// is supported now (tests/test_shard_s3.py), any other scheme still ends here.
    (tmp_path / "wavs").mkdir()
    r = subprocess.run([sys.executable, "-m", "audiopipe.cli", "shard", "--corpus", "wavs", "--out", "gs://b/o"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "gs:// is not supported" in r.stderr, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wavs"]


def test_bench_loader_takes_s3_and_still_refuses_other_schemes_in_one_line(s3, capsys):
    # s3:// reaches the loader (a real S3 server, an empty prefix: a one-line error about the missing manifest,
    # not about the scheme); gs:// is still refused, naming what is supported.
    _, bucket = s3
    r = subprocess.run([sys.executable, "-m", "audiopipe.cli", "bench-loader", "--shards", f"{bucket}/none"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{bucket}/none/manifest.json not found" in r.stderr and "not supported" not in r.stderr, r.stderr
    assert main(["bench-loader", "--shards", "gs://b/shards"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "gs:// is not supported; give s3://" in err, err


def test_library_refuses_urls_before_pathlib_mangles_them():
    from pathlib import Path

    from audiopipe.reader.loader import make_loader

    with pytest.raises(UnsupportedURL, match=r"gs://bucket/x: gs:// is not supported; give s3://"):
        make_loader("gs://bucket/x", ["mel"], max_frames=1000, rank=0, world_size=1)
    with pytest.raises(UnsupportedURL):  # already through pathlib: one slash left, still a URL
        require_local(Path("s3://bucket/x"), "shard folder")


def test_local_paths_pass():
    for p in ["shards", "./s3/x", "/data/s3:backup", "C:/data", os.path.join("a", "b:c")]:
        assert url_scheme(p) is None and require_local(p, "x") == p
    assert url_scheme("S3://b") == "s3" and url_scheme("file:///tmp") == "file"
