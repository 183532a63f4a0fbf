"""Every transcript of a shard folder, in index order: what a text front end needs to build or check a vocab."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from audiopipe.shard.manifest import read_manifest
from audiopipe.storage.s3 import is_s3


def shard_texts(shards_dir: str | Path) -> list[str]:
    """Reads only the `text` column of each Arrow shard (the payload columns are never touched).

    On s3:// each shard is opened by byte range and only the `text` field is asked for (IpcReadOptions'
    included_fields), so its payload buffers are not part of what is decoded."""
    if is_s3(shards_dir):
        from audiopipe.storage.s3 import filesystem, parse_s3

        root, fs = parse_s3(shards_dir), filesystem()
        texts: list[str] = []
        for entry in read_manifest(shards_dir)["shards"]:
            with fs.open_input_file(root.child(entry["arrow"]["path"]).path) as f:
                field = pa.ipc.open_file(f).schema.get_field_index("text")
                r = pa.ipc.open_file(f, options=pa.ipc.IpcReadOptions(included_fields=[field]))
                for i in range(r.num_record_batches):
                    texts.extend(r.get_batch(i).column("text").to_pylist())
        return texts
    root = Path(shards_dir)
    texts = []
    for entry in read_manifest(root)["shards"]:
        with pa.memory_map(str(root / entry["arrow"]["path"])) as src:
            texts.extend(pa.ipc.open_file(src).read_all().column("text").to_pylist())
    return texts
