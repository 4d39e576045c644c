"""Policies that need no model: fixed replies for tests, and each env's reference solver."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentgym.errors import AgentGymError
from agentgym.policies.base import Generation, GenerationRequest, Policy, refuse_choices

__all__ = ["ReferencePolicy", "ScriptedPolicy"]


def _encode_reply(tokenizer: Any, text: str) -> tuple[int, ...] | None:
    if tokenizer is None:
        return None
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None:
        ids.append(int(eos))
    return tuple(ids)


class ScriptedPolicy(Policy):
    """Replay fixed replies: a list (the same script for every episode, turn by turn) or a function.

    Args:
        replies: Either a sequence of action texts (turn ``t`` of every episode gets ``replies[t]``, the
            last one repeating), or a callable ``messages -> text``.
        tokenizer: When given, replies are encoded (plus EOS) so trajectories carry token ids.
        delay_s: Optional fixed latency per call, to simulate a model in benchmarks.
    """

    name = "scripted"

    def __init__(
        self,
        replies: Sequence[str] | Callable[[Sequence[Mapping[str, Any]]], str],
        *,
        tokenizer: Any = None,
        delay_s: float = 0.0,
        max_batch_size: int = 1024,
    ) -> None:
        if not callable(replies) and (isinstance(replies, str) or not replies):
            raise AgentGymError("ScriptedPolicy needs a non-empty list of replies or a callable messages -> text.")
        self.replies = replies
        self.tokenizer = tokenizer
        self.delay_s = delay_s
        self.max_batch_size = max_batch_size

    def _reply(self, request: GenerationRequest) -> str:
        if callable(self.replies):
            return self.replies(request.messages)
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        return self.replies[min(turn, len(self.replies) - 1)]

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        refuse_choices(self, requests)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        out = []
        for request in requests:
            text = self._reply(request)
            out.append(Generation(text=text, token_ids=_encode_reply(self.tokenizer, text)))
        return out


class ReferencePolicy(Policy):
    """Act with each env's reference solver (proves suites solvable; gives demonstrations for BC).

    Args:
        tokenizer: When given, actions are encoded (plus EOS) so trajectories carry token ids.
        shortcut_fraction: Share of episodes played with the env's ``shortcut_solver`` instead (imperfect
            demonstrations); which episodes is decided by a hash of the task, so it is reproducible.
        seed: Mixed into that hash.
    """

    name = "reference"

    def __init__(self, *, tokenizer: Any = None, max_batch_size: int = 1024, shortcut_fraction: float = 0.0,
                 seed: int = 0) -> None:
        if not 0.0 <= shortcut_fraction <= 1.0:
            raise AgentGymError(f"shortcut_fraction must be in [0, 1], got {shortcut_fraction}.")
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.shortcut_fraction = shortcut_fraction
        self.seed = seed
        self._solvers: dict[str, Callable[[str], str]] = {}
        self._lock = threading.Lock()

    def _use_shortcut(self, env: Any) -> bool:
        if self.shortcut_fraction <= 0.0:
            return False
        task = env.unwrapped.task
        key = f"{self.seed}/{task.id}/{task.prompt}".encode()
        draw = int.from_bytes(hashlib.sha256(key).digest()[:8], "little") / 2**64
        return draw < self.shortcut_fraction

    def begin_episode(self, episode_id: str, env: Any) -> None:
        solver = env.unwrapped.shortcut_solver() if self._use_shortcut(env) else env.unwrapped.reference_solver()
        with self._lock:
            self._solvers[episode_id] = solver

    def end_episode(self, episode_id: str) -> None:
        with self._lock:
            self._solvers.pop(episode_id, None)

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        refuse_choices(self, requests)
        out = []
        for request in requests:
            solver = self._solvers.get(request.episode_id)
            if solver is None:
                raise AgentGymError(
                    f"ReferencePolicy has no solver for episode {request.episode_id!r}; it only works inside the "
                    "rollout engine, which calls begin_episode(...) first."
                )
            last = next((m["content"] for m in reversed(request.messages) if m.get("role") != "assistant"), "")
            text = solver(str(last))
            out.append(Generation(text=text, token_ids=_encode_reply(self.tokenizer, text)))
        return out
