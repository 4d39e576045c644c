"""Options the learning studies compare methods with: GiGPO at GRPO's advantage scale, the GRPO-vs-GiGPO agreement
measured before training, and the ArCHer critic's view of the state."""

from __future__ import annotations

import dataclasses

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.algorithms import advantage_drift, aggregate_loss  # noqa: E402
from agentgym.trainers.algorithms.advantages import match_mean_abs  # noqa: E402
from agentgym.trainers.algorithms.gigpo import advantage_agreement, gigpo_advantages  # noqa: E402
from agentgym.trainers.archer import critic_views  # noqa: E402
from agentgym.trainers.batch import build_batch  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402
from agentgym.trainers.gigpo import GigpoConfig, compare_with_grpo  # noqa: E402
from agentgym.trainers.grpo import GrpoTrainer  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402
from tests.helpers.tiny_models import build_maze_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_maze_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _traj(group: str, keys: list[str], score: float, *, tokens: int = 2, final: str | None = "end",
          rewards: list[float] | None = None) -> Trajectory:
    """A recorded episode: one turn per anchor key, the reward on the last turn, token ids on every turn."""
    rewards = rewards or [0.0] * (len(keys) - 1) + [score]
    turns = tuple(Turn(observation=f"obs {k}", action=f"move {i}", reward=r, info={"kind": "tool_call"},
                       prompt_token_ids=(5 + i,), action_token_ids=tuple(range(10, 10 + tokens)), state_key=k)
                  for i, (k, r) in enumerate(zip(keys, rewards)))
    end = "solved" if score > 0 else "max_turns"
    return Trajectory(env_id="agentgym/Maze-v0", task_id=group, seed=0, turns=turns, group_id=group,
                      outcome={"success": score > 0, "score": score, "end_reason": end}, end_reason=end,
                      traj_id=f"{group}-{len(keys)}-{score}", metadata={} if final is None else {"final_observation": final})


# A detour inside solved episodes (s1 -> s2 -> s1) and failures that pass the same states.
BATCH = [_traj("g", ["s0", "s1", "s3"], 1.0), _traj("g", ["s0", "s1", "s2", "s1", "s3"], 1.0),
         _traj("g", ["s0", "s2", "s4"], 0.0), _traj("g", ["s0", "s1", "s2"], 0.0),
         _traj("h", ["t0", "t1"], 1.0), _traj("h", ["t0", "t2", "t1"], 1.0), _traj("h", ["t0", "t2"], 0.0),
         _traj("h", ["t0", "t3"], 0.0)]


# ---- equal advantage scale -------------------------------------------------------------------------------
def test_match_mean_abs_equalises_the_scale_and_keeps_every_sign_and_ratio() -> None:
    ours = torch.tensor([[0.5, -0.25, 0.0], [1.0, 0.0, 0.0]])
    reference = torch.tensor([[1.0, 1.0, 9.0], [-1.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    scaled, factor = match_mean_abs(ours, reference, mask)
    assert scaled[mask.bool()].abs().mean() == pytest.approx(reference[mask.bool()].abs().mean())
    assert factor == pytest.approx(1.0 / (1.75 / 3))
    assert torch.equal(torch.sign(scaled), torch.sign(ours))
    assert match_mean_abs(torch.zeros(2, 3), reference, mask)[1] == 1.0  # no signal: nothing to rescale
    with pytest.raises(ConfigError, match="one shape"):
        match_mean_abs(ours, reference[:, :2], mask)


def _advantage_rows(maze_model: Path, tmp_path: Path, trainer: str, **extra: object) -> tuple[torch.Tensor, torch.Tensor]:
    config = config_from_dict({"trainer": trainer, "model": str(maze_model), "suite": "games-maze",
                               "output_dir": str(tmp_path / trainer), "group_size": 4, "tasks_per_step": 2,
                               "invalid_penalty": 0.0, **extra} if trainer == "gigpo" else
                              {"trainer": trainer, "model": str(maze_model), "suite": "games-maze",
                               "output_dir": str(tmp_path / trainer), "group_size": 4, "tasks_per_step": 2})
    built = make_trainer(config)
    batch = build_batch(BATCH, torch.zeros(len(BATCH)), [True] * len(BATCH), pad_id=0)
    scores = built._scores(BATCH)
    rows, _ = built._token_advantages(BATCH, scores, torch.ones(len(BATCH), dtype=torch.bool), list(range(len(BATCH))),
                                      batch)
    return rows, batch.loss_mask.bool()


def test_gigpo_at_grpo_scale_has_grpos_mean_abs_advantage_on_the_same_batch(maze_model: Path, tmp_path: Path) -> None:
    """GiGPO's mean_norm statistics leave its advantages about half GRPO's (no division by the std): at one
    learning rate that is a hidden step-size change. advantage_scale: grpo removes it and keeps the credit."""
    grpo, mask = _advantage_rows(maze_model, tmp_path, "grpo")
    native, _ = _advantage_rows(maze_model, tmp_path, "gigpo")
    scaled, _ = _advantage_rows(maze_model, tmp_path, "gigpo", advantage_scale="grpo")
    assert float(native[mask].abs().mean()) != pytest.approx(float(grpo[mask].abs().mean()), rel=0.03)  # they differ
    assert float(scaled[mask].abs().mean()) == pytest.approx(float(grpo[mask].abs().mean()), rel=1e-5)
    assert torch.equal(torch.sign(scaled[mask]), torch.sign(native[mask]))
    with pytest.raises(ConfigError, match="advantage_scale"):
        GigpoConfig(model="m", suite="games-maze", advantage_scale="equal")  # type: ignore[arg-type]


# ---- GRPO vs GiGPO agreement -----------------------------------------------------------------------------
def test_agreement_is_perfect_when_the_step_part_says_nothing_new() -> None:
    """Omega 0 makes GiGPO's advantage its episode part: the two methods' tokens agree exactly."""
    keys = [["a", "b"], ["a", "c"], ["a", "b"]]
    result = gigpo_advantages(["g"] * 3, keys, [[0, 1], [0, 0], [0, 1]], omega=0.0, invalid_penalty=0.0)
    report = advantage_agreement(result.episode, result, [[1, 3], [2, 2], [1, 1]])
    assert report["token_correlation"] == pytest.approx(1.0)
    assert report["sign_disagreement"] == 0.0 and report["zero_disagreement"] == 0.0
    assert report["tokens"] == 10.0


def test_agreement_counts_the_detour_grpo_leaves_at_zero_and_weighs_by_tokens() -> None:
    """Every episode of group g solves the task, so GRPO gives all of them 0; GiGPO gives the detour's steps a
    negative step advantage. Those tokens are credit only one method gives."""
    solved = [["s0", "s1", "s3"], ["s0", "s1", "s2", "s1", "s3"]]
    result = gigpo_advantages(["g", "g"], solved, [[0, 0, 1], [0, 0, 0, 0, 1]], invalid_penalty=0.0)
    zero = [torch.zeros(3), torch.zeros(5)]
    report = advantage_agreement(zero, result, [[1] * 3, [1] * 5])
    assert report["zero_disagreement"] > 0 and report["token_correlation"] is None  # GRPO is constant here
    heavy = advantage_agreement(zero, result, [[1] * 3, [1, 100, 1, 1, 1]])  # a step the detour revalues: most tokens
    assert heavy["zero_disagreement"] > report["zero_disagreement"]
    with pytest.raises(ConfigError, match="one per step"):
        advantage_agreement(zero, result, [[1] * 3, [1] * 4])
    rounding = dataclasses.replace(result, advantages=[torch.full((3,), 2.8e-17), torch.full((5,), -2.8e-17)])
    flat = advantage_agreement(zero, rounding, [[1] * 3, [1] * 5])  # float rounding of a group mean is no credit
    assert flat["zero_disagreement"] == 0.0 and flat["sign_disagreement"] == 0.0


def test_compare_with_grpo_on_recorded_trajectories() -> None:
    report = compare_with_grpo(BATCH, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.0))
    assert report["trajectories"] == 8.0 and report["tokens"] == 2.0 * sum(len(t.turns) for t in BATCH)
    assert 0 < report["token_correlation"] < 1  # related, not the same credit
    assert report["steps_in_shared_anchor"] > 0 and report["step_episode_correlation"] is not None
    assert report["mean_abs_gigpo"] < report["mean_abs_episode_level"]  # GRPO's std division: the larger scale
    empty = compare_with_grpo([], GigpoConfig(model="m", suite="games-maze"))
    assert empty["trajectories"] == 0 and empty["token_correlation"] is None


# ---- the loss weighting's net advantage (length bias) ----------------------------------------------------
def test_token_mean_drifts_towards_the_longer_outcome_and_seq_mean_does_not() -> None:
    """A solved episode of 1 step and a failed one of 3 steps, 2 tokens a step, advantages +1 and -1: under
    token-mean the 6 failed tokens outweigh the 2 solved ones, -(6 - 2) / 8 = -0.5; each trajectory once: 0."""
    steps = [torch.tensor([1.0]), torch.tensor([-1.0, -1.0, -1.0])]
    tokens = [[2], [2, 2, 2]]
    assert advantage_drift(steps, tokens, mode="token-mean") == pytest.approx(-0.5)
    assert advantage_drift(steps, tokens, mode="seq-mean-token-sum") == pytest.approx(-0.5)  # every token alike
    assert advantage_drift(steps, tokens, mode="seq-mean-token-mean") == pytest.approx(0.0)
    masked = [*steps, torch.tensor([5.0])]  # a fully masked trajectory trains no token in any mode
    assert advantage_drift(masked, [*tokens, [0]], mode="seq-mean-token-mean") == pytest.approx(0.0)
    assert advantage_drift([], [], mode="token-mean") is None
    with pytest.raises(ConfigError, match="one per step"):
        advantage_drift(steps, [[2], [2, 2]], mode="token-mean")
    with pytest.raises(ConfigError, match="mode"):
        advantage_drift(steps, tokens, mode="sum")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_the_drift_is_the_loss_aggregation_of_the_advantages_themselves(mode: str) -> None:
    """The drift weighs tokens exactly as aggregate_loss weighs their losses (a loss of A per token)."""
    generator = torch.Generator().manual_seed(0)
    steps = [torch.randn(n, generator=generator) for n in (1, 4, 2)]
    tokens = [[3], [1, 2, 5, 1], [4, 4]]
    rows = [torch.cat([a.repeat_interleave(torch.tensor(c)) for a, c in zip(s.split(1), t)]) for s, t in zip(steps, tokens)]
    width = max(len(r) for r in rows)
    padded = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    mask = torch.stack([torch.nn.functional.pad(torch.ones(len(r)), (0, width - len(r))) for r in rows])
    expected = float(aggregate_loss(padded.double(), mask, mode=mode))  # type: ignore[arg-type]
    assert advantage_drift(steps, tokens, mode=mode) == pytest.approx(expected)  # type: ignore[arg-type]


def test_compare_with_grpo_reports_each_weightings_drift() -> None:
    """In BATCH the solved episodes are the longer ones (a detour): token-mean drifts up, seq-mean stays at 0."""
    report = compare_with_grpo(BATCH, GigpoConfig(model="m", suite="games-maze", invalid_penalty=0.0))
    assert report["tokens_solved_mean"] == pytest.approx(2.0 * (3 + 5 + 2 + 3) / 4)
    assert report["tokens_failed_mean"] == pytest.approx(2.0 * (3 + 3 + 2 + 2) / 4)
    assert report["grpo_drift_token_mean"] > 0
    assert report["grpo_drift_seq_mean_token_mean"] == pytest.approx(0.0, abs=1e-6)
    assert report["gigpo_drift_token_mean"] is not None


# ---- the ArCHer critic's view of the state ---------------------------------------------------------------
def test_critic_views_read_the_observation_or_the_state_key() -> None:
    episode = _traj("g", ["s0", "s1", "s2"], 1.0)
    assert critic_views(episode, "observation") == [("obs s0", "obs s1"), ("obs s1", "obs s2"), ("obs s2", "end")]
    assert critic_views(episode, "state_key") == [("s0", "s1"), ("s1", "s2"), ("s2", "s2 move 2")]
    unfinished = _traj("g", ["s0"], 0.0, final=None)  # no final observation recorded: the state and the action
    assert critic_views(unfinished, "observation") == [("obs s0", "obs s0 move 0")]
    keyless = Trajectory(env_id="agentgym/Calc-v0", task_id="t", seed=0, turns=(Turn(observation="o", action="a"),),
                         outcome={}, end_reason="max_turns")
    with pytest.raises(ConfigError, match="critic_input: observation"):
        critic_views(keyless, "state_key")


@pytest.mark.parametrize("mode", ["history", "observation", "state_key"])
def test_archer_buffer_turns_carry_the_critic_input_and_the_actor_keeps_the_prompt(maze_model: Path, tmp_path: Path,
                                                                                   mode: str) -> None:
    trainer = make_trainer(config_from_dict({"trainer": "archer", "model": str(maze_model), "suite": "games-maze",
                                             "output_dir": str(tmp_path / mode), "critic_input": mode}))
    _, trainer.tokenizer = trainer._load(maze_model)
    episodes = [_traj("g", ["s0", "s1"], 1.0), _traj("g", ["s5"], 0.0)]
    turns = trainer._transitions(3, episodes, 0.95)
    assert [(t.episode, t.turn) for t in turns] == [("3:0", 0), ("3:0", 1), ("3:1", 0)]
    assert [t.state_ids for t in turns] == [(5,), (5, 10, 11, 6), (5,)]  # the actor's prompt, whatever the critic reads
    if mode == "history":
        assert turns[0].state == trainer._decode((5,))
    else:
        expected = [critic_views(e, mode) for e in episodes]
        assert [(t.state, t.next_state) for t in turns] == [expected[0][0], expected[0][1], expected[1][0]]
    with pytest.raises(ConfigError, match="critic_input"):
        config_from_dict({"trainer": "archer", "model": "m", "suite": "games-maze", "critic_input": "screen"})


def test_grpo_is_the_reference_the_scale_option_names() -> None:
    """advantage_scale: grpo rescales to GrpoTrainer's own estimate (the estimator named by the advantage field)."""
    assert GrpoTrainer._token_advantages.__qualname__ == "GrpoTrainer._token_advantages"
