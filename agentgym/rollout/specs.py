"""What a rollout runs: the engine's settings (:class:`RolloutConfig`) and its episodes (:class:`EpisodeSpec`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentgym.errors import ConfigError
from agentgym.policies.base import SamplingParams
from agentgym.rollout.context import ContextConfig
from agentgym.suite import Task, TaskSuite

__all__ = ["EpisodeSpec", "RolloutConfig", "episodes_for_suite"]


@dataclass(frozen=True)
class RolloutConfig:
    """How the engine runs episodes.

    Attributes:
        max_in_flight: Episodes running at once.
        sampling: Sampling parameters for every turn.
        step_timeout_s: An env ``reset``/``step`` running longer ends its episode with ``error`` (the time
            counts from when the call starts running, not from when it was queued for a worker).
        env_workers: Threads that run env ``reset``/``step`` calls (daemon threads, see :class:`EnvExecutor`).
        max_context_tokens: When the prompt plus ``sampling.max_tokens`` would exceed this, the episode ends
            with ``context_limit`` (token-level policies only). With a context strategy that rewrites the history
            this bounds each segment: the strategy compacts the context before it is reached.
        max_turn_tokens: The most tokens one action may sample (the turn's ``max_tokens`` is capped to it); an
            action that uses all of them is cut, is not sent to the env, and ends the episode with
            ``turn_token_limit``. ``None``: only ``sampling.max_tokens`` applies (a cut action is then stepped).
        max_episode_tokens: The most tokens the whole episode may sample, over all its segments (summaries
            included); each turn's ``max_tokens`` is capped to what is left, and the episode ends with
            ``episode_token_limit`` once it is spent. ``None``: no limit.
        context: How the conversation is kept when it grows (:class:`~agentgym.rollout.context.ContextConfig`; a
            strategy name or mapping in YAML): ``full`` (default), ``window``, ``drop_tool_outputs``,
            ``summarize`` or your own ``package.module:function``.
        system_prompt: Replaces the env's instructions as the system prompt. ``None`` uses the policy's
            ``default_system_prompt`` (the prompt a trained model was trained with), else the env's instructions.
        observation_role: Chat role of observations after the first (``user`` or ``tool``).
        template_tools: ``auto`` passes the env's ``info["tools"]`` to the chat template (``tools=``, each
            family's native tool format; templates without tools ignore them); ``never`` leaves tools to the
            system prompt text only.
        batch_window_s: How long the batcher waits for more requests before sending a batch.
        deterministic: Send a policy batch only when every running episode waits for the policy, in
            episode order. Runs are then reproducible (training and exact resume rely on it), at the cost
            of the overlap between env steps and generation. In both modes each request carries its own
            seed derived from ``sampling.seed``, the episode and the turn (``None`` stays unseeded), so turns
            sample fresh randomness. In-process policies (HFPolicy, VLLMPolicy) draw each request from its own
            seeded stream, so a seeded run samples the same tokens however timing groups requests into
            batches; ``deterministic`` also fixes the batches themselves, which removes the last float-level
            differences between batch shapes (and the order of env steps).
        progress: Show a progress bar of finished episodes: ``"auto"`` (default) shows it when stderr is a
            terminal, ``True``/``False`` force it on or off.
        env_backend: ``local`` runs envs in this process (worker threads); ``ray`` runs each env in a Ray actor
            anywhere in the cluster this process is connected to (:mod:`agentgym.rollout.ray_envs`), while the policy
            and its batching stay here.
        ray_actor_options: Ray actor options for ``env_backend: ray`` (e.g. ``{"num_cpus": 1}``), merged over
            :data:`agentgym.rollout.ray_envs.DEFAULT_ACTOR_OPTIONS`.
        constrain_actions: Decode each reply as one of the env's valid actions
            (:meth:`~agentgym.env.AgentEnv.action_choices`, asked every turn) instead of free text: no turn is
            void and the tokens the choice forces are left out of training (``Turn.action_forced``). Needs a
            policy that ``supports_choices`` (HFPolicy) and an env with a finite action set (BabyAI, Sokoban,
            Maze); an env without one ends its episodes with an error that says so.
        gc_threshold: While a run is in progress, the garbage collector's youngest generation runs every
            ``gc_threshold`` net allocations instead of CPython's 700 (:mod:`agentgym.utils.gc_tuning`): each turn
            allocates many short-lived objects next to many long-lived ones, and frequent collections walked
            them all. The interpreter's thresholds come back when the run ends. ``None`` leaves the collector
            alone.
    """

    max_in_flight: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    step_timeout_s: float = 60.0
    env_workers: int = 32
    max_context_tokens: int | None = None
    system_prompt: str | None = None
    observation_role: str = "user"
    template_tools: str = "auto"
    batch_window_s: float = 0.002
    deterministic: bool = False
    progress: bool | str = "auto"
    env_backend: str = "local"
    ray_actor_options: Mapping[str, Any] | None = None
    constrain_actions: bool = False
    gc_threshold: int | None = 20_000
    max_turn_tokens: int | None = None
    max_episode_tokens: int | None = None
    context: ContextConfig = field(default_factory=ContextConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "context", ContextConfig.coerce(self.context))
        for name in ("max_turn_tokens", "max_episode_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"{name} must be a positive number of tokens or None (no limit), got {value!r}.")
        if self.gc_threshold is not None and (type(self.gc_threshold) is not int or self.gc_threshold < 1):
            raise ConfigError(f"gc_threshold must be a positive number of allocations (20000: the default) or None "
                              f"(leave the garbage collector alone), got {self.gc_threshold!r}.")
        if not isinstance(self.constrain_actions, bool):
            raise ConfigError(f"constrain_actions must be true or false, got {self.constrain_actions!r}.")
        if self.constrain_actions and self.sampling.choices:
            raise ConfigError("Set either constrain_actions (the env lists the choices every turn) or "
                              "sampling.choices (one fixed list), not both.")
        if self.max_in_flight < 1:
            raise ConfigError(f"max_in_flight must be >= 1, got {self.max_in_flight}.")
        if self.step_timeout_s <= 0:
            raise ConfigError(f"step_timeout_s must be > 0 seconds, got {self.step_timeout_s}.")
        if self.env_workers < 1:
            raise ConfigError(f"env_workers must be >= 1, got {self.env_workers}.")
        if self.max_context_tokens is not None and self.max_context_tokens <= self.sampling.max_tokens:
            raise ConfigError(
                f"max_context_tokens ({self.max_context_tokens}) must exceed sampling.max_tokens "
                f"({self.sampling.max_tokens}), or no turn fits."
            )
        if self.observation_role not in ("user", "tool"):
            raise ConfigError(f"observation_role must be 'user' or 'tool', got {self.observation_role!r}.")
        if self.template_tools not in ("auto", "never"):
            raise ConfigError(f"template_tools must be 'auto' or 'never', got {self.template_tools!r}.")
        if self.env_backend not in ("local", "ray"):
            raise ConfigError(f"env_backend must be 'local' or 'ray' (env workers as Ray actors), got {self.env_backend!r}.")
        if self.ray_actor_options is not None and self.env_backend != "ray":
            raise ConfigError("ray_actor_options applies to env_backend='ray' only; set env_backend='ray' or drop it.")
        if not isinstance(self.progress, bool) and self.progress != "auto":
            raise ConfigError(f"progress must be True, False or 'auto' (a bar when stderr is a terminal), "
                              f"got {self.progress!r}.")


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: which env, which task (or none: the env samples one from the seed), which seed."""

    env_id: str
    task: Task | None = None
    seed: int | None = None
    group_id: str = ""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sampling_seed: int | None = None
    """The episode's own sampling seed: turn ``t`` samples with a seed derived from it and ``t`` alone, so its
    randomness depends on nothing else (not its position in the run, the rank that runs it, the batches timing
    forms, or how many episodes run at once). ``None``: derived from ``RolloutConfig.sampling.seed`` and the
    episode's index in the run."""


def episodes_for_suite(
    suite: TaskSuite, split: str = "test", *, group_size: int = 1, seed: int = 0, limit: int | None = None
) -> list[EpisodeSpec]:
    """Episode specs for a suite split: ``group_size`` rollouts per task, seeds derived from ``seed``."""
    if group_size < 1:
        raise ConfigError(f"group_size must be >= 1, got {group_size}.")
    tasks = suite.split(split)
    if limit is not None:
        tasks = tasks[:limit]
    specs = []
    for i, task in enumerate(tasks):
        for g in range(group_size):
            specs.append(
                EpisodeSpec(env_id=suite.env_id, task=task, seed=seed + i * group_size + g,
                            group_id=f"{suite.name}/{task.id}", env_kwargs=dict(suite.env_kwargs))
            )
    return specs
