"""Context strategies on a 60-turn scripted episode: each one rewrites the history into segments whose ids are
exactly what a fresh render of the rewritten conversation gives; budgets end episodes with their own reasons."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import load_tiny_model  # noqa: E402
from agentgym.policies import ScriptedPolicy  # noqa: E402
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.rollout.context import ContextConfig, drop_tool_outputs, summary_history, window  # noqa: E402
from agentgym.policies.base import SamplingParams  # noqa: E402
from agentgym.suite import Task  # noqa: E402
from agentgym.trajectory import Trajectory  # noqa: E402
from tests.helpers.tiny_models import SMALL  # noqa: E402

SYSTEM = "Walk the hall."
#: 58 forwards, one key, the vault: the reference solution is exactly 60 turns.
QUEST = Task("quest-60", "Find the key and open the vault in room 58.", None, {"rooms": 59, "keys": [20], "seed": 7})
SUMMARY = "I walked forward through the hall and must keep going to the vault."


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from agentgym.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", config=SMALL,
                            texts=["You walk forward. You are in room 3, a dusty chamber. forward() take() open()"])
    return load_tiny_model(path)[1]


def solver_reply(messages: Sequence[Mapping[str, Any]]) -> str:
    """The reference solver on the latest observation (and a summary when asked for one)."""
    last = str(messages[-1]["content"])
    if "summary" in last and "Reply with the summary only" in last:
        return SUMMARY
    latest = last.rsplit("Latest observation:", 1)[-1]
    if "A key lies here" in latest:
        return "take()"
    if "The vault is here" in latest:
        return "open()"
    return "forward()"


def run(tokenizer: Any, context: ContextConfig | str, *, reply: Any = solver_reply, **config: Any) -> Trajectory:
    values: dict[str, Any] = dict(system_prompt=SYSTEM, sampling=SamplingParams(max_tokens=16), max_in_flight=1,
                                  progress=False, context=context)
    values.update(config)
    policy = ScriptedPolicy(reply, tokenizer=tokenizer)
    [trajectory] = RolloutEngine(policy, RolloutConfig(**values)).run(
        [EpisodeSpec("agentgym/LongQuest-v0", task=QUEST, seed=0)])
    assert trajectory.error is None, trajectory.error
    return trajectory


def render(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def head(trajectory: Trajectory) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": trajectory.turns[0].observation}]


def pairs(trajectory: Trajectory, first: int, stop: int) -> list[dict[str, Any]]:
    """Action and observation messages of turns ``first..stop-1`` (turn t's answer is turn t+1's observation)."""
    out: list[dict[str, Any]] = []
    for t in range(first, stop):
        out += [{"role": "assistant", "content": trajectory.turns[t].action},
                {"role": "user", "content": trajectory.turns[t + 1].observation}]
    return out


def assert_segments_rerender(tokenizer: Any, trajectory: Trajectory, start_messages: Any) -> None:
    """Every turn's prompt (ids before its action, within its segment) equals a fresh render of the conversation
    the model saw: the segment's rewritten start and the turns since."""
    views = trajectory.token_views()
    assert [v.segment_index for v in views] == list(range(len(views)))
    assert {v.episode_id for v in views} == {trajectory.traj_id}
    for k, (first, stop) in enumerate(trajectory.segment_bounds()):
        messages = start_messages(k, first)
        ids = list(views[k].input_ids)
        position = 0
        for t in range(first, stop):
            turn = trajectory.turns[t]
            position += len(turn.prompt_token_ids or ())
            if t > first:  # the messages grew by the previous action and its answer
                if trajectory.turns[t - 1].kind == "summary":
                    break
                messages = messages + pairs(trajectory, t - 1, t)
            if turn.kind != "summary":
                assert ids[:position] == render(tokenizer, messages), f"segment {k}, turn {t}"
            position += len(turn.action_token_ids or ())


def test_full_context_ends_at_the_context_limit(tokenizer: Any) -> None:
    trajectory = run(tokenizer, "full", max_context_tokens=600)
    assert trajectory.end_reason == "context_limit" and len(trajectory.turns) < 60
    assert trajectory.num_segments == 1 and len(trajectory.token_views()) == 1


def test_window_finishes_the_60_turn_quest_in_token_exact_segments(tokenizer: Any) -> None:
    trajectory = run(tokenizer, ContextConfig("window", keep_turns=3), max_context_tokens=600)
    assert trajectory.success and len(trajectory.turns) == 60 and trajectory.num_segments > 2
    assert trajectory.metadata["template_forks"] == 0
    assert all(len(v) <= 600 for v in trajectory.token_views())

    def start(k: int, first: int) -> list[dict[str, Any]]:
        return head(trajectory) + (pairs(trajectory, first - 3, first) if k else [])

    assert_segments_rerender(tokenizer, trajectory, start)


def test_drop_tool_outputs_stubs_older_observations(tokenizer: Any) -> None:
    config = ContextConfig("drop_tool_outputs", keep_tool_outputs=2, stub="-")
    trajectory = run(tokenizer, config, max_context_tokens=1500)
    assert trajectory.end_reason == "solved", trajectory.end_reason
    assert trajectory.success and len(trajectory.turns) == 60 and trajectory.num_segments > 1

    def start(k: int, first: int) -> list[dict[str, Any]]:
        messages = head(trajectory) + pairs(trajectory, 0, first)
        if k:
            observations = [i for i in range(2, len(messages)) if messages[i]["role"] == "user"]
            for i in observations[:-2]:
                messages[i] = {**messages[i], "content": config.stub}
        return messages

    assert_segments_rerender(tokenizer, trajectory, start)


def test_summarize_writes_a_sampled_summary_turn_and_continues_from_it(tokenizer: Any) -> None:
    trajectory = run(tokenizer, ContextConfig("summarize", summary_max_tokens=24), max_context_tokens=700)
    summaries = [t for t in trajectory.turns if t.kind == "summary"]
    assert trajectory.success and len(trajectory.turns) == 60 + len(summaries) and summaries
    assert all(t.action == SUMMARY and t.action_token_ids for t in summaries), "a summary is a sampled action"
    assert trajectory.num_segments == len(summaries) + 1
    for view in trajectory.token_views()[:-1]:  # each earlier segment ends with its summary, trained (mask 1)
        assert view.loss_mask[-1] == 1
    assert all(t.state_key and t.state_key.startswith("summary:room ") for t in summaries)

    def start(k: int, first: int) -> list[dict[str, Any]]:
        if not k:
            return head(trajectory)
        latest = trajectory.turns[first].observation
        return summary_history(head(trajectory) + [{"role": "user", "content": latest}],
                               trajectory.turns[first - 1].action)

    assert_segments_rerender(tokenizer, trajectory, start)
    assert trajectory.metadata["segments"] == trajectory.num_segments


def test_a_named_summarizer_writes_summaries_that_no_turn_records(tokenizer: Any) -> None:
    summarizer = ScriptedPolicy([SUMMARY])
    policy = ScriptedPolicy(solver_reply, tokenizer=tokenizer)
    config = RolloutConfig(system_prompt=SYSTEM, sampling=SamplingParams(max_tokens=16), max_in_flight=1,
                           progress=False, context="summarize", max_context_tokens=700)
    [trajectory] = RolloutEngine(policy, config, summarizer=summarizer).run(
        [EpisodeSpec("agentgym/LongQuest-v0", task=QUEST, seed=0)])
    assert trajectory.success and len(trajectory.turns) == 60 and trajectory.num_segments > 1
    assert not any(t.kind == "summary" for t in trajectory.turns)
    assert trajectory.metadata["summaries"] == [SUMMARY] * (trajectory.num_segments - 1)


def custom_keep_last_two(messages: Sequence[Mapping[str, Any]], config: ContextConfig) -> list[dict[str, Any]] | None:
    """A user's own strategy: the task and the last observation only."""
    return [dict(messages[0]), dict(messages[1]), dict(messages[-2]), dict(messages[-1])] if len(messages) > 4 else None


def test_a_summary_prompt_the_model_refuses_ends_as_context_limit_and_says_what_to_change(tokenizer: Any) -> None:
    """A model that refuses the summary request as too long ends the episode as a truncation (``context_limit``,
    trained on), not as an error; the trajectory says the summary prompt did not fit and which settings fix it."""
    from agentgym.errors import ContextLengthExceeded
    from agentgym.trajectory import TERMINATION

    def reply(messages: Sequence[Mapping[str, Any]]) -> str:
        if "Reply with the summary only" in str(messages[-1]["content"]):
            raise ContextLengthExceeded("prompt of 900 tokens plus max_tokens=24 is longer than the context (800)")
        return solver_reply(messages)

    trajectory = run(tokenizer, ContextConfig("summarize", summary_max_tokens=24), reply=reply,
                     max_context_tokens=700)
    assert trajectory.end_reason == "context_limit" and TERMINATION[trajectory.end_reason].trains
    assert trajectory.turns and not any(t.kind == "summary" for t in trajectory.turns)
    note = trajectory.metadata["context_limit"]
    assert "summary" in note and "did not fit" in note
    assert "context.trigger_tokens" in note and "context.summary_max_tokens" in note


def test_a_summary_prompt_past_max_context_tokens_ends_as_context_limit(tokenizer: Any) -> None:
    """A trigger set past what the summary request can fit: the request is not sent (the prompt plus the summary
    would pass ``max_context_tokens``); the episode ends as ``context_limit`` with the same note."""
    asked: list[int] = []

    def reply(messages: Sequence[Mapping[str, Any]]) -> str:
        if "Reply with the summary only" in str(messages[-1]["content"]):
            asked.append(1)
        return solver_reply(messages)

    trajectory = run(tokenizer, ContextConfig("summarize", summary_max_tokens=24, trigger_tokens=690), reply=reply,
                     max_context_tokens=700)
    assert trajectory.end_reason == "context_limit" and not asked, "the summary request was never sent"
    assert "summary" in trajectory.metadata["context_limit"]


def test_a_users_own_strategy_by_dotted_path(tokenizer: Any) -> None:
    trajectory = run(tokenizer, {"strategy": "tests.rollout.test_context:custom_keep_last_two", "trigger_turns": 10})
    assert trajectory.success and trajectory.num_segments == 6  # a rewrite every 10 turns of a 60-turn episode


def test_strategies_are_plain_functions_of_the_history() -> None:
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    for i in range(5):
        history += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"o{i}"}]
    assert window(history, ContextConfig("window", keep_turns=2)) == history[:2] + history[-4:]
    assert window(history[:4], ContextConfig("window", keep_turns=2)) is None
    dropped = drop_tool_outputs(history, ContextConfig("drop_tool_outputs", keep_tool_outputs=1, stub="-"))
    assert dropped is not None and [m["content"] for m in dropped if m["role"] == "user"] == ["task", "-", "-", "-", "-",
                                                                                              "o4"]
    assert summary_history(history, "did things")[-1]["content"].endswith("Latest observation:\no4")


@pytest.mark.parametrize("bad", [{"strategy": "zoom"}, {"strategy": "window", "keep_turns": -1},
                                 {"strategy": "nowhere.module:fn"}, {"strategy": "window", "color": 1}])
def test_bad_context_settings_say_what_to_do(bad: dict[str, Any], tokenizer: Any) -> None:
    with pytest.raises(ConfigError):
        run(tokenizer, bad, max_context_tokens=600)
    # a rewriting strategy needs something that triggers it
    with pytest.raises(ConfigError, match="nothing to trigger"):
        from agentgym.rollout.segments import EpisodeContext

        EpisodeContext(RolloutConfig(context="window"), ScriptedPolicy(["x"], tokenizer=tokenizer))


# ---- budgets ------------------------------------------------------------------------------------------
def test_max_turn_tokens_cuts_the_action_and_ends_the_episode(tokenizer: Any) -> None:
    def reply(messages: Sequence[Mapping[str, Any]]) -> str:
        return "forward() " * 30 if sum(m["role"] == "assistant" for m in messages) == 4 else "forward()"

    trajectory = run(tokenizer, "full", reply=reply, max_turn_tokens=20)
    assert trajectory.end_reason == "turn_token_limit" and len(trajectory.turns) == 5
    assert trajectory.turns[-1].kind == "invalid" and trajectory.turns[-1].reward == 0.0
    assert trajectory.turns[-1].info == {"kind": "invalid", "calls": []}, "the cut action was never stepped"


def test_max_episode_tokens_counts_over_segments(tokenizer: Any) -> None:
    trajectory = run(tokenizer, ContextConfig("window", keep_turns=2), max_context_tokens=500, max_episode_tokens=200)
    assert trajectory.end_reason == "episode_token_limit" and trajectory.num_segments > 1
    # the scripted policy ignores the capped max_tokens, so its last action may pass the budget; the episode ends
    # on the turn that spends it
    assert trajectory.num_action_tokens - len(trajectory.turns[-1].action_token_ids or ()) < 200 \
        <= trajectory.num_action_tokens


def test_context_limit_bounds_each_segment_when_a_rewrite_cannot_help(tokenizer: Any) -> None:
    trajectory = run(tokenizer, ContextConfig("window", keep_turns=40), max_context_tokens=600)
    assert trajectory.end_reason == "context_limit" and trajectory.num_segments == 1


def test_old_trajectory_records_still_load(tmp_path: Path) -> None:
    """A record written before segments existed has no segment_index: it reads as one segment."""
    record = {"schema_version": 1, "env_id": "e", "task_id": "t", "seed": 0, "traj_id": "x", "group_id": "",
              "policy": "", "end_reason": "answered", "outcome": {"success": True, "score": 1.0}, "error": None,
              "timing": {}, "metadata": {},
              "turns": [{"observation": "o", "action": "a", "reward": 1.0, "info": {"kind": "answer"},
                         "prompt_token_ids": [1, 2], "action_token_ids": [3], "action_logprobs": [-0.5],
                         "action_entropies": None, "finish_reason": "stop", "state_key": None}]}
    trajectory = Trajectory.from_dict(record)
    assert trajectory.num_segments == 1 and trajectory.token_view().input_ids == (1, 2, 3)
    assert trajectory.to_dict() == record, "an unsegmented trajectory writes the record it always wrote"


# ---- the branching sampler ---------------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["window", "summarize"])
def test_branching_sampler_keeps_context_and_branches_copy_it(tokenizer: Any, strategy: str) -> None:
    """Branches (replayed on a fresh env: LongQuest is not forkable) continue their parent's segments and
    summaries; every trajectory finishes the 60-turn quest in segments that re-render token-exact."""
    from agentgym.rollout.branching import BranchingConfig, BranchingSampler

    config = RolloutConfig(system_prompt=SYSTEM, sampling=SamplingParams(max_tokens=16, seed=0), progress=False,
                           context=ContextConfig(strategy, keep_turns=3), max_context_tokens=700)
    branching = BranchingConfig(budget=3, initial_rollouts=1, beam_size=2, branch_probability=0.2,
                                entropy_weight=0.0, entropy_top_k=0, vocab_size=512, seed=1)
    sampler = BranchingSampler(ScriptedPolicy(solver_reply, tokenizer=tokenizer), config, branching)
    trajectories = sampler.run([EpisodeSpec("agentgym/LongQuest-v0", task=QUEST, seed=0, group_id="g")] * 3)
    assert any(t.metadata["tree"]["origin"] == "branch" for t in trajectories)
    for trajectory in trajectories:
        assert trajectory.error is None and trajectory.success and trajectory.num_segments > 1
        summaries = sum(t.kind == "summary" for t in trajectory.turns)
        assert len(trajectory.turns) == 60 + summaries and (summaries > 0) == (strategy == "summarize")
        if strategy == "window":
            assert_segments_rerender(tokenizer, trajectory, lambda k, first, t=trajectory: head(t) + (
                pairs(t, first - 3, first) if k else []))
