"""`verify s3://...` compares the length index with the shards, entry by entry, as it does for a local folder: an
index whose ids or frame counts were changed on the server (and the manifest rehashed to match, so every checksum
holds) is named, against a real S3 server on 127.0.0.1 (tests/s3server.py)."""

from __future__ import annotations

import pytest

from audiopipe.cli import main as cli_main
from audiopipe.shard.verify import verify
from reader_helpers import copy_shards, rewrite_index_column, swap_first_two, write_shards

pytest_plugins = ["s3server"]


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("verify_s3") / "shards", tars=False)


def _upload(server, folder, url: str) -> str:
    from s3server import upload  # here, not at import: pytest_plugins loads s3server first (assert rewriting)

    return upload(server, folder, url)


def test_an_intact_set_on_s3_passes(s3, local):
    server, bucket = s3
    url = _upload(server, local.root, f"{bucket}/intact")
    report = verify(url, tars=False)
    assert report.ok and report.records == len(local.rows), report.lines()


@pytest.mark.parametrize("column, says", [
    ("id", "index.arrow: entry 0 says id '{0}', shard-000000 row 0 holds '{1}' (2 entries of this shard disagree)"),
    ("mel_frames", "index.arrow: entry 0 says mel_frames {0}, shard-000000 row 0 holds {1} (2 entries of this "
                   "shard disagree)"),
], ids=["ids", "frames"])
def test_a_tampered_index_on_s3_is_named(s3, local, tmp_path, capsys, column, says):
    import pyarrow as pa

    server, bucket = s3
    c = copy_shards(local, tmp_path / "c")
    index = pa.ipc.open_file(pa.BufferReader((c.root / "index.arrow").read_bytes())).read_all()
    first, second = index.column(column).to_pylist()[:2]
    assert first != second
    rewrite_index_column(c.root, column, swap_first_two)  # the manifest rehashed: every checksum holds
    url = _upload(server, c.root, f"{bucket}/tampered")
    report = verify(url, tars=False)
    want = says.format(second, first)
    assert not report.ok and [f for f in report.failures if f.startswith("index.arrow")] == [
        want + ": the index does not describe the shards; rebuild the shard set"], report.failures
    # the command says it too, and fails
    assert cli_main(["verify", url, "--no-tar"]) == 1
    assert want in capsys.readouterr().out


@pytest.mark.parametrize("cached", [False, True], ids=["ranged", "cached"])
def test_the_loader_over_s3_names_a_tampered_index(s3, local, tmp_path, cached):
    """The loader reading the same set from S3, by ranged reads or through its local shard cache, refuses it too
    (the local loader's check: tests/test_corrupt_shards.py)."""
    from audiopipe.reader.errors import CorruptIndexError
    from audiopipe.reader.loader import make_loader
    from audiopipe.reader.reading import Reading

    server, bucket = s3
    c = copy_shards(local, tmp_path / "c")
    rewrite_index_column(c.root, "id", swap_first_two)
    url = _upload(server, c.root, f"{bucket}/tampered")
    reading = Reading(cache_dir=str(tmp_path / "cache"), max_cache_bytes=1 << 30) if cached else None
    says = r"index\.arrow is corrupt: entry 0 says id 'spk0/utt00.001', shard shard-000000 row 0 holds 'spk0/utt00.000'"
    with pytest.raises(CorruptIndexError, match=says + "; rebuild the shard set"):
        loader = make_loader(url, ["mel"], max_frames=100_000, rank=0, world_size=1, prefetch=0, shuffle=False,
                             reading=reading)
        loader.set_epoch(0)
        list(loader)
