"""Trajectory records and their token view.

A :class:`Turn` keeps the observation the agent saw, the action text, and the *exact* token ids the
policy sampled with their log-probs and entropies. The tokens between two actions (observation text plus
chat-template glue) are stored separately as ``prompt_token_ids``, encoded on their own by the
:class:`~agentgym.agent.ChatAgent`. The training sequence is therefore the concatenation of stored ids,
never a decode/re-encode of the conversation, and its loss mask is 1 exactly on sampled tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentgym.utils.fast_records import quick_init
from agentgym.utils.images import ImageRef

__all__ = ["END_REASONS", "SCHEMA_VERSION", "TURN_KINDS", "TokenView", "Trajectory", "Turn", "jsonable", "utf8_safe"]

SCHEMA_VERSION = 1
TURN_KINDS = ("tool_call", "answer", "void", "invalid")
END_REASONS = ("answered", "solved", "failed", "max_turns", "context_limit", "error")


def utf8_safe(text: str) -> str:
    """``text`` with every lone surrogate (``"\\ud800"``) written as the six characters ``\\ud800``.

    Why: model output and sandbox stdout can hold lone surrogates, which no UTF-8 sink (a terminal, an HTML
    file, Arrow/Parquet) accepts. Stored trajectories keep the exact string; this is for display and export.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


_PLAIN = frozenset((str, int, bool, type(None)))


def jsonable(value: Any) -> Any:
    """Convert a value to plain JSON types (numpy scalars/arrays, tuples, dataclasses with to_dict)."""
    kind = type(value)
    if kind in _PLAIN:  # the common case first: every turn's info goes through here
        return value
    if kind is dict:  # every turn's info: a loop that copies empty containers without a call for each
        if not value:
            return {}
        out = {}
        for key, item in value.items():
            item_kind = type(item)
            if item_kind is dict:
                item = jsonable(item) if item else {}
            elif item_kind is list:
                item = jsonable(item) if item else []
            elif item_kind not in _PLAIN:
                item = jsonable(item)
            out[key if type(key) is str else str(key)] = item
        return out
    if kind is list or kind is tuple:  # before the isinstance chain below: Mapping's ABC check is slow
        return [v if type(v) in _PLAIN else jsonable(v) for v in value] if value else []
    if kind is float:
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, np.ndarray):
        return {"__ndarray__": True, "shape": list(value.shape), "dtype": str(value.dtype)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if hasattr(value, "to_dict"):
        return jsonable(value.to_dict())
    return repr(value)


@quick_init
@dataclass(frozen=True)
class Turn:
    """One agent turn: what it saw, what it did, and what the env answered.

    Attributes:
        observation: The text shown before the action (turn 0: the task's first observation).
        action: The model's raw text for this turn.
        reward: The env's reward for this step.
        info: The env's ``info["turn"]`` (kind, calls, errors, reward components), JSON-safe.
        prompt_token_ids: Tokens placed before this action and not sampled (turn 0: the whole prompt;
            later turns: the template glue and observation since the previous action).
        action_token_ids: The ids the policy sampled, including the token that ended the turn.
        action_logprobs: Sampling log-probs, aligned with ``action_token_ids``.
        action_entropies: Per-token entropies of the sampling distribution, where the policy gives them.
        action_forced: Per action token, whether constrained decoding (``SamplingParams.choices``) left it as the
            only possible token; such tokens get loss mask 0 in :meth:`Trajectory.token_view` (their constrained
            probability is 1, so they carry no learning signal). ``None`` for free-text turns.
        finish_reason: ``stop`` (end token or stop string) or ``length`` (hit max tokens).
        state_key: The env's ``state_key()`` before this action (the state the action was chosen in, without
            history), or ``None`` where the env gave none: GiGPO groups turns of a task by it.
        images: The images of ``observation`` (GUI screenshots), in order; stored by reference as
            ``images/<sha256>.png`` next to the JSONL (see :mod:`agentgym.utils.images`). A vision policy saw them
            (their placeholder tokens are in ``prompt_token_ids``); a text-only policy saw ``observation`` only.
    """

    observation: str
    action: str
    reward: float = 0.0
    info: Mapping[str, Any] = field(default_factory=dict)
    prompt_token_ids: tuple[int, ...] | None = None
    action_token_ids: tuple[int, ...] | None = None
    action_logprobs: tuple[float, ...] | None = None
    action_entropies: tuple[float, ...] | None = None
    action_forced: tuple[bool, ...] | None = None
    finish_reason: str | None = None
    state_key: str | None = None
    images: tuple[ImageRef, ...] = ()

    @property
    def kind(self) -> str:
        return str(self.info.get("kind", ""))

    def to_dict(self) -> dict[str, Any]:
        # Text-only turns keep the exact record they always had: "images" appears only when there are some.
        extra = {"images": [image.to_dict() for image in self.images]} if self.images else {}
        if self.action_forced is not None:  # likewise "action_forced": only for constrained turns
            extra["action_forced"] = [bool(f) for f in self.action_forced]
        return {
            "observation": self.observation,
            "action": self.action,
            "reward": self.reward,
            "info": jsonable(self.info),
            "prompt_token_ids": None if self.prompt_token_ids is None else list(self.prompt_token_ids),
            "action_token_ids": None if self.action_token_ids is None else list(self.action_token_ids),
            "action_logprobs": None if self.action_logprobs is None else list(self.action_logprobs),
            "action_entropies": None if self.action_entropies is None else list(self.action_entropies),
            "finish_reason": self.finish_reason,
            "state_key": self.state_key,
        } | extra

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], image_root: str | None = None) -> Turn:
        """The turn of :meth:`to_dict`; image references resolve against ``image_root`` (the JSONL's folder)."""
        def tup(key: str, kind: type) -> tuple[Any, ...] | None:
            # float("-inf") reads back the non-finite log-probs that jsonable stored as strings
            return None if d.get(key) is None else tuple(kind(v) for v in d[key])

        return cls(
            observation=d["observation"], action=d["action"], reward=float(d.get("reward", 0.0)),
            info=d.get("info") or {}, prompt_token_ids=tup("prompt_token_ids", int),
            action_token_ids=tup("action_token_ids", int), action_logprobs=tup("action_logprobs", float),
            action_entropies=tup("action_entropies", float), action_forced=tup("action_forced", bool),
            finish_reason=d.get("finish_reason"),
            state_key=None if d.get("state_key") is None else str(d["state_key"]),
            images=tuple(ImageRef.from_dict(i, image_root) for i in d.get("images") or ()),
        )


@dataclass(frozen=True)
class TokenView:
    """One training sequence for a trajectory (one sequence per trajectory, not one per turn).

    Attributes:
        input_ids: ``[L]`` prompt, action and observation tokens in order.
        loss_mask: ``[L]`` 1 exactly on sampled action tokens (0 on tokens constrained decoding forced).
        logprobs: ``[L]`` sampling log-probs on action tokens, 0.0 elsewhere.
        turn_index: ``[L]`` index of the turn a token belongs to (the prompt before turn t belongs to t).
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turn_index: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.input_ids)


@quick_init
@dataclass(frozen=True)
class Trajectory:
    """A whole episode: identity, turns, outcome and timing; serialises to one JSON line."""

    env_id: str
    task_id: str
    seed: int | None
    turns: tuple[Turn, ...]
    outcome: Mapping[str, Any]
    end_reason: str
    policy: str = ""
    timing: Mapping[str, float] = field(default_factory=dict)
    traj_id: str = ""
    group_id: str = ""
    error: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return bool(self.outcome.get("success", False))

    @property
    def final_observation(self) -> str | None:
        """The observation after the last action (``None`` for episodes that failed or never acted)."""
        value = self.metadata.get("final_observation")
        return None if value is None else str(value)

    @property
    def final_images(self) -> tuple[ImageRef, ...]:
        """The images of the observation after the last action (``metadata["final_images"]``)."""
        return tuple(i for i in self.metadata.get("final_images") or () if isinstance(i, ImageRef))

    @property
    def prompt_images(self) -> tuple[ImageRef, ...]:
        """Every image in :meth:`token_view`'s sequence, in order (each turn's observation images): what a
        vision-language model's forward pass needs next to the ids to score it."""
        return tuple(image for turn in self.turns for image in turn.images)

    @property
    def score(self) -> float:
        return float(self.outcome.get("score", 0.0))

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns))

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.info.get("calls", ())) for t in self.turns)

    @property
    def num_action_tokens(self) -> int:
        return sum(len(t.action_token_ids or ()) for t in self.turns)

    @property
    def has_tokens(self) -> bool:
        return bool(self.turns) and all(
            t.action_token_ids is not None and t.prompt_token_ids is not None for t in self.turns
        )

    def token_view(self) -> TokenView:
        """Concatenate stored ids into one sequence with a loss mask (no re-tokenisation).

        Raises:
            ValueError: when the trajectory was produced by a policy that did not record token ids.
        """
        if not self.has_tokens:
            raise ValueError(
                f"Trajectory {self.traj_id or self.task_id} has no token ids; record it with a token-level "
                "policy (HFPolicy, VLLMPolicy, or OpenAIPolicy in completions mode) to train on it."
            )
        ids: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        turn_idx: list[int] = []
        for i, turn in enumerate(self.turns):
            prompt = turn.prompt_token_ids or ()
            action = turn.action_token_ids or ()
            lp: Sequence[float] = turn.action_logprobs or (0.0,) * len(action)
            ids += prompt
            mask += [0] * len(prompt)
            logps += [0.0] * len(prompt)
            ids += action
            forced = turn.action_forced
            if forced is not None and len(forced) != len(action):
                raise ValueError(f"Trajectory {self.traj_id or self.task_id} turn {i}: action_forced has "
                                 f"{len(forced)} entries for {len(action)} action tokens.")
            mask += [0 if f else 1 for f in forced] if forced is not None else [1] * len(action)
            logps += list(lp)
            turn_idx += [i] * (len(prompt) + len(action))
        return TokenView(tuple(ids), tuple(mask), tuple(logps), tuple(turn_idx))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "env_id": self.env_id,
            "task_id": self.task_id,
            "seed": self.seed,
            "traj_id": self.traj_id,
            "group_id": self.group_id,
            "policy": self.policy,
            "end_reason": self.end_reason,
            "outcome": jsonable(self.outcome),
            "error": self.error,
            "timing": jsonable(self.timing),
            "metadata": jsonable(self.metadata),
            "turns": [t.to_dict() for t in self.turns],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], image_root: str | None = None) -> Trajectory:
        """The trajectory of :meth:`to_dict`; image references resolve against ``image_root`` (the JSONL's
        folder, which :func:`agentgym.storage.read_trajectories` passes)."""
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"Trajectory record has schema_version={version!r}; this agentgym reads version {SCHEMA_VERSION}."
            )
        return cls(
            env_id=d["env_id"], task_id=d["task_id"], seed=d.get("seed"),
            turns=tuple(Turn.from_dict(t, image_root) for t in d["turns"]), outcome=d.get("outcome") or {},
            end_reason=d["end_reason"], policy=d.get("policy", ""), timing=d.get("timing") or {},
            traj_id=d.get("traj_id", ""), group_id=d.get("group_id", ""), error=d.get("error"),
            metadata=_with_image_refs(d.get("metadata") or {}, image_root),
        )


def _with_image_refs(metadata: Mapping[str, Any], image_root: str | None) -> Mapping[str, Any]:
    """``metadata`` with its stored ``final_images`` references turned back into :class:`ImageRef` objects."""
    if not metadata.get("final_images"):
        return metadata
    return {**metadata, "final_images": [ImageRef.from_dict(i, image_root) for i in metadata["final_images"]]}
