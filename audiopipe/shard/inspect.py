"""`audiopipe inspect`: what is in a shard folder, read from the manifest and the length index only.

For an s3:// shard set those (manifest.json, index.arrow, rejects.jsonl) are downloaded into a temp folder
first; the shards themselves are never read.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from audiopipe.errors import NotFound
from audiopipe.index.lengths import INDEX_NAME, LengthIndex
from audiopipe.shard.manifest import MANIFEST_NAME, REJECTS_NAME, read_manifest
from audiopipe.storage.s3 import is_s3, parse_s3
from audiopipe.storage.scratch import make_scratch, remove_scratch


@contextmanager
def _summary_files(shards_dir: str | Path) -> Iterator[Path]:
    """A local folder holding the shard set's manifest, index and rejects: the folder itself, or for s3:// a temp
    copy of those three objects."""
    if not is_s3(shards_dir):
        yield Path(shards_dir)
        return
    from audiopipe.storage.s3 import filesystem

    url, fs = parse_s3(shards_dir), filesystem()
    tmp = make_scratch("inspect")
    try:
        for name in (MANIFEST_NAME, INDEX_NAME, REJECTS_NAME):
            try:
                with fs.open_input_stream(url.child(name).path) as src:
                    (tmp / name).write_bytes(src.read())
            except FileNotFoundError:
                if name == MANIFEST_NAME:
                    raise NotFound(f"{url.child(name)} not found: run `audiopipe shard --out {url}` "
                                   f"first (or it has not finished)") from None
        yield tmp
    finally:
        remove_scratch(tmp)


def _label(shards_dir: str | Path) -> str:
    if is_s3(shards_dir):
        return str(parse_s3(shards_dir))
    return Path(shards_dir).resolve().name


def summarize(shards_dir: str | Path) -> dict[str, Any]:
    root = Path(shards_dir)
    m = read_manifest(root)
    idx = LengthIndex.open(root)
    dur = idx.duration.astype(np.float64)
    speakers = idx.table.column("speaker").to_pylist()
    per_spk: dict[str, float] = {}
    for s, d in zip(speakers, dur):
        per_spk[s] = per_spk.get(s, 0.0) + float(d)
    reasons: dict[str, int] = {}
    rej = root / REJECTS_NAME
    if rej.exists():
        for line in rej.read_text().splitlines():
            r = json.loads(line)["reason"]
            reasons[r] = reasons.get(r, 0) + 1
    return {
        "totals": m["totals"],
        "shards": len(m["shards"]),
        "bytes": {"arrow": sum(s["arrow"]["bytes"] for s in m["shards"]),
                  "tar": sum(s.get("tar", {}).get("bytes", 0) for s in m["shards"])},
        "features": {k: {"kind": v["kind"], "hash": v["hash"], "sample_rate": v["sample_rate"],
                         "hop_length": v["hop_length"], "dtype": v["dtype"], "channels": v["channels"]}
                     for k, v in m["features"].items()},
        "speakers": len(per_spk),
        "top_speakers": sorted(per_spk.items(), key=lambda kv: -kv[1])[:10],
        "duration_s": {"min": float(dur.min()) if len(dur) else 0.0, "median": float(np.median(dur)) if len(dur) else 0.0,
                       "max": float(dur.max()) if len(dur) else 0.0, "mean": float(dur.mean()) if len(dur) else 0.0},
        "reject_reasons": reasons,
        "resampler": m.get("resampler"),
    }


def plot_durations(shards_dir: str | Path, path: str | Path, label: str | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dur = LengthIndex.open(shards_dir).duration
    fig, ax = plt.subplots(figsize=(7, 3.5), dpi=110)
    ax.hist(dur, bins=min(60, max(10, len(dur) // 5)), color="#3b75af", edgecolor="white")
    ax.set_xlabel("duration (s)")
    ax.set_ylabel("utterances")
    ax.set_title(f"{len(dur)} utterances, {dur.sum() / 3600:.2f} h — {label or _label(shards_dir)}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def inspect_shards(shards_dir: str | Path, plot: str | None = None, as_json: bool = False) -> int:
    # An s3:// set's histogram goes to the current folder unless --plot says where: nothing is written to the store.
    default_png = Path("durations.png") if is_s3(shards_dir) else Path(shards_dir) / "durations.png"
    with _summary_files(shards_dir) as local:
        s = summarize(local)
        png = plot_durations(local, plot or default_png, label=_label(shards_dir))
    s["plot"] = str(png)
    if as_json:
        print(json.dumps(s, indent=1))
        return 0
    t = s["totals"]
    mb = lambda b: f"{b / 1e6:.1f} MB"
    print(f"shards      {s['shards']} (arrow {mb(s['bytes']['arrow'])}, tar {mb(s['bytes']['tar'])})")
    print(f"utterances  {t['written']} written of {t['discovered']} discovered, {t['rejected']} rejected")
    if s["reject_reasons"]:
        print("rejects     " + ", ".join(f"{k} {v}" for k, v in sorted(s["reject_reasons"].items())))
    print(f"audio       {t['hours']:.3f} h; duration min {s['duration_s']['min']:.2f} s, "
          f"median {s['duration_s']['median']:.2f} s, max {s['duration_s']['max']:.2f} s")
    print(f"speakers    {s['speakers']}" + ("  (top: " + ", ".join(f"{k or '-'} {v / 60:.1f} min" for k, v in s["top_speakers"][:5]) + ")" if s["speakers"] else ""))
    for k, v in s["features"].items():
        shape = f"[{v['channels']}, T]" if v["channels"] else "[T]"
        print(f"feature     {k:<10} {v['kind']:<12} {v['dtype']:<8} {shape:<9} {v['sample_rate']} Hz hop {v['hop_length']}  hash {v['hash']}")
    print(f"histogram   {png}")
    return 0
