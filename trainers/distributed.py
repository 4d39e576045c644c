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

**FSDP2** (``parallelism: fsdp``, :class:`Sharding`): for a policy whose weights, gradients and AdamW states do not
fit one device, ``torch.distributed.fsdp.fully_shard`` shards each decoder layer, then the root (the trainer's
:class:`ForwardWith` around the model, so the embeddings, final norm and ``lm_head`` that the chunked log-prob
function calls outside the model's own ``forward`` are all-gathered too). The same guarantees hold:

* gradients are **summed**: each FSDP module gets ``set_gradient_divide_factor(1.0)`` (FSDP averages by default)
  and ``set_force_sum_reduction_for_comms(True)`` (a plain SUM reduce-scatter; the PREMUL_SUM a divide factor
  otherwise uses does not exist in gloo);
* every pass, real or zero-weight, goes through the root, so every rank makes the same all-gathers and
  reduce-scatters; the gradients are reduce-scattered after every micro-batch (FSDP's default) and accumulate
  sharded, so no rank ever holds the full gradients;
* passes without gradients differ in number between ranks (each rank has its own rows), and generation differs in
  length, so they must make no collectives: :meth:`Sharding.full_weights` all-gathers the full weights once, on
  every rank together, switches off resharding after forward, runs the passes (generation, old and reference
  log-probs, evaluation on rank 0 only), then reshards every layer and resets FSDP's per-iteration state. Only the
  weights are gathered, never gradients or optimizer states: a rank samples with full weights (as vLLM would), so a
  model must fit one device for inference, while training memory (gradients, AdamW's two moments) is divided by the
  number of ranks. The KL reference, when it is a separate model, is sharded the same way and gathered only for
  its own pass;
* checkpoints and the final save gather full state dicts (``get_model_state_dict`` / ``get_optimizer_state_dict``
  with ``full_state_dict=True, cpu_offload=True``: streamed to rank 0's CPU memory, one parameter at a time),
  which rank 0 writes in the usual format; a resumed run loads the full model on every rank, shards it, and each
  rank takes its shard of the saved optimizer state (``set_optimizer_state_dict``).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ForwardWith", "Sharding", "World", "data_parallel", "init_world"]


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


class Sharding:
    """FSDP2 for the trainer's modules (``parallelism: fsdp`` under torchrun); inactive otherwise, when every method
    is a no-op and the trainer runs unsharded (one process) or with DDP. See the module docstring for the design."""

    def __init__(self, world: World, enabled: bool) -> None:
        self.world = world
        self.active = enabled and world.distributed
        self._roots: dict[int, torch.nn.Module] = {}  # id(model) -> the FSDP root that shards it

    def is_sharded(self, module: Any) -> bool:
        return id(module) in self._roots

    def shard(self, model: torch.nn.Module, root: torch.nn.Module | None = None) -> torch.nn.Module:
        """Shard ``model``'s decoder layers, then ``root`` (``model`` itself, or a module holding it such as
        :class:`ForwardWith`), in place, with summed gradients; returns ``root``. Every rank must call it at the
        same point, before an optimizer takes the parameters (they become sharded ``DTensor`` s)."""
        root = model if root is None else root
        if not self.active:
            return root
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh(_collective_device().type, (self.world.size,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh)
        fully_shard(root, mesh=mesh)
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a SUM, as one process over the union of the data
                module.set_force_sum_reduction_for_comms(True)
        # FSDP takes the first module whose forward runs as its root; passes under full_weights call the model (not
        # ``root``) first, so fix the root now, as its first forward would (torch 2.13 has no public call for it)
        root._get_fsdp_state()._lazy_init()  # type: ignore[operator]
        self._roots[id(model)] = root
        return root

    @contextlib.contextmanager
    def full_weights(self, model: Any) -> Iterator[None]:
        """Within it, ``model`` holds its full weights and its passes make no collectives (if it is sharded; else a
        no-op). Every rank must enter it together (one all-gather per FSDP module); inside, ranks may run different
        passes, or none. Leaving reshards every layer, whatever ran inside."""
        root = self._roots.get(id(model))
        if root is None:
            yield
            return
        from torch.distributed.fsdp import FSDPModule

        modules = [m for m in root.modules() if isinstance(m, FSDPModule)]
        try:
            for module in modules:
                module.unshard()
                module.set_reshard_after_forward(False, recurse=False)
            yield
        finally:
            for module in modules:  # fully_shard's settings: layers reshard after forward, the root does not
                module.set_reshard_after_forward(module is not root, recurse=False)
            root.reset_iter_state()  # type: ignore[operator]  # reshards; forgets the forward order seen inside

    def full_state_dicts(self, model: torch.nn.Module,
                         optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``(model, optimizer)`` full state dicts of a sharded ``model`` on rank 0's CPU, keyed by parameter name
        (every rank must call it; the others get empty dicts); ``(None, None)`` when ``model`` is not sharded (its
        own ``state_dict`` is complete)."""
        if not self.is_sharded(model):
            return None, None
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict)

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(model, options=options),
                get_optimizer_state_dict(model, optimizer, options=options))


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a full, name-keyed optimizer state (:meth:`Sharding.full_state_dicts`) into ``optimizer``: each rank
    keeps its shard when ``model`` is sharded; an unsharded model takes it whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one: the modules whose class the model names in ``_no_split_modules``
    (every Hugging Face causal LM does, e.g. ``LlamaDecoderLayer``; under LoRA, the base model's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in base.modules() if type(m).__name__ in names]
    if not layers:
        from agentgym.errors import ConfigError

        raise ConfigError(f"parallelism: fsdp shards a model's decoder layers, but {type(base).__name__} names none "
                          "in _no_split_modules: use parallelism: ddp for this model.")
    return layers


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
