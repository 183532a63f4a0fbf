"""What a dataset does with the corrupt shards its open-time scan found: stop (on_corrupt="fail"), or leave their
rows out of the plan (on_corrupt="skip"), decided before anything is planned so every rank plans the same rows.

With on_corrupt="skip" and torch.distributed, ranks may see different files (node-local copies, a shard
truncated between two ranks' scans); `agree_across_ranks()` takes the union of what every rank found. It is a
collective: every rank of the group must call it, which make_loader does only for a loader of the whole group
(integrity.spans_whole_group), never for a loader built on one rank alone.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

from audiopipe.reader import integrity
from audiopipe.reader.errors import CorruptShardError

_log = logging.getLogger(__name__)


def keep_rows(ok: np.ndarray, subset: np.ndarray | None, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, lengths) of the rows `ok` keeps: of the subset when one is given (lengths indexed like it),
    else of every row."""
    if subset is None:
        keep = np.flatnonzero(ok)
        return keep, lengths[keep]
    keep = ok[subset]
    return subset[keep], lengths[keep]


class SkippedShards:
    """The shards of one shard set left out as corrupt, and why (`found`, CorruptShard records in shard order)."""

    def __init__(self, where: str, manifest: dict[str, Any], on_corrupt: str):
        """on_corrupt: "fail" or "skip" (integrity.ON_CORRUPT, checked by the dataset)."""
        self.where, self.manifest, self.on_corrupt = where, manifest, on_corrupt
        self.flags = np.zeros(len(manifest["shards"]), dtype=bool)
        self.found: tuple[integrity.CorruptShard, ...] = ()

    def __contains__(self, k: int) -> bool:
        return bool(self.flags[k])

    def after_scan(self, bad: Sequence[integrity.CorruptShard]) -> None:
        """What the open-time scan found: a CorruptShardError naming them (on_corrupt="fail"), or skipped."""
        if bad and self.on_corrupt == "fail":
            raise CorruptShardError(
                f"{self.where}: {integrity.summary(bad, len(self.manifest['shards']))}; rebuild them "
                f"(`audiopipe verify` lists every problem) or pass on_corrupt='skip' to "
                f"train without their rows")
        self._skip(bad)

    def _skip(self, bad: Sequence[integrity.CorruptShard]) -> None:
        new = [b for b in bad if not self.flags[b.shard]]
        if not new:
            return
        for b in new:
            self.flags[b.shard] = True
        self.found = tuple(sorted((*self.found, *new), key=lambda b: b.shard))
        _log.warning("skipping %d rows of %s: %s", sum(b.rows for b in new), self.where,
                     integrity.summary(new, len(self.manifest["shards"]), limit=len(new)))

    def agree_across_ranks(self, path_of: Any) -> None:
        """Also skip every shard another rank found corrupt (a collective, see the module docstring).
        path_of(k): where shard k is, for the record."""
        if self.on_corrupt != "skip":
            return
        shards = self.manifest["shards"]
        agreed = integrity.union_across_ranks([b.shard for b in self.found], len(shards))
        self._skip([integrity.CorruptShard(k, shards[k]["name"], path_of(k), int(shards[k]["rows"]),
                                           "found corrupt by another rank") for k in agreed if not self.flags[k]])

    def rows_kept(self, shard_of: np.ndarray) -> np.ndarray:
        """Per row (shard_of: each row's shard), whether it is read."""
        return ~self.flags[shard_of]

    def diagnostics(self) -> dict[str, Any]:
        return {"skipped_shards": [b.__dict__.copy() for b in self.found],
                "skipped_rows": int(sum(b.rows for b in self.found))}
