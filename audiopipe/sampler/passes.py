"""Where a pass over an epoch starts, and the epoch/resume bookkeeping every batch sampler here shares.

A sampler's pass starts at a `Position`: the world-size segments an interrupted epoch already ran, and the step
to start from. `load_state_dict` leaves one pending; the next `iter()` takes it over (a fresh pass starts at the
epoch's beginning); `set_epoch` to another epoch drops both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from audiopipe.errors import InvalidValue


@dataclass
class Position:
    """Where a pass over an epoch starts: earlier world-size segments [(world_size, steps)] + start step."""

    segments: tuple[tuple[int, int], ...]
    start: int
    yielded: int = 0
    finished: bool = False


class EpochPasses:
    """Mixed into a batch sampler: `epoch`, `set_epoch`, and the pending/active pass positions."""

    epoch: int
    runs_ahead = False  # pass_ahead works: the sampler's passes only read its plan (no holds on storage)
    _pending: Position | None  # set by load_state_dict, consumed by the next iter()
    _active: Position | None  # the pass in progress (or the last one)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iter() plans. Setting the current epoch again keeps a pending resume."""
        if epoch < 0:
            raise InvalidValue(f"epoch must be >= 0, got {epoch}")
        if epoch != self.epoch:
            self.epoch = int(epoch)
            self._pending = None
            self._active = None

    def _begin_pass(self) -> Position:
        """The position this pass starts at (a pending resume, else the epoch's start), now the active one."""
        pos = self._pending if self._pending is not None else Position((), 0)
        self._pending = None
        self._active = pos
        return pos

    def pass_ahead(self, epoch: int) -> tuple[Position, Iterator[list[int]]]:
        """A fresh pass over `epoch` that leaves this sampler's state alone: a look-ahead draws the next epoch's
        first batches from it while the current pass ends (the plan is a pure function of seed and epoch).
        `adopt` makes it the pass in progress once set_epoch has selected that epoch."""
        pos = Position((), 0)
        return pos, self._batches(epoch, pos)

    def adopt(self, epoch: int, pos: Position) -> bool:
        """Make a pass_ahead(epoch) the active pass, as iter() would have begun it; False (nothing changed) when
        the next iter() would begin another pass: another epoch selected, or a resume pending."""
        if epoch != self.epoch or self._pending is not None:
            return False
        self._active = pos
        return True

    def _batches(self, epoch: int, pos: Position) -> Iterator[list[int]]:
        raise NotImplementedError(f"{type(self).__name__} builds no pass ahead")
