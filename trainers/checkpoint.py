"""Checkpoints with exact resume: model, optimizer, scheduler, RNG states, step and data cursor.

A checkpoint is written to a temporary directory and renamed into place, and ``latest`` is updated
last, so a process killed at any moment (even SIGKILL) leaves the previous checkpoint usable.

A model sharded with FSDP (``parallelism: fsdp``) holds only its shard on each rank, so its trainer passes the full
state dicts every rank gathered together (:meth:`agentgym.trainers.distributed.Sharding.full_state_dicts`), which
rank 0 writes: ``model/`` is then an ordinary model directory and the optimizer state is keyed by parameter name
(``optimizer_format: "names"``), which :func:`load_checkpoint` shards again on load (or loads whole, unsharded).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentgym.errors import ConfigError

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                    scheduler: Any, state: dict[str, Any], keep: int, save_extra: Any = None, *,
                    model_state: dict[str, Any] | None = None, optimizer_state: dict[str, Any] | None = None) -> Path:
    """Write ``root/step-NNNNNN`` atomically, point ``root/latest`` at it, prune old ones.

    ``model_state`` / ``optimizer_state``: full state dicts gathered from a sharded model (FSDP), written instead of
    ``model``'s and ``optimizer``'s own (which would hold only this rank's shards)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per checkpoint
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model", **({"state_dict": model_state} if model_state is not None else {}))
    tokenizer.save_pretrained(tmp / "model")
    if save_extra is not None:
        save_extra(tmp / "model")
    optimizer_blob = ({"optimizer": optimizer_state, "optimizer_format": "names"} if optimizer_state is not None
                      else {"optimizer": optimizer.state_dict()})
    torch.save({**optimizer_blob, "scheduler": scheduler.state_dict(), "rng": _rng_state()}, tmp / "trainer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2), encoding="utf-8")
    for path in tmp.rglob("*"):
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    pointer = root / "latest.tmp"
    pointer.write_text(final.name, encoding="utf-8")
    os.replace(pointer, root / "latest")
    checkpoints = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in checkpoints[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _is_sharded(model: Any) -> bool:
    """Whether ``model`` holds FSDP-sharded parameters (``DTensor`` s)."""
    from torch.distributed.tensor import DTensor

    return model is not None and any(isinstance(p, DTensor) for p in model.parameters())


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` points to, if any."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any, *,
                    model: Any = None) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states (the model is loaded from ``path/model``); returns the state.

    An optimizer state keyed by parameter name (written from an FSDP run) needs ``model``, the module whose
    parameters ``optimizer`` holds, sharded or not."""
    blob = torch.load(path / "trainer.pt", weights_only=False)
    if blob.get("optimizer_format") == "names":
        if model is None:
            raise ConfigError(f"{path} holds an optimizer state keyed by parameter name (an FSDP run): pass the "
                                  "model to load_checkpoint(..., model=...).")
        from agentgym.trainers.distributed import load_full_optimizer_state

        load_full_optimizer_state(model, optimizer, blob["optimizer"])
    elif _is_sharded(model):
        raise ConfigError(f"{path} was written by a run without parallelism: fsdp (its optimizer state is "
                              "keyed by position): resume it with parallelism: ddp, or start the fsdp run afresh.")
    else:
        optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return json.loads((path / "state.json").read_text(encoding="utf-8"))
