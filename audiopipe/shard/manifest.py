"""manifest.json and rejects.jsonl: assembled from the per-shard completion records once all shards exist."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audiopipe.errors import Failed, InvalidValue, NotFound
from audiopipe.version import __version__
from audiopipe.shard.checksum import file_checksum, sha256_file
from audiopipe.storage.s3 import is_s3, parse_s3, require_local_or_s3
from audiopipe.shard.writer import FORMAT_VERSION
# write_json_atomic is re-exported here for the runner (plan.json); its bytes are stable (sorted keys, indent 1).
from audiopipe.storage.atomic import write_json_atomic, write_text_atomic

MANIFEST_NAME = "manifest.json"
REJECTS_NAME = "rejects.jsonl"


def write_rejects(out: Path, rejects: list[dict[str, Any]]) -> Path:
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n"
             for r in sorted(rejects, key=lambda r: (r.get("source") or r.get("path") or "", r["reason"]))]
    return write_text_atomic(out / REJECTS_NAME, "".join(lines))


def assemble_manifest(out: Path, records: list[dict[str, Any]], features: dict[str, Any],
                      resampler: dict[str, Any], job: dict[str, Any], discovered: int,
                      discovery_rejects: int, index_path: Path, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    shards = []
    for r in records:
        entry = {k: r[k] for k in ("name", "rows", "duration", "arrow")}
        if "tar" in r:
            entry["tar"] = r["tar"]
        shards.append(entry)
    written = sum(r["rows"] for r in records)
    rejected = discovery_rejects + sum(len(r["rejects"]) for r in records)
    manifest = {
        "format_version": FORMAT_VERSION,
        "audiopipe_version": __version__,
        "features": features,
        "resampler": resampler,
        "job": job,
        "shards": shards,
        # xxh3_128 is what readers check at every open (fast); sha256 stays for records that name it.
        "index": {"path": index_path.name, "sha256": sha256_file(index_path),
                  "xxh3_128": file_checksum(index_path, "xxh3_128")},
        "totals": {"discovered": discovered, "written": written, "rejected": rejected,
                   "hours": round(sum(r["duration"] for r in records) / 3600, 6)},
    }
    manifest.update(extra or {})
    if discovered != written + rejected:  # the invariant users rely on: nothing vanishes
        raise Failed(f"accounting error: discovered {discovered} != written {written} + rejected {rejected}")
    write_json_atomic(out / MANIFEST_NAME, manifest)
    return manifest


def read_manifest(shards_dir: str | Path) -> dict[str, Any]:
    # Every reader (loader, verify, inspect, bench, export, trainers) opens a shard set here first.
    text = require_local_or_s3(shards_dir, "shard folder")
    if is_s3(text):  # the shard set on object storage: the same file under the prefix
        from audiopipe.storage.s3_ranges import ObjectChanged, RangeReader

        path = parse_s3(text).child(MANIFEST_NAME)
        try:
            raw = RangeReader().read_object(path).decode("utf-8", "replace")
        except ObjectChanged as e:
            raise NotFound(f"{path} not found: not a shard set (write one with `audiopipe shard` or "
                           f"ap.shard) ({e})") from e
    else:
        path = Path(text) / MANIFEST_NAME
        if not path.exists():
            raise NotFound(f"{path} not found: not a shard folder (write one with `audiopipe shard` or ap.shard)")
        raw = path.read_text()
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidValue(f"{path} is not valid JSON ({e}); the folder may be from an interrupted run") from e
