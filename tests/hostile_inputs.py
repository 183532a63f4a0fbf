"""Builders of hostile corpus inputs, shared by tests/test_hostile_*.py, tests/fuzz_corpus.py and
benchmarks/bench_fuzz.py: audio of every container libsndfile writes, cut short or with a lying header; tars
with sparse, linked, duplicate, nested and cut members; named pipes that must never be opened for reading.

Everything is written with the real tools (soundfile / libsndfile, tarfile); only the GNU sparse header is put
together by hand, because tarfile reads that format but cannot write it.
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import soundfile as sf

# (format, subtype, extension) of every container libsndfile writes that discovery walks for, with a subtype
# it decodes sample-exactly (lossless) or not (lossy: compared within a tolerance).
CONTAINERS = [
    ("WAV", "PCM_16", "wav"), ("WAV", "FLOAT", "wav"), ("WAVEX", "PCM_24", "wav"), ("RF64", "PCM_16", "rf64"),
    ("W64", "PCM_16", "w64"), ("AIFF", "PCM_16", "aiff"), ("AIFF", "PCM_S8", "aif"), ("AU", "PCM_16", "au"),
    ("AU", "ULAW", "snd"), ("NIST", "PCM_16", "nist"), ("CAF", "PCM_16", "caf"), ("CAF", "ALAC_16", "caf"),
    ("IRCAM", "PCM_16", "sf"), ("VOC", "PCM_16", "voc"), ("FLAC", "PCM_16", "flac"), ("FLAC", "PCM_24", "flac"),
    ("OGG", "VORBIS", "ogg"), ("OGG", "OPUS", "opus"), ("MP3", "MPEG_LAYER_III", "mp3"), ("SVX", "PCM_16", "svx"),
    ("AVR", "PCM_16", "avr"), ("MAT5", "PCM_16", "mat"), ("PVF", "PCM_16", "pvf"), ("PAF", "PCM_16", "paf"),
    ("MPC2K", "PCM_16", "mpc2k"), ("WVE", "ALAW", "wve"), ("HTK", "PCM_16", "htk"), ("SDS", "PCM_16", "sds"),
    ("XI", "DPCM_16", "xi"),
]
LOSSY = {"VORBIS", "OPUS", "MPEG_LAYER_III"}  # no byte-exact reference for a cut stream of these
# Containers whose header states the length of the data (so a cut file must be refused as truncated). The
# others either state none (IRCAM, PAF, PVF: the data runs to the end of the file) or cannot be cut and still
# open (FLAC and OGG have their own checks, HTK/SDS/XI refuse to open).
DECLARED_LENGTH = {"WAV", "WAVEX", "RF64", "W64", "AIFF", "AU", "NIST", "CAF", "SVX", "AVR", "MAT5", "MPC2K", "VOC",
                   "WVE", "MP3", "SDS"}  # (MP3: the byte count of the Xing frame LAME writes)
RATE = {"WVE": 8000, "OPUS": 48000, "HTK": 16000}


def signal(seconds: float, sr: int, seed: int = 0, peak: float = 0.4) -> np.ndarray:
    """A tone with a little noise: never silent, deterministic."""
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    rng = np.random.default_rng(seed)
    x = peak * np.sin(2 * np.pi * 220.0 * t) + 0.02 * rng.standard_normal(n)
    return np.clip(x, -0.95, 0.95).astype(np.float32)


def audio_bytes(x: np.ndarray, sr: int, fmt: str, subtype: str) -> bytes:
    """x written by libsndfile as fmt/subtype, in memory."""
    buf = io.BytesIO()
    sf.write(buf, x, sr, format=fmt, subtype=subtype)
    return buf.getvalue()


def decoded(data: bytes) -> np.ndarray:
    """What libsndfile decodes from whole, valid bytes (the reference a written clip must equal)."""
    from audiopipe.decode.cells import AudioBytes

    y, _ = sf.read(AudioBytes(data), dtype="float32", always_2d=True)
    return y.mean(axis=1, dtype=np.float32) if y.shape[1] > 1 else y[:, 0]


def streamed_flac(x: np.ndarray, sr: int, subtype: str = "PCM_16") -> bytes:
    """A valid FLAC whose STREAMINFO gives no total (0 samples: what a streaming encoder writes)."""
    d = bytearray(audio_bytes(x, sr, "FLAC", subtype))
    body = 8  # "fLaC" + the STREAMINFO block header
    v = int.from_bytes(d[body + 10:body + 18], "big") & ~((1 << 36) - 1)  # total samples: the low 36 bits
    d[body + 10:body + 18] = v.to_bytes(8, "big")
    return bytes(d)


def rf64_claiming(frames: int, x: np.ndarray, sr: int) -> bytes:
    """An RF64 file whose ds64 chunk claims `frames` frames (and their bytes) over the data it really holds."""
    d = bytearray(audio_bytes(x, sr, "RF64", "PCM_16"))
    pos = d.index(b"ds64") + 8
    d[pos + 8:pos + 16] = struct.pack("<Q", frames * 2)  # data size in bytes (16-bit mono)
    d[pos + 16:pos + 24] = struct.pack("<Q", frames)  # sample count
    return bytes(d)


# ------------------------------------------------------------------------------------------------ tars

def tar_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1_700_000_000
    return info, data


def gnu_sparse_header(name: str, realsize: int, chunks: list[tuple[int, int]]) -> bytes:
    """An old-GNU sparse member header (type 'S'): `chunks` are the (offset, length) stretches stored, the rest
    of `realsize` is holes. tarfile reads this format; GNU tar writes it with --sparse --format=oldgnu."""
    info = tarfile.TarInfo(name)
    info.size = sum(n for _, n in chunks)
    info.mtime = 1_700_000_000
    buf = bytearray(info.tobuf(tarfile.GNU_FORMAT))
    buf[156:157] = b"S"
    for i, (off, n) in enumerate(chunks[:4]):
        buf[386 + 24 * i:386 + 24 * i + 12] = b"%011o\0" % off
        buf[386 + 24 * i + 12:386 + 24 * i + 24] = b"%011o\0" % n
    buf[482] = 0  # no extension blocks
    buf[483:495] = b"%011o\0" % realsize
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf[:512])
    return bytes(buf[:512])


def sparse_member_bytes(name: str, data: bytes, hole: tuple[int, int]) -> bytes:
    """Header and stored data of `data` packed as a sparse member whose bytes [hole[0], hole[1]) are a hole
    (they must be zeros in `data` for the member to be what GNU tar would write)."""
    a, b = hole
    chunks = [(0, a), (b, len(data) - b)]
    stored = data[:a] + data[b:]
    pad = b"\0" * (-len(stored) % 512)
    return gnu_sparse_header(name, len(data), chunks) + stored + pad


def write_tar(path: Path, members: list[Any]) -> None:
    """A tar of `members`: (name, bytes) for a plain file, ("sparse", name, bytes, hole), ("hardlink" |
    "symlink", name, target), ("raw", bytes) for header bytes put in as they are."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for m in members:
            if m[0] == "sparse":
                raw = sparse_member_bytes(m[1], m[2], m[3])
                tf.fileobj.write(raw)
                tf.offset += len(raw)
            elif m[0] in ("hardlink", "symlink"):
                info = tarfile.TarInfo(m[1])
                info.type = tarfile.LNKTYPE if m[0] == "hardlink" else tarfile.SYMTYPE
                info.linkname = m[2]
                tf.addfile(info)
            elif m[0] == "raw":
                tf.fileobj.write(m[1])
                tf.offset += len(m[1])
            else:
                info, data = tar_member(*m)
                tf.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


# ------------------------------------------------------------------------------------------------ pipes

def fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def within(seconds: float, fn: Callable[[], Any], fifos: list[Path] = ()) -> Any:
    """fn() run in a thread; if it has not returned after `seconds`, the named pipes are opened for writing
    (which releases a reader blocked on them) and AssertionError says it hung. Exceptions pass through."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for p in fifos:
            try:
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(10)
        raise AssertionError(f"hung for more than {seconds} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def peak_rss_growth(fn: Callable[[], Any]) -> tuple[Any, int]:
    """(fn(), bytes its peak resident memory rose above the resident memory before it): the kernel's peak is
    reset first (/proc/self/clear_refs), so earlier peaks do not count."""
    def status(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = status("VmRSS:")
    except OSError:  # no reset allowed here: the peak so far is the baseline (a weaker bound, never a false one)
        before = status("VmHWM:")
    value = fn()
    return value, status("VmHWM:") - before
