"""ARPO's configuration: GRPO's fields, the branching sampler's settings, and how advantages reach shared tokens.

The sampler's settings are the rollout layer's own :class:`~agentgym.rollout.branching.BranchingConfig`, held whole
in ``ArpoConfig.branching`` so each has one name, one default and one check. A config file still writes them as
top-level keys (``initial_rollouts: 8``, ``beam_size: 2``, ...), next to ``group_size``, which is the sampler's
budget M. The trainer lives in :mod:`agentgym.trainers.arpo`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from agentgym.errors import ConfigError
from agentgym.rollout.branching import BranchingConfig
from agentgym.trainers.grpo_config import GrpoConfig

__all__ = ["BRANCHING_KEYS", "ArpoConfig"]

_SET_BY_THE_TRAINER = {"budget": "group_size", "seed": "seed"}
"""BranchingConfig fields an ARPO config sets from its own fields (-> the field a config file writes instead)."""

BRANCHING_KEYS = tuple(f.name for f in dataclasses.fields(BranchingConfig) if f.name not in _SET_BY_THE_TRAINER)
"""The sampler settings an ARPO config file writes as top-level keys (each a field of BranchingConfig)."""


@dataclass(frozen=True)
class ArpoConfig(GrpoConfig):
    """GRPO's fields plus ARPO's branching and attribution (defaults: ARPO's 7B recipe, Dong et al., 2025).

    The entropy timing defaults to the paper's, which wastes no generation, and attribution to ``soft``, what the
    reference code does.

    ``group_size`` is ARPO's global budget M (trajectories per task); ``branching.initial_rollouts`` is N.
    """

    output_dir: str = "runs/arpo"
    """Where checkpoints, metrics (JSONL + TensorBoard), the learning curve and the final model go."""
    group_size: int = BranchingConfig.budget
    """M: trajectories per task, the branching sampler's budget (``initial_rollouts`` fresh ones, the rest from
    branching or restarts)."""
    clip_eps_high: float = 0.2
    """Upper PPO clip range (ARPO's scripts use 0.2 on both sides)."""
    branching: BranchingConfig = field(default_factory=BranchingConfig)
    """The branching sampler's settings (``initial_rollouts``, ``beam_size``, ``branch_probability``,
    ``entropy_weight``, ``entropy_window``, ``entropy_top_k``, ``entropy_timing``, ``branch_after``, ``fork``,
    ``vocab_size``; see :class:`~agentgym.rollout.branching.BranchingConfig`), written as top-level keys in a
    config file. Its budget and seed are set from ``group_size`` and ``seed``."""
    attribution: Literal["soft", "hard"] = "soft"
    """soft: every trajectory keeps its own advantage on shared prefixes; hard: shared tokens get the mean."""
    hard_dedupe: bool = False
    """Hard attribution only: train a token shared by d branches once (weight 1/d per copy), not d times."""

    trainer_name: ClassVar[str] = "arpo"
    display_name: ClassVar[str] = "ARPO"
    trainer_class: ClassVar[str] = "agentgym.trainers.arpo:ArpoTrainer"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_initial_rollouts(self.branching.initial_rollouts, self.group_size)
        if self.hard_dedupe and self.attribution != "hard":
            raise self._fail("hard_dedupe", "only applies to attribution: hard; set attribution: hard or "
                                            "hard_dedupe: false.")
        branching = dataclasses.replace(self.branching, budget=self.group_size, seed=self.seed)
        object.__setattr__(self, "branching", branching)  # frozen: the one place the budget and seed are set

    @classmethod
    def _check_initial_rollouts(cls, initial_rollouts: int, group_size: int) -> None:
        """N <= M, said in this config's words (the sampler's own check speaks of its budget)."""
        if initial_rollouts > group_size:
            raise ConfigError(f"{cls.__name__}.initial_rollouts: ({initial_rollouts}) exceeds group_size "
                              f"({group_size}), the budget M of trajectories per task; use initial_rollouts <= "
                              "group_size (ARPO's default: 8 of 16).")

    # ---- a config file writes the sampler's settings as top-level keys ----------------------------------------
    @classmethod
    def config_keys(cls) -> frozenset[str]:
        return (super().config_keys() - {"branching"}) | set(BRANCHING_KEYS)

    @classmethod
    def _arguments(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        """GRPO's arguments plus ``branching``, built from the sampler's keys with ``group_size`` as its budget."""
        arguments = super()._arguments({k: v for k, v in data.items() if k not in BRANCHING_KEYS})
        settings = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in BRANCHING_KEYS}
        group_size = arguments.get("group_size", cls.group_size)
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            group_size = cls.group_size  # a budget the settings can be checked against; group_size fails its own check
        initial_rollouts = settings.get("initial_rollouts", BranchingConfig.initial_rollouts)
        if isinstance(initial_rollouts, int):
            cls._check_initial_rollouts(initial_rollouts, group_size)
        try:
            arguments["branching"] = BranchingConfig(budget=group_size, **settings)
        except ConfigError as exc:
            raise ConfigError(f"{cls.__name__}: {exc}") from None
        return arguments

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML/JSON values, the sampler's settings as top-level keys (as a config file writes them)."""
        values = super().to_dict()
        del values["branching"]
        for key in BRANCHING_KEYS:
            value = getattr(self.branching, key)
            values[key] = list(value) if isinstance(value, tuple) else value
        return values
