"""Trainer configs: read a config file, and every method's config class by name.

``load_config(path)`` reads a YAML file whose ``trainer:`` key (grpo, gigpo, arpo, archer, filtered_bc) picks the
class; the other keys are its fields, validated before any rollout. Each class lives in a module of its own, built
on the shared fields of :mod:`agentgym.trainers.base_config`:

* :class:`~agentgym.trainers.grpo_config.GrpoConfig`, and on it
  :class:`~agentgym.trainers.gigpo_config.GigpoConfig` and :class:`~agentgym.trainers.arpo_config.ArpoConfig`;
* :class:`~agentgym.trainers.replay_actor_config.ReplayActorConfig`, and on it
  :class:`~agentgym.trainers.archer_config.ArcherConfig` and
  :class:`~agentgym.trainers.filtered_bc_config.FilteredBCConfig`.

This module imports them all (none imports it), so every name is also importable from here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agentgym.errors import ConfigError, did_you_mean
from agentgym.trainers.archer_config import ArcherConfig
from agentgym.trainers.arpo_config import ArpoConfig
from agentgym.trainers.base_config import RENAMED_FIELDS, TURN_KINDS, TrainerConfig
from agentgym.trainers.filtered_bc_config import FilteredBCConfig
from agentgym.trainers.gigpo_config import GigpoConfig
from agentgym.trainers.grpo_config import GrpoConfig
from agentgym.trainers.replay_actor_config import ReplayActorConfig

__all__ = ["RENAMED_FIELDS", "TRAINER_CONFIGS", "TURN_KINDS", "ArcherConfig", "ArpoConfig", "FilteredBCConfig",
           "GigpoConfig", "GrpoConfig", "ReplayActorConfig", "TrainerConfig", "config_from_dict", "load_config"]

TRAINER_CONFIGS = {
    "grpo": "agentgym.trainers.grpo_config:GrpoConfig",
    "gigpo": "agentgym.trainers.gigpo_config:GigpoConfig",
    "arpo": "agentgym.trainers.arpo_config:ArpoConfig",
    "archer": "agentgym.trainers.archer_config:ArcherConfig",
    "filtered_bc": "agentgym.trainers.filtered_bc_config:FilteredBCConfig",
}
"""``trainer:`` key of a config file -> its config class as ``module:Class`` (whose ``trainer_class`` names the
trainer)."""


def config_from_dict(data: Mapping[str, Any], *, source: str = "config") -> Any:
    """The config a mapping describes: ``trainer:`` (grpo, gigpo, arpo, archer, filtered_bc; default grpo) picks the
    class, the other keys are its fields (checked: unknown keys, renamed keys, types, values)."""
    data = dict(data)
    trainer = data.pop("trainer", "grpo")
    if trainer not in TRAINER_CONFIGS:
        names = sorted(TRAINER_CONFIGS)
        raise ConfigError(f"{source}: unknown trainer {trainer!r}.{did_you_mean(str(trainer), names)} "
                          f"Available: {', '.join(names)}.")
    module, _, name = TRAINER_CONFIGS[trainer].partition(":")
    return getattr(importlib.import_module(module), name).from_dict(data)


def load_config(path: str | Path) -> Any:
    """Read a trainer config from YAML: ``trainer:`` (see :func:`config_from_dict`) plus its fields."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file {path} does not exist; see configs/ for examples.")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config fields.")
    return config_from_dict(data, source=str(path))
