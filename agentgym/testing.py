"""Conformance checks every registered environment must pass.

:func:`check_agent_env` bundles the three checks the design requires of every env id: Gymnasium's own
``check_env`` (unmodified), determinism under replay (the rollout engine branches by replaying actions,
so a non-deterministic env silently corrupts ARPO/GRPO groups), and a Hypothesis fuzz of garbage actions
(model mistakes must be data, never crashes). Env authors call it from one test per id.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.errors import AgentGymError, DependencyNotInstalled
from agentgym.trajectory import END_REASONS, TURN_KINDS, jsonable

__all__ = ["EnvCheckError", "check_agent_env", "garbage_actions"]

_HUGE_ACTION = "A" * 200_000

#: Fixed adversarial actions: each one has broken a parser or a tool somewhere before.
_MALFORMED: tuple[str, ...] = (
    "",
    " ",
    "\x00",
    "\x00" * 64,
    "<tool_call>",
    "<tool_call>{",
    "</tool_call>",
    "<tool_call></tool_call>",
    "<tool_call>[]</tool_call>",
    "<tool_call>null</tool_call>",
    '<tool_call>{"name": 5}</tool_call>',
    '<tool_call>{"name": null, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "no_such_tool", "arguments": {}}</tool_call>',
    '<tool_call>{"name": "x", "arguments": "not json"}</tool_call>',
    '<tool_call>{"name": "x", "arguments": [1, 2]}</tool_call>',
    "<tool_call><tool_call>{}</tool_call></tool_call>",
    "<tool_call>" + "[" * 5000 + "</tool_call>",
    '<tool_call>{"name": "x", "arguments": {"a": ' + "9" * 5000 + "}}</tool_call>",
    "```python\nprint(1)\n```",
    "```python\nwhile True: pass",
    "<answer></answer>",
    "<answer>" * 50,
    "x(" * 2000,
    ")" * 2000,
    "\ud7ff\ue000\U0010ffff",
    "\u202e\u200b\ufeff",
)


def garbage_actions(tool_names: Sequence[str] = ()) -> list[str]:
    """Fixed malformed actions, plus tool-specific ones for ``tool_names`` (wrong, missing, extra args)."""
    actions = list(_MALFORMED)
    for name in tool_names:
        actions += [
            f"{name}(",
            f"{name}()",
            f"{name}(((((((",
            f"{name}(" + "(" * 300 + ")" * 300 + ")",
            f"{name}(**{{}})",
            f"{name}(1, 2, 3, 4)",
            f"{name}(" + "9" * 5000 + ")",
            f'{name}("' + "\\" * 99 + '")',
            f"{name}(lambda: 0)",
            f"{name}([[[[[[[[[[]]]]]]]]]])",
            f'<tool_call>{{"name": "{name}"}}</tool_call>',
            f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>',
            f'<tool_call>{{"name": "{name}", "arguments": {{"__no_such_arg__": 1}}}}</tool_call>',
            f'<tool_call>{{"name": "{name}", "arguments": null}}</tool_call>',
            f'<tool_call>{{"name": "{name}", "arguments": {{"x": {{"y": [null, true, 1e308, -0.0]}}}}}}</tool_call>',
            f'<tool_call>{{"name": "{name.upper()}", "arguments": {{}}}}</tool_call>',
            f'<tool_call>{{"name": "{name}x", "arguments": {{}}}}</tool_call>',
            f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>' * 20,
        ]
    return actions


class EnvCheckError(AgentGymError, AssertionError):
    """An environment broke the agentgym env contract; the message says which step and which action."""


def _fail(env_id: str, what: str, action: Any = None) -> EnvCheckError:
    where = "" if action is None else f" (action {_short(action)})"
    return EnvCheckError(f"{env_id}: {what}{where}.")


def _short(action: Any, limit: int = 160) -> str:
    text = repr(action)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars in repr)"


def _dump(value: Any) -> str:
    return json.dumps(jsonable(value), sort_keys=True, ensure_ascii=True, default=repr)


def _make(env_id: str, env_kwargs: Mapping[str, Any]) -> Any:
    import gymnasium as gym

    return gym.make(env_id, **dict(env_kwargs))


# ---- (a) gymnasium's checker ------------------------------------------------------------------
def _run_gymnasium_checker(env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    from gymnasium.utils.env_checker import check_env

    env = _make(env_id, env_kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
    except Exception as exc:
        raise _fail(env_id, f"gymnasium check_env failed: {type(exc).__name__}: {exc}") from exc
    finally:
        env.close()
    for warning in caught:
        # Gymnasium's warnings are advice, not failures; re-emit them so the caller still sees them.
        warnings.warn(f"{env_id}: gymnasium check_env: {warning.message}", UserWarning, stacklevel=3)


# ---- shared per-step contract ------------------------------------------------------------------
def _check_step(env_id: str, env: Any, action: Any, result: Any) -> tuple[bool, bool]:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise _fail(env_id, f"step() must return a 5-tuple, got {type(result).__name__}", action)
    obs, reward, terminated, truncated, info = result
    if not env.observation_space.contains(obs):
        raise _fail(env_id, f"observation {_short(obs)} is not in {env.observation_space}", action)
    if not isinstance(reward, (float, int)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise _fail(env_id, f"reward must be a finite float, got {reward!r}", action)
    if type(terminated) is not bool or type(truncated) is not bool:
        raise _fail(env_id, f"terminated/truncated must be bool, got {terminated!r}/{truncated!r}", action)
    if not isinstance(info, dict) or not isinstance(info.get("turn"), dict):
        raise _fail(env_id, "info['turn'] must be a dict describing the turn", action)
    kind = info["turn"].get("kind")
    if kind not in TURN_KINDS:
        raise _fail(env_id, f"info['turn']['kind'] must be one of {TURN_KINDS}, got {kind!r}", action)
    if terminated or truncated:
        outcome = info.get("outcome")
        if not isinstance(outcome, dict) or not {"success", "score", "end_reason"} <= set(outcome):
            raise _fail(env_id, "an ended episode needs info['outcome'] with success, score, end_reason; "
                        f"got {outcome!r}", action)
        if type(outcome["success"]) is not bool:
            raise _fail(env_id, f"outcome['success'] must be bool, got {outcome['success']!r}", action)
        score = outcome["score"]
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            raise _fail(env_id, f"outcome['score'] must be a finite number, got {score!r}", action)
        if outcome["end_reason"] not in END_REASONS:
            raise _fail(env_id, f"outcome['end_reason'] must be one of {END_REASONS}, got {outcome['end_reason']!r}",
                        action)
    return terminated, truncated


class _ReturnTracker:
    """Checks the reward rule: an episode's step rewards sum to its ``outcome["score"]`` (one return for
    Gymnasium users and trainers alike). Feed it every step; call :meth:`reset` after each ``env.reset``."""

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self.total = 0.0

    def reset(self) -> None:
        self.total = 0.0

    def add(self, action: Any, result: tuple[Any, ...]) -> None:
        _, reward, terminated, truncated, info = result
        self.total += float(reward)
        if not (terminated or truncated):
            return
        score = float(info["outcome"]["score"])
        if not math.isclose(self.total, score, rel_tol=1e-6, abs_tol=1e-6):
            raise _fail(self.env_id, f"the step rewards of the episode sum to {self.total!r} but outcome['score'] is "
                        f"{score!r}; they must be equal (pass the episode's worth as finish(score=...); add_reward "
                        "only moves credit earlier)", action)
        self.total = 0.0


def _safe_step(env_id: str, env: Any, action: Any) -> tuple[Any, ...]:
    try:
        result = env.step(action)
    except Exception as exc:
        raise _fail(env_id, f"step() raised {type(exc).__name__}: {exc}; model mistakes must become "
                    "error observations", action) from exc
    _check_step(env_id, env, action, result)
    return result


# ---- (b) determinism -----------------------------------------------------------------------------
def _play_reference(env_id: str, env: Any, seed: int, garbage: Sequence[str], max_steps: int = 500) -> list[str]:
    """Episode 1: garbage, then the reference solver; episode 2 (unseeded reset): garbage only."""
    actions: list[str] = []
    returns = _ReturnTracker(env_id)
    obs, _ = env.reset(seed=seed)
    try:
        solver = env.unwrapped.reference_solver()
    except NotImplementedError:
        solver = None
    done = False
    for action in garbage[:1]:
        actions.append(action)
        result = _safe_step(env_id, env, action)
        returns.add(action, result)
        obs, _, term, trunc, _ = result
        done = term or trunc
    while solver is not None and not done and len(actions) < max_steps:
        action = solver(obs)
        actions.append(action)
        result = _safe_step(env_id, env, action)
        returns.add(action, result)
        obs, _, term, trunc, _ = result
        done = term or trunc
    return actions


def _transcript(env_id: str, env: Any, seed: int, episodes: Sequence[Sequence[Any]], seeded: int = 1) -> list[list[str]]:
    """The JSON lines of each of ``episodes``, played one after another on ``env``; the first ``seeded`` episodes
    reset with ``seed``, the rest with ``None`` (the env's RNG goes on)."""
    transcript: list[list[str]] = []
    for index, actions in enumerate(episodes):
        obs, info = env.reset(seed=seed if index < seeded else None)
        lines = [_dump({"reset": True, "obs": obs, "info": info, "state_key": _state_key(env_id, env)})]
        for action in actions:
            result = _safe_step(env_id, env, action)
            lines.append(_dump({"action": action, "result": list(result), "state_key": _state_key(env_id, env)}))
            if result[2] or result[3]:
                break
        transcript.append(lines)
    return transcript


def _state_key(env_id: str, env: Any) -> str | None:
    """The env's ``state_key()`` (GiGPO anchors), checked to be a str; None for envs without one. The replay
    compares it like the observations, so keys are deterministic too."""
    method = getattr(env.unwrapped, "state_key", None)
    if method is None:
        return None
    key = method()
    if not isinstance(key, str):
        raise _fail(env_id, f"state_key() must return a str, got {type(key).__name__}")
    return key


def _check_determinism(env_id: str, env_kwargs: Mapping[str, Any], seed: int) -> None:
    """Two envs with the same seed and actions give the same transcript, and so does an env that served an earlier,
    unfinished episode: the rollout engine reuses envs for later episodes (and ``cheap_steps`` envs for later runs),
    so nothing an episode leaves behind may reach the next one."""
    env_a, env_b = _make(env_id, env_kwargs), _make(env_id, env_kwargs)
    try:
        tools = list(getattr(env_a.unwrapped, "toolset", None) or [])
        garbage = garbage_actions([t.name for t in tools])
        solved = _play_reference(env_id, env_a, seed, garbage)
        episodes = [solved, garbage[5:5 + 40]]
        earlier = [*garbage[:3], *solved[: max(1, len(solved) // 2)]]  # an episode left half-way, garbage first
        # env_a first serves the earlier episode; from then on both must write the same lines
        first = [line for lines in _transcript(env_id, env_a, seed, [earlier, *episodes], seeded=2)[1:] for line in lines]
        second = [line for lines in _transcript(env_id, env_b, seed, episodes) for line in lines]
    finally:
        env_a.close()
        env_b.close()
    for index, (line_a, line_b) in enumerate(zip(first, second, strict=False)):
        if line_a != line_b:
            raise _fail(env_id, "an env diverged from a fresh one with the same seed and actions (the env must draw "
                        "randomness only from self.np_random, and reset must clear everything an earlier episode "
                        f"left, since envs are reused) at transcript line {index}:\n  A: {line_a[:400]}\n  "
                        f"B: {line_b[:400]}")
    if len(first) != len(second):
        raise _fail(env_id, f"replay lengths differ: {len(first)} vs {len(second)} lines")


def _play(env_id: str, env: Any, actions: Sequence[Any]) -> list[str]:
    """Step ``actions`` until the episode ends; the JSON of every step result."""
    lines = []
    for action in actions:
        result = _safe_step(env_id, env, action)
        lines.append(_dump(list(result)))
        if result[2] or result[3]:
            break
    return lines


def _check_fork(env_id: str, env_kwargs: Mapping[str, Any], seed: int) -> None:
    """A forkable env's copy continues exactly like the original and never disturbs it."""
    from agentgym.env import fork_env

    env = _make(env_id, env_kwargs)
    if not getattr(env.unwrapped, "forkable", False):
        env.close()
        return
    try:
        tools = list(getattr(env.unwrapped, "toolset", None) or [])
        garbage = garbage_actions([t.name for t in tools])
        actions = _play_reference(env_id, env, seed, garbage)
        head, tail = actions[: len(actions) // 2], actions[len(actions) // 2:] + garbage[5:9]
        env.reset(seed=seed)
        for action in head:
            _safe_step(env_id, env, action)
        copy_env = fork_env(env)
        from_copy = _play(env_id, copy_env, tail)
        from_original = _play(env_id, env, tail)
        copy_env.close()
    finally:
        env.close()
    for index, (a, b) in enumerate(zip(from_original, from_copy)):
        if a != b or len(from_original) != len(from_copy):
            raise _fail(env_id, f"fork() is not exact: after the fork, step {index} differs between the original and "
                        f"the copy (is some state shared or outside the process? then set forkable = False):\n"
                        f"  original: {a[:400]}\n  copy:     {b[:400]}")


# ---- (c) fuzz --------------------------------------------------------------------------------------
def _json_values() -> Any:
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    )


def _argument_strategy(schema: Mapping[str, Any]) -> Any:
    """Plausible values for one parameter (so some fuzzed episodes reach real tool code and end)."""
    from hypothesis import strategies as st

    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(min_value=-10**6, max_value=10**6) | st.integers()
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False)
    if kind == "string":
        return st.text(max_size=40) | st.from_regex(r"[0-9+\-*/() ]{1,20}", fullmatch=True)
    if kind == "boolean":
        return st.booleans()
    return _json_values()


def _action_strategy(tools: Sequence[Any]) -> Any:
    from hypothesis import strategies as st

    names = [t.name for t in tools]
    name_choice = st.sampled_from(names + ["nope", "", "answer ", "\x00"]) if names else st.text(max_size=10)

    def hermes_from(payload: Any) -> str:
        return "<tool_call>" + json.dumps(payload, ensure_ascii=False) + "</tool_call>"

    @st.composite
    def good_call(draw: Any) -> str:
        if not tools:
            return draw(st.text())
        t = draw(st.sampled_from(list(tools)))
        props = dict(t.parameters.get("properties", {}))
        args = {k: draw(_argument_strategy(v)) for k, v in props.items()}
        if draw(st.booleans()):
            return hermes_from({"name": t.name, "arguments": args})
        return f"{t.name}({', '.join(repr(v) for v in args.values())})"

    random_call = st.builds(
        lambda name, args, wrap: hermes_from({"name": name, "arguments": args}) if wrap else f"{name}({args!r})",
        name_choice,
        st.dictionaries(st.text(max_size=12), _json_values(), max_size=4) | _json_values(),
        st.booleans(),
    )
    nested = st.builds(lambda a, b: f"<tool_call>{a}<tool_call>{b}</tool_call></tool_call>", st.text(max_size=30),
                       st.text(max_size=30))
    binary = st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
    non_str = st.sampled_from([None, 123, b"bytes", 1.5, ["list"], {"name": "x"}])
    return st.one_of(
        st.sampled_from(garbage_actions(names)),
        st.just(_HUGE_ACTION),
        st.text(),
        binary,
        binary.map(lambda s: s.replace("a", "\x00")),
        random_call,
        nested,
        good_call(),
        st.builds(lambda pre, call, post: pre + call + post, st.text(max_size=20), good_call(), st.text(max_size=20)),
        non_str,
    )


def _run_fuzz(env_id: str, env_kwargs: Mapping[str, Any], seed: int, examples: int) -> None:
    try:
        from hypothesis import HealthCheck, given, settings
        from hypothesis import seed as hypothesis_seed
        from hypothesis import strategies as st
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise DependencyNotInstalled("hypothesis", "test", "check_agent_env's fuzz test") from exc

    env = _make(env_id, env_kwargs)
    tools = list(getattr(env.unwrapped, "toolset", None) or [])

    @hypothesis_seed(seed)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.filter_too_much, HealthCheck.large_base_example])
    @given(actions=st.lists(_action_strategy(tools), min_size=1, max_size=12),
           reset_seed=st.integers(min_value=0, max_value=2**32 - 1))
    def fuzz(actions: list[Any], reset_seed: int) -> None:
        obs, info = env.reset(seed=reset_seed)
        returns = _ReturnTracker(env_id)
        if not env.observation_space.contains(obs):
            raise _fail(env_id, f"reset observation {_short(obs)} is not in {env.observation_space}")
        for action in actions:
            result = _safe_step(env_id, env, action)
            returns.add(action, result)
            if result[2] or result[3]:
                env.reset()

    try:
        fuzz()
    finally:
        env.close()


def _sweep_malformed(env_id: str, env_kwargs: Mapping[str, Any], seed: int) -> None:
    """Every fixed malformed action, once, in order: the fuzz below is random, so it may miss one of them."""
    env = _make(env_id, env_kwargs)
    try:
        env.reset(seed=seed)
        returns = _ReturnTracker(env_id)
        for action in _MALFORMED:
            result = _safe_step(env_id, env, action)
            returns.add(action, result)
            if result[2] or result[3]:
                env.reset()
    finally:
        env.close()


def _check_action_choices(env_id: str, env_kwargs: Mapping[str, Any], seed: int) -> None:
    """An env that lists its action choices (constrained decoding samples only those) must accept each one as an
    action: a listed reply that parsed as void or invalid would be a turn the policy could never get right."""
    env = _make(env_id, env_kwargs)
    try:
        env.reset(seed=seed)
        ask = getattr(env.unwrapped, "action_choices", None)
        if ask is None:  # not an AgentEnv (a client of a remote env): it lists nothing, constrain_actions says so
            return
        try:
            choices = ask()
        except Exception as exc:
            raise _fail(env_id, f"action_choices() raised {type(exc).__name__}: {exc}") from exc
        if choices is None:
            return
        if (not isinstance(choices, tuple) or not choices or len(set(choices)) != len(choices)
                or not all(isinstance(c, str) and c for c in choices)):
            raise _fail(env_id, f"action_choices() must return None or a non-empty tuple of distinct non-empty "
                                f"strings, got {choices!r}")
        for choice in choices:
            env.reset(seed=seed)
            kind = _safe_step(env_id, env, choice)[4].get("turn", {}).get("kind")
            if kind in ("void", "invalid"):
                raise _fail(env_id, f"action_choices() lists {choice!r}, but right after reset(seed={seed}) the env "
                                    f"read it as a {kind} turn; list only replies its parser accepts as actions")
    finally:
        env.close()


def _check_close(env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    env = _make(env_id, env_kwargs)
    env.reset(seed=0)
    try:
        env.close()
        env.close()
        env.unwrapped.close()
    except Exception as exc:
        raise _fail(env_id, f"close() must be idempotent; a repeated call raised {type(exc).__name__}: {exc}") from exc


def check_agent_env(
    env_id: str,
    *,
    seed: int = 0,
    fuzz_examples: int = 50,
    env_kwargs: dict[str, Any] | None = None,
) -> None:
    """Check that a registered env honours the agentgym env contract; raise on the first violation.

    Runs, in order: Gymnasium's ``check_env`` on the unwrapped env (its warnings are re-emitted as
    ``UserWarning``), a determinism replay (two fresh envs, same seed, the reference solver's actions
    plus garbage, identical JSON transcripts), for forkable envs a fork check (a copy taken mid-episode
    answers the rest of the episode exactly like the original, which the copy's steps leave untouched), every fixed malformed action once, for an env that lists
    ``action_choices()`` each choice read as an action (never void or invalid), a Hypothesis fuzz of garbage action sequences (every step
    returns a valid observation, a finite reward, bool flags, a known turn kind, and an outcome once the
    episode ends), and a double ``close()``. In every episode these checks play to its end (the reference
    solver's, the malformed sweep's, the fuzz's), the step rewards must sum to ``outcome["score"]`` (the
    reward rule of :class:`~agentgym.env.AgentEnv`).

    Args:
        env_id: A registered id such as ``"agentgym/Calculator-v0"``.
        seed: Seed for the env resets and for Hypothesis, so a failure reproduces.
        fuzz_examples: Hypothesis examples (each up to 12 actions); lower it for slow envs.
        env_kwargs: Extra keyword arguments for ``gym.make``.

    Raises:
        EnvCheckError: The contract is broken; the message names the check, the step and the action.
            It is both an :class:`~agentgym.errors.AgentGymError` and an ``AssertionError``.
    """
    kwargs = dict(env_kwargs or {})
    _run_gymnasium_checker(env_id, kwargs)
    _check_determinism(env_id, kwargs, seed)
    _check_fork(env_id, kwargs, seed)
    _sweep_malformed(env_id, kwargs, seed)
    _check_action_choices(env_id, kwargs, seed)
    if fuzz_examples > 0:
        _run_fuzz(env_id, kwargs, seed, fuzz_examples)
    _check_close(env_id, kwargs)
