"""Judges are policies: rubric judge calls batched, cached, bounded, and written into trajectories.

:class:`PolicyJudge` puts any agentgym policy (a served model through ``openai:``, Hugging Face, vLLM, a scripted
policy in tests) behind the :class:`~agentgym.rewards.judge.Judge` interface. Its calls go through the rollout
engine's :class:`~agentgym.rollout.batching.PolicyBatcher`, so prompts from many episodes share a batch; each call
is bounded by a timeout and retried; every successful reply is cached on disk by (judge name, prompt), so re-running
a scoring pass over the same episodes makes no call at all.

:func:`judge_trajectories` scores finished trajectories with a rubric, one episode at a time (``independent``) or
one call per task group and criterion (``group``, RULER-style: attempts scored relative to each other, which is
what a group-relative advantage compares). The new score replaces the outcome score and the last turn's reward
absorbs the difference, so the step rewards still sum to the outcome score. An episode whose judge failed keeps
``error="judge_error: ..."``: trainers drop it like an episode whose env failed, and the stats count it.

With ``verdict_format="json"`` each prompt carries the JSON schema of its verdict, and the judge decodes under it:
an in-process Hugging Face policy through ``SamplingParams.constraint`` (a
:class:`~agentgym.policies.json_constraint.JsonConstraint` over its tokenizer), a server through ``response_format``
``json_schema``. Then even an untrained judge model writes a parseable verdict on every call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
from agentgym.policies.base import GenerationRequest, Policy, SamplingParams
from agentgym.rewards.criteria import check_verdict_format
from agentgym.rewards.judge import Judge, JudgePrompt, JudgeReply
from agentgym.rewards.rubric import Rubric, RubricScore
from agentgym.rewards.sample import sample_from_trajectory
from agentgym.rollout.batching import PolicyBatcher
from agentgym.rollout.executor import run_coroutine
from agentgym.utils.coroutines import run_blocking
from agentgym.trajectory import Trajectory

__all__ = ["JUDGE_MODES", "NAIVE_JUDGE", "PolicyJudge", "SchemaConstraint", "judge_policy", "ajudge_trajectories",
           "judge_trajectories", "rescored"]

logger = logging.getLogger(__name__)

JUDGE_MODES = ("independent", "group")
CACHE_FILE = "judge_cache.jsonl"
#: The judge spec of the scripted stand-in judge (:mod:`agentgym.rewards.scripted_judge`), for tests and demos.
NAIVE_JUDGE = "scripted-naive"


def judge_policy(spec: str) -> Policy:
    """The judge policy of a spec: :data:`NAIVE_JUDGE` or any ``make_policy`` spec (``openai:BASE_URL#MODEL``...)."""
    if spec == NAIVE_JUDGE:
        from agentgym.policies.scripted import ScriptedPolicy
        from agentgym.rewards.scripted_judge import naive_judge_reply

        policy = ScriptedPolicy(naive_judge_reply)
        policy.name = NAIVE_JUDGE
        return policy
    from agentgym.policies import make_policy

    return make_policy(spec)


class SchemaConstraint:
    """A :class:`~agentgym.policy.TokenConstraint` that also carries its JSON schema, so each kind of policy can
    honour it its own way: a policy that samples locally steps the :class:`JsonConstraint` built over its tokenizer;
    :class:`~agentgym.policies.openai.OpenAIPolicy` sends ``json_schema`` as ``response_format`` and the server
    constrains the decoding.

    Args:
        schema: The JSON schema the reply must validate against.
        local: The constraint over the policy's tokenizer, or ``None`` for a policy that decodes elsewhere.
    """

    def __init__(self, schema: Mapping[str, Any], local: Any = None) -> None:
        self.json_schema = dict(schema)
        self._local = local

    def _require_local(self) -> Any:
        if self._local is None:
            raise ConfigError("This JSON-schema constraint was built for a server (sent as response_format); a policy "
                              "that samples locally needs one built over its tokenizer (PolicyJudge does that for "
                              "HFPolicy).")
        return self._local

    def start(self, max_tokens: int) -> Any:
        return self._require_local().start(max_tokens)

    def allowed(self, state: Any) -> tuple[Sequence[int], bool]:
        return self._require_local().allowed(state)

    def advance(self, state: Any, token: int) -> Any:
        return self._require_local().advance(state, token)


def _samples_locally(policy: Policy) -> bool:
    """Whether ``policy`` decodes in this process under ``SamplingParams.constraint`` (an :class:`HFPolicy`)."""
    try:
        from agentgym.policies.hf import HFPolicy
    except ImportError:  # no torch / transformers: no in-process model either
        return False
    return isinstance(policy, HFPolicy)


class PolicyJudge:
    """A judge backed by a policy, with batching, an on-disk cache, a timeout and retries.

    Args:
        policy: Any agentgym policy; it receives the judge prompt as system and user messages.
        name: The judge's identity in the cache (default: the policy's name); change it when the model changes.
        cache_dir: Folder for ``judge_cache.jsonl`` (a run directory); ``None`` caches in memory only.
        timeout_s: Most seconds one call may take before it is retried.
        retries: Extra attempts after a failed or timed-out call; then the reply records the error.
        sampling: How the judge samples (default greedy, 512 tokens).
        verdict_format: ``line`` (free text ending ``VERDICT: x``; any policy) or ``json`` (a JSON object decoded
            under its schema: an HF policy in process, or a server that honours ``response_format`` json_schema,
            such as ``agentgym serve`` or vLLM; another policy answers unconstrained and must write the JSON
            itself). ``json`` is what makes a small or untrained judge usable; ``line`` stays the default because
            it works with every policy and keeps the prompts, and so the caches and scores, of existing runs.
    """

    def __init__(self, policy: Policy, *, name: str | None = None, cache_dir: str | Path | None = None,
                 timeout_s: float = 120.0, retries: int = 2, sampling: SamplingParams | None = None,
                 verdict_format: str = "line") -> None:
        if timeout_s <= 0 or retries < 0:
            raise ConfigError(f"PolicyJudge needs timeout_s > 0 and retries >= 0, got {timeout_s} and {retries}.")
        self.verdict_format = check_verdict_format(verdict_format)
        self.policy = policy
        self.name = name or policy.name
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.sampling = sampling or SamplingParams(max_tokens=512, temperature=0.0)
        self.calls = 0  # prompts sent to the policy (retries included)
        self.cache_hits = 0
        self.batches = 0
        self.tokens_out = 0  # tokens the judge generated (where the policy reports them)
        self._constraints: dict[str, SchemaConstraint] = {}
        self._vocabulary: Any = None
        self._cache: dict[str, str] = {}
        self._cache_path = None if cache_dir is None else Path(cache_dir) / CACHE_FILE
        if self._cache_path is not None and self._cache_path.is_file():
            for line in self._cache_path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                    self._cache[str(record["key"])] = str(record["text"])
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a crash: that prompt is asked again

    def key(self, prompt: JudgePrompt) -> str:
        """The cache key: SHA-256 over the judge's name and the full prompt (its verdict schema included)."""
        parts: list[Any] = [self.name, prompt.system, prompt.user]
        if prompt.schema is not None:
            parts.append(json.dumps(prompt.schema, sort_keys=True))
        blob = json.dumps(parts, ensure_ascii=False)
        return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()

    def judge(self, prompts: Sequence[JudgePrompt]) -> list[JudgeReply]:
        """Synchronous :meth:`ajudge`, for envs (``reward=rubric``) and scripts. Called on a thread whose event loop
        is running (an env the rollout engine steps inline), it runs on a thread of its own: a loop cannot wait
        on a second loop in its own thread."""
        return run_blocking(self.ajudge(prompts))

    async def ajudge(self, prompts: Sequence[JudgePrompt]) -> list[JudgeReply]:
        """One reply per prompt; identical prompts are asked once, cached ones not at all."""
        keys = [self.key(p) for p in prompts]
        missing = {k: p for k, p in zip(keys, prompts) if k not in self._cache}
        self.cache_hits += len(keys) - sum(1 for k in keys if k in missing)
        failures: dict[str, str] = {}
        if missing:
            batcher = PolicyBatcher(self.policy, window_s=0.0)
            batcher.start()
            try:
                results = await asyncio.gather(*(self._ask(batcher, p) for p in missing.values()))
            finally:
                self.batches += batcher.calls
                await batcher.stop()
            for key, (text, error) in zip(missing, results):
                if text is None:
                    failures[key] = error or "the judge returned nothing"
                else:
                    self._remember(key, text)
        return [JudgeReply(self._cache[k]) if k in self._cache else JudgeReply(None, failures.get(k)) for k in keys]

    def _constraint(self, schema: Mapping[str, Any]) -> SchemaConstraint:
        """The constraint of a verdict schema, built once per schema (its token scans are cached inside it)."""
        key = json.dumps(schema, sort_keys=True)
        constraint = self._constraints.get(key)
        if constraint is None:
            local = None
            if _samples_locally(self.policy):
                from agentgym.policies.json_constraint import JsonConstraint, TokenVocabulary

                if self._vocabulary is None:
                    self._vocabulary = TokenVocabulary(self.policy.tokenizer)  # type: ignore[attr-defined]
                local = JsonConstraint(schema, self._vocabulary)
            constraint = self._constraints[key] = SchemaConstraint(schema, local)
        return constraint

    def _sampling_for(self, prompt: JudgePrompt) -> SamplingParams:
        if prompt.schema is None:
            return self.sampling
        return dataclasses.replace(self.sampling, constraint=self._constraint(prompt.schema))

    async def _ask(self, batcher: PolicyBatcher, prompt: JudgePrompt) -> tuple[str | None, str | None]:
        try:
            sampling = self._sampling_for(prompt)
        except Exception as exc:  # noqa: BLE001 - e.g. a schema the decoder cannot follow: recorded per prompt
            return None, f"judge call failed: cannot constrain the verdict: {type(exc).__name__}: {exc}"
        request = GenerationRequest(messages=prompt.messages(), sampling=sampling, episode_id=f"judge-{prompt.key}")
        error = ""
        for _ in range(self.retries + 1):
            self.calls += 1
            try:
                generation = await asyncio.wait_for(batcher.submit(request), self.timeout_s)
                self.tokens_out += len(generation.token_ids or ())
                return generation.text, None
            except TimeoutError:
                error = f"judge call timed out after {self.timeout_s:g} s"
            except Exception as exc:  # noqa: BLE001 - a failed judge call is recorded, never raised per episode
                error = f"judge call failed: {type(exc).__name__}: {exc}"
        return None, f"{error} ({self.retries + 1} attempts)"

    def _remember(self, key: str, text: str) -> None:
        self._cache[key] = text
        if self._cache_path is not None:
            self._cache_path.parent.mkdir(parents=True, exist_ok=True)
            with self._cache_path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"judge": self.name, "key": key, "text": text}, ensure_ascii=False) + "\n")


def rescored(trajectory: Trajectory, result: RubricScore) -> Trajectory:
    """``trajectory`` with the rubric's score as its outcome score (the checker's kept as ``checker_score``) and
    the difference paid on its last turn as the reward component ``"rubric"``, so step rewards sum to the score.
    A judge error leaves the score alone and sets ``error``: the episode is masked out of training."""
    outcome = dict(trajectory.outcome)
    outcome.setdefault("checker_score", float(outcome.get("score", 0.0)))
    outcome["rubric"] = result.to_dict()
    if result.error is not None or result.score is None:
        outcome["judge_error"] = result.error
        return dataclasses.replace(trajectory, outcome=outcome, error=result.error)
    outcome["score"] = float(result.score)
    turns = list(trajectory.turns)
    if turns:
        last = turns[-1]
        delta = float(result.score) - sum(t.reward for t in turns)
        info = dict(last.info)
        rewards = dict(info.get("rewards") or {})
        rewards["rubric"] = rewards.get("rubric", 0.0) + delta
        info["rewards"] = rewards
        turns[-1] = dataclasses.replace(last, reward=last.reward + delta, info=info)
    return dataclasses.replace(trajectory, outcome=outcome, turns=tuple(turns), error=trajectory.error)


async def _replies(judge: Judge, prompts: Sequence[JudgePrompt]) -> list[JudgeReply]:
    if isinstance(judge, PolicyJudge):
        return await judge.ajudge(prompts)
    return await asyncio.to_thread(judge.judge, prompts)


async def ajudge_trajectories(trajectories: Sequence[Trajectory], rubric: Rubric, judge: Judge | None = None, *,
                              mode: str = "independent", references: Mapping[str, Any] | None = None,
                              ) -> tuple[list[Trajectory], dict[str, Any]]:
    """Async :func:`judge_trajectories`."""
    if mode not in JUDGE_MODES:
        raise ConfigError(f"judge_mode must be one of {', '.join(JUDGE_MODES)}, got {mode!r}.")
    judge = judge or rubric.judge
    if rubric.needs_judge and judge is None:
        raise ConfigError(f"Rubric {rubric.name!r} has judge criteria; pass judge=PolicyJudge(policy).")
    references = references or {}
    verdict_format = check_verdict_format(str(getattr(judge, "verdict_format", "line")))
    out = list(trajectories)
    live = [i for i, t in enumerate(out) if t.error is None and t.end_reason != "error"]
    samples = {i: sample_from_trajectory(out[i], references.get(out[i].task_id)) for i in live}
    results: dict[int, RubricScore] = {}
    if mode == "independent" or not rubric.needs_judge:
        prompts = {i: rubric.prompts(samples[i], verdict_format) for i in live}
        flat = [p for i in live for p in prompts[i]]
        replies = await _replies(judge, flat) if flat else []  # type: ignore[arg-type]
        at = 0
        for i in live:
            mine = replies[at: at + len(prompts[i])]
            at += len(prompts[i])
            results[i] = rubric.combine(samples[i], {p.key: r for p, r in zip(prompts[i], mine)}, verdict_format)
    else:
        groups: dict[str, list[int]] = {}
        for i in live:
            groups.setdefault(out[i].group_id or out[i].task_id, []).append(i)
        group_prompts = {g: rubric.group_prompts([samples[i] for i in members], verdict_format)
                         for g, members in groups.items()}
        flat = [p for g in groups for p in group_prompts[g]]
        replies = await _replies(judge, flat)  # type: ignore[arg-type]
        at = 0
        for g, members in groups.items():
            mine = replies[at: at + len(group_prompts[g])]
            at += len(group_prompts[g])
            scores = rubric.combine_group([samples[i] for i in members],
                                          {p.key: r for p, r in zip(group_prompts[g], mine)}, verdict_format)
            results.update(zip(members, scores))
    for i, result in results.items():
        out[i] = rescored(out[i], result)
    errors = sum(1 for r in results.values() if r.error is not None)
    stats: dict[str, Any] = {"judged": len(results), "judge_errors": errors}
    if isinstance(judge, PolicyJudge):
        stats.update(judge_calls=judge.calls, judge_cache_hits=judge.cache_hits, judge_batches=judge.batches,
                     judge_tokens_out=judge.tokens_out)
    if errors:
        first = next(r.error for r in results.values() if r.error is not None)
        logger.warning("%d of %d judged episodes have no usable verdict and are masked out (first: %s)",
                       errors, len(results), first)
    return out, stats


def judge_trajectories(trajectories: Sequence[Trajectory], rubric: Rubric, judge: Judge | None = None, *,
                       mode: str = "independent", references: Mapping[str, Any] | None = None,
                       ) -> tuple[list[Trajectory], dict[str, Any]]:
    """Score finished trajectories with ``rubric``; return them rescored, with stats (``judge_calls``,
    ``judge_cache_hits``, ``judge_errors``). Episodes that already failed are returned unchanged.

    Args:
        mode: ``independent`` (one call per episode and judge criterion) or ``group`` (one call per task group
            and judge criterion; groups are ``group_id``, else ``task_id``).
        references: Reference answers by task id, for checks that compare against them.
    """
    return run_coroutine(ajudge_trajectories(trajectories, rubric, judge, mode=mode, references=references))
