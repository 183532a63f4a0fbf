"""The baselines of benchmarks/bench_discovery.py read every header of the corpus they are timed on, and the
corpus holds what the benchmark expects of it (its odd files become rejects, the rest utterances)."""

from __future__ import annotations

import sys
from pathlib import Path

import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from bench_discovery import audio_files, child, headers_in_threads, make_corpus  # noqa: E402


def test_each_baseline_reads_every_header_and_discover_finds_every_file(tmp_path):
    expected = make_corpus(tmp_path, 1200, procs=2)
    files = audio_files(tmp_path)
    assert len(files) == expected["audio_files"] == 1200 + 4 * 1
    for how in ("info", "open"):
        heads = headers_in_threads(files, how)
        assert len(heads) == len(files)
        for path, got in zip(files, heads):  # each file's own header, not a copy or a skipped one
            name = Path(path).name
            if name.startswith(("junk", "cut", "zero")):
                assert got is None, name
            else:
                want = sf.info(path)
                assert got == (want.samplerate, want.frames, want.channels), name
        r = child(how, str(tmp_path))
        assert (r["headers"], r["readable"]) == (expected["audio_files"], expected["utterances"])
    r = child("discover", str(tmp_path))
    assert (r["utterances"], r["rejects"]) == (expected["utterances"], expected["rejects"])


def test_peak_rss_is_the_childs_own():
    # ru_maxrss survives fork + exec on Linux: a child started by a 2 GB parent reported 2 GB for every
    # measurement. VmHWM belongs to the child's own address space.
    import json
    import subprocess

    import numpy as np

    big = np.ones(300 * 2**20 // 8)  # this process: 300 MB more resident
    code = "import json, results_io; print(json.dumps(results_io.peak_rss_mb()))"
    bench = str(Path(__file__).resolve().parent.parent / "benchmarks")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=bench)
    assert json.loads(out.stdout) < 200 < big.nbytes / 2**20
