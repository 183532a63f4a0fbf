"""Start a model from weights made elsewhere: load what matches, keep the rest as initialised, and say which.

Fine-tuning starts from a released checkpoint whose tensors may not all fit: a new text vocabulary, a new
speaker head, a buffer one side keeps and the other derives. `load_matching` loads every tensor whose name and
shape agree, and reports three lists: loaded, new (the model has it, the file does not) and dropped (the file has
it, the model does not). A tensor present on both sides with different shapes is an error that names the tensor
and both shapes, never a silent skip: the caller turns it into the flag that fixes it (e.g. a vocabulary size).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from audiopipe.checkpoints.files import CheckpointError


@dataclass
class LoadReport:
    loaded: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    loaded_values: int = 0  # numbers loaded (parameters and buffers)

    def summary(self, show: int = 6) -> str:
        def names(xs: list[str]) -> str:
            if not xs:
                return "none"
            head = ", ".join(xs[:show])
            return f"{len(xs)} ({head}{', ...' if len(xs) > show else ''})"

        return (f"loaded {len(self.loaded)} tensors ({self.loaded_values / 1e6:.2f} M values); "
                f"new (kept as initialised): {names(self.new)}; dropped (not in this model): {names(self.dropped)}")


class ShapeMismatch(CheckpointError):
    """A tensor both sides have, with different shapes."""

    def __init__(self, name: str, ours: tuple[int, ...], theirs: tuple[int, ...], hint: str = ""):
        self.name, self.ours, self.theirs = name, ours, theirs
        super().__init__(f"tensor {name!r} is {list(theirs)} in the checkpoint but {list(ours)} in this model"
                         + (f": {hint}" if hint else ""))


def load_matching(model: torch.nn.Module, state: Mapping[str, torch.Tensor],
                  hints: Mapping[str, str] | None = None) -> LoadReport:
    """Copy every tensor of `state` whose name the model has into it (in place, under no_grad).

    hints: {name prefix: what to do} for the tensors whose shape follows a user choice (vocabulary, classes):
    a mismatch under that prefix raises ShapeMismatch with the hint. A mismatch elsewhere raises it too, with a
    generic hint (the checkpoint is another configuration of the model).
    """
    own = model.state_dict()
    report = LoadReport()
    for name, target in own.items():
        if name not in state:
            report.new.append(name)
            continue
        src = state[name]
        if not torch.is_tensor(src):
            raise CheckpointError(f"checkpoint entry {name!r} is a {type(src).__name__}, not a tensor")
        if tuple(src.shape) != tuple(target.shape):
            hint = next((h for p, h in (hints or {}).items() if name.startswith(p)),
                        "the checkpoint is another size of this model: pick the matching --config")
            raise ShapeMismatch(name, tuple(target.shape), tuple(src.shape), hint)
        report.loaded.append(name)
        report.loaded_values += target.numel()
    report.dropped = [k for k in state if k not in own]
    with torch.no_grad():
        for name in report.loaded:
            own[name].copy_(state[name].to(dtype=own[name].dtype))
    return report
