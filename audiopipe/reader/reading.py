"""How make_loader reads rows: one option group (`make_loader(..., reading=Reading(...))`).

- "rows": the global, length-bucketed plan of audiopipe/sampler/bucket.py; each batch's rows are read where they
  lie (a slice of an mmap locally; from s3://, one ranged GET per row or run of adjacent rows, `read_ahead`
  batches ahead, `fetch_threads` requests in flight).
- "blocks": audiopipe/sampler/block_window.py; each rank reads blocks of ~block_bytes (one GET per feature and
  block) a window of `window` blocks at a time, `ahead` windows fetched ahead, and plans its batches from the
  resident window's rows. Fewer, larger requests (about one per batch), at a cost in randomness that the
  sampler's diagnostics report.
- "auto" (default): "blocks" for an s3:// shard set of at least `blocks_from_bytes` read by one process
  (num_workers=0) as one corpus, else "rows".
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("auto", "rows", "blocks")


@dataclass(frozen=True)
class Reading:
    """mode: "auto", "rows" or "blocks" (see the module docstring).
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
    block_bytes: int = 16 << 20
    window: int = 8
    ahead: int = 1
    nodes: int = 1
    fetch_threads: int | None = None
    request_rate: float = 2000.0
    blocks_from_bytes: int = 8 << 30

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"reading mode must be one of {MODES}, got {self.mode!r}")
        for name in ("block_bytes", "window", "nodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if isinstance(self.ahead, bool) or not isinstance(self.ahead, int) or self.ahead < 0:
            raise ValueError(f"ahead must be an integer >= 0 (windows fetched ahead), got {self.ahead!r}")

    def resolve(self, *, remote: bool, mixed: bool, num_workers: int, reader: str, corpus_bytes: int) -> str:
        """"rows" or "blocks" for this loader; a combination block-window reading cannot serve is one line."""
        if self.mode == "rows":
            return "rows"
        if self.mode == "auto":
            big = remote and corpus_bytes >= self.blocks_from_bytes
            return "blocks" if big and not mixed and num_workers == 0 and reader == "mmap" else "rows"
        if mixed:
            raise ValueError("reading='blocks' plans one shard set; mix corpora with reading='rows'")
        if reader != "mmap":
            raise ValueError(f"reading='blocks' reads Arrow shards (reader='mmap'), got reader={reader!r}")
        if num_workers:
            raise ValueError("reading='blocks' holds its windows in the loader's process: use num_workers=0 with "
                             "prefetch=K (the copy releases the GIL), or reading='rows' with workers")
        return "blocks"
