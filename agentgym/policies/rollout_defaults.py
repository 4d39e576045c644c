"""Rollout settings saved next to a trained model, so evaluating it later uses the prompt it was trained with.

A model trained with a short system prompt (or none) fails when evaluated with an env's long
instructions it never saw. Trainers write ``agentgym.json`` into the model directory; ``agentgym eval``
and other callers read it for their defaults (explicit arguments still win).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["FILENAME", "load_rollout_defaults", "save_rollout_defaults"]

FILENAME = "agentgym.json"


def save_rollout_defaults(model_dir: str | Path, *, system_prompt: str | None, max_tokens: int, suite: str,
                          constrain_actions: bool = False) -> Path:
    """Record how the model was rolled out in training (``constrain_actions`` only when on, so records of
    free-text models stay as they were)."""
    path = Path(model_dir) / FILENAME
    record: dict[str, Any] = {"system_prompt": system_prompt, "max_tokens": max_tokens, "suite": suite}
    if constrain_actions:
        record["constrain_actions"] = True
    path.write_text(json.dumps(record, indent=2), encoding="utf-8")
    return path


def load_rollout_defaults(model_dir: str | Path) -> dict[str, Any]:
    """The saved settings, or ``{}`` when the directory has none (e.g. a model not trained by agentgym).

    ``model_dir`` may also be a Hub id in the local Hugging Face cache (a model trained here and uploaded keeps
    its ``agentgym.json``); an id that is not cached gives ``{}`` here and its clear error when the model loads.
    """
    directory = Path(model_dir).expanduser()
    if not directory.is_dir():
        from agentgym.errors import ConfigError
        from agentgym.models.loading import is_hub_id, resolve_model_dir

        if not is_hub_id(str(model_dir)):
            return {}
        try:
            directory = resolve_model_dir(str(model_dir))
        except ConfigError:
            return {}
    path = directory / FILENAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
