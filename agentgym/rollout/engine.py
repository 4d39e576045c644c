"""The rollout engine: many episodes at once, policy calls batched across episodes, env steps concurrent.

One engine serves evaluation and training. Each episode is a coroutine: reset the env (in a worker
thread), ask the policy for an action, step the env (in a worker thread, under a timeout), repeat. Policy
requests from all episodes meet in a :class:`~agentgym.rollout.batching.PolicyBatcher`, which sends whatever is
queued as one batch as soon as the policy has a free slot. Episodes therefore pipeline: while some wait on slow
tools, others generate, and no turn waits for the slowest episode of a synchronous batch.

An env that raises or hangs ends only its own episode (``end_reason="error"``); finished trajectories
are streamed to JSONL as they complete, so a crash of the whole process loses no finished episode, and a
trajectory that cannot be written is counted (``stats["write_failures"]``) without costing the others.

Env calls run on :class:`~agentgym.rollout.executor.EnvExecutor`'s daemon threads under a timeout that counts
only the call's own run time; an env that ran past it is abandoned (closed from another thread, never reused).
Healthy envs play the next episode (:mod:`agentgym.rollout.env_reuse`). Each turn goes through the turn protocol
that every engine shares (:mod:`agentgym.rollout.turns`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from agentgym.errors import ConfigError, ContextLengthExceeded
from agentgym.policies.base import Policy, SamplingParams
from agentgym.rollout.batching import PolicyBatcher
from agentgym.rollout.env_reuse import EnvPool, prepare_tasks, tasks_to_prepare
from agentgym.rollout.executor import EnvExecutor, call_env, run_coroutine
from agentgym.rollout.segments import EpisodeContext, SummaryDidNotFit
from agentgym.rollout.specs import EpisodeSpec, RolloutConfig
from agentgym.rollout.summaries import EpisodeProgress, error_reason
from agentgym.rollout.turns import (
    action_choices_of,
    apply_action,
    apply_action_inline,
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
from agentgym.storage import TrajectoryWriter
from agentgym.trajectory import Trajectory, Turn
from agentgym.utils.gc_tuning import relaxed_gc

__all__ = ["RolloutEngine"]

logger = logging.getLogger(__name__)


_forks_noted = False  # the fork note is said once per process (a training run calls run() every step)


def _note_template_forks(forks: int, mismatches: int) -> None:
    """Say once, in words, that the chat template re-renders some turns differently from the tokens the model
    produced (a "template fork"): harmless, since episodes keep and train on the produced tokens. Later runs in the
    same process log their counts at DEBUG; every rollout summary counts them (``template_forks``)."""
    global _forks_noted
    if _forks_noted:
        logger.debug("%d template fork(s), %d action(s) without ids", forks, mismatches)
        return
    _forks_noted = True
    extra = (f"; {mismatches} action(s) were sampled from another prompt and kept as text without token ids"
             if mismatches else "")
    logger.info("note: in %d episode segment(s) the chat template, re-rendering the conversation, gives other tokens "
                "than the model produced (harmless: episodes keep and train on the tokens the model produced; counted per "
                "run as template_forks in rollout summaries; said once per run)%s", forks, extra)


class RolloutEngine:
    """Run episodes with a policy; see the module docstring for how work overlaps.

    Args:
        policy: Any :class:`Policy`. When it has a tokenizer, trajectories carry exact token ids.
        config: Engine settings.
        summarizer: For ``context: summarize``, another policy that writes the summaries (``None``: the acting
            policy writes them itself, in sampled turns that train with the episode's credit).
    """

    def __init__(self, policy: Policy, config: RolloutConfig | None = None, *,
                 summarizer: Policy | None = None) -> None:
        self.policy = policy
        self.config = config or RolloutConfig()
        self.summarizer = summarizer
        self.stats: dict[str, Any] = {}
        self._run_id = ""

    def _sampling_for(self, spec: EpisodeSpec, episode_index: int, turn: int) -> SamplingParams:
        # Every (episode, turn) gets its own seed in both modes: one seed reused on every turn replays one random
        # stream, so a sampled policy repeated the same turn over and over.
        if spec.sampling_seed is not None and self.config.sampling.seed is not None:
            return turn_sampling(dataclasses.replace(self.config.sampling, seed=spec.sampling_seed), 0, turn)
        return turn_sampling(self.config.sampling, episode_index, turn)

    def run(
        self,
        episodes: Sequence[EpisodeSpec],
        *,
        writer: TrajectoryWriter | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run all episodes and return their trajectories in the order of ``episodes``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return run_coroutine(self.arun(episodes, writer=writer, on_trajectory=on_trajectory))
        raise RuntimeError("RolloutEngine.run() was called inside a running event loop; use 'await engine.arun(...)'.")

    async def arun(
        self,
        episodes: Sequence[EpisodeSpec],
        *,
        writer: TrajectoryWriter | None = None,
        on_trajectory: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Async version of :meth:`run`."""
        with relaxed_gc(self.config.gc_threshold):
            return await self._arun(list(episodes), writer=writer, on_trajectory=on_trajectory)

    async def _arun(self, episodes: list[EpisodeSpec], *, writer: TrajectoryWriter | None,
                    on_trajectory: Callable[[Trajectory], None] | None) -> list[Trajectory]:
        if self.config.constrain_actions and not getattr(self.policy, "supports_choices", False):
            raise ConfigError(f"constrain_actions needs a policy that decodes under SamplingParams.choices; "
                              f"{type(self.policy).__name__} does not (HFPolicy does). Turn constrain_actions off.")
        if self.config.context.rewrites:  # bad strategy settings fail the run now, not every episode
            EpisodeContext(self.config, self.policy, self.summarizer)
        self._run_id = uuid.uuid4().hex[:8]
        preparing = tasks_to_prepare(episodes, self.config)
        if preparing:  # slow one-off work of the env classes, before the episodes and their step timeout
            await asyncio.get_running_loop().run_in_executor(None, prepare_tasks, preparing)
        results: list[Trajectory | None] = [None] * len(episodes)
        batcher = PolicyBatcher(self.policy, self.config.batch_window_s, self.config.deterministic)
        batcher.start()
        pool = EnvPool(self.config)
        executor = EnvExecutor(self.config.env_workers)
        write_failures = 0
        max_envs = pool.max_envs()  # Ray: episodes beyond the actors that fit would wait for the end of the run
        if max_envs is not None and max_envs < self.config.max_in_flight:
            logger.info("env_backend=ray: %d env actors fit in the cluster's free resources; running %d episodes "
                        "at once instead of max_in_flight=%d", max_envs, max_envs, self.config.max_in_flight)
        limiter = asyncio.Semaphore(self.config.max_in_flight if max_envs is None
                                    else min(self.config.max_in_flight, max_envs))
        progress = EpisodeProgress(len(episodes), enabled=self.config.progress)
        started = time.perf_counter()

        async def run_one(index: int, spec: EpisodeSpec) -> None:
            async with limiter:
                batcher.episode_started()
                try:
                    traj = await self._episode(spec, index, batcher, pool, executor)
                finally:
                    batcher.episode_finished()
            results[index] = traj
            if writer is not None:
                nonlocal write_failures
                try:
                    if not await asyncio.to_thread(writer.write, traj):
                        write_failures += 1  # kept in the writer's errors file
                except Exception:  # noqa: BLE001 - e.g. disk full: this trajectory is returned, the rest go on
                    write_failures += 1
                    logger.exception("writing trajectory %s to %s failed", traj.traj_id, writer.path)
            if on_trajectory is not None:
                on_trajectory(traj)
            progress.advance(traj)

        try:
            with progress:
                await asyncio.gather(*(run_one(i, s) for i, s in enumerate(episodes)))
        finally:
            await batcher.stop()
            pool.close()
            executor.shutdown(wait=False, cancel_futures=True)
        finished = [r for r in results if r is not None]
        errors = [t for t in finished if t.end_reason == "error"]
        self.stats = {"policy_calls": batcher.calls, "episodes": len(episodes), "errors": len(errors),
                      "write_failures": write_failures, "wall_s": time.perf_counter() - started}
        if errors:  # trainers drop these episodes: say so, with a reason, instead of training on less silently
            logger.warning("%d of %d episodes ended with end_reason='error' (first: %s)", len(errors),
                           len(finished), error_reason(errors[0]))
        forks = sum(int(t.metadata.get("template_forks", 0)) for t in finished)
        mismatches = sum(int(t.metadata.get("prompt_mismatches", 0)) for t in finished)
        if forks or mismatches:  # the linear sequence is what was trained on, the render differs
            _note_template_forks(forks, mismatches)
        return finished

    async def _call_env(self, executor: concurrent.futures.Executor, fn: Callable[..., Any], *args: Any,
                        inline: bool = False, **kwargs: Any) -> Any:
        return await call_env(executor, self.config.step_timeout_s, fn, *args, inline=inline, **kwargs)

    async def _truncate(self, executor: concurrent.futures.Executor, env: Any, turns: list[Turn], inline: bool,
                        reason: str) -> dict[str, Any]:
        """The outcome of an episode ended at an engine limit, as its env scores a truncation; the reward still due
        goes on the last turn."""
        outcome, due = await self._call_env(executor, truncation_outcome, env, reason, inline=inline)
        pay_due_reward(turns, due)
        return outcome

    async def _episode(
        self, spec: EpisodeSpec, index: int, batcher: PolicyBatcher, pool: EnvPool,
        executor: concurrent.futures.Executor,
    ) -> Trajectory:
        cfg = self.config
        episode_id = f"{self._run_id}-{index}"
        t0 = time.perf_counter()
        policy_s = env_s = 0.0
        turns: list[Turn] = []
        outcome: dict[str, Any] = {}
        error: str | None = None
        env: Any = None
        keeper: EpisodeContext | None = None
        healthy = False
        task_id = spec.task.id if spec.task is not None else ""
        try:
            env = pool.take_idle(spec)
            if env is None:
                env = await call_env(executor, pool.build_timeout_s(), pool.build, spec, inline=pool.cheap_to_make(spec))
            options = {"task": spec.task} if spec.task is not None else None
            inline = bool(getattr(env.unwrapped, "cheap_steps", False))
            te = time.perf_counter()
            observation, info = await self._call_env(executor, env.reset, seed=spec.seed, options=options, inline=inline)
            env_s += time.perf_counter() - te
            task_id = info.get("task_id", task_id)
            self.policy.begin_episode(episode_id, env)
            agent = open_conversation(self.policy, cfg, info, observation)
            observation = text_of(observation)
            # decided once per episode, not per turn: without a tokenizer no context limit applies, and without a
            # seed every turn samples with the config's own parameters
            limited = cfg.max_context_tokens is not None and self.policy.tokenizer is not None
            fixed_sampling = cfg.sampling if cfg.sampling.seed is None else None
            # context strategy and token budgets: only episodes that have one pay for it
            keeper = EpisodeContext(cfg, self.policy, self.summarizer) if (
                cfg.context.rewrites or cfg.max_turn_tokens is not None or cfg.max_episode_tokens is not None) else None
            while True:
                if keeper is not None:
                    base = fixed_sampling if fixed_sampling is not None else self._sampling_for(spec, index, len(turns))
                    tp = time.perf_counter()
                    try:
                        summary = await keeper.compact(
                            agent, observation, base, episode_id, lambda request: batcher.submit(request, index),
                            lambda: self._call_env(executor, read_state_key, env, inline=inline))
                    except SummaryDidNotFit:  # a truncation like any prompt too long; the keeper keeps the note
                        outcome = await self._truncate(executor, env, turns, inline, "context_limit")
                        healthy = True
                        break
                    policy_s += time.perf_counter() - tp
                    if summary is not None:
                        turns.append(summary)
                    if keeper.spent():
                        outcome = await self._truncate(executor, env, turns, inline, "episode_token_limit")
                        healthy = True
                        break
                if limited and context_limit_reached(agent, self.policy, cfg):
                    outcome = await self._truncate(executor, env, turns, inline, "context_limit")
                    healthy = True
                    break
                sampling = fixed_sampling if fixed_sampling is not None else self._sampling_for(spec, index, len(turns))
                if keeper is not None:
                    sampling = keeper.capped(sampling)
                if cfg.constrain_actions:  # an env call like any other: a Ray env answers from its actor
                    choices = await self._call_env(executor, action_choices_of, env, inline=inline)
                    sampling = dataclasses.replace(sampling, choices=choices)
                tp = time.perf_counter()
                try:
                    generation = await batcher.submit(agent.request(sampling, episode_id), index)
                except ContextLengthExceeded as exc:  # the model refused the prompt as too long: a truncation
                    log_context_refusal(exc, turns_taken=len(turns))
                    outcome = await self._truncate(executor, env, turns, inline, "context_limit")
                    healthy = True
                    break
                policy_s += time.perf_counter() - tp
                if keeper is not None:
                    keeper.count(generation)
                    if keeper.cut(generation):  # the action ran out of max_turn_tokens: recorded, never stepped
                        prompt_ids, images, action_ids = record_action(self.policy, agent, generation)
                        turns.append(keeper.stamp(make_turn(observation, generation, 0.0,
                                                            {"turn": {"kind": "invalid", "calls": []}},
                                                            prompt_ids, action_ids, None, images)))
                        outcome = await self._truncate(executor, env, turns, inline, "turn_token_limit")
                        healthy = True
                        break
                step = apply_action_inline(self.policy, agent, env, observation, generation) if inline else \
                    await apply_action(self.policy, agent, env, observation, generation, executor, cfg.step_timeout_s,
                                       inline=False)
                env_s += step.env_s
                turns.append(step.turn if keeper is None else keeper.stamp(step.turn))
                observation = step.observation
                if step.outcome is not None:
                    outcome = step.outcome
                    healthy = outcome.get("end_reason") != "error"
                    break
                if keeper is not None and keeper.spent():
                    outcome = await self._truncate(executor, env, turns, inline, "episode_token_limit")
                    healthy = True
                    break
        except TimeoutError:
            error = (f"env call exceeded step_timeout_s={cfg.step_timeout_s} (counted from when it started running; "
                     "raise RolloutConfig.step_timeout_s if the env is slow but healthy)")
        except Exception as exc:  # noqa: BLE001 - an episode's failure must not end the others
            error = f"{type(exc).__name__}: {exc}"
            logger.debug("episode %s failed:\n%s", episode_id, traceback.format_exc())
        finally:
            self.policy.end_episode(episode_id)
            if env is not None:
                pool.finish(spec, env, healthy=healthy)
        metadata: dict[str, Any] = {}
        if error is not None:
            outcome = error_outcome()
        elif turns:
            metadata = final_state(agent, observation)
            if keeper is not None:
                metadata.update(keeper.metadata())
        timing = {"policy_s": policy_s, "env_s": env_s, "wall_s": time.perf_counter() - t0}
        return Trajectory(
            env_id=spec.env_id, task_id=task_id, seed=spec.seed, turns=tuple(turns), outcome=outcome,
            end_reason=str(outcome.get("end_reason", "error")), policy=self.policy.name, timing=timing,
            traj_id=episode_id, group_id=spec.group_id, error=error, metadata=metadata,
        )
