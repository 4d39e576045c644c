"""Token-exact multi-turn sequences with the chat formats of real model families (tests/helpers/chat_families.py).

A scripted token policy (chosen ids, as a model would sample them) plays 3-turn episodes with Hermes
``<tool_call>`` actions through ChatAgent; the checks are on ids: the sequence is prompt + sampled ids + glue,
the loss mask is 1 exactly on sampled ids, the end of a turn is decided on ids, re-rendering templates are
counted as forks, tools reach the template, and actions sampled from another prompt keep no ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from agentgym.agent import ChatAgent
from agentgym.policies.base import Generation, GenerationRequest, Policy
from agentgym.trajectory import Trajectory, Turn
from tests.helpers.chat_families import FAMILIES, Family, build_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]
OBSERVATIONS = ("What is 12*7? Use the calculator.", "84", "Correct!")


def _call(expr: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "calculator", "arguments": {"expr": expr}}) + "\n</tool_call>"


def _actions(family: Family, think: bool) -> list[str]:
    reasoning = "<think>\nI should compute it.\n</think>\n\n" if think else ""
    if family.name == "deepseek-r1-distill":  # its generation prompt already opened the think block
        reasoning = reasoning.removeprefix("<think>\n")
    return [reasoning + _call("12*7"), reasoning + _call("84+0"), reasoning + "The answer is 84."]


def _sampled(tok, text: str, end: str | None) -> tuple[int, ...]:
    """Ids a model would sample for ``text``, ended by the special token ``end`` (None: cut by length)."""
    ids = tok.encode(text, add_special_tokens=False)
    return tuple(ids) + ((tok.convert_tokens_to_ids(end),) if end else ())


def _play(family: Family, role: str, *, think: bool = False, tools: list | None = None,
          ends: tuple[str | None, ...] | None = None) -> tuple[ChatAgent, Trajectory, list[tuple[int, ...]]]:
    tok = build_tokenizer(family)
    agent = ChatAgent(tok, observation_role=role)
    agent.start("Solve arithmetic tasks.", OBSERVATIONS[0], tools=tools)
    agent.exact_after_obs = []  # test-side check: linear ids == a fresh render's ids, after each observation
    turns, sampled = [], []
    ends = ends or (family.end_token,) * 3
    for i, (text, end) in enumerate(zip(_actions(family, think), ends, strict=True)):
        prompt = tuple(agent.pending_prompt_ids)
        ids = _sampled(tok, text, end)
        action_ids = agent.record_action(Generation(text, ids, finish_reason="stop" if end else "length"))
        sampled.append(ids)
        turns.append(Turn(OBSERVATIONS[i], text, prompt_token_ids=prompt, action_token_ids=action_ids))
        if i + 1 < len(OBSERVATIONS):
            agent.add_observation(OBSERVATIONS[i + 1])
            fresh = tok.apply_chat_template(agent.messages, tokenize=False, add_generation_prompt=True,
                                            **({"tools": tools} if tools else {}))
            agent.exact_after_obs.append(agent.token_ids == tok.encode(fresh, add_special_tokens=False))
    return agent, Trajectory(env_id="scripted", task_id="t", seed=0, turns=tuple(turns), outcome={},
                             end_reason="done"), sampled


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("role", ["user", "tool"])
def test_three_turns_are_token_exact_and_mask_only_sampled_ids(family: Family, role: str) -> None:
    agent, traj, sampled = _play(family, role, tools=TOOLS)
    view = traj.token_view()
    assert list(view.input_ids) == agent.token_ids[: len(view.input_ids)]
    masked = [t for t, m in zip(view.input_ids, view.loss_mask, strict=True) if m]
    assert masked == [t for ids in sampled for t in ids]  # 1 exactly on sampled ids, nothing else
    # Without think blocks every family appends: the linear sequence equals a fresh render, id for id.
    # DeepSeek-R1's generation prompt ends in "<think>\n", which its history render drops: every turn forks.
    forks = 2 if family.name == "deepseek-r1-distill" else 0
    assert agent.exact_after_obs == [not forks] * 2
    assert agent.template_forks == forks
    # The sampled end token stands for the template's close: it is never added a second time.
    end_id = agent.tokenizer.convert_tokens_to_ids(family.end_token)
    for i in range(len(agent.token_ids) - 1):
        assert not (agent.token_ids[i] == end_id and agent.token_ids[i + 1] == end_id), "close added twice"


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_length_cut_ending_in_end_token_prefix_gets_the_real_end_id(family: Family) -> None:
    tok = build_tokenizer(family)
    end_id = tok.convert_tokens_to_ids(family.end_token)
    agent = ChatAgent(tok)
    agent.start("sys", OBSERVATIONS[0])
    cut = family.end_token[:2]  # e.g. "<|": text that decodes like the start of the end token
    ids = tuple(tok.encode("partial " + cut, add_special_tokens=False))
    agent.record_action(Generation("partial " + cut, ids, finish_reason="length"))
    before = len(agent.token_ids)
    agent.add_observation("obs")
    assert agent.token_ids[before - len(ids):before] == list(ids)  # the cut action is kept as sampled
    assert agent.token_ids[before] == end_id  # and the real special id follows it (not "|im_end|>" as text)
    assert agent.template_forks == (1 if family.name == "deepseek-r1-distill" else 0)


def test_qwen3_is_accepted_and_forks_are_counted_only_where_history_is_rerendered() -> None:
    qwen3 = next(f for f in FAMILIES if f.name == "qwen3")
    # user role: each observation is a new query, so earlier turns lose their think blocks on a fresh render.
    agent, traj, _ = _play(qwen3, "user", think=True)
    assert agent.template_forks == 2 and agent.exact_after_obs == [False, False]
    assert traj.has_tokens
    # tool role: all assistant turns follow the last query and keep their reasoning: no fork.
    agent, _, _ = _play(qwen3, "tool", think=True)
    assert agent.template_forks == 0
    # Without think blocks Qwen3 appends in both roles.
    for role in ("user", "tool"):
        assert _play(qwen3, role)[0].template_forks == 0


def test_deepseek_r1_strips_reasoning_from_every_turn_and_forks_are_counted() -> None:
    r1 = next(f for f in FAMILIES if f.name == "deepseek-r1-distill")
    agent, traj, sampled = _play(r1, "tool", think=True)
    assert agent.template_forks == 2
    view = traj.token_view()
    assert [t for t, m in zip(view.input_ids, view.loss_mask, strict=True) if m] == [t for s in sampled for t in s]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_tools_reach_the_chat_template(family: Family) -> None:
    with_tools = _play(family, "tool", tools=TOOLS)[0]
    without = _play(family, "tool")[0]
    text = with_tools.tokenizer.decode(with_tools.token_ids)
    assert '"calculator"' in text and '"calculator"' not in without.tokenizer.decode(without.token_ids[:40])
    assert with_tools.token_ids != without.token_ids


def test_action_sampled_from_another_prompt_keeps_text_but_no_ids() -> None:
    family = FAMILIES[0]
    tok = build_tokenizer(family)
    agent = ChatAgent(tok)
    agent.start("sys", OBSERVATIONS[0])
    ids = _sampled(tok, _call("1+1"), family.end_token)
    # A chat server that re-rendered the conversation differently (here: one extra id) reports its prompt.
    other_prompt = tuple(agent.token_ids) + (tok.convert_tokens_to_ids("<|im_start|>"),)
    assert agent.record_action(Generation(_call("1+1"), ids, prompt_token_ids=other_prompt)) is None
    assert agent.prompt_mismatches == 1
    assert agent.messages[-1]["content"] == _call("1+1")
    agent.add_observation("2")
    same = tuple(agent.token_ids)
    assert agent.record_action(Generation("ok", _sampled(tok, "ok", family.end_token), prompt_token_ids=same))
    assert agent.prompt_mismatches == 1


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_hf_policy_rollout_on_calculator_is_token_exact_per_family(family: Family) -> None:
    """Real env, real sampling: a from-config model with the family's tokenizer through RolloutEngine."""
    pytest.importorskip("torch")
    from agentgym.policies.base import SamplingParams
    from agentgym.policies.hf import HFPolicy
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite, summarize
    from agentgym.registration.suites import load_suite
    from tests.helpers.chat_families import build_model

    tok = build_tokenizer(family)
    policy = HFPolicy(build_model(family, tok), tok)
    specs = episodes_for_suite(load_suite("games-calc"), "test", limit=2, group_size=1)
    config = RolloutConfig(sampling=SamplingParams(max_tokens=8, temperature=1.0, seed=0), observation_role="tool")
    trajectories = RolloutEngine(policy, config).run(specs)
    assert trajectories and all(t.error is None for t in trajectories)
    end_ids = set(policy._stop_ids)
    for traj in trajectories:
        # The env's info["tools"] reached the chat template: its schema is rendered in the first prompt.
        assert '"name": "calc"' in tok.decode(list(traj.turns[0].prompt_token_ids))
        view = traj.token_view()
        sampled = [i for turn in traj.turns for i in turn.action_token_ids]
        assert [t for t, m in zip(view.input_ids, view.loss_mask, strict=True) if m] == sampled
        # Where the sampled ids re-encode from their text (valid UTF-8, no special token mid-action), the
        # appending families have no fork; a random byte-level model often samples neither, and the rest counts.
        clean = all(list(tok.encode(t.action, add_special_tokens=False)) == [i for i in t.action_token_ids
                                                                             if i not in end_ids]
                    for t in traj.turns)
        if clean and family.name != "deepseek-r1-distill":
            assert traj.metadata["template_forks"] == 0
        assert 0 <= traj.metadata["template_forks"] <= len(traj.turns)
        end_id = tok.convert_tokens_to_ids(family.end_token)
        for turn, nxt in zip(traj.turns, traj.turns[1:]):
            if turn.action_token_ids[-1] == end_id:  # the sampled end id closed the turn: not added again
                assert nxt.prompt_token_ids[0] != end_id
            elif turn.finish_reason == "length":  # cut by length: the real end id closes it
                assert nxt.prompt_token_ids[0] == end_id
        assert traj.metadata["prompt_mismatches"] == 0
    totals = summarize(trajectories)
    assert totals["template_forks"] == sum(t.metadata["template_forks"] for t in trajectories)


class _ReRenderingChatPolicy(Policy):
    """Scripted chat-server stand-in: answers with a Hermes tool call and reports the prompt it conditioned on.

    On odd calls it reports the agent's ids plus one extra id, as a server that re-rendered the conversation
    differently would; those actions must keep their text and lose their ids.
    """

    name = "rerendering-chat"

    def __init__(self, tokenizer: Any, end_token: str) -> None:
        self.tokenizer = tokenizer
        self.end_token = end_token
        self.calls = 0

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for r in requests:
            self.calls += 1
            text = '<tool_call>\n{"name": "calc", "arguments": {"expression": "1+1"}}\n</tool_call>'
            reported = tuple(r.prompt_token_ids or ()) + ((7,) if self.calls % 2 else ())
            out.append(Generation(text, _sampled(self.tokenizer, text, self.end_token), prompt_token_ids=reported))
        return out


def test_rollout_drops_ids_of_actions_sampled_from_another_prompt_and_counts_them() -> None:
    from agentgym.policies.base import SamplingParams
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite, summarize
    from agentgym.registration.suites import load_suite

    family = FAMILIES[0]
    tok = build_tokenizer(family)
    policy = _ReRenderingChatPolicy(tok, family.end_token)
    specs = episodes_for_suite(load_suite("games-calc"), "test", limit=1, group_size=1)
    (traj,) = RolloutEngine(policy, RolloutConfig(sampling=SamplingParams(max_tokens=64))).run(specs)
    assert traj.error is None and len(traj.turns) >= 2
    with_ids = [t.action_token_ids is not None for t in traj.turns]
    assert with_ids[:2] == [False, True]  # the first call reported another prompt, the second ours
    assert traj.metadata["prompt_mismatches"] == with_ids.count(False)
    assert all(t.action for t in traj.turns)  # text kept
    assert not traj.has_tokens  # a trainer will not take a sequence with foreign ids
    assert summarize([traj])["prompt_mismatches"] == with_ids.count(False)


def test_template_tools_option_is_validated_and_never_keeps_tools_out_of_the_template() -> None:
    from agentgym.errors import ConfigError
    from agentgym.policies.base import SamplingParams
    from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite
    from agentgym.registration.suites import load_suite

    with pytest.raises(ConfigError, match="template_tools"):
        RolloutConfig(template_tools="always")
    family = FAMILIES[0]
    tok = build_tokenizer(family)
    specs = episodes_for_suite(load_suite("games-calc"), "test", limit=1, group_size=1)
    prompts = {}
    for mode in ("auto", "never"):
        config = RolloutConfig(sampling=SamplingParams(max_tokens=64), template_tools=mode)
        (traj,) = RolloutEngine(_ReRenderingChatPolicy(tok, family.end_token), config).run(specs)
        prompts[mode] = tok.decode(list(traj.turns[0].prompt_token_ids))
    assert "<tools>" in prompts["auto"] and "<tools>" not in prompts["never"]
