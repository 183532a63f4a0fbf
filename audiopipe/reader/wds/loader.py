"""make_wds_loader: a WdsStream in a torch DataLoader, with the Loader interface of make_loader.

    loader = make_wds_loader("./shards", ["mel"], max_frames=38400, num_workers=4)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for step, batch in enumerate(loader):
            ...
            ckpt["stream"] = loader.state_dict(consumed_batches=step + 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from audiopipe.collate.pad import padded_bytes
from audiopipe.reader.wds.plan import StreamPlan
from audiopipe.reader.wds.stream import WdsStream


def _passthrough(batch: Any) -> Any:
    return batch


@dataclass
class WdsLoader:
    """A DataLoader over a WdsStream, with the Loader interface of make_loader."""

    stream: WdsStream
    dataloader: torch.utils.data.DataLoader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        start = self.stream._resume or 0
        it = iter(self.dataloader)  # workers start here and take the resume position with them
        self.stream._start, self.stream._resume = start, None
        return it

    def __len__(self) -> int:
        return len(self.stream)

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def plan(self) -> StreamPlan:
        return self.stream.plan()

    def state_dict(self, consumed_batches: int) -> dict[str, Any]:
        return self.stream.state_dict(consumed_batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)

    def shm_bytes_per_worker(self) -> int:
        """Upper bound of shared memory one worker holds: `prefetch` padded batches at the frame budget."""
        s, dl = self.stream, self.dataloader
        if dl.num_workers == 0:
            return 0
        return dl.prefetch_factor * padded_bytes(s.collate.features, s.manifest["features"], s.channels,
                                                 s.budget.max_frames)

    def pool_bytes_per_worker(self) -> int:
        """About what one stream holds decoded while a pool fills: pool_size items of the corpus' mean length."""
        s = self.stream
        mean = float(s.lengths[s.used].mean()) if s.used.any() else 0.0
        return padded_bytes(s.collate.features, s.manifest["features"], s.channels, s.pool_size * mean,
                            mask=False)


def make_wds_loader(shards: str | Path, features: Sequence[str], *, max_frames: int, num_workers: int = 0,
                    prefetch: int = 2, pin_memory: bool = False, **stream_kw: Any) -> WdsLoader:
    """WdsStream (see its parameters) in a DataLoader with `num_workers` workers; same batches as the plan.

    prefetch: batches each worker keeps ready (torch's prefetch_factor; at least 1).
    Workers are not persistent: each pass forks them afresh so that set_epoch() and a resume reach them.
    """
    stream = WdsStream(shards, features, max_frames=max_frames, num_workers=num_workers, **stream_kw)
    kw: dict[str, Any] = {"prefetch_factor": max(int(prefetch), 1)} if num_workers > 0 else {}
    dl = torch.utils.data.DataLoader(stream, batch_size=None, collate_fn=_passthrough, num_workers=num_workers,
                                     pin_memory=pin_memory, **kw)
    return WdsLoader(stream, dl)
