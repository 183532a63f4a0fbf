"""Every transcript of a shard folder, in index order: what a text front end needs to build or check a vocab."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from audiopipe.shard.manifest import read_manifest


def shard_texts(shards_dir: str | Path) -> list[str]:
    """Reads only the `text` column of each Arrow shard (the payload columns are never touched)."""
    root = Path(shards_dir)
    texts: list[str] = []
    for entry in read_manifest(root)["shards"]:
        with pa.memory_map(str(root / entry["arrow"]["path"])) as src:
            texts.extend(pa.ipc.open_file(src).read_all().column("text").to_pylist())
    return texts
