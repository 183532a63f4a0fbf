"""The one-file-per-utterance baseline reads its own files on every path, never a row of the shards."""

import json

import numpy as np
import pytest

from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.bench.files_dataset import FilesDataset, export_per_utterance, files_loader
from reader_helpers import write_shards


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Shards, their per-utterance export, every item as the mmap reader gives it, and the shards moved away:
    from then on a single row read from a shard is an error."""
    tmp = tmp_path_factory.mktemp("files")
    out = write_shards(tmp / "shards", tars=False).root  # real writer, 28 rows in 5 shards, ids with dots
    cache = export_per_utterance(out, ["mel", "f0"], tmp / "cache")
    assert len(list((cache / "mel").glob("*.npy"))) == 28
    ds = ShardDataset(out, ["mel", "f0"])
    want = [{k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in ds[i].items()} for i in range(len(ds))]
    del ds
    (out / "arrow").rename(tmp / "arrow.moved")
    return out, cache, want


def _same(item, want, features=("mel", "f0")):
    assert {k: item[k] for k in ("id", "speaker", "text", "duration", "index")} == \
        {k: want[k] for k in ("id", "speaker", "text", "duration", "index")}
    for f in features:
        np.testing.assert_array_equal(item[f], want[f])


def test_items_and_batches_come_from_the_files(exported):
    out, cache, want = exported
    ds = FilesDataset(out, ["mel", "f0"], cache=cache)
    assert len(ds) == len(want)
    for i in range(len(ds)):
        _same(ds[i], want[i])
    batch = ds.__getitems__(np.arange(len(ds))[::-1])
    for item in batch:
        _same(item, want[item["index"]])
    np.testing.assert_array_equal(ds.lengths("mel"), [w["mel"].shape[-1] for w in want])


@pytest.mark.parametrize("workers", [0, 2])
def test_files_loader_reads_every_row_from_files(exported, workers):
    out, cache, want = exported
    loader = files_loader(out, ["mel", "f0"], cache, max_frames=2000, rank=0,
                          world_size=1, num_workers=workers, seed=1, passes=1)  # every row once
    seen = []
    for batch in loader:
        for j, i in enumerate(batch["index"]):
            for f in ("mel", "f0"):
                t = want[i][f].shape[-1]
                assert int(batch[f"{f}_lengths"][j]) == t
                np.testing.assert_array_equal(batch[f][j, ..., :t].numpy(), want[i][f])
            assert batch["id"][j] == want[i]["id"]
        seen += batch["index"]
    assert sorted(seen) == list(range(len(want)))


def test_an_incomplete_or_stale_export_is_refused(exported, tmp_path):
    out, cache, _ = exported
    with pytest.raises(FileNotFoundError, match="no complete per-utterance export"):
        FilesDataset(out, ["mel"], cache=tmp_path / "nothing")
    with pytest.raises(ValueError, match="export again"):
        FilesDataset(out, ["mel", "voiced"], cache=cache)  # in the shards, not in the export
    stale = tmp_path / "stale"
    stale.mkdir()
    stamp = json.loads((cache / "metadata.json").read_text())
    (stale / "metadata.json").write_text(json.dumps({**stamp, "index_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="other shards"):
        FilesDataset(out, ["mel"], cache=stale)
