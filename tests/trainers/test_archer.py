"""ArCHer and filtered-BC trainers: turns become transitions with the right terminated/truncated flags, the
replay buffer persists and survives torn writes, updates change the actor and the critic (the target critic
follows by Polyak averaging), filtered BC clones only the best episodes, shipped configs validate, and a
SIGKILLed ArCHer run resumes to the same replay buffer, critic, target critic and actor as an uninterrupted one."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers.archer import ArcherConfig, ArcherTrainer  # noqa: E402
from agentgym.trainers.filtered_bc import FilteredBCConfig, FilteredBCTrainer  # noqa: E402
from agentgym.trainers.replay import ReplayBuffer, Transition, transitions_from_trajectory  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402
from tests.helpers.scripts import load_script  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 100),
                            config=SMALL)


def common(model_dir: Path, out: Path, **overrides: object) -> dict:
    values = dict(model=str(model_dir), suite="games-calc", output_dir=str(out), steps=2, tasks_per_step=4,
                  actor_warmup_steps=0, batch_size=4, eval_tasks=4, eval_every=0, checkpoint_every=1, system_prompt="",
                  max_tokens_per_turn=12, max_context_tokens=256, tensorboard=False, actor_steps=1, seed=0)
    values.update(overrides)
    return values


def _digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for name, p in sorted(tensors.items()):
        h.update(name.encode())
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


# ---- transitions and the replay buffer ---------------------------------------------------------------
def _traj(n_turns: int, end_reason: str, rewards: list[float] | None = None, error: str | None = None) -> Trajectory:
    rewards = rewards or [0.0] * n_turns
    turns = tuple(Turn(observation=f"o{i}", action=f"a{i}", reward=rewards[i], info={"kind": "tool_call"},
                       prompt_token_ids=(10 + i,), action_token_ids=(20 + i, 30 + i)) for i in range(n_turns))
    return Trajectory(env_id="agentgym/Maze-v0", task_id="t", seed=0, turns=turns, end_reason=end_reason,
                      outcome={"success": end_reason == "solved", "end_reason": end_reason, "score": sum(rewards)},
                      traj_id="ep", error=error)  # the env contract: step rewards sum to the score


def _decode(ids: tuple[int, ...]) -> str:
    return " ".join(map(str, ids))


@pytest.mark.parametrize(("end_reason", "terminated", "truncated"),
                         [("solved", True, False), ("answered", True, False), ("failed", True, False),
                          ("max_turns", False, True), ("context_limit", False, True)])
def test_turns_become_transitions_with_terminated_or_truncated_flags(end_reason: str, terminated: bool,
                                                                    truncated: bool) -> None:
    ts = transitions_from_trajectory(_traj(3, end_reason, [0.0, 0.0, 1.0]), _decode, gamma=0.5)
    assert [t.terminated for t in ts] == [False, False, terminated]
    assert [t.truncated for t in ts] == [False, False, truncated]
    assert ts[1].state_ids == (10, 20, 30, 11) and ts[1].action_ids == (21, 31)
    assert ts[0].next_state == ts[1].state == "10 20 30 11"
    assert ts[2].next_state == "10 20 30 11 21 31 12 22 32"  # no final observation recorded: state + action
    with_final = dataclasses.replace(_traj(3, end_reason), metadata={"final_prompt_token_ids": [13, 14]})
    assert transitions_from_trajectory(with_final, _decode)[2].next_state == "10 20 30 11 21 31 12 22 32 13 14"
    assert [t.mc_return for t in ts] == pytest.approx([0.25, 0.5, 1.0])  # MC returns, gamma 0.5, through the buffer
    assert transitions_from_trajectory(_traj(2, "error", error="sandbox died"), _decode) == []


def _transition(i: int) -> Transition:
    return Transition(state=f"s{i}", action="a", reward=float(i), next_state="n", terminated=False, truncated=True,
                      state_ids=(1, 2), action_ids=(3,), episode=f"e{i}")


def test_replay_buffer_persists_drops_torn_records_and_rolls_back(tmp_path: Path) -> None:
    path = tmp_path / "replay.jsonl"
    buffer = ReplayBuffer(path, capacity=3)
    buffer.extend([_transition(i) for i in range(2)])
    buffer.extend([_transition(i) for i in range(2, 5)])
    assert len(buffer) == 3 and buffer.total == 5 and [t.reward for t in buffer] == [2.0, 3.0, 4.0]
    with path.open("a") as fh:
        fh.write('{"state": "torn')  # a write cut short by SIGKILL
    reloaded = ReplayBuffer(path, capacity=10)
    assert reloaded.total == 5 and reloaded.items() == [_transition(i) for i in range(5)]
    assert path.read_text().endswith("\n")
    reloaded.truncate(2)
    assert ReplayBuffer(path, capacity=10).items() == [_transition(0), _transition(1)]
    with pytest.raises(ConfigError, match="checkpoint expects"):
        reloaded.truncate(7)
    picks = reloaded.sample(6, torch.Generator().manual_seed(0))
    assert len(picks) == 6 and set(picks) <= {_transition(0), _transition(1)}


# ---- the critic ----------------------------------------------------------------------------------------
def test_critic_keeps_the_latest_tokens_of_long_states(model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.trainers.critic import UtteranceCritic

    critic = UtteranceCritic.from_policy(AutoModelForCausalLM.from_pretrained(model_dir),
                                         AutoTokenizer.from_pretrained(model_dir), max_tokens=8, hidden_size=8)
    tail = " = 12 then 7 * 3 = 21"  # longer than 8 tokens
    with torch.no_grad():
        a, b, c = critic.encode(["1 + 1" * 20 + tail, "9 - 9" * 20 + tail, "1 + 1" * 20 + " = 99"])
        q, v = critic(["s1", "s2", "s3"], ["a1", "a2", ""])
    assert torch.allclose(a, b), "left truncation: only the most recent tokens are read"
    assert not torch.allclose(a, c)
    assert q.shape == v.shape == (2, 3) and torch.isfinite(q).all()


def test_policy_critic_reads_the_last_real_token_whatever_the_padding(model_dir: Path) -> None:
    """A causal backbone has seen the whole text only at its last token: that is the pooled vector, and a
    shorter text padded in a batch pools to exactly what it pools to alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.trainers.critic import UtteranceCritic

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    critic = UtteranceCritic.from_policy(model, tokenizer, max_tokens=64, pooling="last")
    short, long = "3 + 4 = 7", "12 * 12 = 144 and then 144 - 44 = 100"
    with torch.no_grad():
        alone, batched = critic.encode([short]), critic.encode([short, long])
        ids = critic.tokenizer([short], return_tensors="pt")["input_ids"]
        direct = critic.encoder(input_ids=ids).last_hidden_state[0, -1]
    assert torch.allclose(alone[0], batched[0], atol=1e-5) and torch.allclose(alone[0], direct, atol=1e-5)
    assert UtteranceCritic.from_policy(model, tokenizer, max_tokens=64).pooling == "mean"  # the default
    with pytest.raises(ConfigError, match="pooling"):
        UtteranceCritic.from_policy(model, tokenizer, pooling="max")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="critic_pooling"):
        ArcherConfig(model="m", suite="games-maze", critic_pooling="max")  # type: ignore[arg-type]


def test_joint_action_view_reads_the_action_after_its_state(model_dir: Path, tmp_path: Path) -> None:
    """Encoded alone, one utterance has one embedding in every state; read after its state (``joint``), it does
    not, the action's tokens are kept whole under left truncation, and the trainer's critic is built with it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.trainers.critic import UtteranceCritic

    model, tokenizer = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    states, actions = ["What is 2 + 3?", "What is 9 * 9?"], ["answer(5)", "answer(5)"]
    separate = UtteranceCritic.from_policy(model, tokenizer, max_tokens=64)
    joint = UtteranceCritic.from_policy(model, tokenizer, max_tokens=64, pooling="last", action_view="joint")
    with torch.no_grad():
        alone = separate.encode_actions(states, actions)
        read_after = joint.encode_actions(states, actions)
        assert torch.equal(alone[0], alone[1]) and not torch.allclose(read_after[0], read_after[1])
        assert torch.allclose(read_after, joint.encode([f"{s}\n{a}" for s, a in zip(states, actions)]))
        q, v = joint(states, actions)
    assert q.shape == v.shape == (2, 2) and torch.isfinite(q).all()
    with pytest.raises(ConfigError, match="action_view"):
        UtteranceCritic.from_policy(model, tokenizer, action_view="both")  # type: ignore[arg-type]
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", critic_action_view="joint", critic_pooling="last"))
    assert _bare_trainer(model_dir, cfg).critic.action_view == "joint"


def test_byte_critic_reads_one_token_per_byte_so_grid_rows_keep_one_offset(model_dir: Path, tmp_path: Path) -> None:
    """``critic_encoder: bytes``: every character of a grid is one token, so each row starts the row width plus one
    token after the last (a subword tokenizer merges each row differently); its weights are fixed by the seed and
    leave the global random state alone; it trains, and the trainer builds it from the config."""
    from agentgym.trainers.critic import UtteranceCritic

    grid = "#####\n#..E#\n#@#.#\n#####"
    critic = UtteranceCritic.from_bytes(seed=3, max_tokens=64, pooling="last", action_view="joint")
    ids = critic.tokenizer(grid, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(grid.encode())
    newlines = [i for i, token in enumerate(ids) if token == ids[5]]
    assert ids[5] != ids[4] and newlines == [5, 11, 17], "one row = 5 bytes + a newline, at a fixed offset"
    state = torch.random.get_rng_state()
    twin = UtteranceCritic.from_bytes(seed=3, max_tokens=64)
    assert torch.equal(torch.random.get_rng_state(), state), "building it leaves the global RNG alone"
    assert all(torch.equal(a, b) for a, b in zip(critic.encoder.state_dict().values(),
                                                 twin.encoder.state_dict().values()))
    other = UtteranceCritic.from_bytes(seed=4, max_tokens=64)
    assert not torch.equal(critic.encoder.embed_tokens.weight, other.encoder.embed_tokens.weight)
    states, actions = [grid, grid.replace("@", ".").replace("#.#.#", "#@#.#")], ['move("north")', 'move("east")']
    q, v = critic(states, actions)
    assert q.shape == v.shape == (2, 2) and torch.isfinite(q).all()
    (q.sum() + v.sum()).backward()
    assert critic.encoder.embed_tokens.weight.grad is not None and critic.encoder.embed_tokens.weight.grad.abs().sum() > 0
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", critic_encoder="bytes", critic_max_tokens=512, seed=2))
    built = _bare_trainer(model_dir, cfg).critic
    assert type(built.tokenizer).__name__ == "ByT5Tokenizer" and built.max_tokens == 512
    with pytest.raises(ConfigError, match="critic_encoder"):
        ArcherConfig(model="m", suite="games-maze", critic_encoder="chars")  # type: ignore[arg-type]


def test_grid_critic_reads_the_last_grid_as_cells_conditioned_on_the_text(model_dir: Path, tmp_path: Path) -> None:
    """``critic_encoder: grid``: the encoder cuts the text's last character grid out of the text (the rest, with a
    marker where the grid stood, goes to its GRU); one cell changed changes the embedding, as does the text after
    the grid (the move in a joint action view), which enters every cell; gradients reach the cell embedding and the
    convolution; its weights are fixed by the seed and leave the global random state alone; the trainer builds it.
    What it learns is measured by ``benchmarks/archer_critic_fit.py --encoder grid``."""
    from agentgym.trainers.critic import UtteranceCritic
    from agentgym.trainers.grid_encoder import split_grid

    text = "You moved.\n#####\n#.@.#\n#####\nOld.\n###\n#E#\n###\nOpen directions: east."
    rows, rest = split_grid(text)
    assert rows == ["###", "#E#", "###"] and rest == "You moved.\n#####\n#.@.#\n#####\nOld.\n[grid]\nOpen directions: east."
    assert split_grid("no grid here\njust text") == ([], "no grid here\njust text")
    assert split_grid("a b\nc d")[0] == [], "lines with spaces are prose, not a grid"

    state = torch.random.get_rng_state()
    critic = UtteranceCritic.from_grid(seed=1, max_tokens=64, action_view="joint")
    assert torch.equal(torch.random.get_rng_state(), state), "building it leaves the global RNG alone"
    twin = UtteranceCritic.from_grid(seed=1, max_tokens=64)
    assert all(torch.equal(a, b) for a, b in zip(critic.state_dict().values(), twin.state_dict().values()))
    maze = "Find E.\n#####\n#@.E#\n#.#.#\n#####"
    moved = maze.replace("#@.E#", "#.@E#")
    with torch.no_grad():
        a, b, c = critic.encode([maze, moved, maze + '\nmove("east")'])
    assert not torch.allclose(a, b), "the agent's cell is read"
    assert not torch.allclose(a, c), "the text after the grid is read"
    q, v = critic(["no grid at all", maze, "▲▲░\n░▶█\nno ascii"], ['move("north")', 'move("east")', "go"])
    assert q.shape == v.shape == (2, 3) and torch.isfinite(q).all() and torch.isfinite(v).all()
    (q.sum() + v.sum()).backward()
    for weight in (critic.encoder.cell_embedding.weight, critic.encoder.block[0].weight, critic.encoder.text_bias.weight):
        assert weight.grad is not None and weight.grad.abs().sum() > 0

    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", critic_encoder="grid", critic_max_tokens=96, seed=2))
    built = _bare_trainer(model_dir, cfg).critic
    assert type(built.encoder).__name__ == "TextGridEncoder" and built.encoder.max_tokens == 96


# ---- updates -----------------------------------------------------------------------------------------
def test_archer_updates_actor_critic_and_target(model_dir: Path, tmp_path: Path) -> None:
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", steps=1, critic_steps=2, checkpoint_every=0))
    trainer = _bare_trainer(model_dir, cfg)
    actor0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    critic0 = {k: v.clone() for k, v in trainer.critic.state_dict().items()}
    target0 = {k: v.clone() for k, v in trainer.target_critic.state_dict().items()}
    assert _digest(critic0) == _digest(target0), "the target starts as a hard copy"
    stats = trainer._learn(0, trainer._sample(0))
    assert all(torch.isfinite(torch.tensor(stats[k])) for k in ("critic/loss", "actor/loss"))
    assert stats["replay/size"] > 0 and len(trainer.replay) == stats["replay/size"]
    changed = lambda before, module: [k for k, v in module.state_dict().items() if not torch.equal(v, before[k])]  # noqa: E731
    assert len(changed(actor0, trainer.model)) == len(actor0)
    assert len(changed(critic0, trainer.critic)) == len(critic0)
    # the target moved towards the online critic, but only part of the way (tau = 0.1)
    name = "q_heads.0.2.bias"
    t0, t1, online = target0[name], trainer.target_critic.state_dict()[name], trainer.critic.state_dict()[name]
    assert not torch.equal(t0, t1) and not torch.equal(t1, online)


def test_sampled_baseline_updates_the_actor_with_advantages_centred_at_each_state(model_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """``actor_baseline: sampled`` draws several utterances at each buffer state, each with its own seed, and the
    advantages of a state sum to 0: the batch has no shared offset, however far V is from Q."""
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", steps=1, critic_steps=1, checkpoint_every=0,
                                actor_baseline="sampled", actor_samples_per_state=2))
    trainer = _bare_trainer(model_dir, cfg)
    trainer.replay.extend(trainer._transitions(0, trainer._sample(0), cfg.gamma))
    drawn: list[tuple[list[tuple[int, ...]], list[int]]] = []
    sample = trainer._sample_utterances
    def recorded(states: list[tuple[int, ...]], seeds: list[int]) -> list[tuple[int, ...]]:
        drawn.append((states, seeds))
        return sample(states, seeds)

    trainer._sample_utterances = recorded  # type: ignore[method-assign]
    actor0 = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats = trainer._actor_phase(0, torch.Generator().manual_seed(0))
    states, seeds = drawn[0]
    assert len(states) == cfg.batch_size and states[0::2] == states[1::2]  # 2 states, 2 utterances each
    assert len(set(seeds)) == len(seeds)
    assert abs(stats["actor/advantage_mean"]) < 1e-6
    assert any(not torch.equal(v, actor0[k]) for k, v in trainer.model.state_dict().items())


@pytest.mark.parametrize(("optimizer", "expected_ratio"), [("sgd", 0.01), ("adamw", 1.0)])
def test_an_sgd_actor_steps_as_far_as_the_advantages_say_and_adamw_does_not(model_dir: Path, tmp_path: Path,
                                                                            optimizer: str,
                                                                            expected_ratio: float) -> None:
    """The same actor step (same buffer, same sampled utterances) with the critic's Q scaled by 1 and by 0.01: under
    SGD the weights move a hundredth as far, under AdamW (which divides by the gradient's own magnitude) as far."""
    def step(scale: float) -> float:
        torch.manual_seed(0)  # the same critic heads and episodes for both scales
        cfg = ArcherConfig(**common(model_dir, tmp_path / f"run{scale}", steps=1, critic_steps=1, checkpoint_every=0,
                                    actor_baseline="sampled", actor_samples_per_state=2, actor_optimizer=optimizer,
                                    learning_rate=1e-2 if optimizer == "sgd" else 1e-4, max_grad_norm=1e9))
        trainer = _bare_trainer(model_dir, cfg)
        trainer._make_optimizer()
        assert isinstance(trainer.optimizer, torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW)
        trainer.replay.extend(trainer._transitions(0, trainer._sample(0), cfg.gamma))
        critic = trainer.critic
        trainer.critic = lambda states, actions: tuple(x * scale for x in critic(states, actions))  # type: ignore
        before = [p.detach().clone() for p in trainer.model.parameters()]
        stats = trainer._actor_phase(0, torch.Generator().manual_seed(0))
        assert stats["actor/advantage_abs"] > 0
        return float(sum(((p.detach() - b) ** 2).sum() for p, b in zip(trainer.model.parameters(), before)) ** 0.5)

    full, hundredth = step(1.0), step(0.01)
    assert full > 0 and hundredth / full == pytest.approx(expected_ratio, rel=0.05)


def test_a_run_resumes_only_under_the_actor_optimizer_it_was_trained_with(model_dir: Path, tmp_path: Path) -> None:
    """The checkpoint holds AdamW's state, which SGD cannot take up: refused with the fix, even when forced."""
    settings = common(model_dir, tmp_path / "run", steps=1, critic_steps=1, checkpoint_every=1)
    ArcherTrainer(ArcherConfig(**settings)).train()
    switched = ArcherConfig(**{**settings, "steps": 2, "actor_optimizer": "sgd", "learning_rate": 0.3})
    with pytest.raises(ConfigError, match="trained with actor_optimizer: adamw.*Set actor_optimizer: adamw"):
        ArcherTrainer(switched).train(force_resume=True)
    summary = ArcherTrainer(ArcherConfig(**{**settings, "steps": 2})).train()  # as trained: resumes
    assert summary["config"]["steps"] == 2


def _bare_trainer(model_dir: Path, cfg: ArcherConfig) -> ArcherTrainer:
    """An ArcherTrainer with its actor, policy, critic, buffer and metrics log built (a config with
    ``prior_episodes`` logs while it is built), without running ``train()``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.policies.hf import HFPolicy
    from agentgym.trainers.metrics import MetricsLogger

    trainer = ArcherTrainer(cfg)
    trainer.metrics = MetricsLogger.from_config(trainer.output_dir, cfg)
    trainer.model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer.tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    trainer.policy = HFPolicy(trainer.model, trainer.tokenizer)
    trainer._setup(None)
    return trainer


def test_critic_learns_which_utterance_pays_and_the_advantage_follows(model_dir: Path, tmp_path: Path) -> None:
    """TD learning on a one-step problem: from the same state, one answer ends the episode with reward 1 and
    another with 0. After a few critic steps Q ranks them, the advantage the actor would get ranks them the
    same way, and the logged explained variance against the buffer's returns is high."""
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", critic_steps=20, critic_learning_rate=1e-3,
                                batch_size=16, tau=0.5))
    trainer = _bare_trainer(model_dir, cfg)
    ids = tuple(trainer.tokenizer("What is 2 + 3?")["input_ids"])
    state = "What is 2 + 3?"
    # The critic reads actions decoded from their ids (as it reads fresh samples), so the ids must be the real ones.
    paid = [Transition(state=state, action=answer, reward=reward, next_state=state + answer, terminated=True,
                       truncated=False, state_ids=ids, action_ids=tuple(trainer.tokenizer(answer)["input_ids"]),
                       mc_return=reward, episode=f"e{k}")
            for k, (answer, reward) in enumerate([("answer(5)", 1.0), ("answer(7)", 0.0)] * 8)]
    trainer.replay.extend(paid)
    before = trainer._critic_phase(0, torch.Generator().manual_seed(0))
    stats = trainer._critic_phase(1, torch.Generator().manual_seed(1))
    with torch.no_grad():
        q, v = trainer.critic([state, state], [trainer._decode(paid[0].action_ids), trainer._decode(paid[1].action_ids)])
    right, wrong = q.min(dim=0).values.tolist()
    assert right > 0.8 and wrong < 0.2, (right, wrong)
    from agentgym.trainers.algorithms.archer import utterance_advantage

    adv = utterance_advantage(q, v)
    assert adv[0] > adv[1] + 0.5
    assert stats["critic/explained_variance"] > 0.9 > before["critic/explained_variance"]
    # Not compared: the phases' mean critic loss. It has a floor (V chases Q of freshly sampled utterances) that the
    # first phase already reaches, so the second phase's mean moves with the samples (0.3147 against 0.3144, then
    # 0.339 against 0.309 in two clean-clone runs). Learning shows in the Q values and explained variance above.
    assert torch.isfinite(torch.tensor(stats["critic/loss"]))


def test_filtered_bc_clones_only_top_episodes_and_skips_a_uniform_pool(model_dir: Path, tmp_path: Path) -> None:
    cfg = FilteredBCConfig(**common(model_dir, tmp_path / "fbc", checkpoint_every=0))
    trainer = FilteredBCTrainer(cfg)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer.model = AutoModelForCausalLM.from_pretrained(model_dir)
    trainer.tokenizer = AutoTokenizer.from_pretrained(model_dir)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=1e-3)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    trainer._setup(None)
    losers = [dataclasses.replace(_traj(2, "failed"), traj_id=f"l{i}") for i in range(9)]
    assert trainer._learn(0, losers)["train/skipped_update"] == 1.0  # every return is 0: nothing to clone
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    winner = dataclasses.replace(_traj(2, "solved", [0.0, 1.0]), traj_id="w")
    stats = trainer._learn(1, [winner])
    assert stats["filter/episodes_kept"] == 1.0 and stats["filter/pool_episodes"] == 10.0
    assert stats["filter/cutoff"] == pytest.approx(0.1)
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())


# ---- episodes before the first step -------------------------------------------------------------------------
def _turns_of(path: Path) -> list[Transition]:
    return list(ReplayBuffer(path, capacity=10**9, persist=False).items())


def test_prior_episodes_start_both_methods_from_the_same_turns_and_count_as_episodes(model_dir: Path,
                                                                                     tmp_path: Path) -> None:
    shared = dict(steps=1, prior_episodes=6, checkpoint_every=0, eval_tasks=2)
    ArcherTrainer(ArcherConfig(**common(model_dir, tmp_path / "archer", critic_steps=1, critic_prior_steps=4,
                                        **shared))).train()
    FilteredBCTrainer(FilteredBCConfig(**common(model_dir, tmp_path / "fbc", **shared))).train()
    replay, pool = _turns_of(tmp_path / "archer" / "replay.jsonl"), _turns_of(tmp_path / "fbc" / "pool.jsonl")
    for turns in (replay, pool):
        prior = [t for t in turns if t.episode.startswith("prior:")]
        assert {t.episode for t in prior} == {f"prior:{k}" for k in range(6)}
        assert turns[: len(prior)] == prior, "the prior turns come before the first step's"
        assert {t.episode.split(":")[0] for t in turns[len(prior):]} == {"0"}
    # the same episodes for both methods: same tasks, same sampled tokens
    assert [t.action_ids for t in replay if t.episode.startswith("prior:")] == \
        [t.action_ids for t in pool if t.episode.startswith("prior:")]
    for run in ("archer", "fbc"):
        assert json.loads((tmp_path / run / "summary.json").read_text())["episodes"] == 6 + 4
    records = [json.loads(line) for line in (tmp_path / "archer" / "metrics.jsonl").read_text().splitlines()]
    at_start = {k: v for r in records if r["step"] == 0 for k, v in r.items()}
    assert at_start["prior/episodes"] == 6 and at_start["prior/turns"] == sum(
        t.episode.startswith("prior:") for t in replay)
    assert at_start["critic/prior_steps"] == 4 and at_start["time/critic_prior_s"] > 0
    for key in ("prior/success_rate", "critic/prior_loss", "time/prior_s"):
        assert key in at_start


def test_critic_prior_fit_regresses_q_and_v_onto_the_returns_and_copies_the_target(model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", prior_episodes=8, critic_learning_rate=3e-3))
    trainer = _bare_trainer(model_dir, cfg)
    turns = list(trainer.replay)
    assert turns and all(t.episode.startswith("prior:") for t in turns)
    returns = torch.tensor([t.mc_return for t in turns])

    def error() -> float:
        with torch.no_grad():
            q, v = trainer.critic([t.state for t in turns], trainer._buffer_actions(turns))
        return float(((q - returns) ** 2).mean() + ((v - returns) ** 2).mean())

    before = error()
    trainer.config = dataclasses.replace(cfg, critic_prior_steps=30)
    trainer._critic_prior_fit()
    assert error() < 0.5 * before
    assert _digest(trainer.critic.state_dict()) == _digest(trainer.target_critic.state_dict())


# ---- configs -----------------------------------------------------------------------------------------
def test_config_checks_explain_the_fix(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Did you mean 'critic_steps'"):
        ArcherConfig.from_dict({"model": "m", "suite": "games-maze", "critic_step": 3})
    with pytest.raises(ConfigError, match="actor would never be updated"):
        ArcherConfig(model="m", suite="games-maze", steps=2, actor_warmup_steps=2)
    with pytest.raises(ConfigError, match="tau"):
        ArcherConfig(model="m", suite="games-maze", tau=0.0)
    with pytest.raises(ConfigError, match="held-out"):
        FilteredBCConfig(model="m", suite="games-maze", eval_split="train")
    with pytest.raises(ConfigError, match="no split"):
        ArcherTrainer(ArcherConfig(**common(model_dir, tmp_path, eval_split="validation")))
    with pytest.raises(ConfigError, match="divide batch_size"):
        ArcherConfig(model="m", suite="games-maze", actor_baseline="sampled", batch_size=16, actor_samples_per_state=3)
    with pytest.raises(ConfigError, match="must be >= 2"):
        ArcherConfig(model="m", suite="games-maze", actor_baseline="sampled", actor_samples_per_state=1)
    with pytest.raises(ConfigError, match="expected one of 'value', 'sampled'"):
        ArcherConfig(model="m", suite="games-maze", actor_baseline="mean")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="expected one of 'adamw', 'sgd'"):
        ArcherConfig(model="m", suite="games-maze", actor_optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no returns to regress onto; set prior_episodes"):
        ArcherConfig(model="m", suite="games-maze", critic_prior_steps=100)
    with pytest.raises(ConfigError, match="prior_episodes"):
        FilteredBCConfig(model="m", suite="games-maze", prior_episodes=-1)


# ---- resume after SIGKILL ----------------------------------------------------------------------------
def _train_subprocess(config: ArcherConfig, tmp: Path) -> subprocess.Popen[bytes]:
    path = tmp / f"config-{time.monotonic_ns()}.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"trainer": "archer", **config.to_dict()}))
    script = ("import sys, torch; torch.set_num_threads(1)\n"
              "from agentgym.trainers.config import load_config\n"
              "from agentgym.trainers.archer import ArcherTrainer\n"
              "ArcherTrainer(load_config(sys.argv[1])).train()\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-c", script, str(path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _final_state(out: Path) -> dict[str, str]:
    from transformers import AutoModelForCausalLM

    blob = torch.load(out / "checkpoints" / "step-000006" / "critic.pt", weights_only=False)
    trainer = torch.load(out / "checkpoints" / "step-000006" / "trainer.pt", weights_only=False)
    return {
        "actor": _digest(AutoModelForCausalLM.from_pretrained(out / "model").state_dict()),
        "critic": _digest(blob["critic"]),
        "target_critic": _digest(blob["target_critic"]),
        "critic_optimizer": _digest({f"{k}.{n}": v for k, s in blob["critic_optimizer"]["state"].items()
                                     for n, v in s.items() if isinstance(v, torch.Tensor)}),
        "actor_optimizer": _digest({f"{k}.{n}": v for k, s in trainer["optimizer"]["state"].items()
                                    for n, v in s.items() if isinstance(v, torch.Tensor)}),
        "replay": hashlib.sha256((out / "replay.jsonl").read_bytes()).hexdigest(),
    }


@pytest.mark.slow  # three training processes; test_data_parallel resumes a killed-and-restarted ArCHer loop too
def test_sigkilled_run_resumes_replay_critic_target_and_actor(model_dir: Path, tmp_path: Path) -> None:
    straight = ArcherConfig(**common(model_dir, tmp_path / "straight", steps=6, actor_warmup_steps=1,
                                     critic_steps=2, warmstart="bc", bc_demos=8, bc_steps=5))
    proc = _train_subprocess(straight, tmp_path)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    killed = dataclasses.replace(straight, output_dir=str(tmp_path / "killed"))
    proc = _train_subprocess(killed, tmp_path)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 600
    while time.time() < deadline and not (latest.is_file() and latest.read_text().strip() >= "step-000002"):
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert latest.read_text().strip() in {f"step-00000{i}" for i in range(2, 6)}
    proc = _train_subprocess(killed, tmp_path)
    assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()[-3000:]

    assert _final_state(tmp_path / "killed") == _final_state(tmp_path / "straight")
    summary = json.loads((tmp_path / "killed" / "summary.json").read_text())
    assert "resumed_from" in summary and summary["episodes"] == 6 * 4


# ---- benchmarks/archer_critic_fit.py --------------------------------------------------------------------
def _critic_fit_module():  # noqa: ANN202
    return load_script("benchmarks/archer_critic_fit.py")


def test_critic_fit_oracle_reads_the_exact_path_length_off_the_rendered_maze() -> None:
    from agentgym.envs.games.maze import Maze

    fit = _critic_fit_module()
    for seed in range(20):
        maze = Maze(5, 5, seed)
        start, goal = (seed % 5, 0), (4, 4 - seed % 3)
        state = f"<|im_start|>user\nYou moved east.\n{maze.render(start, goal)}\nOpen directions: north.<|im_end|>"
        earlier = maze.render(goal, start)  # only the last grid of a state counts
        assert fit.maze_distance(earlier + "\n" + state) == len(maze.shortest_path(start, goal))
    assert fit.maze_distance("no grid here") is None


def test_move_ranking_scores_a_critic_against_the_mazes_shortest_path() -> None:
    """The maze oracle gives each move's distance to the exit (None where a wall blocks it), and the ranking is 1
    for a critic that prefers shorter paths, 0 for one that prefers longer ones and 0.5 for one that cannot tell."""
    import re
    from types import SimpleNamespace

    from agentgym.envs.games.maze import Maze

    fit = _critic_fit_module()
    move_ranking = fit.move_ranking
    turns = []
    for seed in range(12):
        maze = Maze(4, 4, seed)
        start, goal = (seed % 4, 0), (3, 3)
        state = f"You moved east.\n{maze.render(start, goal)}\nOpen directions: north."
        moves, path = fit.maze_moves(state), maze.shortest_path(start, goal)
        assert moves[path[0]] == len(path) - 1
        assert [name for name, d in moves.items() if d is None] == [n for n in fit.MOVES if maze.step(start, n) is None]
        turns.append(SimpleNamespace(state=state))
    assert fit.maze_moves("no grid here") is None

    def critic(sign: float):  # noqa: ANN202 (a scorer of the critic's shape: Q and V as [2, B])
        def score(states: list[str], actions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
            after = [fit.maze_moves(s)[re.search("north|south|east|west", a).group()] for s, a in zip(states, actions)]
            q = torch.tensor([[sign * -(99 if d is None else d) for d in after]] * 2)
            return q, q
        return score

    actions = ['move("west")<|im_end|>'] * len(turns)  # the direction is swapped for each of the four
    best, worst, blind = (move_ranking(critic(sign), turns, actions) for sign in (1.0, -1.0, 0.0))
    assert (best["move_ranking"], worst["move_ranking"], blind["move_ranking"]) == (1.0, 0.0, 0.5)
    assert best["move_states"] == len(turns) and best["move_pairs"] >= len(turns)
    assert move_ranking(critic(1.0), turns[:1], ["answer(3)"])["move_ranking"] is None  # no move to swap


def test_critic_fit_runs_on_a_replay_buffer_and_explains_its_options(model_dir: Path, tmp_path: Path) -> None:
    fit = _critic_fit_module()
    run = tmp_path / "run"
    run.mkdir()
    buffer = ReplayBuffer(run / "replay.jsonl")
    buffer.extend(Transition(state=f"What is {k} + {k}?" + " step" * turn, action=f"answer({2 * k})",
                             reward=float(k % 2), next_state="", terminated=turn == 2, truncated=False,
                             mc_return=float(k % 2) * 0.9 ** (2 - turn), episode=f"e{k}", turn=turn)
                  for k in range(10) for turn in range(3))
    (run / "config.json").write_text(json.dumps({"model": str(model_dir)}))
    with pytest.raises(SystemExit):
        fit.main(["--replay", str(run / "missing.jsonl")])
    assert fit.main(["--replay", str(run / "replay.jsonl"), "--steps", "4", "--batch-size", "4", "--evals", "2"]) == 0
    report = json.loads((run / "critic_fit.json").read_text())
    assert report["args"]["model"] == str(model_dir)  # the run's starting model, read from its config.json
    names = [name for name, _ in report["rows"]]
    assert names[0].startswith("mean return per turn index") and not any("maze oracle" in n for n in names)
    assert [step for step, _ in report["curve"]] == [2, 4]
    other = tmp_path / "other.jsonl"  # another run's buffer: its turns train, the held-out fifth stays the first's
    ReplayBuffer(other).extend(Transition(state=f"What is {k} * 2?", action=f"answer({2 * k})", reward=1.0,
                                          next_state="", terminated=True, truncated=False, mc_return=1.0,
                                          episode=f"o{k}", turn=0) for k in range(7))
    with pytest.raises(SystemExit):
        fit.main(["--replay", str(run / "replay.jsonl"), "--train-replay", str(tmp_path / "missing.jsonl")])
    assert fit.main(["--replay", str(run / "replay.jsonl"), "--train-replay", str(other), "--encoder", "bytes",
                     "--steps", "2", "--batch-size", "4", "--evals", "1"]) == 0
    report = json.loads((run / "critic_fit.json").read_text())
    assert "regression on returns of 31 training turns" in report["rows"][-2][0]  # 8 episodes x 3 turns + 7
    assert report["args"]["encoder"] == "bytes" and report["args"]["train_replay"] == [str(other)]


def test_critic_reads_buffer_and_fresh_actions_as_the_same_kind_of_text(model_dir: Path, tmp_path: Path) -> None:
    """Q must not be fit on stripped buffer text but read on raw decoded samples: both come from ids."""
    cfg = ArcherConfig(**common(model_dir, tmp_path / "run", critic_steps=1, batch_size=2))
    trainer = _bare_trainer(model_dir, cfg)
    ids = tuple(trainer.tokenizer("What is 2 + 3?")["input_ids"])
    action_ids = tuple(trainer.tokenizer("answer(5)")["input_ids"]) + (trainer.tokenizer.eos_token_id,)
    trainer.replay.extend([Transition(state="What is 2 + 3?", action="answer(5)", reward=1.0, next_state="done",
                                      terminated=True, truncated=False, state_ids=ids, action_ids=action_ids,
                                      mc_return=1.0, episode=f"e{k}") for k in range(2)])
    seen: list[list[str]] = []
    forward = trainer.critic.forward

    def recording(states: list[str], actions: list[str]) -> Any:
        seen.append(list(actions))
        return forward(states, actions)

    trainer.critic.forward = recording
    trainer._critic_phase(0, torch.Generator().manual_seed(0))
    assert seen and all(a == trainer._decode(action_ids) for batch in seen for a in batch)
    assert trainer._decode(action_ids) != "answer(5)"  # the end token is part of what the critic reads


def test_a_resumed_critic_takes_this_configs_learning_rate(model_dir: Path, tmp_path: Path) -> None:
    """A forced resume with a new critic_learning_rate trains the critic at the new rate, not the stored one."""
    first = _bare_trainer(model_dir, ArcherConfig(**common(model_dir, tmp_path / "run", critic_learning_rate=1e-3)))
    first._save_extra_state(tmp_path)
    second = _bare_trainer(model_dir, ArcherConfig(**common(model_dir, tmp_path / "run", critic_learning_rate=2e-4)))
    second._setup(tmp_path)
    assert [g["lr"] for g in second.critic_optimizer.param_groups] == [2e-4] * len(second.critic_optimizer.param_groups)
