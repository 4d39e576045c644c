"""Data parallelism with torch.distributed (``torchrun``); gloo on CPU, nccl on GPU.

Each rank rolls out its share of the step's task groups (whole groups, so group statistics stay local),
the global token and sequence counts are summed across ranks before the loss is formed, and gradients
are summed across ranks: the update is exactly the single-process update on the union of the data.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["World", "init_world"]


class World:
    """Rank and size of the process group (a world of 1 when not launched with torchrun)."""

    def __init__(self, rank: int = 0, size: int = 1) -> None:
        self.rank = rank
        self.size = size

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def shard(self, items: Sequence[object]) -> list[object]:
        """This rank's contiguous share of ``items``."""
        per = -(-len(items) // self.size)
        return list(items[self.rank * per : (self.rank + 1) * per])

    def sum(self, value: float) -> float:
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item())

    def sum_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        if not self.distributed:
            return
        for p in parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Make every rank hold rank 0's weights (after work done on each rank separately, e.g. BC)."""
        if not self.distributed:
            return
        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()


def init_world(device: str = "cpu") -> World:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return World(dist.get_rank(), dist.get_world_size())
