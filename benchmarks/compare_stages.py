"""Two versions of the loader side by side: the per-batch stages that benchmarks/bench_copy.py measured for each.

    python benchmarks/compare_stages.py --run before=/tmp/before.json --run after=/tmp/after.json \\
        --json benchmarks/results/loader_stages.json --plot docs/img/loader_stages.png

Each --run is LABEL=one or more bench_copy.py JSON files (comma-separated: runs taken alternately with the other
label's, so both versions saw the same moments of a shared machine). Per corpus and label: the median over the
runs of each stage's milliseconds per batch (wall and this thread's CPU time), with the range, and the within-run
"loader % of memcpy". The CPU times are the comparison to trust on a loaded machine: the wall time there also
counts the waits for a core.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from results_io import output_args, pyplot, save, write_results  # benchmarks/ (the script's own folder is on sys.path)

STAGES = ("loader", "sampler", "rows", "collate", "other", "bct")
NAMES = {"bct": "copy kernel alone"}


def load(runs: dict[str, list[Path]]) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{corpus: {label: {key: [value per run]}}} for every stage key (wall and CPU) and loader_vs_memcpy."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for label, paths in runs.items():
        for path in paths:
            corpora = json.loads(path.read_text())["corpora"]
            for corpus, r in corpora.items():
                if "loader_ms_per_batch" not in r:
                    raise SystemExit(f"{path}: {corpus} has no loader stages (a --quick run of bench_copy.py?)")
                keys = [f"{s}{t}_ms_per_batch" for s in STAGES for t in ("", "_cpu")
                        if f"{s}{t}_ms_per_batch" in r] + ["loader_vs_memcpy"]
                row = out.setdefault(corpus, {}).setdefault(label, {})
                for k in keys:
                    row.setdefault(k, []).append(float(r[k]))
    return out


def markdown(data: dict) -> str:
    lines = ["| corpus | code | clock | " + " | ".join(NAMES.get(s, s) for s in STAGES) + " | loader % of memcpy |",
             "|" + "---|" * (4 + len(STAGES))]
    for corpus, labels in data.items():
        for label, r in labels.items():
            for t, clock in (("", "wall"), ("_cpu", "thread CPU")):
                cells = []
                for s in STAGES:
                    v = r.get(f"{s}{t}_ms_per_batch") or r.get(f"{s}_ms_per_batch")
                    cells.append(f"{np.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
                share = r["loader_vs_memcpy"]
                pct = f"{np.median(share):.0%} ({min(share):.0%}-{max(share):.0%})" if not t else ""
                lines.append(f"| {corpus} | {label} | {clock} | " + " | ".join(cells) + f" | {pct} |")
    return "\n".join(lines)


def plot(data: dict, path: Path, machine: str) -> None:
    plt = pyplot()

    stages = ("sampler", "rows", "collate", "other")
    fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 3.6), squeeze=False)
    for ax, (corpus, labels) in zip(axes[0], data.items()):
        names = list(labels)
        left = np.zeros(len(names))
        for s in stages:  # thread CPU time: what the loader itself spends per batch
            vals = np.array([np.median(labels[n][f"{s}_cpu_ms_per_batch"]) for n in names])
            ax.barh(names, vals, left=left, label=s)
            left += np.maximum(vals, 0)
        ax.set_title(f"{corpus}: loader ms per batch (thread CPU time), median of runs", fontsize=9)
        ax.invert_yaxis()
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(machine, fontsize=8)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, metavar="LABEL=JSON[,JSON...]",
                   help="a label and the bench_copy.py JSON files of that code version")
    output_args(p)
    args = p.parse_args()
    runs: dict[str, list[Path]] = {}
    for spec in args.run:
        label, sep, files = spec.partition("=")
        if not sep or not label or not files:
            p.error(f"--run wants LABEL=file.json[,file.json...], got {spec!r}")
        paths = [Path(f) for f in files.split(",")]
        missing = [str(f) for f in paths if not f.is_file()]
        if missing:
            p.error(f"--run {label}: no such file {', '.join(missing)}")
        runs[label] = paths
    data = load(runs)
    print(markdown(data))
    result = {"command": " ".join(["python", "benchmarks/compare_stages.py", *sys.argv[1:]]),
              "machine": args.machine, "runs": {k: [str(f) for f in v] for k, v in runs.items()},
              "sources": {k: [json.loads(f.read_text()) for f in v] for k, v in runs.items()}, "stages": data}
    write_results(result, args.json, lambda path: plot(data, path, args.machine), args.plot)


if __name__ == "__main__":
    main()
