"""Errors a reader raises; each names the shard so a user knows which file to rebuild."""

from audiopipe.errors import AudiopipeError


class ShardError(AudiopipeError, RuntimeError):
    pass


class CorruptShardError(ShardError):
    """A shard that cannot be trusted: missing, wrong size, unreadable Arrow footer or schema, wrong row count,
    failed checksum, broken column structure, or changed on disk after it was mapped. The message is one line
    naming the shard and what to do (see docs/loader.md, "Corrupt shards")."""


class CorruptIndexError(CorruptShardError):
    """index.arrow cannot be trusted: it fails the manifest's checksum, or its shard/row columns do not list
    the manifest's shards row by row (a permuted or out-of-range row would pair one utterance's id and length
    with another's features). One line naming the file; rebuild the shard set (or its index)."""


class ConfigMismatch(AudiopipeError, ValueError):
    pass


class NonFiniteBatch(ShardError):
    """A batch whose feature values hold NaN or inf (make_loader(check_finite=True)): bytes changed in a shard
    without changing its size, which the default size check cannot see. One line naming the feature and the
    utterance ids; `audiopipe verify` (or verify="checksum") finds the shard."""
