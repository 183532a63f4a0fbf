"""The loader regression guard's figure: make_loader's raw throughput as a ratio to a plain numpy loop copying the
same batches, in the same process, on a small fixed synthetic corpus (audiopipe/bench/guard.py says exactly what
each side does).

    python benchmarks/bench_loader_guard.py --json benchmarks/results/loader_guard.json

The committed JSON's `ratio` is what tests/test_loader_guard.py compares with: the test prints both and fails only
below half of it.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

from audiopipe.bench.guard import measure, write_guard_corpus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--corpus", type=Path, default=None, help="where to write the corpus (default: a temp folder)")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU (other jobs running)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shards = write_guard_corpus(a.corpus or Path(tmp) / "guard")
        result = measure(shards, a.rounds)
    result = {"command": "python benchmarks/bench_loader_guard.py", "machine": a.machine,
              "python": platform.python_version(), **result}
    print(f"loader/reference, CPU time = {result['ratio']:.3f}, wall time = {result['wall_ratio']:.3f} "
          f"(cheapest of {a.rounds} rounds each), load {result['load_avg'][0]:.1f}")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
