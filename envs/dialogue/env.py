"""The support env: a customer-service conversation with a simulated customer."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.envs.dialogue.tasks import WISHES, generate_support_tasks
from agentgym.envs.dialogue.user import SimulatedCustomer
from agentgym.errors import TaskError
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["SupportEnv"]

_ACTIONS = (*WISHES, "escalate")


class SupportEnv(AgentEnv):
    """Help a simulated customer: find out the order, the problem and what they want, then resolve the case.

    ## Description

    A dialogue task. A customer writes in about an order with a problem (damaged, late, wrong item) and a wish
    (refund or replacement), and reveals each only when asked: the agent talks with `say`, then closes the case
    with `resolve`. The customer is simulated by fixed keyword rules, so episodes replay exactly; it says "I already
    told you that" when asked twice. How the conversation went (asking once, apologising, confirming) has no
    checker: score it with a rubric, `agentgym.envs.dialogue.rubric.support_rubric`, as `reward=support_rubric(judge)`.

    ## Tools

    - `say(message)`: say something to the customer; the observation is their reply.
    - `resolve(order_id, action)`: close the case with `refund`, `replacement` or `escalate`; this ends the
      episode.

    ## Reward

    Without a rubric: 1 when `resolve` names the customer's order and the action they asked for, else 0
    (component `resolved`). With `reward=rubric`, the rubric's score (this one kept as `outcome["checker_score"]`).

    ## Episode end

    Terminated by `resolve`; truncated after `max_turns` turns.

    ## Arguments

    - `max_turns`: turns before truncation.
    - `tasks`: cases to draw from (a suite's split); without them a case is drawn from the reset seed.
    - `split`: which customers a drawn case comes from when no tasks are given: `train` or `test`.
    - `max_action_chars`, `max_calls_per_turn`, `render_mode`: see `AgentEnv`.

    ## Version history

    - v0: the first version.
    """

    description: ClassVar[str] = "Help a simulated customer with an order problem: say(message), resolve(order_id, action)."
    cheap_steps: ClassVar[bool] = True
    forkable: ClassVar[bool] = True

    def __init__(self, *, max_turns: int = 8, tasks: Sequence[Task] | None = None, split: str = "train",
                 max_action_chars: int = 4000, max_calls_per_turn: int = 1, render_mode: str | None = None) -> None:
        generate_support_tasks(random.Random(0), 1, split=split)  # a bad split fails here, with the fix
        self.split = split
        self.customer: SimulatedCustomer | None = None
        super().__init__(max_turns=max_turns, tasks=tasks, max_action_chars=max_action_chars,
                         max_calls_per_turn=max_calls_per_turn, render_mode=render_mode)

    @tool
    def say(self, message: str) -> str | ToolResult:
        """Say something to the customer; you get their reply.

        Args:
            message: What you say, e.g. "Could you tell me your order number, please?".
        """
        if not message.strip():
            return ToolResult.error("Error: the message is empty; say something to the customer.")
        assert self.customer is not None
        return self.customer.reply(message)

    @tool
    def resolve(self, order_id: str, action: str) -> str | ToolResult:
        """Close the case; this ends the episode.

        Args:
            order_id: The customer's order number, e.g. "A-1234".
            action: "refund", "replacement" or "escalate".
        """
        action = action.strip().lower()
        if action not in _ACTIONS:
            return ToolResult.error(f"Error: action must be one of {', '.join(_ACTIONS)}, got {action!r}.")
        assert self.task is not None
        right = order_id.strip().upper() == self.task.answer["order_id"] and action == self.task.answer["action"]
        self.mark_answer()
        self.add_reward("resolved", float(right))
        self.finish(success=right, score=float(right), reason="answered")
        return "Case closed." if right else "Case closed. The customer is not satisfied with the outcome."

    def _build_tools(self) -> ToolSet:
        return ToolSet([self.say, self.resolve])

    def _sample_task(self, rng: np.random.Generator) -> Task:
        from agentgym.envs.games._common import python_rng

        return generate_support_tasks(python_rng(rng), 1, split=self.split)[0]

    def _begin_episode(self, task: Task) -> str:
        meta = task.metadata
        if not {"name", "order_id", "problem", "wish"} <= set(meta):
            raise TaskError(f"Support task {task.id!r} needs metadata name, order_id, problem and wish.")
        self.customer = SimulatedCustomer(meta)
        return self.customer.opening()

    def _task_instructions(self) -> str:
        return ("You are a customer-service agent. Talk to the customer with say to find out their order number, "
                "what went wrong and whether they want a refund or a replacement; ask for each once. Then close the "
                "case with resolve(order_id, action); resolving ends the conversation. Be courteous. "
                f"You have {self.max_turns} turns.")

    def state_key(self) -> str:
        told = sorted(self.customer.told) if self.customer is not None else []
        return "closed" if self._finished else f"told {told} repeats {self.customer.repeats if self.customer else 0}"

    def reference_solver(self) -> ReferenceSolver:
        """Apologise, ask for the order number, the problem and the wish once each, confirm, then resolve."""
        questions = ["I'm sorry to hear that. Could you give me your order number, please?",
                     "Thank you. What happened with the order?",
                     "Would you prefer a refund or a replacement?"]
        state: dict[str, Any] = {"asked": 0, "order": "", "wish": ""}

        def call(name: str, **arguments: Any) -> str:
            return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

        def solve(observation: str) -> str:
            order = re.search(r"order number is ([A-Z]-\d+)", observation)
            wish = re.search(r"like a (refund|replacement)", observation)
            state["order"] = order.group(1) if order else state["order"]
            state["wish"] = wish.group(1) if wish else state["wish"]
            if state["asked"] < len(questions):
                state["asked"] += 1
                return call("say", message=questions[state["asked"] - 1])
            return call("resolve", order_id=state["order"], action=state["wish"])

        return solve

    def shortcut_solver(self) -> ReferenceSolver:
        """Resolve at once without asking: a guessed order and a refund."""
        reply = json.dumps({"name": "resolve", "arguments": {"order_id": "A-0000", "action": "refund"}})
        return lambda observation: f"<tool_call>{reply}</tool_call>"
