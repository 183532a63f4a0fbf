"""The dataset step of make_loader: shard sets in, one map-style dataset out (the sampler and the loader follow).

    ds = open_dataset("./shards", ["mel"])                    # ShardDataset: a local folder, memory-mapped
    ds = open_dataset("s3://bucket/shards", ["mel"])          # RemoteShardDataset: rows by byte range
    ds = open_dataset(["./libritts", "./emilia"], ["mel"])    # MixtureDataset: their union, corpus after corpus

Opening checks what is read (the features and their config against `expect`) and whether it can be trusted
(every shard, `verify`); what is corrupt stops the open or, with on_corrupt="skip", leaves the rows a sampler may
plan (skipped.py). `agree_on_skips=True` also skips what other ranks found: a collective every rank must run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from audiopipe.errors import InvalidValue
from audiopipe.reader.arrow_dataset import ShardDataset
from audiopipe.reader.mixture import MixtureDataset
from audiopipe.reader.reading import Reading
from audiopipe.storage.s3 import is_s3, require_local_or_s3
from audiopipe.features.names import column_names


def shard_sets(shards: str | Path | Sequence[str | Path]) -> list[str | Path]:
    """One shard set, or the list of them to mix (refused empty)."""
    if isinstance(shards, (str, Path)):
        return [shards]
    sets = [str(s) for s in shards]
    if not sets:
        raise InvalidValue("shards is an empty list: give at least one shard folder")
    return sets


def open_dataset(shards: str | Path | Sequence[str | Path], features: Sequence[str], *,
                 expect: dict[str, str] | None = None, verify: str = "size", on_corrupt: str = "fail",
                 reading: Reading | None = None, agree_on_skips: bool = False) -> Any:
    """A ShardDataset (local folder), RemoteShardDataset (s3://bucket/prefix) or, for a list, a MixtureDataset.

    expect, verify, on_corrupt: see ShardDataset. reading: Reading(max_open=..., cache_dir=..., ...).
    agree_on_skips: with on_corrupt="skip", also skip the shards other ranks found corrupt (a collective)."""
    features = column_names(features)
    expect = dict(zip(column_names(list(expect)), expect.values())) if expect else expect
    opts = reading if reading is not None else Reading()
    if not isinstance(opts, Reading):
        raise InvalidValue(f"reading must be a Reading(...), got {type(reading).__name__}")
    sets = shard_sets(shards)
    remote = [is_s3(require_local_or_s3(s, "shard folder")) for s in sets]  # other schemes: one line
    if not any(remote) and opts.cache_dir is not None:
        raise InvalidValue("cache_dir/max_cache_bytes cache shards read from s3://; these folders are local already")

    def one(source: str | Path, is_remote: bool) -> ShardDataset:
        if is_remote:
            from audiopipe.reader.remote_dataset import RemoteShardDataset

            return RemoteShardDataset(str(source), features, expect=expect, verify=verify, on_corrupt=on_corrupt,
                                      max_open=opts.max_open, cache_dir=opts.cache_dir,
                                      max_cache_bytes=opts.max_cache_bytes, fetch_threads=opts.fetch_threads,
                                      request_rate=opts.request_rate)
        return ShardDataset(source, features, expect=expect, verify=verify, on_corrupt=on_corrupt,
                            max_open=opts.max_open)

    if isinstance(shards, (str, Path)):
        ds: Any = one(shards, remote[0])
    else:
        ds = MixtureDataset([one(s, r) for s, r in zip(sets, remote)], sets)
    if agree_on_skips:  # a collective: all ranks plan the same rows; never for a loader of one rank alone
        ds.skip_what_other_ranks_skip()
    return ds


def is_remote(shards: str | Path | Sequence[str | Path]) -> bool:
    """Whether any of these shard sets is on object storage."""
    return any(is_s3(str(s)) for s in shard_sets(shards))
