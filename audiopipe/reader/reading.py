"""How rows come off storage: make_loader's one option group for it (`make_loader(..., reading=Reading(...))`).

Which rows a batch holds is the sampler's business; this says how they are read:
- mode "rows": the global, length-bucketed plan of audiopipe/sampler/bucket.py; each batch's rows are read where
  they lie (a slice of an mmap locally; from s3://, one ranged GET per row or run of adjacent rows, `prefetch`
  batches ahead, `fetch_threads` requests in flight).
- mode "blocks": audiopipe/sampler/block_window.py; each rank reads blocks of ~block_bytes (one GET per feature
  and block) a window of `window` blocks at a time, `ahead` windows fetched ahead, and plans its batches from the
  resident window's rows. Fewer, larger requests (about one per batch), at a cost in randomness that the
  sampler's diagnostics report.
- mode "auto" (default): "blocks" for an s3:// shard set of at least `blocks_from_bytes` read by one process
  (num_workers=0) as one corpus, else "rows".
- what a process keeps open (`max_open` shards), and for s3:// a local cache of whole shards (`cache_dir`,
  `max_cache_bytes`, audiopipe/reader/shard_cache.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from audiopipe.errors import InvalidValue

MODES = ("auto", "rows", "blocks")


@dataclass(frozen=True)
class Reading:
    """mode: "auto", "rows" or "blocks" (see the module docstring).
    max_open: shards kept open per process (a mapping and a file descriptor each; s3://: their small buffers stay
        in memory whatever this is); the least recently used is closed beyond it and opened again when needed.
    cache_dir, max_cache_bytes: s3:// only, both or neither: whole shards downloaded in the background into this
        folder, at most this many bytes of them, and read by mmap once there (later epochs send no request).
    block_bytes, window, ahead: block-window reading: bytes of feature values per block (8-16 MB: one GET
        each), blocks per window, windows fetched ahead of the one being read (resident at most: (1 + ahead) x
        window x block_bytes per rank).
    nodes: block-window reading: shard k is read only by the ranks of node k % nodes (rank // (world_size //
        nodes)), so with a cache_dir each node caches a fixed 1/nodes of the shards.
    fetch_threads: requests in flight per process from s3:// (None: request_rate x the round trip measured when
        the shards are opened, 16..256); pyarrow's IO threads are raised to match.
    blocks_from_bytes: "auto" reads an s3:// shard set at least this big in blocks.
    """

    mode: str = "auto"
    max_open: int = 128
    cache_dir: str | os.PathLike[str] | None = None
    max_cache_bytes: int | None = None
    block_bytes: int = 16 << 20
    window: int = 8
    ahead: int = 1
    nodes: int = 1
    fetch_threads: int | None = None
    request_rate: float = 2000.0
    blocks_from_bytes: int = 8 << 30

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidValue(f"reading mode must be one of {MODES}, got {self.mode!r}")
        for name in ("block_bytes", "window", "nodes", "max_open"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValue(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.ahead, bool) or not isinstance(self.ahead, int) or self.ahead < 0:
            raise InvalidValue(f"ahead must be an integer >= 0 (windows fetched ahead), got {self.ahead!r}")
        if (self.cache_dir is None) != (self.max_cache_bytes is None):
            raise InvalidValue("cache_dir and max_cache_bytes go together: the folder of the local shard cache and "
                               "the most it may hold on disk")

    def resolve(self, *, remote: bool, mixed: bool, num_workers: int, corpus_bytes: int) -> str:
        """"rows" or "blocks" for this loader; a combination block-window reading cannot serve is one line."""
        if self.mode == "rows":
            return "rows"
        if self.mode == "auto":
            big = remote and corpus_bytes >= self.blocks_from_bytes
            return "blocks" if big and not mixed and num_workers == 0 else "rows"
        if mixed:
            raise InvalidValue("reading='blocks' plans one shard set; mix corpora with reading='rows'")
        if num_workers:
            raise InvalidValue("reading='blocks' holds its windows in the loader's process: use num_workers=0 with "
                               "prefetch=K (the copy releases the GIL), or reading='rows' with workers")
        return "blocks"
