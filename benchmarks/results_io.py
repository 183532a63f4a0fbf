"""Where a benchmark's result goes: its JSON (benchmarks/results/) and its PNG (docs/img/), each when asked for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable


def write_results(result: dict[str, Any], json_path: Path | None, plot: Callable[[Path], None],
                  plot_path: Path | None) -> None:
    if json_path:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {json_path}")
    if plot_path:
        plot(plot_path)
        print(f"wrote {plot_path}")
