"""Checkpoints with exact resume: model, optimizer, scheduler, RNG states, step and data cursor.

A checkpoint is written to a temporary directory and renamed into place, and ``latest`` is updated
last, so a process killed at any moment (even SIGKILL) leaves the previous checkpoint usable.
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

__all__ = ["latest_checkpoint", "load_checkpoint", "save_checkpoint"]


def _rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(root: Path, step: int, model: Any, tokenizer: Any, optimizer: torch.optim.Optimizer,
                    scheduler: Any, state: dict[str, Any], keep: int, save_extra: Any = None) -> Path:
    """Write ``root/step-NNNNNN`` atomically, point ``root/latest`` at it, prune old ones."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per checkpoint
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    if save_extra is not None:
        save_extra(tmp / "model")
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": _rng_state()},
               tmp / "trainer.pt")
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


def latest_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``root/latest`` points to, if any."""
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / "state.json").is_file() else None


def load_checkpoint(path: Path, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore optimizer, scheduler and RNG states (the model is loaded from ``path/model``); returns the state."""
    blob = torch.load(path / "trainer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return json.loads((path / "state.json").read_text(encoding="utf-8"))
