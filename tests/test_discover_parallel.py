"""Discovery reads headers (and sidecar transcripts) in parallel, and its result does not depend on it."""

from __future__ import annotations

import threading
import time

import numpy as np
import soundfile as sf

import audiopipe.corpus.discover as discover_mod
from audiopipe.corpus.discover import discover


def _corpus(root, n: int = 96) -> None:
    rng = np.random.default_rng(0)
    for i in range(n):
        d = root / f"spk{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        sf.write(d / f"u{i:03d}.wav", (0.1 * rng.standard_normal(800 + 7 * i)).astype(np.float32), 8000)
        if i % 3 == 0:
            (d / f"u{i:03d}.txt").write_text(f"text {i}")
    (root / "spk0" / "bad.wav").write_bytes(b"RIFF not really")  # a reject among them
    sf.write(root / "spk1" / "u001.flac", np.zeros(900, np.float32) + 0.1, 8000)  # duplicate id of u001.wav


def test_headers_are_read_concurrently_and_the_result_is_the_serial_one(tmp_path, monkeypatch):
    _corpus(tmp_path)
    serial = discover(tmp_path, header_threads=1)

    real = discover_mod.read_info
    active, peak, lock = [0], [0], threading.Lock()

    def timed_read_info(path):  # the real read, made as slow as a network file system's round trip
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.005)
            return real(path)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(discover_mod, "read_info", timed_read_info)
    parallel = discover(tmp_path, header_threads=8)
    assert peak[0] > 1, "headers were read one at a time"
    assert parallel == serial
    assert [r.reason for r in serial.rejects] == ["unreadable", "duplicate_id"]
    assert len(serial.utterances) == 96 and {u.id: u.text for u in serial.utterances}["spk3/u003"] == "text 3"
