"""Entropy-guided branching rollouts (ARPO: Dong et al., 2025, arXiv 2507.19849).

For every task the sampler starts ``initial_rollouts`` trajectories (N) and grows the group to ``budget``
(M) by branching: right after a tool result, where the model tends to be unsure, a trajectory may be
copied and the copy continues on its own from the same prefix. Work goes in rounds, all active
trajectories together: generate one turn each (one batched policy call, in index order), decide
branches, step the envs concurrently, start fresh trajectories for tasks with nothing left to branch
from. Rounds and per-(trajectory, turn) seeds make a run reproducible.

When does a trajectory branch? Let ``H(seg)`` be the normalised entropy of a generated turn
(:func:`~agentgym.rollout.branch_rule.segment_entropy`: the top-k candidates of its first K tokens)
and ``H_init`` the entropy of the trajectory's first own turn. Each branch attempt succeeds with
probability ``clip(alpha + beta * (H_now - H_init), 0, 1)``.

* ``entropy_timing="paper"`` (default: it follows the paper and wastes no generation): the turn generated
  right after a tool result is measured, and the decision is taken before the env steps it. A branch is a
  sibling of that turn: it gets the prefix up to and including the tool result and samples its own turn next
  round (the turn already generated stays with the original).
* ``entropy_timing="code"``: the reference code's one-step lag. The decision is taken after the tool
  result is appended, with the entropy of the turn generated *before* that tool call; for a fresh
  trajectory's first tool call ``dH = 0`` exactly, a pure coin flip.

A branch copies the env with :func:`~agentgym.env.fork_env` when the family is ``forkable`` (pure
in-process state) and otherwise rebuilds it by deterministic replay: a fresh env, the same seed and
task, the recorded actions stepped again, each observation checked against the recorded one. A replay
that diverges abandons that branch (counted in ``stats``); the budget slot stays free.

Each trajectory records its place in the tree in ``metadata["tree"]``: ``origin`` (initial, branch,
restart), ``parent`` (trajectory id), ``branch_turn`` (turns shared with the parent; the prompt tokens of
that turn, i.e. the tool result, are shared too) and ``index`` (creation order in its group).
``metadata["segment_entropy"]`` holds each turn's normalised entropy.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from agentgym.agent import ChatAgent
from agentgym.rollout.branch_rule import branch_probability, segment_entropy
from agentgym.env import fork_env
from agentgym.errors import AgentGymError, ConfigError, ContextLengthExceeded
from agentgym.policies.base import Generation, Policy, SamplingParams
from agentgym.rollout.batching import act_per_request
from agentgym.rollout.env_reuse import EnvPool, discard_env, prepare_tasks, tasks_to_prepare
from agentgym.rollout.executor import EnvExecutor, call_env, run_coroutine
from agentgym.rollout.segments import EpisodeContext, SummaryDidNotFit
from agentgym.rollout.specs import EpisodeSpec, RolloutConfig
from agentgym.rollout.turns import (
    action_choices_of,
    apply_action,
    context_limit_reached,
    error_outcome,
    final_state,
    log_context_refusal,
    make_turn,
    open_conversation,
    pay_due_reward,
    read_state_key,
    record_action,
    text_of,
    truncation_outcome,
    turn_sampling,
)
from agentgym.trajectory import TURN_KINDS, Trajectory, Turn

__all__ = ["BranchReplayMismatch", "BranchingConfig", "BranchingSampler"]


class BranchReplayMismatch(AgentGymError):
    """Replaying a trajectory's actions on a fresh env gave a different observation (the env is not
    deterministic given its seed and task, so a replayed branch would not share its parent's state)."""


@dataclass(frozen=True)
class BranchingConfig:
    """How a branching rollout spends its budget (defaults: ARPO's 7B reasoning recipe, Dong et al., 2025).

    Attributes:
        budget: ``M``, trajectories kept per task (GRPO's group size).
        initial_rollouts: ``N``, trajectories started from the bare task; the other ``M - N`` come from
            branching, or from fresh restarts when a task has no active trajectory left.
        beam_size: At most ``beam_size - 1`` branches per trajectory per round.
        branch_probability: ``alpha``, the branch chance when the entropy did not change (the code's
            ``tau``; 0.5).
        entropy_weight: ``beta``, how much a rise (fall) in entropy raises (lowers) that chance (0.2).
        entropy_window: ``K``, leading tokens of a turn whose entropy counts (20).
        entropy_top_k: ``k``, candidate log-probs per token (10); 0 uses the policy's exact per-token
            entropies instead of the top-k truncation.
        entropy_timing: ``paper`` (default) or ``code`` (one-step lag, for reproduction); module docstring.
        branch_after: Turn kinds after which a trajectory may branch (a tool call: its result follows).
        vocab_size: ``|V|`` for the normalisation; ``None`` reads it from the policy's tokenizer.
        fork: ``auto`` copies forkable envs and replays the others; ``replay`` always replays.
        seed: Seeds the branch draws (each task has its own stream).
    """

    budget: int = 16
    initial_rollouts: int = 8
    beam_size: int = 2
    branch_probability: float = 0.5
    entropy_weight: float = 0.2
    entropy_window: int = 20
    entropy_top_k: int = 10
    entropy_timing: Literal["paper", "code"] = "paper"
    branch_after: tuple[str, ...] = ("tool_call",)
    vocab_size: int | None = None
    fork: Literal["auto", "replay"] = "auto"
    seed: int = 0

    def __post_init__(self) -> None:
        def fail(name: str, message: str) -> ConfigError:
            return ConfigError(f"BranchingConfig.{name}: {message}")

        for name in ("budget", "initial_rollouts", "beam_size", "entropy_window"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise fail(name, f"must be an integer >= 1, got {value!r}.")
        if self.initial_rollouts > self.budget:
            raise fail("initial_rollouts", f"({self.initial_rollouts}) exceeds budget ({self.budget}); the budget M "
                       "counts the initial rollouts N plus their branches, so N <= M (ARPO's default: 8 of 16).")
        if not isinstance(self.entropy_top_k, int) or self.entropy_top_k < 0:
            raise fail("entropy_top_k", f"must be an integer >= 0 (10 as in the reference code; 0 = exact "
                       f"entropies), got {self.entropy_top_k!r}.")
        for name in ("branch_probability", "entropy_weight"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                raise fail(name, f"must be a finite number, got {value!r}.")
        if self.entropy_timing not in ("paper", "code"):
            raise fail("entropy_timing", f"must be 'paper' or 'code', got {self.entropy_timing!r}.")
        if self.fork not in ("auto", "replay"):
            raise fail("fork", f"must be 'auto' or 'replay', got {self.fork!r}.")
        unknown = set(self.branch_after) - set(TURN_KINDS)
        if not self.branch_after or unknown:
            raise fail("branch_after", f"must list turn kinds from {TURN_KINDS}, got {list(self.branch_after)}.")
        if self.vocab_size is not None and self.vocab_size < 2:
            raise fail("vocab_size", f"must be >= 2 or null (read from the tokenizer), got {self.vocab_size}.")

    @property
    def can_branch(self) -> bool:
        """False when no attempt can ever succeed (alpha <= 0 and beta = 0, beam 1, or N = M)."""
        return (self.initial_rollouts < self.budget and self.beam_size > 1
                and (self.branch_probability > 0 or self.entropy_weight != 0))


@dataclass
class _Live:
    """One trajectory under construction."""

    group: int
    index: int  # creation order inside the group
    seed_index: int  # global index for per-request seeds (group * budget + index)
    spec: EpisodeSpec
    traj_id: str
    origin: str
    parent: str | None = None
    branch_turn: int | None = None
    env: Any = None
    agent: ChatAgent | None = None
    context: EpisodeContext | None = None  # context strategy and token budgets (None: neither is set)
    inline: bool = False
    observation: str = ""
    task_id: str = ""
    turns: list[Turn] = field(default_factory=list)
    entropies: list[float | None] = field(default_factory=list)
    h_init: float | None = None
    born_at: int = 0  # turns shared with the parent at creation
    calls_run: int = 0  # tool calls this trajectory's own env ran (a copied prefix's are its parent's)
    done: bool = False
    healthy: bool = False
    outcome: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    timing: dict[str, float] = field(default_factory=lambda: {"policy_s": 0.0, "env_s": 0.0, "fork_s": 0.0})
    started: float = field(default_factory=time.perf_counter)


class BranchingSampler:
    """Run ARPO branching rollouts: ``BranchingSampler(policy, rollout, branching).run(specs)``.

    Args:
        policy: A token-level policy (HF, vLLM) when ``entropy_weight != 0``: it must return top-k
            log-probs (or per-token entropies with ``entropy_top_k=0``).
        rollout: Engine settings reused from :class:`~agentgym.rollout.RolloutConfig` (sampling, step timeout,
            env workers, context limit, system prompt, observation role). Runs are always deterministic.
        branching: Budget and branch rule.
    """

    def __init__(self, policy: Policy, rollout: RolloutConfig | None = None,
                 branching: BranchingConfig | None = None) -> None:
        self.policy = policy
        self.rollout = rollout or RolloutConfig()
        self.config = branching or BranchingConfig()
        self.stats: dict[str, Any] = {}
        self._vocab = self._vocab_size()
        rollout = self.rollout
        self._managed = (rollout.context.rewrites or rollout.max_turn_tokens is not None
                         or rollout.max_episode_tokens is not None)
        if rollout.context.rewrites:  # bad strategy settings fail now, not in every trajectory
            EpisodeContext(rollout, policy)

    def _vocab_size(self) -> int | None:
        if self.config.vocab_size is not None:
            return self.config.vocab_size
        tokenizer = getattr(self.policy, "tokenizer", None)
        if tokenizer is not None:
            return len(tokenizer)
        if self.config.entropy_weight != 0:
            raise ConfigError(
                f"Entropy-guided branching needs |V|: policy {self.policy.name!r} has no tokenizer. Set "
                "BranchingConfig.vocab_size, use a token-level policy (HFPolicy, VLLMPolicy), or set entropy_weight=0."
            )
        return None

    # ---- public API --------------------------------------------------------------------------------
    def run(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Branching rollouts for ``specs``: ``budget`` specs per group (same ``group_id``, one task).

        The k-th fresh trajectory of a group (initial or restart) runs spec k; a branch keeps its
        parent's spec (seed and task), since it continues the parent's episode. Returns each group's
        ``budget`` trajectories in creation order, groups in the order they first appear in ``specs``.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_coroutine(self.arun(specs))
        raise RuntimeError("BranchingSampler.run() was called inside a running event loop; use 'await sampler.arun(...)'.")

    async def arun(self, specs: Sequence[EpisodeSpec]) -> list[Trajectory]:
        """Async version of :meth:`run`."""
        groups = self._group(specs)
        cfg = self.config
        preparing = tasks_to_prepare(specs, self.rollout)
        if preparing:  # slow one-off work of the env classes, before the episodes and their step timeout
            await asyncio.get_running_loop().run_in_executor(None, prepare_tasks, preparing)
        run_id = uuid.uuid4().hex[:8]
        started = time.perf_counter()
        pool = EnvPool(self.rollout)
        executor = EnvExecutor(self.rollout.env_workers, name="agentgym-branch")  # daemon threads: a hang never blocks exit
        self._executor = executor  # summary turns read the env's state key on it
        rngs = [np.random.default_rng([cfg.seed, g]) for g in range(len(groups))]
        created: list[list[_Live]] = [[] for _ in groups]
        fresh_used = [0] * len(groups)
        next_index = [0] * len(groups)  # creation counter (abandoned branches leave gaps, never reuse)
        counters: Counter[str] = Counter()
        branch_turns: Counter[int] = Counter()
        self._warned_no_entropy = False
        initial = cfg.initial_rollouts if cfg.can_branch else cfg.budget

        def new_live(g: int, origin: str, spec: EpisodeSpec, parent: _Live | None = None) -> _Live:
            k = next_index[g]
            next_index[g] += 1
            live = _Live(group=g, index=k, seed_index=g * cfg.budget + k, spec=spec, origin=origin,
                         traj_id=f"{run_id}-{g}-{k}", parent=parent.traj_id if parent else None)
            created[g].append(live)
            return live

        async def start_fresh(g: int, origin: str) -> _Live:
            live = new_live(g, origin, groups[g][fresh_used[g]])
            fresh_used[g] += 1
            await self._start(live, pool, executor)
            return live

        try:
            await asyncio.gather(*(start_fresh(g, "initial") for g in range(len(groups)) for _ in range(initial)))
            while True:
                active = [t for g in created for t in g if not t.done]
                if not active:
                    break
                counters["rounds"] += 1
                generations = await self._generate(active)
                # Paper timing: decide on the turn just generated, before the env steps it.
                pending: list[tuple[_Live, _Live]] = []
                if cfg.entropy_timing == "paper" and cfg.can_branch:
                    for live in active:
                        if self._eligible_paper(live):
                            pending += self._decide(live, created, rngs, branch_turns, counters, new_live,
                                                    at_turn=len(live.turns))
                    await self._fork_all(pending, created, pool, executor, counters)
                await asyncio.gather(*(self._step(live, gen, executor) for live, gen in zip(active, generations)))
                if cfg.entropy_timing == "code" and cfg.can_branch:
                    pending = []
                    for live in active:
                        if not live.done and live.turns[-1].kind in cfg.branch_after:
                            pending += self._decide(live, created, rngs, branch_turns, counters, new_live,
                                                    at_turn=len(live.turns))
                    await self._fork_all(pending, created, pool, executor, counters)
                refills = [g for g in range(len(groups))
                           if len(created[g]) < cfg.budget and all(t.done for t in created[g])]
                counters["restarts"] += len(refills)
                await asyncio.gather(*(start_fresh(g, "restart") for g in refills))
        finally:
            for group in created:
                for live in group:
                    self._release(live, pool)
            pool.close()
            executor.shutdown(wait=False, cancel_futures=True)
        trajectories = [self._trajectory(live) for group in created for live in group[: cfg.budget]]
        self.stats = self._stats(created, counters, branch_turns, time.perf_counter() - started)
        return trajectories

    # ---- setup ---------------------------------------------------------------------------------------
    def _group(self, specs: Sequence[EpisodeSpec]) -> list[list[EpisodeSpec]]:
        by_group: dict[str, list[EpisodeSpec]] = defaultdict(list)
        for spec in specs:
            by_group[spec.group_id].append(spec)
        budget = self.config.budget
        for gid, members in by_group.items():
            if len(members) != budget:
                raise ConfigError(f"group {gid!r} has {len(members)} specs; a branching rollout needs exactly budget={budget} "
                                  "per group (one per possible fresh trajectory, all with the same task).")
            if len({m.task.id if m.task is not None else None for m in members}) != 1 or len({m.env_id for m in members}) != 1:
                raise ConfigError(f"group {gid!r} mixes tasks or envs; every spec of a group must name the same env and task.")
        return list(by_group.values())

    async def _start(self, live: _Live, pool: EnvPool, executor: concurrent.futures.Executor) -> None:
        """Acquire an env, reset it and open the conversation (a failure ends only this trajectory)."""
        spec = live.spec
        timeout = self.rollout.step_timeout_s
        live.task_id = spec.task.id if spec.task is not None else ""
        try:
            live.env = await call_env(executor, timeout, pool.acquire, spec)
            live.inline = bool(getattr(live.env.unwrapped, "cheap_steps", False))
            t0 = time.perf_counter()
            observation, info = await call_env(executor, timeout, live.env.reset, seed=spec.seed,
                                               options=self._options(spec), inline=live.inline)
            live.timing["env_s"] += time.perf_counter() - t0
            live.task_id = info.get("task_id", live.task_id)
            self.policy.begin_episode(live.traj_id, live.env)
            live.observation = text_of(observation)
            live.agent = open_conversation(self.policy, self.rollout, info, live.observation)
            if self._managed:
                live.context = EpisodeContext(self.rollout, self.policy)
        except Exception as exc:  # noqa: BLE001 - one trajectory's failure must not end the others
            self._fail(live, exc)

    @staticmethod
    def _options(spec: EpisodeSpec) -> dict[str, Any] | None:
        return {"task": spec.task} if spec.task is not None else None

    # ---- one round -----------------------------------------------------------------------------------
    def _sampling(self, live: _Live) -> SamplingParams:
        sampling = self.rollout.sampling
        if self.config.entropy_top_k and sampling.top_logprobs < self.config.entropy_top_k:
            sampling = replace(sampling, top_logprobs=self.config.entropy_top_k)
        if self.rollout.constrain_actions:
            sampling = replace(sampling, choices=action_choices_of(live.env))
        if live.spec.sampling_seed is not None and sampling.seed is not None:
            # The episode's own seed, as in the engine; a branch shares its parent's spec, so it draws from the
            # same seed's stream number (index + 1) instead, never repeating its parent's samples.
            stream = live.index + 1 if live.origin == "branch" else 0
            return turn_sampling(replace(sampling, seed=live.spec.sampling_seed), stream, len(live.turns))
        return turn_sampling(sampling, live.seed_index, len(live.turns))

    async def _truncate(self, live: _Live, reason: str = "context_limit") -> None:
        """End ``live`` at an engine limit with the outcome its env gives a truncation (and the reward due)."""
        live.outcome, due = await call_env(self._executor, self.rollout.step_timeout_s, truncation_outcome, live.env,
                                           reason, inline=live.inline)
        pay_due_reward(live.turns, due)
        live.done = live.healthy = True

    async def _generate(self, active: list[_Live]) -> list[Generation | None]:
        """One policy turn for every active trajectory, batched in index order (context limits end some)."""
        rollout = self.rollout
        results: list[Generation | None] = [None] * len(active)
        asking = []
        for i, live in enumerate(active):
            if live.context is not None and not await self._compact(live):
                continue
            if context_limit_reached(live.agent, self.policy, rollout):
                await self._truncate(live)
            else:
                asking.append(i)
        order = sorted(asking, key=lambda i: active[i].seed_index)
        size = max(1, self.policy.max_batch_size)
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            requests = [active[i].agent.request(self._capped(active[i]), active[i].traj_id) for i in chunk]
            t0 = time.perf_counter()
            try:
                generations = await act_per_request(self.policy, requests)
            except Exception as exc:  # noqa: BLE001 - a failed batch ends its trajectories, not the run
                for i in chunk:
                    self._fail(active[i], exc)
                continue
            elapsed = time.perf_counter() - t0
            for i, gen in zip(chunk, generations):
                live = active[i]
                live.timing["policy_s"] += elapsed
                if isinstance(gen, ContextLengthExceeded):  # the model refused this prompt as too long
                    log_context_refusal(gen, turns_taken=len(live.turns))
                    await self._truncate(live)
                    continue
                results[i] = gen
                h = self._entropy(gen)
                live.entropies.append(h)
                if live.h_init is None:
                    live.h_init = h
        return results

    def _capped(self, live: _Live) -> SamplingParams:
        sampling = self._sampling(live)
        return sampling if live.context is None else live.context.capped(sampling)

    async def _compact(self, live: _Live) -> bool:
        """Apply the context strategy before this trajectory's next turn (a summary turn is sampled on its own,
        not batched: summaries are rare); ``False`` when the episode ended (its token budget is spent, or it
        failed)."""
        context = live.context
        assert context is not None and live.agent is not None

        async def generate(request: Any) -> Generation:
            [generation] = await act_per_request(self.policy, [request])
            if isinstance(generation, BaseException):
                raise generation
            return generation

        async def state_key() -> str | None:
            return await call_env(self._executor, self.rollout.step_timeout_s, read_state_key, live.env,
                                  inline=live.inline)

        try:
            t0 = time.perf_counter()
            summary = await context.compact(live.agent, live.observation, self._sampling(live), live.traj_id,
                                            generate, state_key)
            live.timing["policy_s"] += time.perf_counter() - t0
        except SummaryDidNotFit:  # a truncation like any prompt too long; the context keeps the note
            await self._truncate(live)
            return False
        except Exception as exc:  # noqa: BLE001 - one trajectory's failure must not end the others
            self._fail(live, exc)
            return False
        if summary is not None:
            live.turns.append(summary)
            live.entropies.append(None)  # no branch point: the env never saw a summary
        if context.spent():
            await self._truncate(live, "episode_token_limit")
            return False
        return True

    def _entropy(self, generation: Generation) -> float | None:
        cfg = self.config
        if self._vocab is None:
            return None
        if cfg.entropy_top_k and generation.top_logprobs is not None:
            return segment_entropy(generation.top_logprobs, window=cfg.entropy_window, vocab_size=self._vocab)
        if generation.entropies is not None:
            return float(sum(generation.entropies[: cfg.entropy_window])) / math.log(self._vocab)
        if cfg.entropy_weight != 0:
            raise ConfigError(
                f"policy {self.policy.name!r} returned neither top-k log-probs nor entropies, so ARPO cannot measure "
                "the entropy after a tool result. Use a token-level policy (HFPolicy, VLLMPolicy) or set entropy_weight=0."
            )
        return None

    async def _step(self, live: _Live, generation: Generation | None, executor: concurrent.futures.Executor) -> None:
        if live.done or generation is None:
            return
        context = live.context
        try:
            if context is not None:
                context.count(generation)
                if context.cut(generation):  # the action ran out of max_turn_tokens: recorded, never stepped
                    prompt_ids, images, action_ids = record_action(self.policy, live.agent, generation)
                    live.turns.append(context.stamp(make_turn(live.observation, generation, 0.0,
                                                              {"turn": {"kind": "invalid", "calls": []}},
                                                              prompt_ids, action_ids, None, images)))
                    await self._truncate(live, "turn_token_limit")
                    return
            step = await apply_action(self.policy, live.agent, live.env, live.observation, generation, executor,
                                      self.rollout.step_timeout_s, inline=live.inline)
            live.timing["env_s"] += step.env_s
            live.calls_run += len(step.turn.info.get("calls", ()))
            live.turns.append(step.turn if context is None else context.stamp(step.turn))
            live.observation = step.observation
            if step.outcome is not None:
                live.outcome = step.outcome  # a TimeLimit truncation is max_turns
                live.healthy = live.outcome.get("end_reason") != "error"
                live.done = True
            elif context is not None and context.spent():
                await self._truncate(live, "episode_token_limit")
        except TimeoutError:
            self._fail(live, TimeoutError(f"env call exceeded step_timeout_s={self.rollout.step_timeout_s}"))
        except Exception as exc:  # noqa: BLE001
            self._fail(live, exc)

    # ---- branching -----------------------------------------------------------------------------------
    def _eligible_paper(self, live: _Live) -> bool:
        """Paper timing: this round's turn follows a tool result and is not the trajectory's first own turn."""
        t = len(live.turns)
        return (not live.done and t > live.born_at and bool(live.entropies)
                and live.turns[t - 1].kind in self.config.branch_after)

    def _decide(self, live: _Live, created: list[list[_Live]], rngs: list[np.random.Generator],
                branch_turns: Counter[int], counters: Counter[str], new_live: Any, at_turn: int) -> list[tuple[_Live, _Live]]:
        """Branch attempts for ``live`` (at most beam_size - 1, within the task's remaining budget)."""
        cfg = self.config
        g = live.group
        remaining = cfg.budget - len(created[g])
        if remaining <= 0:
            return []
        h_now = live.entropies[-1]
        h_init = live.h_init
        dh_known = h_now is not None and h_init is not None
        p = branch_probability(h_now if dh_known else 0.0, h_init if dh_known else 0.0,
                               alpha=cfg.branch_probability, beta=cfg.entropy_weight)
        made = []
        for _ in range(min(cfg.beam_size - 1, remaining)):
            counters["branch_attempts"] += 1
            if float(rngs[g].random()) < p:
                child = new_live(g, "branch", live.spec, parent=live)
                child.branch_turn = child.born_at = at_turn
                branch_turns[at_turn] += 1
                made.append((live, child))
        return made

    async def _fork_all(self, pending: list[tuple[_Live, _Live]], created: list[list[_Live]], pool: EnvPool,
                        executor: concurrent.futures.Executor, counters: Counter[str]) -> None:
        """Give each new branch a copy of its parent's conversation, turns and env; drop those that fail."""
        if not pending:
            return
        # Copies of the conversation and the turns are taken now, before the parent moves on.
        for parent, child in pending:
            child.agent = parent.agent.fork()
            child.context = parent.context.fork() if parent.context is not None else None
            child.turns = list(parent.turns[: child.born_at])
            child.entropies = list(parent.entropies[: child.born_at])
            child.observation = parent.observation
            child.task_id = parent.task_id
            child.inline = parent.inline
        await asyncio.gather(*(self._fork_env(parent, child, pool, executor, counters) for parent, child in pending))
        for parent, child in pending:
            if child.origin == "abandoned":
                counters["abandoned_calls_run"] += child.calls_run  # ran, then dropped: still spent
                created[child.group].remove(child)  # its budget slot is free again
            else:
                self.policy.begin_episode(child.traj_id, child.env)

    async def _fork_env(self, parent: _Live, child: _Live, pool: EnvPool, executor: concurrent.futures.Executor,
                        counters: Counter[str]) -> None:
        t0 = time.perf_counter()
        timeout = self.rollout.step_timeout_s
        try:
            if self.config.fork == "auto" and getattr(parent.env.unwrapped, "forkable", False):
                child.env = await call_env(executor, timeout, fork_env, parent.env, inline=parent.inline)
                counters["fork_copies"] += 1
            else:
                child.env = await call_env(executor, timeout, pool.acquire, child.spec)
                await call_env(executor, max(timeout, timeout * (len(child.turns) + 1)), self._replay, child)
                counters["fork_replays"] += 1
        except BranchReplayMismatch:
            counters["replay_mismatches"] += 1
            self._abandon(child)
            return
        except Exception as exc:  # noqa: BLE001 - a failed copy ends the branch, not the run
            counters["fork_errors"] += 1
            self._abandon(child, exc)
            return
        child.timing["fork_s"] += time.perf_counter() - t0

    def _replay(self, child: _Live) -> None:
        """Rebuild the parent's env state on ``child.env``: same seed and task, the recorded actions again."""
        env = child.env
        observation, _ = env.reset(seed=child.spec.seed, options=self._options(child.spec))
        for i, turn in enumerate(child.turns):
            if turn.kind == "summary":  # written for the model's context; the env never saw it
                continue
            if text_of(observation) != turn.observation:
                raise BranchReplayMismatch(f"replayed observation before turn {i} differs from the recorded one")
            observation, _, terminated, truncated, _ = env.step(turn.action)
            child.calls_run += len(turn.info.get("calls", ()))  # a replay runs the prefix's calls again
            if terminated or truncated:
                raise BranchReplayMismatch(f"the replayed episode ended at turn {i}, the recorded one went on")
        if text_of(observation) != child.observation:
            raise BranchReplayMismatch("the replayed observation at the branch point differs from the recorded one")

    def _abandon(self, child: _Live, exc: Exception | None = None) -> None:
        """Mark a branch whose env could not be copied; :meth:`_fork_all` frees its budget slot."""
        if child.env is not None:
            discard_env(child.env)
            child.env = None
        child.done = True
        child.error = f"branch abandoned: {type(exc).__name__}: {exc}" if exc else "branch abandoned: replay mismatch"
        child.origin = "abandoned"

    # ---- results -------------------------------------------------------------------------------------
    def _fail(self, live: _Live, exc: BaseException) -> None:
        live.error = f"{type(exc).__name__}: {exc}"
        live.outcome = error_outcome()
        live.done = True
        live.healthy = False

    def _release(self, live: _Live, pool: EnvPool) -> None:
        self.policy.end_episode(live.traj_id)
        if live.env is None:
            return
        pool.finish(live.spec, live.env, healthy=live.healthy)
        live.env = None

    def _trajectory(self, live: _Live) -> Trajectory:
        outcome = live.outcome or error_outcome()
        timing = dict(live.timing)
        timing["wall_s"] = time.perf_counter() - live.started
        metadata = {
            "tree": {"origin": live.origin, "parent": live.parent, "branch_turn": live.branch_turn, "index": live.index},
            "segment_entropy": list(live.entropies[: len(live.turns)]),
            "initial_entropy": live.h_init,
        }
        if live.error is None and live.turns:
            metadata.update(final_state(live.agent, live.observation))
            if live.context is not None:
                metadata.update(live.context.metadata())
        return Trajectory(
            env_id=live.spec.env_id, task_id=live.task_id, seed=live.spec.seed, turns=tuple(live.turns),
            outcome=outcome, end_reason=str(outcome.get("end_reason", "error")), policy=self.policy.name,
            timing=timing, traj_id=live.traj_id, group_id=live.spec.group_id, error=live.error, metadata=metadata,
        )

    def _stats(self, created: list[list[_Live]], counters: Counter[str], branch_turns: Counter[int],
               wall_s: float) -> dict[str, Any]:
        """Branches and restarts per task, branch points by turn, entropy after tool results vs initial."""
        kept = [live for group in created for live in group[: self.config.budget] if live.origin != "abandoned"]
        after_tool = [h for live in kept for t, h in enumerate(live.entropies[: len(live.turns)])
                      if h is not None and t > 0 and live.turns[t - 1].kind in self.config.branch_after]
        initial = [live.h_init for live in kept if live.h_init is not None and live.origin != "branch"]
        tasks = max(len(created), 1)
        distinct = [len({tuple(t.action for t in live.turns) for live in group[: self.config.budget]}) / max(len(group), 1)
                    for group in created]
        return {
            "tasks": len(created),
            "trajectories": len(kept),
            "branches_per_task": sum(live.origin == "branch" for live in kept) / tasks,
            "restarts_per_task": counters["restarts"] / tasks,
            "branch_attempts": counters["branch_attempts"],
            "branch_points_by_turn": dict(sorted(branch_turns.items())),
            "fork_copies": counters["fork_copies"],
            "fork_replays": counters["fork_replays"],
            "replay_mismatches": counters["replay_mismatches"],
            "fork_errors": counters["fork_errors"],
            "tool_calls_per_episode": sum(_tool_calls(live) for live in kept) / max(len(kept), 1),
            # What the tree saves: calls the envs actually ran (every created trajectory, abandoned ones too), per
            # kept trajectory; a prefix copied into a branch is not run again. Independent rollouts run all of
            # tool_calls_per_episode.
            "tool_calls_run_per_episode": (sum(live.calls_run for group in created for live in group)
                                           + counters["abandoned_calls_run"]) / max(len(kept), 1),
            "entropy_after_tool": float(np.mean(after_tool)) if after_tool else float("nan"),
            "entropy_initial": float(np.mean(initial)) if initial else float("nan"),
            "distinct_action_sequences": float(np.mean(distinct)) if distinct else float("nan"),
            "rounds": counters["rounds"],
            "wall_s": wall_s,
        }


def _tool_calls(live: _Live) -> int:
    return sum(len(t.info.get("calls", ())) for t in live.turns)
