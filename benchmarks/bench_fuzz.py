"""A long run of the corpus-layer fuzzing harness (tests/fuzz_corpus.py) with a seed: the same seed and counts draw
the same examples. What it checks and reports, and the command: docs/corpus.md. Exit code 1 if any kind failed.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from pathlib import Path

from hypothesis import seed as with_seed
from results_io import MACHINE, ROOT, host, write_results  # benchmarks/, the script's folder, is on sys.path

sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from fuzz_corpus import KINDS, MEMORY_LIMIT, TIME_LIMIT_S, fuzz  # noqa: E402


def run(kind: str, examples: int, seed: int) -> dict:
    tried: dict[str, int] = {}
    t0, failure = time.perf_counter(), None
    try:
        with_seed(seed)(fuzz(kind, examples, tried))()
    except Exception as e:  # the shrunk counterexample, reported rather than raised: the other kinds still run
        parts = e.exceptions if isinstance(e, BaseExceptionGroup) else [e]
        failure = "\n".join("".join(traceback.format_exception_only(type(x), x))[-3000:] for x in parts)
    out = {"examples_tried": tried.get(kind, 0), "seconds": round(time.perf_counter() - t0, 1), "failure": failure}
    print(f"{kind:14s} {out['examples_tried']:6d} examples in {out['seconds']:7.1f} s  "
          f"{'FAILED: ' + failure.splitlines()[0] if failure else 'ok'}", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=1000, help="examples per kind of input")
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, reported)")
    p.add_argument("--machine", default=MACHINE, help="label for the JSON")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    res = {"host": host(a.machine), "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "seed": seed,
           "examples_per_kind": a.examples, "time_limit_s": TIME_LIMIT_S, "memory_limit_mib": MEMORY_LIMIT >> 20}
    print(f"seed {seed}, {a.examples} examples per kind, load {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.perf_counter()
    res["kinds"] = done = {k: run(k, a.examples, seed) for k in KINDS}
    res.update(examples_tried=sum(k["examples_tried"] for k in done.values()),
               failures=sum(bool(k["failure"]) for k in done.values()), seconds=round(time.perf_counter() - t0, 1))
    print(f"{res['examples_tried']} examples, {res['failures']} kinds failed, seed {seed}")
    write_results(res, a.json, lambda _: None, None)
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
