"""CodeInterpreter-v1: solve problems by reasoning in text and running Python (SimpleTIR style).

Each turn the agent writes text and at most one fenced Python block; the block runs in the episode's
sandboxed interpreter (state persists across turns, numpy and sympy are preloaded) and the interpreter's
output is the next observation. The episode ends when the agent gives a final answer (``\\boxed{...}`` or
``<answer>...</answer>``, or prints ``\\boxed{...}`` from code, e.g. with the predefined
``final_answer(x)``), at the turn limit (truncated), on a void turn, or when the rollout engine's
``max_context_tokens`` is reached.

The reward is :func:`~agentgym.envs.code_interpreter.answer_grading.grade_answer` of the final answer: one value in
the structure the task kind asks for, in any equivalent notation. Several different final answers in one reply
or one code output (``\\boxed{5} ... \\boxed{6}``, ``final_answer`` called in a loop) are a hedge and score 0.

Turn kinds follow SimpleTIR (Xue et al., 2025, arXiv 2509.02479): a turn with a code block or a final answer is
``tool_call``/``answer``; a turn with neither is ``void`` and, by default, ends the episode. Code that
raises is *not* void: the error comes back as feedback and the episode continues.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.envs.code_interpreter.answer_grading import grade_answer
from agentgym.envs.code_interpreter.answer_text import extract_final_answer
from agentgym.errors import ConfigError, EnvCrashed, TaskError
from agentgym.parsers import CompositeParser, HermesParser, ParsedAction, ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolCall, ToolResult, ToolSet, tool

__all__ = ["CodeInterpreterEnv", "TirParser", "format_feedback"]

#: SimpleTIR's code detector: a newline after the opening fence and before the closing one are required.
CODE_BLOCK = re.compile(r"```(?:py|python)?\n(.*?)\n```", re.DOTALL)
FEEDBACK_STYLES = ("simpletir", "full")
FINAL_ANSWER_HELPER = "def final_answer(x):\n    print('\\\\boxed{' + str(x) + '}')\n"
RESULT_PREFIX = "Code execution result: "


class TirParser:
    """SimpleTIR's turn reading: the first complete code block runs; ``\\boxed{}``/``<answer>`` answers.

    Text after the first code block is ignored (SimpleTIR cuts the turn there), so an answer counts only
    if it comes before or without a code block; an answer printed by the code ends the episode too.
    """

    def parse(self, text: str) -> ParsedAction:
        calls: list[ToolCall] = []
        positions: list[int] = []
        match = CODE_BLOCK.search(text)
        head = text if match is None else text[: match.start()]
        answer = extract_final_answer(head)
        if match is not None:
            calls.append(ToolCall("python", {"code": match.group(1)}, raw=match.group(0), format="code"))
            positions.append(match.start())
        if answer is not None:
            calls.append(ToolCall("answer", {"answer": answer}, raw=answer, format="tag"))
            positions.append(len(head) if match is None else match.end())
        return ParsedAction(tuple(calls), (), tuple(positions))


def _elide(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = max(limit // 2 - 10, 0)
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters elided]...\n{text[len(text) - half:]}"


def format_feedback(stdout: str, stderr: str, *, style: str = "simpletir", max_chars: int = 512) -> str:
    """Render interpreter output for the model.

    ``simpletir``: ``Code execution result: {stdout}`` with the output's middle elided beyond
    ``max_chars``; if stderr is non-empty its last line replaces stdout (SimpleTIR's format). ``full``:
    stdout, then the whole traceback, each elided to ``max_chars``.
    """
    if style == "simpletir":
        if stderr.strip():
            return RESULT_PREFIX + _elide(stderr.strip().splitlines()[-1], max_chars)
        return RESULT_PREFIX + _elide(stdout, max_chars)
    parts = [RESULT_PREFIX + _elide(stdout, max_chars)]
    if stderr.strip():
        parts.append("Error:\n" + _elide(stderr.rstrip(), max_chars))
    return "\n".join(parts)


class CodeInterpreterEnv(AgentEnv):
    r"""Solve math and algorithmic problems by running Python in a sandbox (SimpleTIR style); answer in `\boxed{}`.

    ## Description

    Tool-integrated reasoning with a sandboxed, persistent Python interpreter. Each turn the agent writes text and
    at most one fenced Python block; the block runs in the episode's interpreter (state persists across turns, numpy
    and sympy are preloaded, there is no internet) and its output is the next observation. Code that raises is not
    a wasted turn: the error comes back as feedback. Tasks come from the `code-train` suite by default.

    ## Tools

    - `python(code)`: run code in the persistent interpreter and see its output (the reply's first fenced Python
      block is this call); printing `\boxed{...}` (e.g. with the predefined `final_answer(x)`) answers.
    - `answer(answer)`: give the final answer and end the episode (`\boxed{...}` or `<answer>...</answer>` in the
      reply is the same call).

    ## Reward

    1 when `grade_answer` accepts the final answer (one value in the structure the task kind asks for, in any
    equivalent notation; component `correct`), else 0. Several different final answers in one reply or one code
    output (`\boxed{5} ... \boxed{6}`, `final_answer` in a loop) are a hedge and score 0.

    ## Episode end

    Terminated by a final answer, or by a void turn (neither code nor a final answer) when `end_on_void` is on;
    truncated after `max_turns` turns, or when the rollout engine's `max_context_tokens` is reached.

    ## Arguments

    - `max_turns`: generation rounds before truncation (SimpleTIR's recipe uses 5).
    - `tasks`: tasks to draw from; by default tasks come from the `suite` below.
    - `suite`: suite to sample from when `tasks` is not given (default `code-train`).
    - `sandbox`: sandbox options (`backend`, limits such as `wall_timeout_s`, `memory_bytes`; see
      `agentgym.tools.sandbox.SandboxConfig`) as a dict, or a `SandboxConfig`.
    - `feedback`: `"simpletir"` (stdout, or the last stderr line) or `"full"` (stdout and traceback).
    - `max_feedback_chars`: interpreter output longer than this is elided in the middle.
    - `end_on_void`: end the episode on a turn with neither code nor a final answer (SimpleTIR).
    - `max_action_chars`: see `AgentEnv`.
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v1: the reward changed: graders per answer kind, hedged answers fail, no partial credit.
    - v0: the first version.
    """

    description: ClassVar[str] = "Solve math/algorithmic problems by running Python in a sandbox; answer in \\boxed{}."
    native_format_hint: ClassVar[str] = (
        "You can also run code by writing a fenced block:\n```python\nprint(2 ** 10)\n```\n"
        "and give the final answer as \\boxed{ANSWER} (or <answer>ANSWER</answer>)."
    )

    def __init__(
        self,
        *,
        max_turns: int = 5,
        tasks: Sequence[Task] | None = None,
        suite: str = "code-train",
        sandbox: Mapping[str, Any] | Any | None = None,
        feedback: str = "simpletir",
        max_feedback_chars: int = 512,
        end_on_void: bool = True,
        max_action_chars: int = 20_000,
        render_mode: str | None = None,
    ) -> None:
        from agentgym.tools.sandbox import SandboxConfig, default_pool

        if feedback not in FEEDBACK_STYLES:
            raise ConfigError(f"feedback must be one of {FEEDBACK_STYLES}, got {feedback!r}.")
        if not isinstance(max_feedback_chars, int) or max_feedback_chars < 32:
            raise ConfigError(f"max_feedback_chars must be an integer >= 32, got {max_feedback_chars!r}.")
        if isinstance(sandbox, SandboxConfig):
            config = sandbox
        elif sandbox is None or isinstance(sandbox, Mapping):
            config = SandboxConfig.from_kwargs(**dict(sandbox or {}))
        else:
            raise ConfigError(f"sandbox must be a dict of sandbox options or a SandboxConfig, got {type(sandbox).__name__}.")
        self.feedback, self.max_feedback_chars, self.end_on_void = feedback, max_feedback_chars, bool(end_on_void)
        self._suite_name = suite
        self._pool = default_pool(config)  # raises SandboxUnavailable (what to install) when nothing isolates
        self._session = self._pool.session()
        self._code_runs = 0
        self._code_errors = 0
        self._outputs: set[str] = set()  # distinct printed outputs of runs that succeeded (what the agent learned)
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars, max_calls_per_turn=2,
                         render_mode=render_mode)

    # ---- tools -------------------------------------------------------------------------------------
    @tool
    def python(self, code: str) -> ToolResult:
        """Run Python code in your persistent interpreter (numpy and sympy are available) and see its output.

        Args:
            code: Python source. Variables persist across turns; print what you want to see.
        """
        from agentgym.tools.sandbox import SandboxError

        try:
            result = self._session.run(code)
        except SandboxError as exc:
            raise EnvCrashed(f"the Python sandbox failed: {exc}") from exc
        self._code_runs += 1
        failed = result.status != "ok"
        self._code_errors += failed
        if not failed:
            self._outputs.add(result.stdout.strip())
        feedback = format_feedback(result.stdout, result.stderr, style=self.feedback, max_chars=self.max_feedback_chars)
        if result.notice:
            feedback = f"[{result.notice}]\n{feedback}"
        printed = extract_final_answer(result.stdout) if "\\boxed{" in result.stdout else None
        if printed is not None and not self._finished:
            self._submit(printed)
        return ToolResult(feedback, metadata={"status": result.status, "duration_s": result.duration_s,
                                              "state_reset": result.state_reset})

    @tool
    def answer(self, answer: str) -> str:
        """Give your final answer; this ends the episode.

        Args:
            answer: The final answer only (a number, expression, interval, ...), without explanation.
        """
        return self._submit(answer)

    def _submit(self, answer: str) -> str:
        assert self.task is not None
        success = grade_answer(self.task, answer)  # the same function the labelled grading set checks
        self.add_reward("correct", 1.0 if success else 0.0)
        self.mark_answer()
        self.finish(success=success, score=1.0 if success else 0.0, reason="answered")
        self._last_answer = answer
        return f"Final answer recorded: {answer}"

    def state_key(self) -> str:
        """The distinct outputs of the code runs that succeeded so far, sorted (read from memory, never from the
        sandbox). Two replies that compute the same numbers reach the same state whatever code or order they
        used; a run that fails adds nothing, so a retry after an error starts from the state before it. The
        interpreter's variables are not part of the key: reading them would need a sandbox call."""
        if self._finished:
            return "answered"
        return json.dumps(sorted(self._outputs), ensure_ascii=False)

    # ---- AgentEnv hooks ----------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.python, self.answer])

    def _build_parser(self) -> ToolCallParser:
        return CompositeParser([HermesParser(), TirParser()])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        from agentgym.registration.suites import load_suite

        pool = list(load_suite(self._suite_name))
        if not pool:
            raise TaskError(f"Suite {self._suite_name!r} has no tasks.")
        return pool[int(rng.integers(len(pool)))]

    def _begin_episode(self, task: Task) -> str:
        from agentgym.tools.sandbox import SandboxError

        self._session.reset()
        self._code_runs = self._code_errors = 0
        self._outputs = set()
        self._last_answer: str | None = None
        try:
            setup = self._session.run(FINAL_ANSWER_HELPER)
        except SandboxError as exc:
            raise EnvCrashed(f"the Python sandbox failed to start: {exc}") from exc
        if not setup.ok:
            raise EnvCrashed(f"the Python sandbox failed to start: {setup.stderr or setup.status}")
        return task.prompt

    def _run_action(self, action: Any, turn_info: dict[str, Any]) -> tuple[str, str]:
        observation, kind = super()._run_action(action, turn_info)
        turn_info["code_runs"] = self._code_runs
        if kind == "void":
            observation = ("Your reply had neither a ```python code block nor a final answer in \\boxed{}. "
                           + ("The episode ends." if self.end_on_void else "Run code or give the final answer."))
            if self.end_on_void:
                self.finish(success=False, score=0.0, reason="failed")  # the void turn is on record
        return observation, kind

    def _format_results(self, results: Sequence[tuple[ToolCall, ToolResult]], notes: Sequence[str]) -> str:
        # The interpreter output is the observation; the answer acknowledgement only when nothing ran.
        texts = [r.content for c, r in results if c.name == "python" or r.is_error]
        if not texts:
            texts = [r.content for _, r in results]
        return "\n".join(texts + list(notes))

    def _task_instructions(self) -> str:
        return (
            "Solve the problem below. Think step by step and use Python when it helps: write one fenced block "
            "```python\n...\n``` per reply and its output comes back as 'Code execution result: ...'. Only "
            "the first code block of a reply runs. Variables persist between replies; numpy and sympy are "
            "installed; there is no internet. When you are done, give the final answer as \\boxed{ANSWER} "
            "(or call final_answer(x) in code). A reply with neither code nor a final answer ends the "
            f"episode. You have {self.max_turns} replies."
        )

    def reference_solver(self) -> ReferenceSolver:
        """Run the task's reference code, then box what it printed."""
        assert self.task is not None
        code = self.task.metadata.get("reference_code")
        if not code:
            raise TaskError(f"Task {self.task.id!r} has no reference_code in its metadata.")

        def solve(observation: str) -> str:
            if observation.startswith(RESULT_PREFIX) and "characters elided]" not in observation:
                return f"The code printed the answer.\n\\boxed{{{observation[len(RESULT_PREFIX):].strip()}}}"
            if observation.startswith(RESULT_PREFIX):  # too long to copy from the elided feedback: box it in code
                return ("The output is long, so I box it from code.\n```python\nimport contextlib, io\n"
                        "_buffer = io.StringIO()\nwith contextlib.redirect_stdout(_buffer):\n"
                        f"    exec({code!r})\nfinal_answer(_buffer.getvalue().strip())\n```")
            return f"Let me compute this.\n```python\n{code.rstrip()}\n```"

        return solve

    def close(self) -> None:
        if not self._closed:
            self._session.close()
        super().close()
