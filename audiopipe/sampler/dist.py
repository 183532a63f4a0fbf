"""Which data-parallel rank this process is: the one rule every per-rank plan (samplers, streams) uses.

The sampler package stays importable without torch, so torch.distributed is asked only when a value is missing.
"""

from __future__ import annotations

from audiopipe.errors import InvalidValue


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values win; otherwise torch.distributed when initialized; otherwise a single process."""
    if rank is None or world_size is None:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
        except ImportError:
            pass
    rank = 0 if rank is None else int(rank)
    world_size = 1 if world_size is None else int(world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise InvalidValue(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size
