"""Context strategies: what an episode's conversation becomes when it grows too long to keep whole.

An episode is one growing conversation; a long-horizon task (50-200 turns) outgrows any model's context, and the
agents people train compact it. Each strategy here is a plain function of the message history that returns the
rewritten history (or ``None``: keep it as it is), so users replace it with their own (``strategy:
"package.module:function"``):

* ``full``: never rewrite (the episode ends with ``context_limit`` when the next turn would not fit);
* ``window``: the system prompt, the task and the last ``keep_turns`` turns (action and observation);
* ``drop_tool_outputs``: observations older than the latest ``keep_tool_outputs`` become a short stub;
* ``summarize``: the model writes a summary of the episode so far (in a turn of its own, a sampled action that
  trains with the episode's credit), and the episode continues from system prompt + task + summary + the latest
  observation (:func:`summary_history`).

A rewrite happens when the segment's context passes ``trigger_tokens`` (or holds ``trigger_turns`` turns); the
engine then starts a new *segment*, whose prompt is one fresh render of the rewritten history: the ids the model
conditions on from then on (see :class:`agentgym.trajectory.Turn` ``segment_index``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from agentgym.errors import ConfigError

__all__ = ["BUILTIN_STRATEGIES", "ContextConfig", "Rewrite", "drop_tool_outputs", "head_of", "resolve_strategy",
           "summary_history", "window"]

Messages = Sequence[Mapping[str, Any]]
#: A strategy: ``(messages, config) -> rewritten messages`` (ending with an observation) or ``None`` (no change).
Rewrite = Callable[[Messages, "ContextConfig"], "list[dict[str, Any]] | None"]

DEFAULT_SUMMARY_PROMPT = (
    "Your context is nearly full. Before acting, write a short summary of everything you will need later: the "
    "task, what you have found so far, and what is left to do. Reply with the summary only; the conversation "
    "will continue from it."
)
DEFAULT_STUB = "[older tool output removed to save context]"


@dataclass(frozen=True)
class ContextConfig:
    """How the rollout engine keeps an episode's context (``RolloutConfig.context``).

    Attributes:
        strategy: ``full`` | ``window`` | ``drop_tool_outputs`` | ``summarize``, or ``"package.module:function"``
            naming a function ``(messages, config) -> messages | None``.
        keep_turns: ``window``: turns (an action and its observation) kept after the task.
        keep_tool_outputs: ``drop_tool_outputs``: latest observations kept verbatim (at least the latest one,
            which the model answers next).
        stub: ``drop_tool_outputs``: what an older observation becomes.
        trigger_tokens: Rewrite when the segment's prompt plus a full turn passes this many tokens. ``None``: the
            engine's ``max_context_tokens`` (for ``summarize``, less room for the summary request and the summary,
            checked one turn ahead: the largest turn so far must still leave room for the request after it).
        trigger_turns: Rewrite when the segment holds this many turns (also for policies without a tokenizer,
            which count no tokens). ``None``: only the token trigger.
        summary_prompt: ``summarize``: appended to the latest observation to ask for the summary.
        summary_max_tokens: ``summarize``: the summary's token budget (``None``: the turn budget).
    """

    strategy: str = "full"
    keep_turns: int = 4
    keep_tool_outputs: int = 2
    stub: str = DEFAULT_STUB
    trigger_tokens: int | None = None
    trigger_turns: int | None = None
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT
    summary_max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, str) or not self.strategy:
            raise ConfigError(f"context.strategy must be one of {sorted(BUILTIN_STRATEGIES)} or "
                              f"'package.module:function', got {self.strategy!r}.")
        if self.strategy not in BUILTIN_STRATEGIES and ":" not in self.strategy:
            raise ConfigError(f"context.strategy {self.strategy!r} is not one of {sorted(BUILTIN_STRATEGIES)}; "
                              "name your own function as 'package.module:function'.")
        for name in ("keep_turns", "keep_tool_outputs"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ConfigError(f"context.{name} must be an integer >= 0, got {value!r}.")
        for name in ("trigger_tokens", "trigger_turns", "summary_max_tokens"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ConfigError(f"context.{name} must be a positive integer or null, got {value!r}.")

    @classmethod
    def coerce(cls, value: ContextConfig | Mapping[str, Any] | str | None) -> ContextConfig:
        """A config from YAML's forms: a strategy name, a mapping of these fields, or ``None`` (``full``)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(strategy=value)
        if isinstance(value, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ConfigError(f"context has unknown keys {unknown}; it takes {sorted(known)}.")
            return cls(**dict(value))
        raise ConfigError(f"context must be a strategy name, a mapping or null, got {type(value).__name__}.")

    @property
    def rewrites(self) -> bool:
        return self.strategy != "full"


def head_of(messages: Messages) -> list[dict[str, Any]]:
    """The part no strategy drops: the system prompt (if any) and the task (the first user message)."""
    head: list[dict[str, Any]] = []
    for message in messages:
        head.append(dict(message))
        if message.get("role") != "system":
            break
    return head


def window(messages: Messages, config: ContextConfig) -> list[dict[str, Any]] | None:
    """System prompt, task, and the last ``keep_turns`` turns; ``None`` when nothing would be dropped."""
    head = head_of(messages)
    rest = [dict(m) for m in messages[len(head):]]
    keep = 2 * config.keep_turns  # an action and the observation that answered it
    if len(rest) <= keep:
        return None
    tail = rest[len(rest) - keep:] if keep else rest[-1:]
    while tail and tail[0].get("role") != "assistant" and keep:  # start on an action (never orphan an answer)
        tail = tail[1:]
    if not tail or tail[-1].get("role") == "assistant":
        return None
    return head + tail


def drop_tool_outputs(messages: Messages, config: ContextConfig) -> list[dict[str, Any]] | None:
    """Observations older than the latest ``keep_tool_outputs`` become ``config.stub``; ``None`` when none is left
    to drop."""
    head = head_of(messages)
    out = head + [dict(m) for m in messages[len(head):]]
    observations = [i for i in range(len(head), len(out)) if out[i].get("role") != "assistant"]
    older = observations[:len(observations) - max(1, config.keep_tool_outputs)]  # the latest one is answered next
    changed = False
    for i in older:
        if out[i].get("content") != config.stub:
            out[i] = {**out[i], "content": config.stub}
            changed = True
    return out if changed else None


def summary_history(messages: Messages, summary: str) -> list[dict[str, Any]]:
    """What ``summarize`` continues from: system prompt and task, then one message with the summary and the latest
    observation (the one the summary request was appended to, without the request)."""
    head = head_of(messages)
    latest = dict(messages[-1]) if len(messages) > len(head) else {}
    role = latest.get("role", "user")
    content = latest.get("content", "")
    text = content if isinstance(content, str) else " ".join(
        str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    body = f"Summary of your progress so far:\n{summary.strip()}\n\nLatest observation:\n{text}"
    return head + [{"role": role, "content": body}]


def _summarize_marker(messages: Messages, config: ContextConfig) -> list[dict[str, Any]] | None:
    """``summarize`` is driven by the engine (the summary is a sampled turn); as a plain function it keeps the
    history unchanged."""
    return None


BUILTIN_STRATEGIES: dict[str, Rewrite | None] = {
    "full": None,
    "window": window,
    "drop_tool_outputs": drop_tool_outputs,
    "summarize": _summarize_marker,
}


def resolve_strategy(config: ContextConfig) -> Rewrite | None:
    """The function of ``config.strategy`` (``None`` for ``full``).

    Raises:
        ConfigError: A ``package.module:function`` that cannot be imported or is not callable.
    """
    if config.strategy in BUILTIN_STRATEGIES:
        return BUILTIN_STRATEGIES[config.strategy]
    module_name, _, attr = config.strategy.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"context.strategy {config.strategy!r} cannot be imported ({exc}); name an installed "
                          "module and a function in it as 'package.module:function'.") from exc
    if not callable(fn):
        raise ConfigError(f"context.strategy {config.strategy!r} is not callable; it must be a function "
                          "(messages, config) -> messages | None.")
    return fn
