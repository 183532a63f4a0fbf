"""Writing a semantic-token set: the sidecar shard folder `audiopipe tokens` makes for GPT-SoVITS stage 1.

Every source (semantic.py: a GPT-SoVITS tsv; kmeans.py: k-means units) hands a TokenSet to write_token_set.

Storage: `--out` is an ordinary shard folder (docs/format.md), Arrow only (no tars):
    manifest.json  features = {"semantic": spec}; spec["kind"] says what the tokens ARE
                   ("sovits_semantic", or "kmeans-fbank-512"); job = how they were made, from which folder
    index.arrow    id, speaker, duration, semantic_frames, phones_frames, shard, row
    rejects.jsonl  every parent row that got no tokens, with the reason (nothing is dropped silently)
    report.json    the source's own report (tsv names that matched no row; k-means fit statistics)
    arrow/<parent shard name>.arrow   id, speaker, text, source, duration, semantic int16 [T], phones int16 [P]
So `make_loader("./tokens", ["semantic", "phones"])` works as for any shard folder. One token shard per parent
shard, rows in parent order; tokens are small (25 per second), so the copy of `phones` costs nothing.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from audiopipe.errors import Failed, InvalidValue, NotFound
from audiopipe.features.base import FeatureSpec
from audiopipe.index.lengths import LengthIndex, build_index
from audiopipe.shard.columns import ListColumn
from audiopipe.shard.manifest import (MANIFEST_NAME, assemble_manifest, read_manifest, write_json_atomic,
                                      write_rejects)
from audiopipe.shard.writer import ArrayColumn, write_arrow

TOKEN_COLUMN = "semantic"
REPORT_NAME = "report.json"
# Everything a token folder may hold: --overwrite clears these and refuses to touch anything else.
_OURS = ("arrow", MANIFEST_NAME, "index.arrow", "rejects.jsonl", REPORT_NAME, "kmeans.npz")
_COPIED = ("id", "speaker", "text", "source", "duration")


@dataclass
class TokenSet:
    """What a token source hands to `write_token_set`."""

    spec: FeatureSpec  # name "semantic"; kind names the source
    tokens: dict[int, np.ndarray]  # global row of the parent index -> int16 [T]
    rejects: dict[int, tuple[str, str]]  # global row -> (reason, detail) for rows without tokens
    job: dict[str, Any]  # how the tokens were made (recorded as manifest["job"])
    report: dict[str, Any]  # written to report.json


def prepare_out(parent: Path, out: Path, force: bool) -> None:
    """Refuse to write over the parent or over an existing folder (unless force: then clear our files)."""
    parent, out = Path(parent), Path(out)
    if not (parent / MANIFEST_NAME).exists():
        raise NotFound(f"{parent / MANIFEST_NAME} not found: --shards must be an `audiopipe shard` output")
    if out.resolve() == parent.resolve():
        raise InvalidValue("--out must be a new folder, not the --shards folder (tokens are a sidecar shard set)")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise InvalidValue(f"{out} is not empty; pass --overwrite to replace the tokens there, or choose "
                               f"another --out")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _OURS and ".tmp" not in p.name)
        if foreign:
            raise InvalidValue(f"{out} holds files a token folder does not ({', '.join(foreign[:3])}); refusing to "
                               f"clear it even with --overwrite")
        for name in _OURS:
            target = out / name
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
        for tmp in out.glob("*.tmp*"):
            tmp.unlink()
    out.mkdir(parents=True, exist_ok=True)


def parent_ids(parent: Path) -> list[str]:
    return LengthIndex.open(parent).table.column("id").to_pylist()


def phones_note(parent: str | Path) -> str | None:
    """A warning line when the parent shards have no phones (stage 1 of GPT-SoVITS reads phones -> tokens)."""
    if read_manifest(parent).get("job", {}).get("phones"):
        return None
    return (f"note: {parent} has no phones column, so the token folder has none either; the gpt_sovits trainer "
            f"needs them (shard with --preset gpt_sovits)")


def write_token_set(parent: str | Path, out: str | Path, ts: TokenSet) -> dict[str, Any]:
    """Write the sidecar folder for `ts` next to the parent shards; returns its manifest."""
    parent, out = Path(parent), Path(out)
    pm = read_manifest(parent)
    index = LengthIndex.open(parent)
    n = len(index)
    missing = sorted(set(range(n)) - set(ts.tokens) - set(ts.rejects))
    if missing:  # a source must account for every row: tokens or a reason
        raise Failed(f"token source left {len(missing)} rows without tokens or reason (e.g. row {missing[0]})")
    spec = {**ts.spec.to_dict(), "hash": ts.spec.config_hash}
    bert_spec = pm["features"].get("bert")
    features = {TOKEN_COLUMN: spec, **({"bert": bert_spec} if bert_spec else {})}
    meta = {"features": features, "job": ts.job}
    ids = index.table.column("id").to_pylist()
    rows_by_shard: dict[int, list[int]] = {}
    for g, k in enumerate(index.shard.tolist()):
        rows_by_shard.setdefault(k, []).append(g)
    row_of = index.row
    records: list[dict[str, Any]] = []
    rejects: list[dict[str, Any]] = []
    for k, entry in enumerate(pm["shards"]):
        globals_ = rows_by_shard.get(k, [])
        if not globals_:
            continue
        with pa.memory_map(str(parent / entry["arrow"]["path"])) as src:
            table = pa.ipc.open_file(src).read_all()
        cols = {c: table.column(c) for c in _COPIED}
        phones = ListColumn(table.column("phones"), zero_copy_only=False) if "phones" in table.column_names else None
        # per-phone BERT features (--bert-checkpoint) travel with the phones they belong to
        bert = ListColumn(table.column("bert"), zero_copy_only=False) if bert_spec else None
        rows, shard_rejects = [], []
        for g in globals_:
            r = int(row_of[g])
            row = {c: cols[c][r].as_py() for c in _COPIED}
            if row["id"] != ids[g]:
                raise Failed(f"{parent}: index row {g} ({ids[g]}) is not row {r} of {entry['name']}")
            if g in ts.rejects:
                reason, detail = ts.rejects[g]
                shard_rejects.append({"id": row["id"], "source": row["source"], "reason": reason, "detail": detail})
                continue
            arrays = {TOKEN_COLUMN: np.ascontiguousarray(ts.tokens[g], dtype=np.int16)}
            if phones is not None:
                arrays["phones"] = phones[r]
            if bert is not None:
                arrays["bert"] = bert[r].reshape(bert_spec["channels"], -1)
            rows.append({**row, "arrays": arrays, "scalars": {}})
        rejects += shard_rejects
        if not rows:
            continue
        acols = [ArrayColumn(TOKEN_COLUMN, "int16", 0)]
        if phones is not None:
            acols.append(ArrayColumn("phones", "int16", 0))
        if bert is not None:
            acols.append(ArrayColumn("bert", bert_spec["dtype"], bert_spec["channels"]))
        rel = f"arrow/{entry['name']}.arrow"
        digest = write_arrow(out / rel, rows, acols, [], meta)  # hashed as written: no second read of the file
        records.append({"name": entry["name"], "rows": len(rows), "duration": float(sum(r["duration"] for r in rows)),
                        "arrow": digest.entry(rel),
                        "rejects": []})
    if not records:
        raise InvalidValue("no utterance got tokens, nothing to write")
    index_path = build_index(out, [r["arrow"]["path"] for r in records])
    # Totals count the parent's rows: discovered = parent rows = rows with tokens + rows in rejects.jsonl.
    manifest = assemble_manifest(out, records, features, pm.get("resampler", {}), ts.job,
                                 discovered=n, discovery_rejects=len(rejects), index_path=index_path,
                                 extra={"phones": pm["phones"]} if "phones" in pm else None)  # the phone id table
    write_rejects(out, rejects)
    write_json_atomic(out / REPORT_NAME, ts.report)
    return manifest


def token_spec(parent: str | Path) -> dict[str, Any]:
    """The `semantic` spec of a token folder (raises a clear error when the folder has no tokens)."""
    m = read_manifest(parent)
    if TOKEN_COLUMN not in m["features"]:
        raise InvalidValue(f"{parent} has no {TOKEN_COLUMN!r} tokens (features: {sorted(m['features'])}); "
                           f"make them with `audiopipe tokens --shards <shards> --out <tokens> ...`")
    return m["features"][TOKEN_COLUMN]


def read_report(out: str | Path) -> dict[str, Any]:
    return json.loads((Path(out) / REPORT_NAME).read_text())
