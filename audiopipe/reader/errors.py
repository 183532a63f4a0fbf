"""Errors a reader raises; each names the shard so a user knows which file to rebuild."""


class ShardError(RuntimeError):
    pass


class CorruptShardError(ShardError):
    """A shard that cannot be trusted: missing, wrong size, unreadable Arrow footer or schema, wrong row count,
    failed checksum, broken column structure, or changed on disk after it was mapped. The message is one line
    naming the shard and what to do (see docs/loader.md, "Corrupt shards")."""


class CorruptIndexError(CorruptShardError):
    """index.arrow cannot be trusted: it fails the manifest's checksum, or its shard/row columns do not list
    the manifest's shards row by row (a permuted or out-of-range row would pair one utterance's id and length
    with another's features). One line naming the file; rebuild the shard set (or its index)."""


class ConfigMismatch(ValueError):
    pass
