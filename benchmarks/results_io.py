"""What every benchmark shares: its --machine/--json/--plot flags, the host and load average it ran under, steps
in an order that rotates from round to round, a figure's median and range over rounds (and as bars with whiskers), a
fresh child process (its environment, its result line, its own peak memory), its JSON (benchmarks/results/) and its
PNG (docs/img/), each when asked for."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

MACHINE = "2-core shared CPU VM, no GPU (other jobs running)"
ROOT = Path(__file__).resolve().parent.parent  # the checkout whose audiopipe the benchmarks run


def output_args(p: argparse.ArgumentParser, machine: str = MACHINE, json_required: bool = False) -> None:
    p.add_argument("--machine", default=machine, help="label for the JSON and the plot")
    p.add_argument("--json", type=Path, required=json_required, help="write the results here")
    p.add_argument("--plot", type=Path, help="draw the PNG here")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), or what platform knows."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host(label: str, **versions: str) -> dict[str, Any]:
    """The machine a run measured: its label, Python, cores and the load average when this is called (the
    machine is shared: a figure is read with its load)."""
    return {"label": label, "cpu": cpu_name(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "platform": platform.platform(), "load_average": list(os.getloadavg()), **versions}


def spread(values: Iterable[float | None]) -> dict[str, float]:
    """A figure over rounds: its median with the range (rounds that have no value, None, left out)."""
    v = [x for x in values if x is not None]
    return {"median": float(np.median(v)), "min": float(min(v)), "max": float(max(v))}


def rotated(steps: list, rnd: int) -> list:
    """`steps` starting at a different one each round, so that neither the machine's load nor the caches favour
    whichever runs first."""
    k = rnd % len(steps) if steps else 0
    return steps[k:] + steps[:k]


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a child that must import this checkout's audiopipe (its root first on PYTHONPATH)."""
    path = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), **extra}


def peak_rss_mb() -> float:
    """This process's own peak RSS (VmHWM). Not ru_maxrss: Linux carries that across fork and exec, so a child
    would report its parent's size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def bars(ax: Any, spreads: list[dict[str, float]], labels: list[str] | None = None, offset: float = 0.0,
         width: float = 0.8, **style: Any) -> None:
    """Medians as bars, their range over rounds as whiskers (`spread` entries)."""
    med = [s["median"] for s in spreads]
    x = np.arange(len(spreads)) + offset
    ax.bar(x, med, width, yerr=[[m - s["min"] for m, s in zip(med, spreads)],
                                [s["max"] - m for m, s in zip(med, spreads)]], capsize=3, **style)
    if labels is not None:
        ax.set_xticks(np.arange(len(spreads)), labels, fontsize=8)


def grouped_bars(ax: Any, groups: list[str], series: dict[str, list[dict[str, float]]], **style: Any) -> None:
    """Bars side by side in each group, one per series (its `spread` entries, one per group), with a legend."""
    width = 0.8 / len(series)
    for j, (label, spreads) in enumerate(series.items()):
        bars(ax, spreads, groups, offset=(j - (len(series) - 1) / 2) * width, width=width, label=label, **style)
    ax.legend(fontsize=8)


def child_result(cmd: list[str], tag: str = "RESULT ", what: str = "child", **run: Any) -> dict[str, Any]:
    """Run a benchmark's child process (a fresh interpreter: its own imports, peak memory and caches) and return
    the JSON it printed on the line starting with `tag`; a child that fails stops the benchmark with its stderr."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **run)
    if proc.returncode:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith(tag))
    return json.loads(line[len(tag):])


def pyplot():  # noqa: ANN201 - matplotlib.pyplot, imported on demand (only plots need it)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def write_results(result: dict[str, Any], json_path: Path | None, plot: Callable[[Path], None],
                  plot_path: Path | None) -> None:
    """The JSON (with the load average at the end of the run beside whatever the script recorded) and the plot."""
    if json_path:
        result.setdefault("load_average_end", list(os.getloadavg()))
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {json_path}")
    if plot_path:
        plot(plot_path)
        print(f"wrote {plot_path}")
