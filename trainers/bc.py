"""Behaviour cloning warm start: maximise the likelihood of demonstration actions.

Demonstrations are rollouts of each env's reference solver (optionally mixed with its shortcut solver,
to make an imperfect teacher), recorded through the same engine and ChatAgent as RL rollouts, so their
token views, templates and loss masks are exactly those the policy will see during GRPO.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from agentgym.policies import ReferencePolicy, SamplingParams
from agentgym.utils.progress import track
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.rollout.context import ContextConfig
from agentgym.suite import TaskSuite
from agentgym.trainers.batch import build_batch, sequence_logprobs, vision_inputs
from agentgym.trainers.interrupt import BCInterrupted
from agentgym.trainers.seeding import mix_seed
from agentgym.utils.cpu_threads import SlowStepWatch
from agentgym.trajectory import Trajectory

__all__ = ["behaviour_clone", "collect_demonstrations"]

logger = logging.getLogger(__name__)


def collect_demonstrations(suite: TaskSuite, split: str, count: int, tokenizer: Any, *, shortcut_fraction: float = 0.0,
                           seed: int = 0, system_prompt: str | None = None, processor: Any = None,
                           policy: ReferencePolicy | None = None, max_in_flight: int = 256,
                           max_context_tokens: int | None = None,
                           context: ContextConfig | Mapping[str, Any] | str | None = None,
                           max_action_tokens: int | None = None) -> list[Trajectory]:
    """Reference-solver (and optionally shortcut) episodes on the first ``count`` tasks of ``split``.

    With a vision-language model's ``processor``, the demonstrations see what the VLM will see: image
    observations become image content parts expanded to the model's image tokens, and each trajectory keeps its
    screenshots, so :func:`behaviour_clone` scores the actions given the pixels. ``policy`` replaces the plain
    :class:`ReferencePolicy` (e.g. one that rewrites the solver's actions into another action space).
    ``max_in_flight`` bounds the episodes run at once (browser envs on a small machine need few).
    ``max_context_tokens`` ends a demonstration where the learner's own episodes will end (the rollout's context
    limit), so cloning never trains on contexts longer than the policy will see, nor past the model's positions.
    ``context`` (the rollouts' context strategy, e.g. ``{"strategy": "window", "keep_turns": 4}``) rewrites the
    demonstrations' history as the learner's episodes will be rewritten, so the policy clones actions from the
    contexts it will act in (each rewrite starts a segment, a row of its own in :func:`behaviour_clone`).
    ``max_action_tokens`` (the tokens a turn may sample): demonstrated actions longer than that are counted and
    logged as a warning with the fix, since the policy's own turns are cut there and can never produce them.
    """
    tasks = suite.split(split)[:count]
    specs = [EpisodeSpec(suite.env_id, task=t, seed=seed + i, env_kwargs=dict(suite.env_kwargs)) for i, t in enumerate(tasks)]
    if policy is None:
        policy = ReferencePolicy(tokenizer=tokenizer, shortcut_fraction=shortcut_fraction, seed=seed)
    if processor is not None:  # a scripted teacher reads no pixels; the recorded prompts must carry them all the same
        policy.accepts_images, policy.processor = True, processor
    config = RolloutConfig(max_in_flight=max_in_flight, sampling=SamplingParams(max_tokens=1), system_prompt=system_prompt,
                           deterministic=True, max_context_tokens=max_context_tokens, context=context)
    demos = [d for d in RolloutEngine(policy, config).run(specs) if d.error is None and d.has_tokens]
    if max_action_tokens is not None:
        _warn_of_long_actions(demos, max_action_tokens, suite.name)
    return demos


def _warn_of_long_actions(demos: Sequence[Trajectory], limit: int, suite: str) -> None:
    """Log how many demonstrated actions a turn of ``limit`` tokens would cut (the policy cannot learn to finish
    them: its own turns stop at the limit, mid-call)."""
    lengths = [len(t.action_token_ids) for d in demos for t in d.turns if t.action_token_ids]
    long = [n for n in lengths if n > limit]
    if long:
        logger.warning("%s: %d of %d demonstrated actions are longer than the %d tokens a turn may sample (longest "
                       "%d): the policy's turns are cut there, so it can never produce them; raise the turn limit "
                       "(max_tokens_per_turn) to at least %d", suite, len(long), len(lengths), limit, max(long),
                       max(long))


def behaviour_clone(model: Any, tokenizer: Any, demonstrations: Sequence[Trajectory], *, steps: int, learning_rate: float,
                    batch_size: int, seed: int, device: str = "cpu",
                    log: Callable[[int, dict[str, float]], None] | None = None,
                    progress: bool | str = "auto", processor: Any = None, start: int = 0,
                    critical: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
                    threads: int | None = None,
                    forward_context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext) -> dict[str, float]:
    """Train ``model`` in place with token-mean cross-entropy on the demonstrations' action tokens.

    Demonstrations with images (collected with a VLM's ``processor``) are scored with their pixel values,
    so ``processor`` is then required (:func:`agentgym.trainers.batch.vision_inputs` says so otherwise).

    Every 25th step (and the last) is logged as ``BC step N/STEPS`` (1-based) and handed to ``log`` with its
    0-based index; ``progress`` draws a step bar (see :mod:`agentgym.utils.progress`).

    Interruption: each step's update runs inside ``critical()`` (e.g.
    :meth:`agentgym.trainers.interrupt.InterruptGuard.critical`), and a ``KeyboardInterrupt`` leaves as
    :class:`~agentgym.trainers.interrupt.BCInterrupted` with the steps completed, so the caller can save them and a
    later call continue from ``start`` (with a fresh optimizer state and its own sampling seed). ``threads``: the
    torch CPU threads in use, for the slow-step hint (:class:`agentgym.utils.cpu_threads.SlowStepWatch`).
    ``forward_context``: what the forward runs in (the trainer's mixed precision, :mod:`agentgym.trainers.precision`).
    """
    if not demonstrations:
        raise ValueError("behaviour_clone got no demonstrations; check the suite's reference solver.")
    batch = build_batch(demonstrations, [0.0] * len(demonstrations), [True] * len(demonstrations),
                        pad_id=int(tokenizer.pad_token_id or 0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed if start == 0 else mix_seed(seed, start))
    model.train()
    started = time.perf_counter()
    loss_value = float("nan")
    watch = SlowStepWatch("a BC step", threads=threads or torch.get_num_threads()) if device == "cpu" else None
    completed = start
    try:
        for step in track(range(start, steps), "BC steps", enabled=progress, unit="step", completed=start):
            rows = torch.randint(len(batch), (min(batch_size, len(batch)),), generator=generator)
            mb = batch.select(rows)
            ids, attn, mask = mb.input_ids.to(device), mb.attention_mask.to(device), mb.loss_mask.to(device)
            if watch is not None:
                watch.start()
            with critical():
                with forward_context():
                    logp = sequence_logprobs(model, ids, attn, vision=vision_inputs(mb, processor, device))
                    loss = -(logp * mask).sum() / mask.sum().clamp(min=1.0)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                completed = step + 1
                loss_value = float(loss.item())
                if watch is not None:
                    watch.stop()
                if step % 25 == 0 or step == steps - 1:
                    logger.info("BC step %d/%d: loss %.4f", step + 1, steps, loss_value)
                    if log is not None:
                        log(step, {"bc/loss": loss_value, "bc/elapsed_s": time.perf_counter() - started})
    except KeyboardInterrupt:
        model.eval()
        raise BCInterrupted(completed) from None
    model.eval()
    return {"bc/final_loss": loss_value, "bc/seconds": time.perf_counter() - started, "bc/demonstrations": len(batch)}
