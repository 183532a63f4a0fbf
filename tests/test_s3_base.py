"""audiopipe.storage.s3 against a real S3 server on 127.0.0.1 (moto's server mode)."""

from __future__ import annotations

import time

import pytest

from audiopipe.storage.paths import UnsupportedURL
from audiopipe.storage.s3 import S3Settings, S3URL, filesystem, parse_s3, require_local_or_s3

pytest_plugins = ["s3server"]


def test_parse_s3_normalises_and_refuses_what_is_not_s3():
    assert parse_s3("s3://b/a/b/") == S3URL("b", "a/b")
    assert parse_s3("S3://b") == S3URL("b", "")
    assert parse_s3("s3:/b/x") == S3URL("b", "x")  # what pathlib leaves of s3://b/x
    assert str(S3URL("b", "a").child("shard-0.arrow")) == "s3://b/a/shard-0.arrow"
    assert S3URL("b").child("x/").path == "b/x"
    with pytest.raises(UnsupportedURL, match="needs a bucket"):
        parse_s3("s3:///key")
    with pytest.raises(UnsupportedURL, match="not an s3:// URL"):
        parse_s3("/data/shards")


def test_require_local_or_s3_names_the_argument():
    assert require_local_or_s3("s3://b/x", "--out") == "s3://b/x"
    assert require_local_or_s3("./shards", "--out") == "./shards"
    with pytest.raises(UnsupportedURL, match=r"^--shards gs://b/x: gs:// is not supported; give s3://"):
        require_local_or_s3("gs://b/x", "--shards")


def test_round_trip_and_byte_range(s3):
    _, root = s3
    url = parse_s3(root).child("a", "x.bin")
    fs = filesystem()
    with fs.open_output_stream(url.path) as f:
        f.write(bytes(range(256)) * 4)
    with fs.open_input_file(url.path) as f:
        assert f.size() == 1024 and f.read_at(3, 300) == bytes([44, 45, 46])


def test_a_stopped_server_fails_in_bounded_time(s3):
    server, root = s3
    url = parse_s3(root).child("y.bin")
    fs = filesystem(S3Settings(attempts=2, connect_timeout=1.0, request_timeout=2.0))
    server.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(OSError):
            fs.get_file_info(url.path)
        assert time.monotonic() - t0 < 30  # an error, not a hang
    finally:
        server.start()
    assert fs.get_file_info(url.path).type.name == "NotFound"  # the same client works again after the restart
