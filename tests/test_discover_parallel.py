"""Discovery reads headers (and sidecar transcripts) in parallel, and its result does not depend on it."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

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

    active, peak, lock = [0], [0], threading.Lock()

    def slowed(real):
        def timed(path):  # the real read, made as slow as a network file system's round trip
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            try:
                time.sleep(0.005)
                return real(path)
            finally:
                with lock:
                    active[0] -= 1
        return timed

    # WAV headers are read directly, anything else (the FLAC, the broken file) by libsndfile: slow both.
    monkeypatch.setattr(discover_mod, "read_info", slowed(discover_mod.read_info))
    monkeypatch.setattr(discover_mod, "read_wav_header", slowed(discover_mod.read_wav_header))
    parallel = discover(tmp_path, header_threads=8)
    assert peak[0] > 1, "headers were read one at a time"
    assert parallel == serial
    assert [r.reason for r in serial.rejects] == ["unreadable", "duplicate_id"]
    assert len(serial.utterances) == 96 and {u.id: u.text for u in serial.utterances}["spk3/u003"] == "text 3"


def test_the_light_header_read_agrees_with_soundfile_info(tmp_path):
    # Discovery opens a SoundFile instead of calling sf.info() (~2/3 of the cost per file); both read the same
    # libsndfile header, for every container the corpora use.
    from audiopipe.decode.audio import RejectError, read_info

    x = (0.1 * np.random.default_rng(1).standard_normal((4410, 2))).astype(np.float32)
    for name, kw in (("a.wav", {}), ("b.flac", {}), ("c.ogg", {"format": "OGG", "subtype": "VORBIS"}),
                     ("d.wav", {"subtype": "FLOAT"})):
        sf.write(tmp_path / name, x if name != "b.flac" else x[:, 0], 22050, **kw)
        want, got = sf.info(str(tmp_path / name)), read_info(tmp_path / name)
        assert (got.samplerate, got.frames, got.channels, got.format, got.subtype) == \
            (want.samplerate, want.frames, want.channels, want.format, want.subtype)
    (tmp_path / "bad.wav").write_bytes(b"RIFF not really")
    try:
        read_info(tmp_path / "bad.wav")
    except RejectError as e:
        assert e.reason == "unreadable" and "cannot read the header" in e.detail
    else:
        raise AssertionError("a broken header was accepted")


def test_reads_stay_a_few_blocks_ahead_of_the_caller(monkeypatch):
    # At a million files, handing every read to the pool at once (one future each) cost ~1 KB per file and the
    # reads ran far ahead of the decisions; now only a few blocks per thread are in flight.
    done = [0]
    lock = threading.Lock()

    def counted(c):
        with lock:
            done[0] += 1
        return c

    submitted = []

    class Recording(ThreadPoolExecutor):
        def submit(self, *args, **kwargs):
            submitted.append(super().submit(*args, **kwargs))
            return submitted[-1]

    monkeypatch.setattr(discover_mod, "_read_one", counted)
    monkeypatch.setattr(discover_mod, "ThreadPoolExecutor", Recording)
    reads = discover_mod._read_all(list(range(50_000)), 4)
    assert next(reads) == 0
    # The caller now holds: the pool runs as far ahead as it will, i.e. until every block handed to it is read.
    wait(submitted)
    assert 0 < done[0] <= 2 * 4 * 256  # blocks of at most 256, at most two per thread handed out
    assert list(reads) == list(range(1, 50_000)) and done[0] == 50_000


def test_discovery_leaves_the_garbage_collector_as_it_found_it(tmp_path):
    import gc

    _corpus(tmp_path, n=8)
    assert gc.isenabled()
    discover(tmp_path)
    assert gc.isenabled()
    gc.disable()
    try:
        discover(tmp_path)
        assert not gc.isenabled()
    finally:
        gc.enable()
