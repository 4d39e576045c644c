"""Turn-level RL trainers and their pure algorithm functions.

Every trainer is the one online loop of :mod:`agentgym.trainers.loop` (sample, estimate, update) with its method's
parts; a config's class names its trainer, so ``make_trainer(load_config(path)).train()`` runs any of them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["make_trainer"]


def make_trainer(config: Any, **kwargs: Any) -> Any:
    """The trainer for ``config`` (a :class:`~agentgym.trainers.config.TrainerConfig` subclass, e.g. from
    :func:`~agentgym.trainers.config.load_config`); ``kwargs`` go to its constructor (e.g. ``world=``)."""
    import importlib

    from agentgym.errors import ConfigError
    from agentgym.trainers.base_config import TrainerConfig

    target = getattr(type(config), "trainer_class", None)
    if not isinstance(config, TrainerConfig) or not target:
        raise ConfigError(f"make_trainer needs a trainer config (GrpoConfig, GigpoConfig, ArpoConfig, ArcherConfig or "
                          f"FilteredBCConfig, e.g. from load_config(path)), got {type(config).__name__}.")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(config, **kwargs)
