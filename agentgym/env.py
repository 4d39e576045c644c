"""The environment base class every agentgym env derives from.

:class:`AgentEnv` implements the turn loop once, so that every family behaves the same way:
the raw model text is parsed into tool calls, the calls run through the env's :class:`ToolSet`, and the
turn is classified (``tool_call | answer | void | invalid``). Model mistakes never raise: they become an
error observation that says the fix. Infrastructure failures (:class:`EnvCrashed`) end the episode with
``end_reason="error"``.

A family implements a handful of hooks: ``_build_tools``, ``_sample_task``, ``_begin_episode``,
``_task_instructions`` and (optionally) ``_build_parser`` and ``reference_solver``. Tools end the episode by
calling :meth:`AgentEnv.finish` and may add named reward components with :meth:`AgentEnv.add_reward`.

The reward rule (one definition of return, the same for every env): **the step rewards of an episode sum to
its outcome score**. ``add_reward`` pays credit early (progress, penalties); ``finish(success, score)`` fixes
the outcome score (``float(success)`` when no score is given; 0.0 when the episode is truncated without
``finish``); on the episode's last step the env pays the remainder, ``score - (rewards paid so far)``, as the
reward component ``"outcome"``. So ``add_reward`` moves credit in time but never changes the return, and the
return a Gymnasium user sums equals ``outcome["score"]``, the number the trainers use. The rollout engine's
context limit ends an episode between two steps; :meth:`AgentEnv.truncate_episode` then gives the outcome any
truncation gets from the env and the remainder, which the engine adds to the episode's last turn.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from agentgym.errors import AgentGymError, EnvCrashed, TaskError
from agentgym.parsers import (
    BareNameParser,
    CodeBlockParser,
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    ParsedAction,
    TagParser,
    ToolCallParser,
)
from agentgym.rewards.env_reward import score_episode, with_reward_kwarg
from agentgym.rewards.rubric import Rubric
from agentgym.spaces import UnicodeText
from agentgym.suite import Task
from agentgym.toolset import ToolCall, ToolResult, ToolSet

__all__ = ["AgentEnv", "OutcomeOnTimeLimit", "ReferenceSolver", "accepted_formats", "fork_env"]

ReferenceSolver = Callable[[str], str]
"""Given the latest observation, return the next action text (stateful, one per episode)."""


class AgentEnv(gym.Env[str, str]):
    """Gymnasium env whose actions are raw model text and whose observations are text.

    Parsing: by default every env reads Hermes ``<tool_call>`` blocks, the Llama 3.1 JSON and Mistral
    ``[TOOL_CALLS]`` native formats and function-call strings (``answer("x")``) for its own tools; override
    ``_build_parser`` to narrow or widen that. A reply with no call is a ``void`` turn whose observation lists
    the accepted formats with one example each.

    Rewards: the step rewards of an episode sum to ``info["outcome"]["score"]``. ``add_reward`` pays credit
    early; ``finish(success, score)`` sets the score; the last step pays the remainder as the ``"outcome"``
    component (see the module docstring).

    Args:
        max_turns: Turns before the episode is truncated (``end_reason="max_turns"``).
        tasks: Tasks to draw from on ``reset``; without it the env generates a task from the seed.
        max_action_chars: Longer actions are rejected as ``invalid`` (protects parsers and tools).
        max_calls_per_turn: Extra calls in one action are ignored and reported.
        render_mode: ``"ansi"`` renders the transcript as text.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: One-line description for ``agentgym list``.
    description: ClassVar[str] = ""
    #: Extra text for the instructions describing the family-native action formats.
    native_format_hint: ClassVar[str] = ""
    #: True when construction, reset and step are pure in-process computation taking microseconds (no I/O, no
    #: subprocess, no sleeping). The rollout engine then builds and calls such envs inline on its event loop
    #: instead of paying a worker-thread round trip per call; anything that can block must leave this False.
    #: Set it on the class: the engine reads the registered class's value before building an instance.
    cheap_steps: ClassVar[bool] = False
    #: True when :meth:`fork` works: the episode state is plain in-process data that ``copy.deepcopy``
    #: duplicates (no subprocess, socket, browser page or sandbox handle). Branching samplers (ARPO) copy
    #: such envs mid-episode; others are rebuilt by replaying the episode's actions from the same seed.
    forkable: ClassVar[bool] = False
    #: The rubric that scores episodes instead of the checker alone (``gym.make(id, reward=rubric)``); ``None``
    #: keeps the checker's score. See :mod:`agentgym.rewards.env_reward`.
    reward_rubric: Rubric | None = None

    @classmethod
    def prepare_tasks(cls, tasks: Sequence[Task]) -> None:
        """Build what these tasks' episodes need and do not have yet (generated game files, say), before any of
        them starts. The rollout engines call it once a run with the run's tasks of this class, on a worker
        thread and outside ``RolloutConfig.step_timeout_s``: work that takes seconds a task, done inside
        ``reset`` by hundreds of episodes at once on a few cores, would exceed any step timeout. The default
        builds nothing (the env prepares what it needs in ``reset``)."""

    # Marks the default: callers skip classes that keep it (no thread, no call) without importing this module.
    prepare_tasks.__func__.builds_nothing = True  # type: ignore[attr-defined]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every family takes ``reward=`` (a rubric or ``"module:name"``) without declaring it in its own
        ``__init__``, so a rubric can score any env, ours or a user's."""
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_takes_reward", False):
            cls.__init__ = with_reward_kwarg(init)  # type: ignore[method-assign]

    def __init__(
        self,
        *,
        max_turns: int = 10,
        tasks: Sequence[Task] | None = None,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int = 4,
        render_mode: str | None = None,
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}.")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}.")
        self.max_turns = int(max_turns)
        self.max_action_chars = int(max_action_chars)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.render_mode = render_mode
        self._tasks: dict[str, Task] = {t.id: t for t in tasks} if tasks else {}
        self._task_order: list[str] = list(self._tasks)
        self.observation_space = UnicodeText()
        self.action_space = UnicodeText()
        self.toolset: ToolSet = self._build_tools()
        self.parser: ToolCallParser = self._build_parser()
        self.task: Task | None = None
        self._turn = 0
        self._started = False
        self._closed = False
        self._transcript: list[tuple[str, str]] = []
        self._time_limit: int | None = None
        self._reset_episode_state()

    # ---- hooks for families --------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        raise NotImplementedError

    def _build_parser(self) -> ToolCallParser:
        """Every common format for this env's tools: Hermes ``<tool_call>`` with the Llama 3.1 JSON and Mistral
        native forms, and function-call strings such as ``answer("x")``, so one agent prompt works in every env
        (ours and a user's). Override to narrow it or to add a family format (code blocks, tags)."""
        return CompositeParser([HermesParser(), FunctionCallParser(self.toolset.names)])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        """Generate a task from the env's own RNG (used when no task is given and no task list is set)."""
        raise NotImplementedError

    def _begin_episode(self, task: Task) -> str:
        """Set up episode state for ``task`` and return the first observation."""
        raise NotImplementedError

    def _task_instructions(self) -> str:
        """What the agent must do in this family (the tool list and formats are appended)."""
        raise NotImplementedError

    def reference_solver(self) -> ReferenceSolver:
        """A solver for the current episode: observation -> next action. Proves suites solvable."""
        raise NotImplementedError(f"{type(self).__name__} has no reference solver.")

    def shortcut_solver(self) -> ReferenceSolver:
        """A plausible but wrong way to act (e.g. answering without using the tools).

        Used to build imperfect demonstrations for warm-start experiments, so that RL has a local decision
        to fix (whether to use a tool). Families without an obvious shortcut need not implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} has no shortcut solver.")

    # ---- helpers for tools ---------------------------------------------------------------------
    def finish(self, *, success: bool, score: float | None = None, reason: str = "answered") -> None:
        """End the episode after this turn (``terminated=True``) with this outcome.

        ``score`` (default ``float(success)``) is the episode's return: the step that ends the episode pays
        ``score`` minus the rewards already paid, as the ``"outcome"`` reward component.
        """
        self._finished = True
        self._success = bool(success)
        self._score = float(success) if score is None else float(score)
        self._end_reason = reason

    def add_reward(self, name: str, value: float) -> None:
        """Pay a named reward component on the current step.

        This moves credit earlier in the episode; it does not change the return, which is the outcome score
        (the last step pays the remainder). To change what an episode is worth, pass ``score`` to :meth:`finish`.
        """
        self._step_rewards[name] = self._step_rewards.get(name, 0.0) + float(value)

    def mark_answer(self) -> None:
        """Classify the current turn as an ``answer`` turn."""
        self._answered_this_turn = True

    # ---- gymnasium API -------------------------------------------------------------------------
    def _reset_episode_state(self) -> None:
        self._finished = False
        self._success = False
        self._score = 0.0
        self._end_reason = ""
        self._step_rewards: dict[str, float] = {}
        self._paid = 0.0
        self._answered_this_turn = False

    def _resolve_task(self, options: Mapping[str, Any] | None) -> Task:
        options = dict(options or {})
        unknown = set(options) - {"task", "task_id"}
        if unknown:
            raise AgentGymError(f"Unknown reset option(s) {sorted(unknown)}; use {{'task': Task}} or {{'task_id': str}}.")
        if "task" in options:
            task = options["task"]
            if isinstance(task, Mapping):
                task = Task.from_dict(task)
            if not isinstance(task, Task):
                raise TaskError(f"options['task'] must be a Task or a task dict, got {type(task).__name__}.")
            return task
        if "task_id" in options:
            task_id = options["task_id"]
            if task_id not in self._tasks:
                from agentgym.errors import did_you_mean

                raise TaskError(
                    f"Unknown task_id {task_id!r}.{did_you_mean(str(task_id), self._tasks)} "
                    "Pass tasks=... when making the env, or pass options={'task': Task(...)}."
                )
            return self._tasks[task_id]
        if self._tasks:
            return self._tasks[self._task_order[int(self.np_random.integers(len(self._task_order)))]]
        return self._sample_task(self.np_random)

    def instructions(self) -> str:
        """The system prompt: the task family's rules, the tools, and the exact action format."""
        tool_lines = "\n".join(json.dumps(s["function"], ensure_ascii=False) for s in self.toolset.schemas())
        example = self.toolset.names[0]
        parts = [
            self._task_instructions().strip(),
            "Tools:\n" + tool_lines,
            "Call a tool by writing <tool_call>{\"name\": \"TOOL\", \"arguments\": {...}}</tool_call> "
            f"(for example <tool_call>{{\"name\": \"{example}\", \"arguments\": {{...}}}}</tool_call>).",
        ]
        if self.native_format_hint:
            parts.append(self.native_format_hint.strip())
        return "\n\n".join(parts)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        if self._closed:
            raise AgentGymError(f"{type(self).__name__} is closed; make a new env with gym.make(...).")
        self._reset_episode_state()
        self.task = self._resolve_task(options)
        observation = self._begin_episode(self.task)
        self._turn = 0
        self._started = True
        self._transcript = [("observation", observation)]
        info = {
            "task_id": self.task.id,
            "instructions": self.instructions(),
            "tools": self.toolset.schemas(),
            "max_turns": self.turn_limit,
        }
        return observation, info

    @property
    def turn_limit(self) -> int:
        """Turns before truncation: ``max_turns``, or a wrapping ``TimeLimit``'s step limit when that is smaller."""
        return self.max_turns if self._time_limit is None else min(self.max_turns, self._time_limit)

    def align_with_time_limit(self, max_episode_steps: int | None) -> None:
        """Truncate at a wrapping ``TimeLimit``'s limit too (see :class:`OutcomeOnTimeLimit`)."""
        self._time_limit = None if max_episode_steps is None else int(max_episode_steps)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._require_running("step()")
        self._step_rewards = {}
        self._answered_this_turn = False
        self._turn += 1
        turn_info: dict[str, Any] = {"index": self._turn - 1, "calls": [], "errors": [], "tool_errors": []}
        try:
            observation, kind = self._run_action(action, turn_info)
        except EnvCrashed as exc:
            observation, kind = f"Error: the environment crashed ({exc}); the episode ends.", "invalid"
            self.finish(success=False, score=0.0, reason="error")
            turn_info["errors"].append(str(exc))
        turn_info["kind"] = kind
        terminated = self._finished
        truncated = not terminated and self._turn >= self.turn_limit
        if truncated:
            self._end_reason = "max_turns"
        rubric_outcome: dict[str, Any] = {}
        if terminated or truncated:
            if self.reward_rubric is not None:
                rubric_outcome = score_episode(self, action, observation, turn_info["calls"])
            self._pay_outcome()
        turn_info["rewards"] = dict(self._step_rewards)
        reward = float(sum(self._step_rewards.values()))
        self._paid += reward
        info: dict[str, Any] = {"turn": turn_info}
        if terminated or truncated:
            info["outcome"] = {"success": self._success, "score": self._score, "end_reason": self._end_reason,
                               **rubric_outcome}
        self._transcript.append(("action", action if isinstance(action, str) else repr(action)))
        self._transcript.append(("observation", observation))
        return observation, reward, terminated, truncated, info

    def _require_running(self, call: str) -> None:
        """Refuse ``call`` outside a running episode, with the fix."""
        if not self._started:
            raise AgentGymError(f"Call reset() before {call}: the episode has not started.")
        if self._finished or self._turn >= self.turn_limit:
            raise AgentGymError("The episode is over (terminated or truncated); call reset() to start a new one.")

    def truncate_episode(self, reason: str) -> tuple[dict[str, Any], float]:
        """End the episode from outside, between two steps (the rollout engine's context limit): ``(outcome,
        reward still due)``.

        The outcome is the one this env gives any truncated episode (a turn-limit truncation gets the same; e.g.
        TextWorld keeps the points earned), with ``reason`` as its ``end_reason``. Under the reward rule the last
        step pays the score minus the rewards already paid; there is no step here, so that remainder is returned
        for the caller to add to the episode's last turn, and the rewards still sum to the score.
        """
        self._require_running("truncate_episode()")
        self._step_rewards = {}
        self._end_reason = reason
        self._pay_outcome()
        due = float(sum(self._step_rewards.values()))
        self._paid += due
        self._step_rewards = {}
        self._turn = self.turn_limit  # over: a further step is refused like one after any truncation
        return {"success": self._success, "score": self._score, "end_reason": reason}, due

    def _pay_outcome(self) -> None:
        """The reward rule: on the last step, pay what is left of the outcome score as ``"outcome"``."""
        remainder = self._score - (self._paid + float(sum(self._step_rewards.values())))
        if abs(remainder) > 1e-12:
            self._step_rewards["outcome"] = self._step_rewards.get("outcome", 0.0) + remainder

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        """Parse and execute one action; return (observation, turn kind)."""
        if not isinstance(action, str):
            turn_info["errors"].append("action is not a string")
            return f"Error: the action must be text (a str), got {type(action).__name__}.", "invalid"
        if len(action) > self.max_action_chars:
            turn_info["errors"].append("action too long")
            return (
                f"Error: your reply has {len(action)} characters; the limit is {self.max_action_chars}. "
                "Reply with a short tool call.",
                "invalid",
            )
        try:
            parsed: ParsedAction = self.parser.parse(action)
        except Exception as exc:  # noqa: BLE001 - a parser bug must not crash on model text
            turn_info["errors"].append(f"parser failed: {type(exc).__name__}")
            return f"Error: your reply could not be read ({type(exc).__name__}). " + self._format_reminder(), "invalid"

        turn_info["errors"].extend(parsed.errors)
        if not parsed.calls:
            if parsed.errors:
                return "Error: " + " ".join(parsed.errors) + " " + self._format_reminder(), "invalid"
            return "No tool call found in your reply. " + self._format_reminder(), "void"
        calls = list(parsed.calls)
        notes: list[str] = []
        if len(calls) > self.max_calls_per_turn:
            notes.append(f"Only the first {self.max_calls_per_turn} tool calls of a turn run; {len(calls) - self.max_calls_per_turn} ignored.")
            calls = calls[: self.max_calls_per_turn]
        results: list[tuple[ToolCall, ToolResult]] = []
        for call in calls:
            if self._finished:
                notes.append(f"The episode ended before {call.name} ran; it was ignored.")
                break
            result = self.toolset.call(call)
            results.append((call, result))
            turn_info["calls"].append(call.to_dict())
            if result.is_error:
                turn_info["tool_errors"].append(result.content)
        observation = self._format_results(results, notes)
        if results and all(r.is_error for _, r in results):
            kind = "invalid"
        elif self._answered_this_turn:
            kind = "answer"
        else:
            kind = "tool_call"
        return observation, kind

    def _format_results(self, results: Sequence[tuple[ToolCall, ToolResult]], notes: Sequence[str]) -> str:
        if len(results) == 1 and not notes:
            return results[0][1].content
        lines = [f"[{call.name}] {result.content}" for call, result in results]
        return "\n".join(lines + list(notes))

    def _format_reminder(self) -> str:
        """Which formats this env's parser accepts, one example each (shown after a void or invalid turn)."""
        names = ", ".join(self.toolset.names)
        examples = accepted_formats(self.parser, self.toolset)
        return f"Call one of the tools ({names}). Accepted formats: " + "; ".join(examples) + "."

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"{'>>' if who == 'action' else '<<'} {text}" for who, text in self._transcript)

    def action_choices(self) -> tuple[str, ...] | None:
        """Every reply that is a valid action now, when that set is small and known; ``None`` for free text.

        Constrained decoding (``RolloutConfig.constrain_actions``) samples replies only from these, so no turn is
        void and format tokens carry no gradient. The default enumerates the tools when each takes no argument
        (``forward()``) or one argument restricted to a list of values (``move("up")``), in the function-call
        format every env parses and the reference solvers write; any other tool makes the set open (``None``).
        Envs whose valid actions depend on the state override it.
        """
        choices: list[str] = []
        for name in self.toolset.names:
            schema = self.toolset[name].parameters
            properties = dict(schema.get("properties") or {})
            if not properties:
                choices.append(f"{name}()")
                continue
            values = next(iter(properties.values())).get("enum") if len(properties) == 1 else None
            if not values or list(schema.get("required") or ()) != list(properties):
                return None
            choices += [f"{name}({json.dumps(v, ensure_ascii=False)})" for v in values]
        return tuple(choices) or None

    def state_key(self) -> str:
        """A text key for the env state the next action starts from; equal keys mean "the same state".

        Step-level credit assignment (GiGPO's anchor-state groups) compares the actions taken from identical
        env states within a task group, so the key describes the *state*, not the path that led to it: no
        history, no turn count, no echo of the last action's message. The default is the raw current
        observation text (for dict observations, its ``"text"``), which is right when the observation shows the
        whole state; families override it with their internal state (maze position, page URL and form values,
        board position). The key must be deterministic (same seed and actions, same keys), cheap (built from
        in-process data, never a sandbox or network call) and is never shown to the policy: it is not put in
        observations or ``info``. Read it through wrappers as ``env.unwrapped.state_key()``.
        """
        if not self._transcript:
            return ""
        observation = self._transcript[-1][1]
        if isinstance(observation, Mapping):
            return str(observation.get("text", ""))
        return observation if isinstance(observation, str) else str(observation)

    def fork(self) -> AgentEnv:
        """An independent copy of this env in the same mid-episode state (same task, history and RNG).

        Stepping the copy never affects the original, and both answer the same action identically.
        Families whose state lives outside the process (sandboxes, browsers) leave ``forkable`` False;
        callers then replay the actions on a fresh env instead (the determinism check of
        :func:`~agentgym.testing.check_agent_env` is what makes that replay exact).

        Raises:
            NotImplementedError: The family is not forkable.
        """
        if not self.forkable:
            raise NotImplementedError(
                f"{type(self).__name__} cannot be forked (its state is not in-process); replay the episode's "
                "actions on a fresh env with the same seed and task instead."
            )
        return copy.deepcopy(self)

    def close(self) -> None:
        self._closed = True
        super().close()

    @property
    def turn(self) -> int:
        """Turns taken in the current episode."""
        return self._turn


def accepted_formats(parser: ToolCallParser, toolset: ToolSet) -> list[str]:
    """One example per tool-call format ``parser`` reads, written for the first tool of ``toolset``.

    Used in void-turn observations so that a model (or a person reading its transcript) learns why a reply
    did nothing. Parsers this function does not know are described generically.
    """
    first = next(iter(toolset), None)
    name = first.name if first is not None else "TOOL"
    params = first.parameter_names if first is not None else []
    args = json.dumps({params[0]: "..."}) if params else "{}"
    parsers = parser.parsers if isinstance(parser, CompositeParser) else [parser]
    out: list[str] = []
    for p in parsers:
        if isinstance(p, HermesParser):
            out.append(f'Hermes <tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>')
            if p.native:
                out.append(f'Llama 3.1 JSON {{"name": "{name}", "parameters": {args}}}')
                out.append(f'Mistral [TOOL_CALLS][{{"name": "{name}", "arguments": {args}}}]')
        elif isinstance(p, FunctionCallParser):
            tool_name = name if name in p.tool_names else (p.tool_names[0] if p.tool_names else name)
            out.append(f'function call {tool_name}("...")' if params else f"function call {tool_name}()")
        elif isinstance(p, BareNameParser):
            out.append(f"just the action's name, e.g. {name if name in p.tool_names else p.tool_names[0]}")
        elif isinstance(p, TagParser):
            tag = next(iter(p.tags), "answer")
            out.append(f"tag <{tag}>...</{tag}>")
        elif isinstance(p, CodeBlockParser):
            out.append(f"a ```python code block (runs {p.tool})")
        else:
            out.append(f"the {type(p).__name__} format")
    return out


def fork_env(env: gym.Env[Any, Any]) -> gym.Env[Any, Any]:
    """Fork an env as ``gym.make`` returns it: the wrappers (time limit, order enforcing) are copied with
    their counters around the unwrapped env's own :meth:`AgentEnv.fork`.

    Raises:
        NotImplementedError: The env is not forkable (see :attr:`AgentEnv.forkable`).
    """
    inner = env.unwrapped
    if not getattr(inner, "forkable", False):
        raise NotImplementedError(f"{type(inner).__name__} is not forkable; replay its actions on a fresh env instead.")
    return copy.deepcopy(env, memo={id(inner): inner.fork()})


class OutcomeOnTimeLimit(gym.Wrapper[Any, Any, Any, Any], gym.utils.RecordConstructorArgs):
    """Lets an :class:`AgentEnv` end a ``TimeLimit``-truncated episode itself, with ``info["outcome"]``.

    ``gym.make(id, max_episode_steps=N)`` and ``gym.make_vec`` wrap the env in Gymnasium's ``TimeLimit``, which
    sets ``truncated=True`` after ``N`` steps without telling the env: the last step's ``info`` then has no
    ``outcome`` and the env never pays the outcome remainder (so the rewards would not sum to the score).
    Registered as an additional wrapper (outside ``TimeLimit``), this wrapper finds the ``TimeLimit`` inside it
    on every ``reset`` and hands its limit to the env, which then truncates on that same step as usual
    (``end_reason="max_turns"``). Envs that are not :class:`AgentEnv` pass through untouched.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        gym.utils.RecordConstructorArgs.__init__(self)
        gym.Wrapper.__init__(self, env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        align = getattr(self.env.unwrapped, "align_with_time_limit", None)
        if align is not None:
            align(_time_limit_inside(self.env))
        return self.env.reset(seed=seed, options=options)


def _time_limit_inside(env: gym.Env[Any, Any]) -> int | None:
    """The smallest ``max_episode_steps`` of the ``TimeLimit`` wrappers around ``env.unwrapped`` (None: none)."""
    limits = []
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            limits.append(int(env._max_episode_steps))
        env = env.env
    return min(limits) if limits else None
