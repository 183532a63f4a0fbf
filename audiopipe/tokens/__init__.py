"""Semantic tokens for GPT-SoVITS stage 1, stored as a sidecar shard folder that the loader reads mmap'd.

Two sources, both written the same way:
    audiopipe tokens --shards ./shards --out ./tokens --name2semantic 6-name2semantic.tsv   # real SoVITS tokens
    audiopipe tokens --shards ./shards --out ./tokens --kmeans 512 --feature fbank          # k-means units

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

import argparse
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from audiopipe.features.base import FeatureSpec
from audiopipe.index.lengths import LengthIndex, build_index
from audiopipe.shard.manifest import (MANIFEST_NAME, assemble_manifest, read_manifest, write_json_atomic,
                                      write_rejects)
from audiopipe.shard.writer import ArrayColumn, write_arrow

TOKEN_COLUMN = "semantic"
REPORT_NAME = "report.json"
# Everything a token folder may hold: --force clears these and refuses to touch anything else.
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
        raise FileNotFoundError(f"{parent / MANIFEST_NAME} not found: --shards must be an `audiopipe shard` output")
    if out.resolve() == parent.resolve():
        raise ValueError("--out must be a new folder, not the --shards folder (tokens are a sidecar shard set)")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise ValueError(f"{out} is not empty; pass --force to replace the tokens there, or choose another --out")
        foreign = sorted(p.name for p in out.iterdir() if p.name not in _OURS and ".tmp" not in p.name)
        if foreign:
            raise ValueError(f"{out} holds files a token folder does not ({', '.join(foreign[:3])}); refusing to "
                             f"clear it even with --force")
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
    from audiopipe.shard.checksum import sha256_file

    parent, out = Path(parent), Path(out)
    pm = read_manifest(parent)
    index = LengthIndex.open(parent)
    n = len(index)
    missing = sorted(set(range(n)) - set(ts.tokens) - set(ts.rejects))
    if missing:  # a source must account for every row: tokens or a reason
        raise RuntimeError(f"token source left {len(missing)} rows without tokens or reason (e.g. row {missing[0]})")
    spec = {**ts.spec.to_dict(), "hash": ts.spec.config_hash}
    meta = {"features": {TOKEN_COLUMN: spec}, "job": ts.job}
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
        phones = _ListColumn(table.column("phones")) if "phones" in table.column_names else None
        rows, shard_rejects = [], []
        for g in globals_:
            r = int(row_of[g])
            row = {c: cols[c][r].as_py() for c in _COPIED}
            if row["id"] != ids[g]:
                raise RuntimeError(f"{parent}: index row {g} ({ids[g]}) is not row {r} of {entry['name']}")
            if g in ts.rejects:
                reason, detail = ts.rejects[g]
                shard_rejects.append({"id": row["id"], "source": row["source"], "reason": reason, "detail": detail})
                continue
            arrays = {TOKEN_COLUMN: np.ascontiguousarray(ts.tokens[g], dtype=np.int16)}
            if phones is not None:
                arrays["phones"] = phones[r]
            rows.append({**row, "arrays": arrays, "scalars": {}})
        rejects += shard_rejects
        if not rows:
            continue
        acols = [ArrayColumn(TOKEN_COLUMN, "int16", 0)]
        if phones is not None:
            acols.append(ArrayColumn("phones", "int16", 0))
        rel = f"arrow/{entry['name']}.arrow"
        write_arrow(out / rel, rows, acols, [], meta)
        records.append({"name": entry["name"], "rows": len(rows), "duration": float(sum(r["duration"] for r in rows)),
                        "arrow": {"path": rel, "bytes": (out / rel).stat().st_size, "sha256": sha256_file(out / rel)},
                        "rejects": []})
    if not records:
        raise ValueError("no utterance got tokens, nothing to write")
    index_path = build_index(out, [r["arrow"]["path"] for r in records])
    # Totals count the parent's rows: discovered = parent rows = rows with tokens + rows in rejects.jsonl.
    manifest = assemble_manifest(out, records, {TOKEN_COLUMN: spec}, pm.get("resampler", {}), ts.job,
                                 discovered=n, discovery_rejects=len(rejects), index_path=index_path,
                                 extra={"phones": pm["phones"]} if "phones" in pm else None)  # the phone id table
    write_rejects(out, rejects)
    write_json_atomic(out / REPORT_NAME, ts.report)
    return manifest


class _ListColumn:
    """Zero-copy rows of a large_list column."""

    def __init__(self, col: pa.ChunkedArray):
        chunk = col.combine_chunks()
        self.offsets = chunk.offsets.to_numpy()
        self.values = chunk.values.to_numpy(zero_copy_only=False)

    def __getitem__(self, r: int) -> np.ndarray:
        return self.values[self.offsets[r]:self.offsets[r + 1]]


def token_spec(parent: str | Path) -> dict[str, Any]:
    """The `semantic` spec of a token folder (raises a clear error when the folder has no tokens)."""
    m = read_manifest(parent)
    if TOKEN_COLUMN not in m["features"]:
        raise ValueError(f"{parent} has no {TOKEN_COLUMN!r} tokens (features: {sorted(m['features'])}); "
                         f"make them with `audiopipe tokens --shards <shards> --out <tokens> ...`")
    return m["features"][TOKEN_COLUMN]


# ----------------------------------------------------------------------------- command line

def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of `audiopipe tokens`."""
    p.add_argument("--shards", required=True, help="shard folder with phones (and the k-means feature)")
    p.add_argument("--out", required=True, help="new folder for the token shards (a sidecar shard set)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--name2semantic", metavar="FILE",
                     help="GPT-SoVITS 6-name2semantic.tsv (item_name<TAB>space-separated ints), joined by "
                          "utterance name (basename of the id)")
    src.add_argument("--kmeans", type=int, metavar="K",
                     help="fit K k-means units on --feature and tokenise every utterance (NOT SoVITS tokens)")
    src.add_argument("--codebook", metavar="NPZ", help="tokenise with a codebook saved by an earlier --kmeans run")
    p.add_argument("--codebook-size", type=int, default=1024,
                   help="name2semantic: token ids must be below this (SoVITS: 1024)")
    p.add_argument("--token-rate", type=float, default=25.0,
                   help="name2semantic: tokens per second (SoVITS v1/v2: 25); used for the length check")
    p.add_argument("--require-all", action="store_true",
                   help="name2semantic: exit 1 when any row or tsv name is left unmatched")
    p.add_argument("--feature", default="fbank", help="kmeans: shard column (or kind) to cluster (default fbank)")
    p.add_argument("--stack", type=int, default=0,
                   help="kmeans: frames stacked per token (default 0 = auto, to about 25 tokens/s)")
    p.add_argument("--seed", type=int, default=0, help="kmeans: seed of sampling, init and mini-batches")
    p.add_argument("--fit-vectors", type=int, default=200_000, help="kmeans: at most this many vectors to fit on")
    p.add_argument("--steps", type=int, default=200, help="kmeans: mini-batch steps (default 200)")
    p.add_argument("--batch-size", type=int, default=4096, help="kmeans: vectors per mini-batch (default 4096)")
    p.add_argument("--force", action="store_true", help="replace an existing token folder at --out")


def run(args: argparse.Namespace) -> int:
    """`audiopipe tokens`: returns the exit code; user errors raise ValueError/OSError with one-line messages."""
    if args.name2semantic:
        from audiopipe.tokens.semantic import import_name2semantic

        summary = import_name2semantic(args.shards, args.name2semantic, args.out, codebook_size=args.codebook_size,
                                       token_rate=args.token_rate, force=args.force)
        for line in summary.lines():
            print(line)
        return 1 if args.require_all and not summary.complete else 0
    from audiopipe.tokens.kmeans import kmeans_tokens

    if args.kmeans is not None and args.kmeans < 2:
        raise ValueError(f"--kmeans needs at least 2 clusters, got {args.kmeans}")
    summary = kmeans_tokens(args.shards, args.out, k=args.kmeans, feature=args.feature, stack=args.stack,
                            seed=args.seed, fit_vectors=args.fit_vectors, steps=args.steps,
                            batch_size=args.batch_size, codebook=args.codebook, force=args.force)
    for line in summary:
        print(line)
    return 0


def read_report(out: str | Path) -> dict[str, Any]:
    return json.loads((Path(out) / REPORT_NAME).read_text())
