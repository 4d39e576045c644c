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

__all__ = ["BUDGET_END_REASONS", "END_REASONS", "SCHEMA_VERSION", "TERMINATION", "TRUNCATING_END_REASONS",
           "TURN_KINDS", "Termination", "TokenView", "Trajectory", "Turn", "jsonable", "utf8_safe"]

SCHEMA_VERSION = 1
#: ``summary``: the turn in which the policy wrote a summary of the episode so far (context strategy
#: ``summarize``); the env never saw it, but it is a sampled action and trains with the episode's credit.
TURN_KINDS = ("tool_call", "answer", "void", "invalid", "summary")


@dataclass(frozen=True)
class Termination:
    """How an episode that ended for one reason is treated in training.

    Attributes:
        truncated: Stopped from outside (a limit), not by reaching an end state: critics bootstrap through it.
        budget: A budget ran out (turns, context or tokens): Mini-o3's over-turn mask leaves such episodes out of
            the loss when they were still calling tools (neither rewarded nor punished for running out).
        trains: Whether the episode is evidence about the policy at all (an infrastructure error is not).
        meaning: One line for people reading a run's end reasons.
    """

    truncated: bool
    budget: bool
    trains: bool
    meaning: str


#: The one table of episode end reasons: every engine ends episodes with one of these, every trainer masks and
#: bootstraps by it (``docs/concepts/rollout-engine.md`` shows it).
TERMINATION: Mapping[str, Termination] = {
    "answered": Termination(False, False, True, "the agent gave its final answer (graded by the env)"),
    "solved": Termination(False, False, True, "the env reached its goal state"),
    "failed": Termination(False, False, True, "the env reached a losing end state"),
    "max_turns": Termination(True, True, True, "the env's turn limit"),
    "context_limit": Termination(True, True, True, "the next turn would not fit in max_context_tokens (per "
                                                   "segment), or the model refused the prompt as too long"),
    "turn_token_limit": Termination(True, True, True, "an action used all of max_turn_tokens (cut, not sent to the "
                                                      "env)"),
    "episode_token_limit": Termination(True, True, True, "the episode sampled max_episode_tokens in all its "
                                                         "segments"),
    "error": Termination(False, False, False, "an env, policy or infrastructure failure (never trained on)"),
}
END_REASONS = tuple(TERMINATION)
TRUNCATING_END_REASONS = tuple(r for r, t in TERMINATION.items() if t.truncated)
BUDGET_END_REASONS = tuple(r for r, t in TERMINATION.items() if t.budget)


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
        segment_index: Which segment of the episode the turn belongs to. A context strategy that rewrites the
            history (a window, dropped tool outputs, a summary) starts a new segment: its first turn's
            ``prompt_token_ids`` are the whole rewritten prompt as the model saw it, so each segment is one
            token-exact sequence. 0 for every turn of an episode whose history was never rewritten.
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
    segment_index: int = 0

    @property
    def kind(self) -> str:
        return str(self.info.get("kind", ""))

    def to_dict(self) -> dict[str, Any]:
        # Text-only turns keep the exact record they always had: "images" appears only when there are some.
        extra = {"images": [image.to_dict() for image in self.images]} if self.images else {}
        if self.action_forced is not None:  # likewise "action_forced": only for constrained turns
            extra["action_forced"] = [bool(f) for f in self.action_forced]
        if self.segment_index:  # and "segment_index" only past the first segment: old readers see old records
            extra["segment_index"] = self.segment_index
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
            segment_index=int(d.get("segment_index") or 0),
        )


@dataclass(frozen=True)
class TokenView:
    """One training sequence: a whole trajectory, or one segment of it (one sequence per segment, not per turn).

    Attributes:
        input_ids: ``[L]`` prompt, action and observation tokens in order.
        loss_mask: ``[L]`` 1 exactly on sampled action tokens (0 on tokens constrained decoding forced).
        logprobs: ``[L]`` sampling log-probs on action tokens, 0.0 elsewhere.
        turn_index: ``[L]`` index of the turn a token belongs to (the prompt before turn t belongs to t), counted
            over the whole episode, so a step-level advantage finds its turn in any segment.
        segment_index: Which segment of its episode this sequence is (0 for an unsegmented episode).
        episode_id: The episode's ``traj_id``: the segments of one episode share it (and its return).
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turn_index: tuple[int, ...]
    segment_index: int = 0
    episode_id: str = field(default="", compare=False)  # which episode, not what it holds: views compare by tokens

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

    @property
    def num_segments(self) -> int:
        """How many token-exact sequences the episode is (1 unless a context strategy rewrote its history)."""
        return len(self.segment_bounds())

    def segment_bounds(self) -> list[tuple[int, int]]:
        """``(first, stop)`` turn ranges of each segment, in order (one range for an unsegmented episode).

        Raises:
            ValueError: Turns whose ``segment_index`` goes down or skips a segment (a hand-edited record).
        """
        bounds: list[tuple[int, int]] = []
        start = 0
        for i in range(1, len(self.turns) + 1):
            if i == len(self.turns) or self.turns[i].segment_index != self.turns[start].segment_index:
                expected = len(bounds)
                if self.turns[start].segment_index != expected:
                    raise ValueError(f"Trajectory {self.traj_id or self.task_id}: turn {start} is in segment "
                                     f"{self.turns[start].segment_index}, expected {expected} (segments count up "
                                     "from 0 without gaps).")
                bounds.append((start, i))
                start = i
        return bounds or [(0, 0)]

    def token_view(self) -> TokenView:
        """Concatenate stored ids into one sequence with a loss mask (no re-tokenisation).

        Raises:
            ValueError: when the trajectory was produced by a policy that did not record token ids, or when its
                history was rewritten (several segments: no one sequence holds what the model saw; use
                :meth:`token_views`).
        """
        views = self.token_views()
        if len(views) > 1:
            raise ValueError(f"Trajectory {self.traj_id or self.task_id} has {len(views)} segments (a context strategy "
                             "rewrote its history), so no single sequence is what the model saw; use token_views(), "
                             "one sequence per segment.")
        return views[0]

    def token_views(self) -> list[TokenView]:
        """One token-exact sequence per segment, in order: the ids the model conditioned on (prompts, rendered
        once per segment) and the ids it sampled (loss mask 1). A trainer treats each as a row; all of them carry
        the episode's ``traj_id`` (``episode_id``), by which they share its return and advantage.

        Raises:
            ValueError: when the trajectory was produced by a policy that did not record token ids.
        """
        if not self.has_tokens:
            raise ValueError(
                f"Trajectory {self.traj_id or self.task_id} has no token ids; record it with a token-level "
                "policy (HFPolicy, VLLMPolicy, or OpenAIPolicy in completions mode) to train on it."
            )
        return [self._segment_view(k, first, stop) for k, (first, stop) in enumerate(self.segment_bounds())]

    def _segment_view(self, segment: int, first: int, stop: int) -> TokenView:
        ids: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        turn_idx: list[int] = []
        for i in range(first, stop):
            turn = self.turns[i]
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
        return TokenView(tuple(ids), tuple(mask), tuple(logps), tuple(turn_idx), segment, self.traj_id)

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
