"""The direct WAV header read answers only where libsndfile would answer the same (rate, frames, channels,
format, subtype), on a hostile corpus of odd chunks, odd sizes, placeholder sizes, truncations and mutations."""

from __future__ import annotations

import os
import struct

import numpy as np
import soundfile as sf

from audiopipe.corpus.wavheader import read_wav_header
from audiopipe.decode.audio import read_info


def _fmt(tag=1, ch=1, sr=16000, bits=16, align=None, byte_rate=None, extra=b""):
    align = ch * bits // 8 if align is None else align
    byte_rate = sr * align if byte_rate is None else byte_rate
    body = struct.pack("<HHIIHH", tag, ch, sr, byte_rate, align, bits) + extra
    return b"fmt " + struct.pack("<I", len(body)) + body


def _chunk(cid: bytes, body: bytes, size: int | None = None, pad: bool = True) -> bytes:
    n = len(body) if size is None else size
    return cid + struct.pack("<I", n) + body + (b"\0" if pad and len(body) & 1 else b"")


def _riff(*chunks: bytes, riff_size: int | None = None, magic=b"RIFF", wave=b"WAVE") -> bytes:
    payload = wave + b"".join(chunks)
    return magic + struct.pack("<I", len(payload) if riff_size is None else riff_size) + payload


def _hostile() -> dict[str, bytes]:
    pcm = np.arange(-300, 300, dtype=np.int16).tobytes()  # 600 frames of 16-bit mono
    c: dict[str, bytes] = {
        "canonical": _riff(_fmt(), _chunk(b"data", pcm)),
        "stereo": _riff(_fmt(ch=2), _chunk(b"data", pcm)),
        "six_ch_24": _riff(_fmt(ch=6, bits=24), _chunk(b"data", bytes(18 * 50))),
        "u8": _riff(_fmt(bits=8), _chunk(b"data", bytes(range(256)) * 2)),
        "u8_odd_with_pad": _riff(_fmt(bits=8), _chunk(b"data", bytes(301))),
        "u8_odd_no_pad": _riff(_fmt(bits=8), _chunk(b"data", bytes(301), pad=False)),
        "pcm32": _riff(_fmt(bits=32), _chunk(b"data", bytes(400))),
        "float": _riff(_fmt(tag=3, bits=32), _chunk(b"data", np.zeros(100, np.float32).tobytes())),
        "double": _riff(_fmt(tag=3, bits=64), _chunk(b"data", np.zeros(100, np.float64).tobytes())),
        "float_16bit": _riff(_fmt(tag=3, bits=16), _chunk(b"data", pcm)),
        "bits12": _riff(_fmt(bits=12, align=2), _chunk(b"data", pcm)),
        "fmt18_cb0": _riff(_fmt(extra=b"\0\0"), _chunk(b"data", pcm)),
        "fmt18_cb2": _riff(_fmt(extra=b"\2\0"), _chunk(b"data", pcm)),
        "fmt20": _riff(_fmt(extra=b"\2\0ab"), _chunk(b"data", pcm)),
        "alaw": _riff(_fmt(tag=6, bits=8), _chunk(b"fact", struct.pack("<I", 600)), _chunk(b"data", bytes(600))),
        "ulaw": _riff(_fmt(tag=7, bits=8), _chunk(b"data", bytes(600))),
        "tag2": _riff(_fmt(tag=2, bits=4, align=256), _chunk(b"data", bytes(512))),
        "extensible_tag": _riff(_fmt(tag=0xFFFE, extra=b"\0\0"), _chunk(b"data", pcm)),
        "channels0": _riff(_fmt(ch=0, align=0), _chunk(b"data", pcm)),
        "rate0": _riff(_fmt(sr=0), _chunk(b"data", pcm)),
        "bad_align": _riff(_fmt(align=4), _chunk(b"data", pcm)),
        "bad_byte_rate": _riff(_fmt(byte_rate=12345), _chunk(b"data", pcm)),
        "data_size0": _riff(_fmt(), _chunk(b"data", pcm, size=0)),
        "data_sizeFFFF": _riff(_fmt(), _chunk(b"data", pcm, size=0xFFFFFFFF)),
        "data_past_end": _riff(_fmt(), _chunk(b"data", pcm, size=3 * len(pcm))),
        "data_short_of_end": _riff(_fmt(), _chunk(b"data", pcm, size=len(pcm) - 100)),
        "data_odd_size16": _riff(_fmt(), _chunk(b"data", pcm + b"\1")),
        "riff_size_big": _riff(_fmt(), _chunk(b"data", pcm), riff_size=10_000),
        "riff_size_small": _riff(_fmt(), _chunk(b"data", pcm), riff_size=100),
        "riff_size_ffff": _riff(_fmt(), _chunk(b"data", pcm), riff_size=0xFFFFFFFF),
        "riff_size_0": _riff(_fmt(), _chunk(b"data", pcm), riff_size=0),
        "rifx": _riff(_fmt(), _chunk(b"data", pcm), magic=b"RIFX"),
        "rf64": _riff(_fmt(), _chunk(b"data", pcm), magic=b"RF64"),
        "not_wave": _riff(_fmt(), _chunk(b"data", pcm), wave=b"AVI "),
        "data_before_fmt": _riff(_chunk(b"data", pcm), _fmt()),
        "no_data": _riff(_fmt()),
        "two_fmt": _riff(_fmt(), _fmt(ch=2), _chunk(b"data", pcm)),
        "list_before": _riff(_chunk(b"LIST", b"INFOISFT\x06\0\0\0abcde\0"), _fmt(), _chunk(b"data", pcm)),
        "list_subchunk_garbage": _riff(_fmt(ch=2, bits=24), _chunk(b"LIST", b"INFO\0\xab\0\0" + bytes(6)),
                                       _chunk(b"data", bytes(600))),
        "peak_wrong_size": _riff(_fmt(tag=3, bits=32, ch=2), _chunk(b"PEAK", bytes(16)), _chunk(b"data", bytes(400))),
        "cue_garbage": _riff(_fmt(), _chunk(b"cue ", bytes(7) + b"\xff"), _chunk(b"data", pcm)),
        "list_after": _riff(_fmt(), _chunk(b"data", pcm), _chunk(b"LIST", b"INFOISFT\x04\0\0\0abc\0")),
        "junk_odd_padded": _riff(_chunk(b"JUNK", b"abc"), _fmt(), _chunk(b"data", pcm)),
        "junk_odd_unpadded": _riff(_chunk(b"JUNK", b"abc", pad=False), _fmt(), _chunk(b"data", pcm)),
        "unknown_chunk": _riff(_fmt(), _chunk(b"zzzz", b"abcd"), _chunk(b"data", pcm)),
        "binary_chunk_id": _riff(_fmt(), _chunk(b"\x01\x02\x03\x04", b"abcd"), _chunk(b"data", pcm)),
        "fact_peak": _riff(_fmt(tag=3, bits=32), _chunk(b"fact", struct.pack("<I", 100)),
                           _chunk(b"PEAK", bytes(16)), _chunk(b"data", bytes(400))),
        "second_data_after": _riff(_fmt(), _chunk(b"data", pcm), _chunk(b"data", pcm)),
        "second_fmt_after": _riff(_fmt(), _chunk(b"data", pcm), _fmt(ch=2)),
        "trailing_garbage": _riff(_fmt(), _chunk(b"data", pcm)) + b"\0\0\0",
        "trailing_zeros_in_riff": _riff(_fmt(), _chunk(b"data", pcm), b"\0" * 12),
        "big_header_list": _riff(_chunk(b"LIST", b"INFO" + bytes(6000)), _fmt(), _chunk(b"data", pcm)),
        "big_file_list_after": _riff(_fmt(), _chunk(b"data", bytes(20000)), _chunk(b"LIST", b"INFO" + bytes(16))),
        "big_file": _riff(_fmt(), _chunk(b"data", bytes(200_000))),
        "header_only": _riff(_fmt(), _chunk(b"data", b"", size=0)),
        "cut_in_fmt": _riff(_fmt(), _chunk(b"data", pcm))[:30],
        "empty": b"",
        "text": b"this is not audio at all\n" * 4,
    }
    for name, kw in (("sf_wavex", {"format": "WAV", "subtype": "PCM_16"}), ("sf_float", {"subtype": "FLOAT"}),
                     ("sf_24", {"subtype": "PCM_24"}), ("sf_ima", {"subtype": "IMA_ADPCM"}),
                     ("sf_ms", {"subtype": "MS_ADPCM"}), ("sf_gsm", {"subtype": "GSM610"})):
        c[name] = kw  # written by libsndfile itself below
    return c


def _reference(path):
    try:
        h = read_info(path)
    except Exception:
        return None
    return tuple(h)


def test_direct_header_equals_libsndfile_on_a_hostile_corpus(tmp_path):
    answered = []
    for name, data in _hostile().items():
        p = tmp_path / f"{name}.wav"
        if isinstance(data, dict):
            x = (0.1 * np.sin(np.arange(3 * 4410) / 7.0)).astype(np.float32)
            sf.write(p, np.stack([x, x], 1) if name == "sf_wavex" else x, 8000 if name == "sf_gsm" else 22050,
                     **data)
        else:
            p.write_bytes(data)
        got = read_wav_header(str(p))
        if got is not None:
            assert tuple(got) == _reference(p), name
            answered.append(name)
    # The fast path must actually serve the plain files (else the test above proves nothing).
    for name in ("canonical", "stereo", "six_ch_24", "u8", "u8_odd_with_pad", "pcm32", "float", "double",
                 "fmt18_cb0", "list_before", "list_after", "fact_peak", "big_file", "sf_float",
                 "sf_24", "sf_wavex"):
        assert name in answered, f"{name} was sent to libsndfile"


def test_direct_header_equals_libsndfile_on_mutated_and_cut_files(tmp_path):
    rng = np.random.default_rng(12)
    pcm = np.arange(-500, 500, dtype=np.int16).tobytes()
    bases = [_riff(_fmt(), _chunk(b"data", pcm)),
             _riff(_fmt(ch=2, bits=24), _chunk(b"LIST", b"INFO" + bytes(10)), _chunk(b"data", bytes(600))),
             _riff(_fmt(tag=3, bits=32), _chunk(b"fact", struct.pack("<I", 100)), _chunk(b"data", bytes(400))),
             _riff(_chunk(b"JUNK", bytes(8)), _fmt(ch=2), _chunk(b"LIST", b"INFOISFT\x05\0\0\0Lavf\0\0"),
                   _chunk(b"data", bytes(400)), _chunk(b"LIST", b"INFOINAM\x02\0\0\0ab")),
             _riff(_fmt(tag=3, bits=32, ch=2), _chunk(b"PEAK", bytes(24)), _chunk(b"data", bytes(400)))]
    answered = 0
    for i in range(int(os.environ.get("WAVHEADER_FUZZ", 600))):
        b = bytearray(bases[i % len(bases)])
        kind = i % 4
        if kind == 0:  # a header byte changed
            b[rng.integers(0, 60)] = int(rng.integers(0, 256))
        elif kind == 1:  # cut anywhere
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 2:  # a size field moved by a little
            at = [4, 16, 40][int(rng.integers(0, 3))]
            struct.pack_into("<I", b, at, max(0, struct.unpack_from("<I", b, at)[0] + int(rng.integers(-3, 4))))
        else:  # bytes appended
            b += bytes(rng.integers(0, 256, int(rng.integers(1, 20)), dtype=np.uint8))
        p = tmp_path / f"m{i}.wav"
        p.write_bytes(bytes(b))
        got = read_wav_header(str(p))
        if got is not None:
            assert tuple(got) == _reference(p), (i, kind)
            answered += 1
    assert answered > 20  # the mutations that keep a plain WAV (e.g. a changed sample byte) still take the fast path


def test_direct_header_leaves_missing_and_special_files_to_libsndfile(tmp_path):
    assert read_wav_header(str(tmp_path / "absent.wav")) is None
    os.mkfifo(tmp_path / "pipe.wav")
    assert read_wav_header(str(tmp_path / "pipe.wav")) is None
