"""Constrained decoding of actions: the env lists its valid replies, the policy samples only those, and the tokens
a choice forces are recorded and left out of the loss (``RolloutConfig.constrain_actions``)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gymnasium as gym  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import agentgym  # noqa: E402,F401
from agentgym.errors import ConfigError  # noqa: E402
from agentgym.policies.base import SamplingParams  # noqa: E402
from agentgym.policies.hf import HFPolicy  # noqa: E402
from agentgym.policies.scripted import ScriptedPolicy  # noqa: E402
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.trainers.batch import build_batch  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402
from tests.helpers.tiny_models import build_maze_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_maze_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_envs_list_their_finite_action_sets_and_open_ones_list_none() -> None:
    assert gym.make("agentgym/Maze-v0").unwrapped.action_choices() == (
        'move("north")', 'move("south")', 'move("east")', 'move("west")')
    assert gym.make("agentgym/Sokoban-v0").unwrapped.action_choices() == (
        'move("up")', 'move("down")', 'move("left")', 'move("right")')
    assert gym.make("agentgym/GuessNumber-v0").unwrapped.action_choices() is None  # guess(n): an open set


def test_forced_tokens_leave_the_loss_mask_and_survive_a_round_trip() -> None:
    turn = Turn("obs", 'move("north")', prompt_token_ids=(1, 2), action_token_ids=(5, 6, 7, 8),
                action_logprobs=(-0.1, -0.2, -0.3, -0.4), action_forced=(True, False, True, True))
    traj = Trajectory("agentgym/Maze-v0", "t", 0, (turn,), {"success": False}, "max_turns")
    view = traj.token_view()
    assert view.loss_mask == (0, 0, 0, 1, 0, 0)
    assert view.logprobs == (0.0, 0.0, -0.1, -0.2, -0.3, -0.4)
    again = Trajectory.from_dict(traj.to_dict())
    assert again.turns[0].action_forced == (True, False, True, True) and again.token_view() == view
    free = Turn("obs", "x", prompt_token_ids=(1,), action_token_ids=(5,), action_logprobs=(-0.1,))
    assert "action_forced" not in free.to_dict()  # free-text records are unchanged
    broken = Turn("obs", "x", prompt_token_ids=(1,), action_token_ids=(5, 6), action_forced=(True,))
    with pytest.raises(ValueError, match="action_forced has 1 entries for 2"):
        Trajectory("e", "t", 0, (broken,), {}, "max_turns").token_view()


def test_constrained_rollouts_never_void_and_mark_forced_tokens(maze_model: Path) -> None:
    policy = HFPolicy.from_pretrained(maze_model)
    suite = load_suite("games-maze")
    config = RolloutConfig(sampling=SamplingParams(max_tokens=12, temperature=1.0, seed=3), system_prompt="",
                           constrain_actions=True, max_context_tokens=700)
    trajectories = RolloutEngine(policy, config).run(
        [EpisodeSpec(suite.env_id, task=t, seed=i) for i, t in enumerate(suite.split("train")[:4])])
    choices = gym.make("agentgym/Maze-v0").unwrapped.action_choices()
    turns = [turn for t in trajectories for turn in t.turns]
    assert turns and all(t.error is None for t in trajectories)
    for turn in turns:  # the untrained model writes garbage freely; constrained, every reply is an action
        assert turn.action in choices and turn.kind == "tool_call"
        assert len(turn.action_forced) == len(turn.action_token_ids)
        assert 0 < sum(not f for f in turn.action_forced) < len(turn.action_forced)
    batch = build_batch(trajectories, torch.zeros(len(trajectories)), [True] * len(trajectories), pad_id=0)
    assert int(batch.loss_mask.sum()) == sum(not f for turn in turns for f in turn.action_forced)


def test_constrain_actions_refuses_what_cannot_honour_it(maze_model: Path, tmp_path: Path) -> None:
    suite = load_suite("games-guess")
    config = RolloutConfig(sampling=SamplingParams(max_tokens=12), constrain_actions=True, system_prompt="")
    with pytest.raises(ConfigError, match="supports_choices|decodes under"):
        RolloutEngine(ScriptedPolicy(["guess(50)"]), config).run([EpisodeSpec(suite.env_id, task=suite.train[0])])
    [traj] = RolloutEngine(HFPolicy.from_pretrained(maze_model), config).run(
        [EpisodeSpec(suite.env_id, task=suite.train[0], seed=0)])
    assert traj.end_reason == "error" and "lists no action choices" in traj.error
    with pytest.raises(ConfigError, match="not both"):
        RolloutConfig(sampling=SamplingParams(choices=("a",)), constrain_actions=True)
    base = dict(model=str(maze_model), suite="games-maze", eval_split="validation", output_dir=str(tmp_path),
                constrain_actions=True)
    with pytest.raises(ConfigError, match="ArCHer"):
        config_from_dict({**base, "trainer": "archer"})
    with pytest.raises(ConfigError, match="generation_backend"):
        config_from_dict({**base, "trainer": "grpo", "generation_backend": "vllm", "device": "cuda"})


def test_policies_that_cannot_decode_under_choices_refuse_them() -> None:
    import asyncio

    from agentgym.policies.base import GenerationRequest

    request = GenerationRequest(({"role": "user", "content": "go"},), sampling=SamplingParams(choices=("forward()",)))
    with pytest.raises(ConfigError, match="cannot decode under SamplingParams.choices"):
        asyncio.run(ScriptedPolicy(["turn_left()"]).act([request]))
