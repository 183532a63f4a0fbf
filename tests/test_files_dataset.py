"""The one-file-per-utterance baseline reader gives exactly the items of the mmap reader."""

import numpy as np

from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.files_dataset import FilesDataset, export_per_utterance
from audiopipe.reader.loader import make_loader
from shard_helpers import shard


def test_files_reader_matches_mmap_reader(synthetic_corpus, tmp_path):
    out = tmp_path / "shards"
    shard(synthetic_corpus.root, out, [("vocos_mel", {}), ("f0", {})])
    cache = export_per_utterance(out, ["mel", "f0"], tmp_path / "cache")
    assert len(list((cache / "mel").glob("*.npy"))) == len(synthetic_corpus.utterances)
    a, b = ShardDataset(out, ["mel", "f0"]), FilesDataset(out, ["mel", "f0"], cache=cache)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert {k: x[k] for k in ("id", "speaker", "text", "index")} == {k: y[k] for k in ("id", "speaker", "text", "index")}
        assert np.array_equal(x["mel"], y["mel"]) and np.array_equal(x["f0"], y["f0"])
    batches = [[int(i) for i in bt["index"]] for bt in make_loader(out, ["mel"], max_frames=2000, reader="files",
                                                                    files_cache=cache, rank=0, world_size=1)]
    assert sorted(i for bt in batches for i in bt) == list(range(len(a)))
