"""Data parallelism on torch's own DistributedDataParallel (``torchrun``); gloo on CPU, nccl on GPU.

Each rank rolls out its share of the step's task groups (whole groups, so group statistics stay local).
The trainer's update then makes the single-process update on the union of all ranks' data:

* the loss denominators (global token and sequence counts) are summed across ranks before any loss is
  formed, so each rank's loss is its share of the union's loss;
* gradients are **summed** across ranks, not averaged (:func:`data_parallel` installs a summing comm hook on
  DDP, whose default divides by the world size), so the summed shares are the union's gradient;
* every rank makes the same collectives in the same order: the counts come from one
  :meth:`World.gather` before the loop, and a rank with fewer micro-batches (none at all, e.g. when every one
  of its episodes errored) runs zero-weight passes so it joins every gradient all-reduce. Nothing returns
  early before a collective the other ranks make, so no rank waits forever.

DDP buckets the gradients (one all-reduce per ~25 MB bucket, overlapped with backward) instead of one
all-reduce per parameter. Passes without gradients (old/reference log-probs, generation) use the unwrapped
model and make no collectives.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ForwardWith", "World", "data_parallel", "init_world"]


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
        """``value`` summed over ranks (one all-reduce; every rank must call it)."""
        if not self.distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=_collective_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item())

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """``[size, *tensor.shape]``: every rank's ``tensor`` (one all-gather; same shape on every rank).

        One collective gives both sums and maxima (reduce the first dimension locally), so a trainer can learn
        every count it needs before its update loop with a single round trip.
        """
        if not self.distributed:
            return tensor[None].clone()
        device = _collective_device()
        local = tensor.to(device).contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local)
        return torch.stack(parts).to(tensor.device)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (any picklable value), in rank order (one ``all_gather_object``; every rank must call
        it). Sizes may differ between ranks, which a tensor all-gather does not allow: ArCHer and filtered BC
        gather each rank's new transitions with it, so every rank holds the same replay buffer."""
        if not self.distributed:
            return [obj]
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, obj)
        return parts

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


class ForwardWith(torch.nn.Module):
    """``module`` with ``fn(module, *args)`` as its forward.

    DDP only reduces gradients of a backward whose forward went through the DDP wrapper; wrapping the trainer's
    own log-prob function (chunked ``lm_head``, packing) this way keeps it intact under DDP instead of falling
    back to the model's plain ``forward`` and its full ``[N, L, V]`` logits.
    """

    def __init__(self, module: torch.nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.module = module
        self._fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(self.module, *args, **kwargs)


def _sum_allreduce(group, bucket):  # type: ignore[no-untyped-def]  # DDP rejects string (postponed) annotations
    """DDP comm hook: all-reduce a gradient bucket (a ``dist.GradBucket``) as a SUM; DDP's default divides by the
    world size. Returns the future of the reduced flat buffer."""
    work = dist.all_reduce(bucket.buffer(), op=dist.ReduceOp.SUM, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def data_parallel(module: torch.nn.Module, world: World) -> torch.nn.Module:
    """``module`` wrapped in DistributedDataParallel with gradients summed across ranks (itself in a world of 1).

    The wrapper shares ``module``'s parameters: generation and gradient-free passes keep using ``module``
    directly. Only parameters that require grad are reduced (LoRA: the adapters). Building it broadcasts rank 0's
    parameters once, so every rank must build it at the same point.
    """
    if not world.distributed:
        return module
    from torch.nn.parallel import DistributedDataParallel

    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    # buffers (rotary tables) are equal on every rank: no broadcast before each forward
    no_buffer_sync = ({"forward_sync_buffers": False}
                      if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
                      else {"broadcast_buffers": False})
    wrapped = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None,
                                      **no_buffer_sync)
    wrapped.register_comm_hook(None, _sum_allreduce)
    return wrapped


def _collective_device() -> torch.device:
    """Where tensors of a collective must live: the current GPU under nccl, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_world(device: str = "cpu") -> World:
    """Join the process group when launched by torchrun (WORLD_SIZE > 1), else a world of one.

    On CUDA each rank takes GPU ``LOCAL_RANK``, so ``device: cuda`` means this rank's own GPU.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    cuda = device.startswith("cuda")
    if cuda and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return World(dist.get_rank(), dist.get_world_size())
