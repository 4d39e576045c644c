"""Asynchronous training: the next steps' rollouts are generated while the current step trains, within a
staleness bound, nothing is dropped, every turn records the weights that sampled it, and the update weights stale
tokens by their behaviour importance ratio. The rollout worker runs in a thread or in a process of its own; both
give the same episodes for the same weights, and a dead worker process is a clear error, never a hang."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from agentgym.errors import ConfigError  # noqa: E402
from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.cli.quickstart import demonstration_texts  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.algorithms import behaviour_weights  # noqa: E402
from agentgym.trainers.async_rollouts import AsyncRollouts, RolloutWorkerDied, WeightMailbox  # noqa: E402
from agentgym.trainers.policy_versions import with_versions  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402
from agentgym.trajectory import Trajectory, Turn  # noqa: E402

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 60),
                            config=SMALL)


def _config(model_dir: Path, out: Path, **overrides: object) -> object:
    values: dict[str, object] = dict(trainer="grpo", model=str(model_dir), suite="games-calc", output_dir=str(out),
                                     steps=4, tasks_per_step=2, group_size=4, eval_tasks=2, eval_every=0,
                                     checkpoint_every=0, system_prompt="", max_tokens_per_turn=12,
                                     max_context_tokens=128, tensorboard=False, micro_batch_size=4, progress=False)
    values.update(overrides)
    return config_from_dict(values)


def _ready(config: object) -> object:
    """A trainer with its model, tokenizer and generation policy, as ``train()`` builds them, without running."""
    trainer = make_trainer(config)
    trainer.model, trainer.tokenizer = trainer._load(trainer.config.model)
    trainer.policy = trainer._generation_policy(trainer.model_dir)
    return trainer


def _rows(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _gone(pid: int) -> bool:
    """The process has exited and was reaped (no zombie left)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.parametrize(("trainer", "staleness", "worker"), [("grpo", 1, "thread"), ("gigpo", 2, "process")])
def test_async_training_stays_within_its_staleness_and_drops_nothing(model_dir: Path, tmp_path: Path, trainer: str,
                                                                    staleness: int, worker: str) -> None:
    config = _config(model_dir, tmp_path, trainer=trainer, max_staleness=staleness, async_worker=worker)
    run = make_trainer(config)
    summary = run.train()
    assert summary["episodes"] == 4 * 2 * 4
    steps = [r for r in _rows(tmp_path) if "async/staleness" in r]
    assert len(steps) == 4
    lags = [r["async/staleness"] for r in steps]
    assert all(0 <= lag <= staleness for lag in lags) and max(lags) >= 1, lags  # it did run ahead
    # per token: never staler than the step's start, and the max is a real lag of some token
    assert all(r["async/token_staleness_mean"] <= r["async/token_staleness_max"] <= r["async/staleness"]
               for r in steps), steps
    assert all(r["async/dropped_episodes"] == 0 for r in steps)
    assert all(r["async/episodes_per_task_min"] == r["async/episodes_per_task_max"] == 4 for r in steps)
    assert all(r["train/episodes"] == 8 for r in steps) and (tmp_path / "model" / "config.json").is_file()
    assert all("train/is_weight_mean" in r for r in steps)  # auto: the correction is on when asynchronous
    if worker == "process":
        pid = run._async.pid
        assert pid is not None and _gone(pid)
        assert not [p for p in multiprocessing.active_children() if p.name == "agentgym-rollouts"]
        run._async.close()  # idempotent


def _same_turns(a: Trajectory, b: Trajectory) -> int:
    """How many leading turns two trajectories of one spec share; asserts that turns sampled by the same weights
    from the same prompt are the same tokens (log-probs equal up to float rounding)."""
    va, vb = a.metadata["policy_versions"], b.metadata["policy_versions"]
    for i, (ta, tb) in enumerate(zip(a.turns, b.turns)):
        if va[i] != vb[i]:
            return i
        assert ta.prompt_token_ids == tb.prompt_token_ids and ta.action_token_ids == tb.action_token_ids, (i, va)
        assert ta.action_logprobs == pytest.approx(tb.action_logprobs, abs=1e-4)
    assert len(a.turns) == len(b.turns)
    return len(a.turns)


def test_process_and_thread_workers_sample_the_same_episodes_from_the_same_weights(model_dir: Path,
                                                                                    tmp_path: Path) -> None:
    trainer = _ready(_config(model_dir, tmp_path, steps=3, max_staleness=1, temperature=1.0))
    synchronous = trainer._sample(0)
    initial = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    batches = {}
    for worker in ("thread", "process"):
        trainer.model.load_state_dict(initial)  # both start from the same weights
        rollouts = AsyncRollouts(trainer, 0, 1, worker)
        try:
            first, _, lag = rollouts.take(0)
            assert lag["async/staleness"] == 0
            with torch.no_grad():  # an update: step 2 starts with it, step 1 may take it mid-episode
                trainer.model.model.embed_tokens.weight.mul_(1.5)
            rollouts.publish(trainer.model)
            second, _, _ = rollouts.take(1)
            third, _, lag = rollouts.take(2)
            assert lag["async/staleness"] == 0 and lag["async/token_staleness_max"] == 0
        finally:
            rollouts.close()
            rollouts.close()
        batches[worker] = (first, second, third)
    thread, process = batches["thread"], batches["process"]
    for a, b in zip(synchronous, thread[0], strict=True):  # no update before step 0: the synchronous episodes
        assert [(t.prompt_token_ids, t.action_token_ids) for t in a.turns] == [
            (t.prompt_token_ids, t.action_token_ids) for t in b.turns]
    assert all(set(t.metadata["policy_versions"]) == {0} for t in thread[0] + process[0])
    assert all(set(t.metadata["policy_versions"]) == {1} for t in thread[2] + process[2])
    compared = 0
    for step in range(3):
        for a, b in zip(thread[step], process[step], strict=True):
            compared += _same_turns(a, b)
    assert compared >= sum(len(t.turns) for t in thread[0] + thread[2])  # steps 0 and 2 compared in full


def test_a_killed_worker_process_is_a_clear_error_and_delivered_steps_are_kept(model_dir: Path,
                                                                                tmp_path: Path) -> None:
    trainer = _ready(_config(model_dir, tmp_path, steps=4, max_staleness=2, async_worker="process"))
    rollouts = AsyncRollouts(trainer, 0, 2, "process")
    pid = rollouts.pid
    try:
        rollouts.take(0)
        deadline = time.monotonic() + 60
        while rollouts._results.qsize() < 2 and time.monotonic() < deadline:  # steps 1 and 2 generated and sent
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)
        assert len(rollouts.take(1)[0]) == len(rollouts.take(2)[0]) == 8  # already generated: not lost
        rollouts.publish(trainer.model)
        killed = time.monotonic()
        with pytest.raises(RolloutWorkerDied, match="killed by signal SIGKILL"):
            rollouts.take(3)
        assert time.monotonic() - killed < 15
    finally:
        rollouts.close()
        rollouts.close()
    assert _gone(pid)


def test_weight_mailbox_hands_out_only_complete_newer_weights() -> None:
    model = torch.nn.Linear(3, 2)
    box = WeightMailbox(model.state_dict(), 4)
    copy = torch.nn.Linear(3, 2)
    assert box.read_into(copy.load_state_dict, 4) == 4 and not torch.equal(copy.weight, model.weight)
    with torch.no_grad():
        model.weight.add_(1.0)
    box.publish(model.state_dict(), 5)
    assert box.version == 5
    assert box.read_into(copy.load_state_dict, 4) == 5 and torch.equal(copy.weight, model.weight)


def _turn(n: int) -> Turn:
    return Turn(observation="o", action="a", action_token_ids=tuple(range(n)), action_logprobs=(-1.0,) * n,
                prompt_token_ids=(1,))


def test_a_branch_inherits_the_versions_of_the_turns_it_shares_with_its_parent() -> None:
    parent = Trajectory(env_id="e", task_id="t", seed=0, turns=(_turn(2), _turn(3), _turn(1)), outcome={},
                        end_reason="answered", traj_id="r-0-0", metadata={"tree": {"origin": "initial"}})
    child = Trajectory(env_id="e", task_id="t", seed=0, turns=(_turn(2), _turn(3), _turn(4)), outcome={},
                       end_reason="answered", traj_id="r-0-1",
                       metadata={"tree": {"origin": "branch", "parent": "r-0-0", "branch_turn": 2}})
    recorded = {"r-0-0": [0, 0, 1], "r-0-1": [2]}
    out = with_versions([child, parent], recorded)
    assert out[0].metadata["policy_versions"] == [0, 0, 2] and out[1].metadata["policy_versions"] == [0, 0, 1]


def test_behaviour_weights_truncate_or_drop_above_the_cap() -> None:
    proximal = torch.tensor([[-1.0, -2.0, -0.1, -5.0]])
    behaviour = torch.tensor([[-1.0, -1.0, -3.0, -5.0]])
    weights = behaviour_weights(proximal, behaviour, cap=2.0)
    assert weights.tolist()[0] == pytest.approx([1.0, 0.36788, 2.0, 1.0], abs=1e-5)
    dropped = behaviour_weights(proximal, behaviour, cap=2.0, mode="mask")
    assert dropped.tolist()[0] == pytest.approx([1.0, 0.36788, 0.0, 1.0], abs=1e-5)
    with pytest.raises(ConfigError, match="cap"):
        behaviour_weights(proximal, behaviour, cap=0.5)
    with pytest.raises(ConfigError, match="mode"):
        behaviour_weights(proximal, behaviour, mode="clip")  # type: ignore[arg-type]


def test_arpo_branches_asynchronously(tmp_path: Path) -> None:
    maze = build_tiny_model(tmp_path / "maze", texts=demonstration_texts("games-maze", 40), config=SMALL)
    config = _config(maze, tmp_path / "run", trainer="arpo", suite="games-maze", eval_split="validation", steps=2,
                     max_staleness=1, initial_rollouts=2, branch_probability=1.0, entropy_weight=0.0,
                     branch_after=("tool_call", "invalid", "void"),
                     max_tokens_per_turn=10, max_context_tokens=700, off_policy_correction="decoupled")
    summary = make_trainer(config).train()
    assert summary["episodes"] == 2 * 2 * 4
    steps = [r for r in _rows(tmp_path / "run") if "async/staleness" in r]
    assert len(steps) == 2 and all(r["async/episodes_per_task_min"] == 4 for r in steps)
    assert sum(r["arpo/branches_per_task"] for r in steps) > 0  # it did branch
    assert all("train/is_bounded_frac" in r for r in steps)


def test_async_settings_that_cannot_work_fail_with_the_fix(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_staleness: must be >= 0"):
        _config(model_dir, tmp_path, max_staleness=-1)
    with pytest.raises(ConfigError, match="async_worker"):
        _config(model_dir, tmp_path, max_staleness=1, async_worker="fork")
    with pytest.raises(ConfigError, match="use async_worker: thread"):
        _config(model_dir, tmp_path, max_staleness=1, async_worker="process", generation_backend="vllm", device="cuda")
    with pytest.raises(ConfigError, match="use async_worker: thread"):
        _config(model_dir, tmp_path, max_staleness=1, async_worker="process", env_backend="ray")
    vllm = _config(model_dir, tmp_path, max_staleness=1, generation_backend="vllm", device="cuda")
    assert vllm.async_worker == "thread" and vllm.corrects_off_policy
    assert _config(model_dir, tmp_path, max_staleness=1).corrects_off_policy
    assert not _config(model_dir, tmp_path).corrects_off_policy
    decoupled = _config(model_dir, tmp_path, off_policy_correction="decoupled")
    assert decoupled.corrects_off_policy and decoupled.behaviour_weight_mode == "mask"


@pytest.mark.gpu
def test_vllm_generates_asynchronously_and_loads_each_update(model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    config = _config(model_dir, tmp_path, device="cuda", generation_backend="vllm", steps=3, max_staleness=1)
    summary = make_trainer(config).train()
    assert summary["episodes"] == 3 * 2 * 4
    steps = [r for r in _rows(tmp_path) if "async/staleness" in r]
    assert len(steps) == 3 and max(r["async/staleness"] for r in steps) >= 1
    # the engine samples with the published weights: its log-probs stay close to the trainer's recomputation, and
    # the behaviour weights (stale tokens) stay near 1 at this learning rate
    assert max(r["train/logprob_mismatch"] for r in steps) < 0.5
    assert all(0.5 < r["train/is_weight_mean"] < 2.0 for r in steps)
