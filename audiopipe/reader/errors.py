"""Errors a reader raises; each names the shard so a user knows which file to rebuild."""


class ShardError(RuntimeError):
    pass


class ConfigMismatch(ValueError):
    pass
