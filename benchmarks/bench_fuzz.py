"""A long run of the corpus-layer fuzzing harness (tests/fuzz_corpus.py): the CI test runs it with a fixed seed
and about a minute of examples; this runs as many examples per kind as asked, with a seed, and reports how many
it tried, how long they took and the first failure of each kind (hypothesis shrinks it to a small example).

    python benchmarks/bench_fuzz.py --examples 2000 --seed 20260101 --json benchmarks/results/fuzz.json
    python benchmarks/bench_fuzz.py --examples 200 --kinds audio,emilia_tar      # a quick look at two kinds

The invariant checked on every example is the CI test's: each input written with exactly the data it holds or
rejected with a reason, discovered = written + rejected, no hang (20 s per example), no traceback, peak memory
rising by less than 256 MiB. The seed makes a run repeatable: the same seed and counts draw the same examples.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from results_io import write_results  # noqa: E402  (benchmarks/: the script's own folder is on sys.path)


def run(kinds: list[str], examples: int, seed: int) -> dict:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as with_seed

    from fuzz_corpus import KINDS, MEMORY_LIMIT, TIME_LIMIT_S, check

    out: dict = {"seed": seed, "examples_per_kind": examples, "time_limit_s": TIME_LIMIT_S,
                 "memory_limit_mib": MEMORY_LIMIT >> 20, "kinds": {}}
    for kind in kinds:
        tried: dict[str, int] = {}

        @with_seed(seed)
        @settings(max_examples=examples, deadline=None, derandomize=False, database=None, print_blob=True,
                  suppress_health_check=list(HealthCheck))
        @given(example=KINDS[kind])
        def fuzz(example):
            check(example, tried, kind)

        t0 = time.perf_counter()
        failure = None
        try:
            fuzz()
        except Exception as e:  # the shrunk counterexample, reported rather than raised: the other kinds still run
            failure = _describe(e)
        spent = time.perf_counter() - t0
        out["kinds"][kind] = {"examples_tried": tried.get(kind, 0), "seconds": round(spent, 1),
                              "failure": failure}
        print(f"{kind:14s} {tried.get(kind, 0):6d} examples in {spent:7.1f} s  "
              f"{'FAILED: ' + failure.splitlines()[0] if failure else 'ok'}", flush=True)
    out["examples_tried"] = sum(k["examples_tried"] for k in out["kinds"].values())
    out["failures"] = sum(1 for k in out["kinds"].values() if k["failure"])
    return out


def _describe(e: BaseException) -> str:
    """The failure and its falsifying example (hypothesis's notes), each of a group of distinct failures."""
    parts = e.exceptions if isinstance(e, BaseExceptionGroup) else [e]
    return "\n".join("".join(traceback.format_exception_only(type(x), x))[-3000:] for x in parts)


def main() -> int:
    from fuzz_corpus import KINDS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=1000, help="examples per kind of input")
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, reported)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, from {', '.join(KINDS)}")
    p.add_argument("--json", type=Path, default=None, help="write the result here (benchmarks/results/fuzz.json)")
    p.add_argument("--machine", default="2-core shared CPU VM, no GPU; other engineers used the CPU at the same time")
    a = p.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**32)
    kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        p.error(f"unknown kind {', '.join(bad)}; choose from {', '.join(KINDS)}")
    load_start = os.getloadavg()[0]
    print(f"seed {seed}, {a.examples} examples per kind, load {load_start:.1f}", flush=True)
    t0 = time.perf_counter()
    result = run(kinds, a.examples, seed)
    result.update(command=" ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), machine=a.machine,
                  python=platform.python_version(), load_avg_start=round(load_start, 1), load_avg_end=round(os.getloadavg()[0], 1),
                  seconds=round(time.perf_counter() - t0, 1))
    print(f"{result['examples_tried']} examples, {result['failures']} kinds failed, seed {seed}")
    write_results(result, a.json, lambda path: None, None)
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
