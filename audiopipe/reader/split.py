"""`split(shards, by="speaker", test=...)`: held-out and training rows of a shard set, as the `subset=` indices
make_loader takes (lhotse's CutSet.split, Hugging Face's train_test_split, without copying anything).

    train, test = ap.split("./shards", by="speaker", test=2)            # two whole speakers held out
    loader = ap.make_loader("./shards", ["mel"], max_frames=38_400, subset=train)

Rows are numbered as make_loader numbers them: the shard set's rows in index order, and for a list of shard
sets each one's rows after the previous ones' (speakers of different sets are different speakers). Only the
length index is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from audiopipe.errors import InvalidValue

BY = ("speaker", "utterance")


class Split(NamedTuple):
    """Sorted global row indices (int64) of the training and the held-out part; `test_speakers` by speaker."""
    train: np.ndarray
    test: np.ndarray
    test_speakers: list[str]


def _how_many(test: float, n: int, what: str) -> int:
    """test: a fraction in (0, 1) of n (at least one), or a whole number of `what`."""
    if isinstance(test, float) and 0 < test < 1:
        k = max(1, round(test * n))
    elif isinstance(test, int) and not isinstance(test, bool):
        k = test
    else:
        raise InvalidValue(f"test={test!r}: give a fraction in (0, 1) or a whole number of {what}")
    if not 1 <= k < n:
        raise InvalidValue(f"test={test!r} holds out {k} of {n} {what}: at least one must be held out and one "
                           f"left to train on")
    return k


def split(shards: str | Path | Sequence[str | Path], *, by: str = "speaker", test: float = 0.1,
          seed: int = 0) -> Split:
    """Hold out `test` (a fraction, or a count of speakers/utterances) of `shards`, chosen with `seed`.

    by="speaker": whole speakers (a fraction counts speakers); by="utterance": single rows. Returns
    Split(train, test, test_speakers), the first two ready for make_loader(..., subset=...)."""
    from audiopipe.reader.open_dataset import open_dataset

    if by not in BY:
        raise InvalidValue(f"by={by!r}: choose from {', '.join(BY)}")
    ds = open_dataset(shards, [])
    parts = getattr(ds, "datasets", [ds])
    speakers = np.concatenate([np.asarray([f"{k}:{s}" if len(parts) > 1 else s
                                           for s in d.index.table.column("speaker").to_pylist()], dtype=object)
                               for k, d in enumerate(parts)])
    rng = np.random.default_rng(seed)
    if by == "utterance":
        held = np.sort(rng.choice(len(speakers), _how_many(test, len(speakers), "utterances"), replace=False))
        names: list[str] = []
    else:
        uniq = sorted(set(speakers.tolist()))
        names = sorted(rng.choice(uniq, _how_many(test, len(uniq), "speakers"), replace=False).tolist())
        held = np.flatnonzero(np.isin(speakers, names))
    mask = np.zeros(len(speakers), dtype=bool)
    mask[held] = True
    return Split(np.flatnonzero(~mask).astype(np.int64), np.flatnonzero(mask).astype(np.int64), names)
