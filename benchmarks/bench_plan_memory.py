"""The shard driver's memory through planning: discovery, the plan, plan.json, the work units, at N utterances.

    PYTHONPATH=. python benchmarks/bench_plan_memory.py /data/scale/sub_150000 .          # this checkout
    PYTHONPATH=/tmp/old python benchmarks/bench_plan_memory.py /data/scale/sub_150000 /tmp/old   # another one

The second argument is the checkout whose audiopipe is on PYTHONPATH (its tests/shard_helpers.py makes the job).
Prints one JSON line: the process' peak RSS (VmHWM) after importing the feature code (base) and after planning
and writing plan.json (peak), and the CPU time of that. A checkout before plan.json was written unit by unit
(its _plan returns the units inside the plan) is run the way its driver ran it.
"""
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main() -> None:
    corpus, checkout = sys.argv[1], sys.argv[2]
    from audiopipe.shard import run
    from audiopipe.shard.plan import WorkUnit

    sys.path.insert(0, str(Path(checkout) / "tests"))
    from shard_helpers import make_job

    tmp = Path(tempfile.mkdtemp(prefix="plan-memory-"))
    job = make_job(corpus, tmp / "out", [("energy", {})], shard_bytes=2_000_000)
    specs = run.job_specs(job)
    base, t = peak_mb(), time.process_time()
    r = run._plan(job, None, "auto", specs, "auto")
    if len(r) == 2:  # before: the units inside the plan as dicts, one json.dumps, work units made from the dicts
        plan = r[0]
        run.write_json_atomic(tmp / "plan.json", plan)
        units = [WorkUnit.from_dict(u) for u in plan["units"]]
    else:
        plan, units, _ = r
        run.write_plan(tmp / "plan.json", plan, units)
    print(json.dumps({"base_mb": round(base, 1), "peak_mb": round(peak_mb(), 1),
                      "growth_mb": round(peak_mb() - base, 1), "cpu_s": round(time.process_time() - t, 2),
                      "units": len(units)}))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
