"""Several shard sets read as one dataset: global index = the corpus's offset + its own index.

    ds = MixtureDataset([ShardDataset("./libritts", ["mel"]), ShardDataset("./emilia", ["mel"])],
                        names=["./libritts", "./emilia"])

It is what make_loader(["./libritts", "./emilia"], weights=[1, 3], ...) plans over: lengths() and durations()
of the union for the sampler and the corpus weights (audiopipe/sampler/corpus_weights.py), a whole batch read
with __getitems__ (one RowBatch, whatever corpora its rows come from), read_ahead hints passed to each corpus,
and the skip-corrupt handling of every corpus. The corpora must have been extracted alike: every feature read
has the same config hash in every corpus, or opening fails with one line naming both corpora.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

from audiopipe.collate.rows import RowBatch, Rows
from audiopipe.errors import InvalidValue, OutOfRange
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.errors import ConfigMismatch
from audiopipe.reader.skipped import keep_rows


def _differing(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The first few settings that differ between two feature specs, as 'key a vs b'."""
    flat = lambda s: {**{k: v for k, v in s.items() if k not in ("params", "hash")},  # noqa: E731
                      **{f"params.{k}": v for k, v in s.get("params", {}).items()}}
    fa, fb = flat(a), flat(b)
    diff = [f"{k} {fa.get(k)!r} vs {fb.get(k)!r}" for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    return ", ".join(diff[:3]) or "same settings, other extractor version"


def check_same_features(datasets: Sequence[ShardDataset], names: Sequence[str], features: Sequence[str]) -> None:
    """Every feature read must come from one config in every corpus; else one line naming both corpora."""
    first = datasets[0].manifest["features"]
    for ds, name in zip(datasets[1:], names[1:]):
        specs = ds.manifest["features"]
        if "phones" in features:  # phone ids index the manifest's table: two tables would mean two languages
            a, b = (d.manifest.get("phones", {}).get("vocab") for d in (datasets[0], ds))
            if a != b:
                raise ConfigMismatch(
                    f"feature 'phones' differs between corpora {names[0]} and {name}: their phone tables differ "
                    f"({len(a or [])} vs {len(b or [])} symbols); extract both with the same phone set to mix them")
        for f in features:
            a, b = first.get(f), specs.get(f)
            if a is None or b is None:
                continue  # a front-end column without a FeatureSpec (phones): nothing to compare
            if a.get("hash") != b.get("hash"):
                raise ConfigMismatch(
                    f"feature {f!r} differs between corpora {names[0]} (config {a.get('hash')}) and {name} "
                    f"(config {b.get('hash')}): {_differing(a, b)}; extract both with the same preset to mix them")


class MixtureDataset:
    """N ShardDatasets as one map-style dataset; item i of corpus k is global index offsets[k] + i."""

    def __init__(self, datasets: Sequence[ShardDataset], names: Sequence[str] | None = None):
        if not datasets:
            raise InvalidValue("a mixture needs at least one shard set")
        self.datasets = list(datasets)
        self.names = [str(n) for n in names] if names is not None else [str(d.root) for d in self.datasets]
        if len(self.names) != len(self.datasets):
            raise InvalidValue(f"{len(self.names)} names for {len(self.datasets)} shard sets")
        self.features = list(self.datasets[0].features)
        check_same_features(self.datasets, self.names, self.features)
        sizes = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        # The collator and shm sizing read these: equal across corpora once the config hashes agree.
        self.manifest = self.datasets[0].manifest
        self.channels = self.datasets[0].channels

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def corpus_of(self, indices: np.ndarray) -> np.ndarray:
        """Corpus number of each global index."""
        return np.searchsorted(self.offsets, np.asarray(indices, dtype=np.int64), side="right") - 1

    def lengths(self, feature: str | None = None) -> np.ndarray:
        return np.concatenate([d.lengths(feature) for d in self.datasets])

    def durations(self) -> np.ndarray:
        """Seconds of audio per utterance (the index's duration column), what corpus weights count in hours."""
        return np.concatenate([d.index.duration.astype(np.float64) for d in self.datasets])

    # ---- corrupt shards: each corpus decides, the union is what the sampler plans --------------------------

    def skip_what_other_ranks_skip(self) -> None:
        for d in self.datasets:  # the same order on every rank: each call is a collective
            d.skip_what_other_ranks_skip()

    def without_skipped(self, subset: np.ndarray | None, lengths: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """As ShardDataset.without_skipped, over global indices."""
        lengths = np.asarray(lengths)
        if not any(d.skipped for d in self.datasets):
            return subset, lengths
        return keep_rows(np.concatenate([d.rows_kept() for d in self.datasets]), subset, lengths)

    def diagnostics(self) -> dict[str, Any]:
        """Each corpus's reader diagnostics (skipped shards, mappings), by name."""
        return {"corpora": {name: d.diagnostics() for name, d in zip(self.names, self.datasets)}}

    # ---- reading ------------------------------------------------------------------------------------------

    def _split(self, indices: Sequence[int]) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """(corpus, positions in indices, local indices) for each corpus the indices touch."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise OutOfRange(f"index out of range for a mixture of {len(self)} utterances")
        corpus = self.corpus_of(idx)
        for k in np.unique(corpus).tolist():
            positions = np.flatnonzero(corpus == k)
            yield k, positions, idx[positions] - self.offsets[k]

    def read_ahead(self, indices: Sequence[int]) -> None:
        for k, _, local in self._split(indices):
            self.datasets[k].read_ahead(local)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> RowBatch:
        """One RowBatch in the order asked, its rows read from each corpus (Rows point into their shards)."""
        n = len(indices)
        arrays: dict[str, list[Rows]] = {f: [] for f in self.features}
        columns: dict[str, list[Any]] = {}
        for k, positions, local in self._split(indices):
            part = self.datasets[k].__getitems__(local)
            for f, rows in part.arrays.items():
                arrays[f] += [r._replace(positions=positions[r.positions]) for r in rows]
            for c, values in part.columns.items():
                col = columns.setdefault(c, [None] * n)
                for p, v in zip(positions.tolist(), values):
                    col[p] = v
        columns["index"] = [int(i) for i in np.asarray(indices, dtype=np.int64).reshape(-1)]
        columns["corpus"] = [self.names[k] for k in self.corpus_of(np.asarray(columns["index"]))] if n else []
        return RowBatch(n, dict(self.channels), arrays, columns)
