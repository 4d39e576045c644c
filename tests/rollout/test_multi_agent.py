"""Multi-agent rollouts: one policy per seat or one shared policy with role prompts, per-agent trajectories
sharing an episode id (streamed to JSONL), per-turn rewards that add up to the game's, parallel games,
token ids for training, and failures that stay inside their own game."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("pyspiel")

from agentgym.rollout.multi_agent import (
    MultiAgentEpisodeSpec,
    MultiAgentRolloutConfig,
    MultiAgentRolloutEngine,
)

from agentgym.errors import ConfigError, RegistrationError
from agentgym.policies import ScriptedPolicy
from agentgym.policies.base import Generation, GenerationRequest, Policy
from agentgym.storage import TrajectoryWriter, read_trajectories


def first_empty_cell(messages: Sequence[Mapping[str, Any]]) -> str:
    match = re.search(r"Empty cells: ([\d, ]+)\.", str(messages[-1]["content"]))
    return f"play({match.group(1).split(',')[0].strip()})" if match else "play(0)"


def test_one_policy_per_seat_writes_per_agent_trajectories(tmp_path: Path) -> None:
    p0 = ScriptedPolicy(first_empty_cell)
    p1 = ScriptedPolicy(["let me think", "play(8)", "play(7)", "play(6)", "play(5)"])
    engine = MultiAgentRolloutEngine({"player_0": p0, "player_1": p1})
    specs = [MultiAgentEpisodeSpec("agentgym/TicTacToe-v0", seed=i, group_id="ttt") for i in range(4)]
    with TrajectoryWriter(tmp_path / "games.jsonl") as writer:
        episodes = engine.run(specs, writer=writer)
    stored = list(read_trajectories(tmp_path / "games.jsonl"))
    assert len(episodes) == 4 and len(stored) == 8
    assert engine.stats["policy_calls"] >= 2
    for episode in episodes:
        trajs = episode.trajectories
        assert set(trajs) == {"player_0", "player_1"} and episode.error is None
        ids = {t.metadata["episode_id"] for t in trajs.values()}
        assert ids == {episode.episode_id}
        assert {t.traj_id for t in trajs.values()} == {f"{episode.episode_id}/player_0", f"{episode.episode_id}/player_1"}
        x, o = trajs["player_0"], trajs["player_1"]
        assert x.outcome["result"] == "win" and o.outcome["result"] == "loss"
        assert x.total_reward == pytest.approx(1.0)
        assert o.total_reward == pytest.approx(-1.1), "the void first turn costs 0.1, the loss 1"
        assert o.turns[0].kind == "void" and o.turns[0].reward == pytest.approx(-0.1)
        assert x.turns[0].observation.startswith("Tic-tac-toe. You are x")
        assert x.group_id == "ttt" and x.policy == "scripted"
    assert {t.metadata["agent"] for t in stored} == {"player_0", "player_1"}


def test_shared_policy_with_role_prompts_and_parallel_game() -> None:
    seen_system: list[str] = []

    def reply(messages: Sequence[Mapping[str, Any]]) -> str:
        seen_system.append(str(messages[0]["content"]))
        return "cooperate()" if str(messages[0]["content"]).startswith("You are the dove") else "defect()"

    config = MultiAgentRolloutConfig(role_prompts={"player_0": "You are the dove.", "player_1": "You are the hawk."})
    engine = MultiAgentRolloutEngine(ScriptedPolicy(reply), config)
    [episode] = engine.run([MultiAgentEpisodeSpec("agentgym/PrisonersDilemma-v0", seed=0, parallel=True,
                                                  env_kwargs={"rounds": 4})])
    dove, hawk = episode.trajectories["player_0"], episode.trajectories["player_1"]
    assert [t.action for t in dove.turns] == ["cooperate()"] * 4 and hawk.total_reward == 20.0
    assert dove.outcome["success"] is False and hawk.outcome["success"] is True
    assert any(s.startswith("You are the hawk.") and "prisoner's dilemma" in s for s in seen_system)
    assert dove.metadata["role_prompt"] == "You are the dove." and dove.metadata["parallel"] is True


def test_negotiation_rewards_add_up_per_agent() -> None:
    engine = MultiAgentRolloutEngine({"player_0": ScriptedPolicy(["propose(1, 0, 2)"]),
                                      "player_1": ScriptedPolicy(["accept()"])})
    setup = {"counts": [1, 2, 3], "values": [[4, 0, 2], [0, 2, 2]]}
    [episode] = engine.run([MultiAgentEpisodeSpec("agentgym/Negotiation-v0", setup=setup, task_id="n1")])
    trajs = episode.trajectories
    assert trajs["player_0"].total_reward == pytest.approx(0.8) and trajs["player_1"].total_reward == pytest.approx(0.6)
    assert trajs["player_0"].turns[0].reward == pytest.approx(0.8), "the deal arrives on the partner's move"
    assert trajs["player_0"].task_id == "n1"


class _TokenPolicy(Policy):
    """A token-level scripted policy: encodes its replies with a tiny character tokenizer."""

    name = "token-scripted"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for request in requests:
            text = "cooperate()"
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False)) + (self.tokenizer.eos_token_id,)
            out.append(Generation(text=text, token_ids=ids, logprobs=tuple(-0.5 for _ in ids)))
        return out


class _CharTokenizer:
    eos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [2 + (ord(c) % 250) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i - 2) if i >= 2 else "" for i in ids)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def test_token_level_policy_records_exact_ids_for_training() -> None:
    engine = MultiAgentRolloutEngine(_TokenPolicy(_CharTokenizer()))
    [episode] = engine.run([MultiAgentEpisodeSpec("agentgym/PrisonersDilemma-v0", seed=0, env_kwargs={"rounds": 3})])
    for traj in episode.trajectories.values():
        assert traj.has_tokens and len(traj.turns) == 3
        view = traj.token_view()
        assert sum(view.loss_mask) == 3 * (len("cooperate()") + 1)


def test_failures_stay_inside_their_game_and_bad_specs_fail_fast() -> None:
    class Flaky(Policy):
        name = "flaky"

        async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
            if any("/player_1" in r.episode_id and r.episode_id.endswith("-1/player_1") for r in requests):
                raise ConnectionError("server down")
            return [Generation(text="defect()") for _ in requests]

    engine = MultiAgentRolloutEngine(Flaky(), MultiAgentRolloutConfig(max_in_flight=1))
    episodes = engine.run([MultiAgentEpisodeSpec("agentgym/PrisonersDilemma-v0", seed=i, env_kwargs={"rounds": 2})
                           for i in range(3)])
    assert [e.error is None for e in episodes] == [True, False, True]
    assert all(t.end_reason == "error" for t in episodes[1].trajectories.values())
    assert "server down" in str(episodes[1].error)

    with pytest.raises(RegistrationError, match="Did you mean"):
        engine.run([MultiAgentEpisodeSpec("agentgym/TicTacToo-v0")])
    with pytest.raises(ConfigError, match="no parallel form"):
        engine.run([MultiAgentEpisodeSpec("agentgym/Chess-v0", parallel=True)])
    [bad] = MultiAgentRolloutEngine({"player_0": Flaky()}).run([MultiAgentEpisodeSpec("agentgym/TicTacToe-v0")])
    assert "No policy for seat 'player_1'" in str(bad.error)
    with pytest.raises(ConfigError, match="observation_role"):
        MultiAgentRolloutConfig(observation_role="system")
