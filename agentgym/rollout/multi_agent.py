"""Multi-agent rollouts: whole games with one policy per seat, or one shared policy with role prompts.

The single-agent :class:`~agentgym.rollout.RolloutEngine` runs one agent per episode. Here every seat of a
PettingZoo game is an agent with its own conversation (a :class:`~agentgym.agent.ChatAgent`, so token ids
are exact and never re-tokenised), and the engine records one :class:`~agentgym.trajectory.Trajectory`
per agent. The trajectories of one game share ``metadata["episode_id"]`` (and the ``traj_id`` prefix),
so trainers can treat each agent's view as an ordinary single-agent trajectory (MARFT-style per-agent
credit) or regroup a game by its episode id.

Two ways to fill the seats:

* ``policies={"player_0": a, "player_1": b}``: one policy per agent (e.g. a learner against a frozen copy);
* one shared policy plus ``role_prompts={"speaker_0": "...", "listener_0": "..."}`` (CORY/MARFT style): the
  same model plays every seat, told its role in the system prompt.

Policy calls from all games and all seats that share a policy are batched together (the core engine's
batcher, :mod:`agentgym.rollout.batching`), each turn is recorded and each game ended through the turn protocol every
engine shares (:mod:`agentgym.rollout.turns`), games run concurrently, and a game whose env fails ends with
``end_reason="error"`` for every agent without stopping the others. Turn-based (AEC) and simultaneous-move (Parallel) games are both supported.
Each turn's reward is everything the agent received from its move until its next move (PettingZoo's
cumulative reward), so the per-agent returns add up to the game's rewards.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.policies.base import Generation, Policy, SamplingParams
from agentgym.registration.multi_agent import get_multi_agent_entry, make_multi_agent, make_multi_agent_parallel
from agentgym.rollout.batching import PolicyBatcher
from agentgym.rollout.executor import EnvExecutor, call_env, run_coroutine
from agentgym.rollout.turns import episode_outcome, error_outcome, make_turn, record_action
from agentgym.storage import TrajectoryWriter
from agentgym.trajectory import Trajectory, Turn

__all__ = ["MultiAgentEpisode", "MultiAgentEpisodeSpec", "MultiAgentRolloutConfig", "MultiAgentRolloutEngine"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MultiAgentEpisodeSpec:
    """One game to play.

    Attributes:
        env_id: A multi-agent id, e.g. ``agentgym/Negotiation-v0``.
        seed: Reset seed (the game's setup is drawn from it unless ``setup`` is given).
        setup: A fixed game setup (``reset(options={"setup": ...})``), e.g. a task's ``metadata["setup"]``.
        parallel: Play the simultaneous-move form (the id must have one).
        group_id: Stored on every trajectory of the game (for group-relative advantages).
        task_id: Stored on every trajectory (default: ``seed-<seed>``).
        env_kwargs: Constructor arguments of the game.
    """

    env_id: str
    seed: int | None = None
    setup: Mapping[str, Any] | None = None
    parallel: bool = False
    group_id: str = ""
    task_id: str = ""
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MultiAgentRolloutConfig:
    """How the multi-agent engine runs games.

    Attributes:
        max_in_flight: Games running at once.
        sampling: Sampling parameters of every turn.
        role_prompts: Per seat, a role prompt put before the game's instructions in the system prompt (for a
            shared policy playing several roles); seats without one get the plain instructions.
        step_timeout_s: An env ``reset``/``step`` that takes longer ends the game with ``error``.
        env_workers: Threads that run env calls of games that are not cheap (engines, subprocesses).
        observation_role: Chat role of observations after the first (``user`` or ``tool``).
        batch_window_s: How long the batcher waits for more requests before calling a policy.
        max_turns_per_agent: Safety net: a game in which any agent exceeds this many turns ends with error.
    """

    max_in_flight: int = 16
    sampling: SamplingParams = field(default_factory=SamplingParams)
    role_prompts: Mapping[str, str] = field(default_factory=dict)
    step_timeout_s: float = 60.0
    env_workers: int = 8
    observation_role: str = "user"
    batch_window_s: float = 0.002
    max_turns_per_agent: int = 1000

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.env_workers < 1 or self.max_turns_per_agent < 1:
            raise ConfigError("max_in_flight, env_workers and max_turns_per_agent must all be >= 1.")
        if self.step_timeout_s <= 0:
            raise ConfigError(f"step_timeout_s must be > 0 seconds, got {self.step_timeout_s}.")
        if self.observation_role not in ("user", "tool"):
            raise ConfigError(f"observation_role must be 'user' or 'tool', got {self.observation_role!r}.")


@dataclass(frozen=True)
class MultiAgentEpisode:
    """One finished game: a trajectory per agent, all sharing ``episode_id``."""

    episode_id: str
    env_id: str
    seed: int | None
    trajectories: Mapping[str, Trajectory]
    error: str | None = None

    @property
    def outcomes(self) -> dict[str, Mapping[str, Any]]:
        return {agent: traj.outcome for agent, traj in self.trajectories.items()}


@dataclass
class _Move:
    """One action of a seat, completed as the game goes on: its reward is everything the seat receives until its
    next move, and the env's turn info comes after the step."""

    observation: str
    generation: Generation
    prompt_ids: tuple[int, ...] | None
    action_ids: tuple[int, ...] | None
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def turn(self) -> Turn:
        """The finished move as a :class:`Turn`, recorded like every engine's turns (:func:`make_turn`)."""
        return make_turn(self.observation, self.generation, self.reward, {"turn": self.info}, self.prompt_ids,
                         self.action_ids)


@dataclass
class _Seat:
    """Per-agent state of a running game."""

    agent: str
    policy: Policy
    chat: ChatAgent
    turns: list[_Move] = field(default_factory=list)
    started: bool = False
    outcome: dict[str, Any] = field(default_factory=dict)


class MultiAgentRolloutEngine:
    """Play multi-agent games with policies; see the module docstring.

    Args:
        policies: One policy for every seat (shared), or a mapping ``seat -> policy``.
        config: Engine settings.
    """

    def __init__(self, policies: Policy | Mapping[str, Policy], config: MultiAgentRolloutConfig | None = None) -> None:
        if isinstance(policies, Mapping):
            if not policies or not all(isinstance(p, Policy) for p in policies.values()):
                raise ConfigError("policies must map every seat to a Policy (e.g. {'player_0': p0, 'player_1': p1}).")
        elif not isinstance(policies, Policy):
            raise ConfigError(f"policies must be a Policy or a mapping seat -> Policy, got {type(policies).__name__}.")
        self.policies = policies
        self.config = config or MultiAgentRolloutConfig()
        self.stats: dict[str, Any] = {}
        self._run_id = ""

    def _policy_for(self, agent: str) -> Policy:
        if isinstance(self.policies, Mapping):
            if agent not in self.policies:
                raise ConfigError(f"No policy for seat {agent!r}; policies cover {sorted(self.policies)}.")
            return self.policies[agent]
        return self.policies

    def _all_policies(self) -> list[Policy]:
        if isinstance(self.policies, Mapping):
            unique: dict[int, Policy] = {}
            for policy in self.policies.values():
                unique.setdefault(id(policy), policy)
            return list(unique.values())
        return [self.policies]

    def run(self, episodes: Sequence[MultiAgentEpisodeSpec], *, writer: TrajectoryWriter | None = None,
            on_episode: Callable[[MultiAgentEpisode], None] | None = None) -> list[MultiAgentEpisode]:
        """Play every game; returns them in the order of ``episodes``. Trajectories stream to ``writer``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_coroutine(self.arun(episodes, writer=writer, on_episode=on_episode))
        raise RuntimeError("MultiAgentRolloutEngine.run() was called inside a running event loop; use "
                           "'await engine.arun(...)'.")

    async def arun(self, episodes: Sequence[MultiAgentEpisodeSpec], *, writer: TrajectoryWriter | None = None,
                   on_episode: Callable[[MultiAgentEpisode], None] | None = None) -> list[MultiAgentEpisode]:
        """Async version of :meth:`run`."""
        episodes = list(episodes)
        for spec in episodes:
            entry = get_multi_agent_entry(spec.env_id)  # fail fast on unknown ids
            if spec.parallel and entry.parallel_entry_point is None:
                raise ConfigError(f"{spec.env_id} has no parallel form; set parallel=False.")
        self._run_id = uuid.uuid4().hex[:8]
        batchers = {id(p): PolicyBatcher(p, self.config.batch_window_s) for p in self._all_policies()}
        for batcher in batchers.values():
            batcher.start()
        executor = EnvExecutor(self.config.env_workers, name="agentgym-ma-env")  # daemon threads: a hang never blocks exit
        limiter = asyncio.Semaphore(self.config.max_in_flight)
        results: list[MultiAgentEpisode | None] = [None] * len(episodes)
        started = time.perf_counter()

        async def run_one(index: int, spec: MultiAgentEpisodeSpec) -> None:
            async with limiter:
                episode = await self._episode(spec, index, batchers, executor)
            results[index] = episode
            if writer is not None:
                for traj in episode.trajectories.values():
                    await asyncio.get_running_loop().run_in_executor(executor, writer.write, traj)
            if on_episode is not None:
                on_episode(episode)

        try:
            await asyncio.gather(*(run_one(i, s) for i, s in enumerate(episodes)))
        finally:
            for batcher in batchers.values():
                await batcher.stop()
            executor.shutdown(wait=False, cancel_futures=True)
        self.stats = {"episodes": len(episodes), "policy_calls": sum(b.calls for b in batchers.values()),
                      "wall_s": time.perf_counter() - started}
        return [r for r in results if r is not None]

    async def _call(self, executor: concurrent.futures.Executor, inline: bool, fn: Callable[..., Any], *args: Any,
                    **kwargs: Any) -> Any:
        # the timeout counts only the call's own run time, not time queued behind other episodes
        return await call_env(executor, self.config.step_timeout_s, fn, *args, inline=inline, **kwargs)

    def _system_prompt(self, env: Any, agent: str) -> str:
        role = self.config.role_prompts.get(agent)
        instructions = env.instructions(agent)
        return f"{role.strip()}\n\n{instructions}" if role else instructions

    async def _act(self, seat: _Seat, env: Any, text: str, batchers: Mapping[int, PolicyBatcher], episode_id: str,
                   order: int) -> _Move:
        """Ask the seat's policy for its next action and put it into the seat's conversation and turns."""
        if not seat.started:
            seat.chat.start(self._system_prompt(env, seat.agent), text)
            seat.started = True
        else:
            seat.chat.add_observation(text)
        if len(seat.turns) >= self.config.max_turns_per_agent:
            raise RuntimeError(f"{seat.agent} exceeded max_turns_per_agent={self.config.max_turns_per_agent}")
        request = seat.chat.request(self.config.sampling, f"{episode_id}/{seat.agent}")
        generation = await batchers[id(seat.policy)].submit(request, order)
        prompt_ids, _, action_ids = record_action(seat.policy, seat.chat, generation)
        move = _Move(text, generation, prompt_ids, action_ids)
        seat.turns.append(move)
        return move

    async def _episode(self, spec: MultiAgentEpisodeSpec, index: int, batchers: Mapping[int, PolicyBatcher],
                       executor: concurrent.futures.Executor) -> MultiAgentEpisode:
        episode_id = f"{self._run_id}-{index}"
        t0 = time.perf_counter()
        timing = {"policy_s": 0.0, "env_s": 0.0}
        seats: dict[str, _Seat] = {}
        error: str | None = None
        env: Any = None
        agents: list[str] = []
        try:
            make = make_multi_agent_parallel if spec.parallel else make_multi_agent
            env = await self._call(executor, False, make, spec.env_id, **dict(spec.env_kwargs))
            inline = bool(getattr(env, "cheap_steps", False))
            agents = list(env.possible_agents)
            for agent in agents:
                policy = self._policy_for(agent)
                chat = ChatAgent(policy.tokenizer, observation_role=self.config.observation_role)
                seats[agent] = _Seat(agent, policy, chat)
                policy.begin_episode(f"{episode_id}/{agent}", env)
            options = {"setup": dict(spec.setup)} if spec.setup is not None else None
            if spec.parallel:
                await self._play_parallel(env, spec, seats, batchers, executor, inline, episode_id, index, options, timing)
            else:
                await self._play_aec(env, spec, seats, batchers, executor, inline, episode_id, index, options, timing)
        except TimeoutError:
            error = f"env call exceeded step_timeout_s={self.config.step_timeout_s}"
        except Exception as exc:  # noqa: BLE001 - one game's failure must not end the others
            error = f"{type(exc).__name__}: {exc}"
            logger.debug("game %s failed:\n%s", episode_id, traceback.format_exc())
        finally:
            for seat in seats.values():
                seat.policy.end_episode(f"{episode_id}/{seat.agent}")
            if env is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(executor, env.close)
                except Exception:
                    logger.debug("closing a game failed", exc_info=True)
        timing["wall_s"] = time.perf_counter() - t0
        task_id = spec.task_id or f"seed-{spec.seed}"
        trajectories: dict[str, Trajectory] = {}
        for agent, seat in seats.items():
            outcome = dict(seat.outcome) if error is None and seat.outcome else error_outcome()
            turns = tuple(move.turn() for move in seat.turns)
            trajectories[agent] = Trajectory(
                env_id=spec.env_id, task_id=task_id, seed=spec.seed, turns=turns, outcome=outcome,
                end_reason=str(outcome.get("end_reason", "error")), policy=seat.policy.name, timing=dict(timing),
                traj_id=f"{episode_id}/{agent}", group_id=spec.group_id, error=error,
                metadata={"episode_id": episode_id, "agent": agent, "agents": agents, "multi_agent": True,
                          "parallel": spec.parallel, "role_prompt": self.config.role_prompts.get(agent, "")},
            )
        return MultiAgentEpisode(episode_id, spec.env_id, spec.seed, trajectories, error)

    async def _play_aec(self, env: Any, spec: MultiAgentEpisodeSpec, seats: dict[str, _Seat],
                        batchers: Mapping[int, PolicyBatcher], executor: concurrent.futures.Executor, inline: bool,
                        episode_id: str, index: int, options: Any, timing: dict[str, float]) -> None:
        te = time.perf_counter()
        await self._call(executor, inline, env.reset, seed=spec.seed, options=options)
        timing["env_s"] += time.perf_counter() - te
        while env.agents:
            agent = env.agent_selection
            observation, reward, terminated, truncated, info = env.last()
            seat = seats[agent]
            if seat.turns:
                seat.turns[-1].reward += float(reward)
            if terminated or truncated:
                seat.outcome = episode_outcome(info, truncated)
                env.step(None)
                continue
            tp = time.perf_counter()
            move = await self._act(seat, env, str(observation["text"]), batchers, episode_id, index)
            timing["policy_s"] += time.perf_counter() - tp
            te = time.perf_counter()
            await self._call(executor, inline, env.step, move.generation.text)
            timing["env_s"] += time.perf_counter() - te
            move.info = dict(env.infos.get(agent, {}).get("turn", {}))

    async def _play_parallel(self, env: Any, spec: MultiAgentEpisodeSpec, seats: dict[str, _Seat],
                             batchers: Mapping[int, PolicyBatcher], executor: concurrent.futures.Executor,
                             inline: bool, episode_id: str, index: int, options: Any, timing: dict[str, float]) -> None:
        te = time.perf_counter()
        observations, _ = await self._call(executor, inline, env.reset, seed=spec.seed, options=options)
        timing["env_s"] += time.perf_counter() - te
        while env.agents:
            live = list(env.agents)
            tp = time.perf_counter()
            acted = await asyncio.gather(*(self._act(seats[a], env, str(observations[a]["text"]), batchers, episode_id,
                                                     index) for a in live))
            timing["policy_s"] += time.perf_counter() - tp
            moves = dict(zip(live, acted))
            te = time.perf_counter()
            observations, rewards, terminations, truncations, infos = await self._call(
                executor, inline, env.step, {a: moves[a].generation.text for a in live})
            timing["env_s"] += time.perf_counter() - te
            for agent in live:
                moves[agent].reward = float(rewards.get(agent, 0.0))
                info = infos.get(agent, {})
                moves[agent].info = dict(info.get("turn", {}))
                if terminations.get(agent) or truncations.get(agent):
                    seats[agent].outcome = episode_outcome(info, bool(truncations.get(agent)))
