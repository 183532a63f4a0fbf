"""What an exported model computes in its upstream project, against what it computed in its run.

Weights that load strictly can still compute something else upstream: a forward rule, a prompt rule, a phone
table or an epsilon the run chose differently. Each exporter lists such choices as `Difference`s (from the run's
recorded model config); `settle` refuses the export while there are any, or, when the user allows it, returns one
printed note per difference, so an export never differs without a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from audiopipe.checkpoints.files import CheckpointError

ALLOW_FLAG = "--allow-different"


@dataclass(frozen=True)
class Difference:
    what: str  # the run's setting, as its flag or config field names it
    ours: Any
    upstream: Any
    effect: str  # what upstream then computes otherwise

    def __str__(self) -> str:
        return f"{self.what} {self.ours} (upstream: {self.upstream}): {self.effect}"


class ExportDiffers(CheckpointError):
    """The exported model would compute in upstream something other than what it computed in its run."""

    def __init__(self, run: str, differences: list[Difference]):
        self.differences = differences
        super().__init__(f"{run} was trained with rules upstream does not run, so its export would compute "
                         f"something else there: {'; '.join(map(str, differences))}. Pass {ALLOW_FLAG} to write "
                         f"it anyway")


def settle(run: str, differences: list[Difference], allow_different: bool) -> list[str]:
    """Refuse (ExportDiffers) when there are differences and they are not allowed; else one note per difference."""
    if differences and not allow_different:
        raise ExportDiffers(run, differences)
    return [f"computes differently in upstream: {d}" for d in differences]
