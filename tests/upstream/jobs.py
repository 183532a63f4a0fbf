"""Several scripts of this folder in one interpreter, in order, for a test that needs more than one upstream job.

    jobs.py SCRIPT ARG... + SCRIPT ARG... [+ ...]

Each script runs as `python SCRIPT ARG...` would (its `__main__` block, its own sys.argv). Starting the side venv's
torch and an upstream package costs seconds of CPU (GPT-SoVITS's Lightning module: ~8 s); one start serves all.
"""

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> None:
    job: list[str] = []
    for arg in [*argv, "+"]:
        if arg != "+":
            job.append(arg)
            continue
        if not job:
            raise SystemExit("jobs.py: an empty job (two '+' in a row, or a '+' at an end)")
        script = str(HERE / job[0])
        sys.argv = [script, *job[1:]]
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:  # a script's sys.exit(0) ends its job, not the jobs after it
            if e.code not in (0, None):
                raise
        job = []


if __name__ == "__main__":
    main(sys.argv[1:])
