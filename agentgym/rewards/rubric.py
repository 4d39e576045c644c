"""A rubric: a weighted set of criteria (checks, judge questions, nested rubrics) scored in [0, 1].

Scoring is split in two so that judge calls can be batched across many episodes: :meth:`Rubric.prompts` lists
the judge prompts an episode needs, something else answers them (a :class:`~agentgym.rewards.judge.Judge`, or the
rollout layer's batched judge pass), and :meth:`Rubric.combine` turns the replies into a :class:`RubricScore`.
:meth:`Rubric.evaluate` does both with one judge, for envs and scripts.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from agentgym.errors import ConfigError
from agentgym.rewards.criteria import Check, JudgeCriterion, VerdictError, check_verdict_format
from agentgym.rewards.judge import Judge, JudgePrompt, JudgeReply
from agentgym.rewards.sample import RubricSample

__all__ = ["Criterion", "Rubric", "RubricScore", "load_rubric"]

Criterion = Union[Check, JudgeCriterion, "Rubric"]


@dataclass(frozen=True)
class RubricScore:
    """A rubric's result for one episode.

    Attributes:
        score: The weighted score in [0, 1]; ``None`` when a judge failed (see ``error``).
        breakdown: Score of every criterion by path (``"report/facts"``), nested rubrics' totals included.
        error: Why a judge gave no usable verdict; such an episode must not be trained on.
    """

    score: float | None
    breakdown: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "breakdown": dict(self.breakdown), "error": self.error}


@dataclass(frozen=True)
class Rubric:
    """A weighted set of criteria.

    Attributes:
        name: Its key in a parent's breakdown and the prefix of its criteria's paths.
        criteria: :class:`Check`, :class:`JudgeCriterion` or nested :class:`Rubric` items, with distinct names.
        weight: Its share when nested in another rubric.
        judge: The judge :meth:`evaluate` uses when none is passed (an env with ``reward=rubric`` uses it).
    """

    name: str
    criteria: tuple[Criterion, ...]
    weight: float = 1.0
    judge: Judge | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "criteria", tuple(self.criteria))
        if not self.criteria:
            raise ConfigError(f"Rubric {self.name!r} has no criteria; give it at least one Check or JudgeCriterion.")
        names = [c.name for c in self.criteria]
        if len(set(names)) != len(names):
            raise ConfigError(f"Rubric {self.name!r} has duplicate criterion names: {names}.")
        for c in self.criteria:
            if not isinstance(c, (Check, JudgeCriterion, Rubric)):
                raise ConfigError(f"Rubric {self.name!r}: {c!r} is not a Check, JudgeCriterion or Rubric.")
        if not math.isfinite(self.weight) or self.weight < 0:
            raise ConfigError(f"Rubric {self.name!r}: weight must be a finite number >= 0, got {self.weight!r}.")
        if sum(c.weight for c in self.criteria) <= 0:
            raise ConfigError(f"Rubric {self.name!r}: the criteria's weights sum to 0; give one a positive weight.")

    def judge_criteria(self, prefix: str = "") -> Iterator[tuple[str, JudgeCriterion]]:
        """Every judge criterion with its path, depth first."""
        base = f"{prefix}{self.name}/"
        for c in self.criteria:
            if isinstance(c, JudgeCriterion):
                yield base + c.name, c
            elif isinstance(c, Rubric):
                yield from c.judge_criteria(base)

    @property
    def needs_judge(self) -> bool:
        return next(self.judge_criteria(), None) is not None

    def prompts(self, sample: RubricSample, verdict_format: str = "line") -> list[JudgePrompt]:
        """The judge prompts one episode needs (one per judge criterion), asking for verdicts in
        ``verdict_format`` (``line`` or ``json``, see :mod:`agentgym.rewards.criteria`)."""
        return [c.prompt(sample, key, verdict_format) for key, c in self.judge_criteria()]

    def group_prompts(self, samples: Sequence[RubricSample], verdict_format: str = "line") -> list[JudgePrompt]:
        """The judge prompts a task group needs: one per judge criterion, showing every attempt."""
        return [c.group_prompt(samples, key, verdict_format) for key, c in self.judge_criteria()]

    def combine(self, sample: RubricSample, replies: Mapping[str, JudgeReply],
                verdict_format: str = "line") -> RubricScore:
        """The score of one episode given the judge's replies to :meth:`prompts` (same ``verdict_format``), by key."""
        check_verdict_format(verdict_format)
        verdicts: dict[str, float] = {}
        for key, c in self.judge_criteria():
            reply = replies.get(key)
            try:
                verdicts[key] = c.parse(_reply_text(reply, key), verdict_format)
            except VerdictError as exc:
                return RubricScore(None, {}, f"judge_error: {key}: {exc}")
        return self._score(sample, verdicts)

    def combine_group(self, samples: Sequence[RubricSample], replies: Mapping[str, JudgeReply],
                      verdict_format: str = "line") -> list[RubricScore]:
        """The scores of a task group given the replies to :meth:`group_prompts`; a failed group call fails the
        whole group (its relative scores mean nothing without the call)."""
        check_verdict_format(verdict_format)
        per_sample: list[dict[str, float]] = [{} for _ in samples]
        for key, c in self.judge_criteria():
            try:
                scores = c.parse_group(_reply_text(replies.get(key), key), len(samples), verdict_format)
            except VerdictError as exc:
                return [RubricScore(None, {}, f"judge_error: {key}: {exc}") for _ in samples]
            for verdicts, s in zip(per_sample, scores):
                verdicts[key] = s
        return [self._score(sample, verdicts) for sample, verdicts in zip(samples, per_sample)]

    def evaluate(self, sample: RubricSample, judge: Judge | None = None) -> RubricScore:
        """Score one episode, asking ``judge`` (default: the rubric's own) for the judge criteria, in the judge's
        ``verdict_format`` (``line`` when it has none)."""
        judge = judge or self.judge
        verdict_format = str(getattr(judge, "verdict_format", "line"))
        prompts = self.prompts(sample, verdict_format)
        if prompts and judge is None:
            raise ConfigError(f"Rubric {self.name!r} has judge criteria but no judge: pass Rubric(..., judge=...) or "
                              "score it with agentgym.rollout.judging.judge_trajectories(..., judge=PolicyJudge(policy)).")
        replies = judge.judge(prompts) if prompts else []
        return self.combine(sample, {p.key: r for p, r in zip(prompts, replies)}, verdict_format)

    def _score(self, sample: RubricSample, verdicts: Mapping[str, float], prefix: str = "") -> RubricScore:
        base = f"{prefix}{self.name}/"
        breakdown: dict[str, float] = {}
        total = weights = 0.0
        for c in self.criteria:
            path = base + c.name
            if isinstance(c, Check):
                value = c.score(sample)
            elif isinstance(c, JudgeCriterion):
                value = verdicts[path]
            else:
                nested = c._score(sample, verdicts, base)
                breakdown.update(nested.breakdown)
                value = float(nested.score or 0.0)
            breakdown[path] = value
            total += c.weight * value
            weights += c.weight
        return RubricScore(total / weights, breakdown)


def _reply_text(reply: JudgeReply | None, key: str) -> str:
    if reply is None:
        raise VerdictError(f"no reply for {key}")
    if reply.error is not None or reply.text is None:
        raise VerdictError(reply.error or "the judge returned nothing")
    return reply.text


def load_rubric(spec: Rubric | str) -> Rubric:
    """A rubric, or ``"module:name"`` / ``"path/to/file.py:name"`` naming one (or a function returning one), as a
    suite YAML's ``env_kwargs: {reward: ...}`` or ``agentgym rescore --rubric`` writes it."""
    if isinstance(spec, Rubric):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"A rubric is a Rubric or 'module:name' naming one (e.g. 'mypkg.rubrics:report'); got {spec!r}.")
    where, _, name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ConfigError(f"Rubric file {where!r} does not exist.")
            module_spec = importlib.util.spec_from_file_location(f"_agentgym_rubric_{path.stem}", path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as exc:
        raise ConfigError(f"Cannot import the rubric module {where!r}: {exc}.") from exc
    value = getattr(module, name, None)
    if inspect.isfunction(value):
        try:
            value = value()
        except Exception as exc:  # noqa: BLE001 - the user's builder failed: say which one and why
            raise ConfigError(f"Building the rubric with {spec!r}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, Rubric):
        raise ConfigError(f"{spec!r} is not a Rubric (got {type(value).__name__}); name a Rubric or a function "
                          "that returns one.")
    return value
