"""The shard job's progress bar: audio seconds of finished shards, with audio-hours per second and the real-time
factor. Counted by the driver from the shards the workers report, so it costs the workers nothing."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total_s: float, show: bool) -> None:
        from tqdm import tqdm

        self.show = show
        self.seconds = 0.0
        self._t0 = time.monotonic()
        self._bar = tqdm(total=round(total_s), unit="audio-s", desc="shard", disable=not show, file=sys.stderr,
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} audio-s "
                                    "[{elapsed}<{remaining}{postfix}]")

    @property
    def tick(self) -> float | None:
        """How long a driver may sleep waiting for work: long enough never to matter, short enough to move the
        bar's clock (None: no bar, sleep until something happens)."""
        return 10.0 if self.show else None

    def add(self, seconds: float) -> None:
        self.seconds += seconds
        self.refresh()

    def refresh(self) -> None:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        self._bar.n = round(self.seconds)
        self._bar.set_postfix_str(f"{self.seconds / 3600 / elapsed:.4f} audio-h/s, "
                                  f"{self.seconds / elapsed:.0f}x real time", refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.n = self._bar.total
        self._bar.close()
