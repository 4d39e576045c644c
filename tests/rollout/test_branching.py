"""ARPO's branching sampler: the tree is exact (shared prefix tokens and env state, divergence after), on a
forkable game (copy), the code interpreter and search (replay); the entropy rule picks the branch points in
both timings; with alpha = beta = 0 it degenerates to plain group rollouts and ARPO's update to GRPO's."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.rollout.branching import BranchingConfig, BranchingSampler
from agentgym.errors import ConfigError
from agentgym.models.tiny import TinyModelConfig, build_tiny_model, load_tiny_model
from agentgym.policies import SamplingParams, ScriptedPolicy
from agentgym.policies.hf import HFPolicy
from agentgym.cli.quickstart import demonstration_texts
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
from agentgym.suite import Task
from agentgym.registration.suites import load_suite
from agentgym.trajectory import Trajectory

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", texts=demonstration_texts("games-calc", 100),
                            config=SMALL)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return load_tiny_model(model_dir)[1]


def rollout_config(**overrides: Any) -> RolloutConfig:
    values: dict[str, Any] = dict(sampling=SamplingParams(max_tokens=24, seed=7), system_prompt="",
                                  max_context_tokens=400, deterministic=True, step_timeout_s=60)
    values.update(overrides)
    return RolloutConfig(**values)


def group_specs(env_id: str, tasks: Sequence[Task], budget: int, env_kwargs: Mapping[str, Any] | None = None) -> list[EpisodeSpec]:
    return [EpisodeSpec(env_id, task=task, seed=1000 * k + g, group_id=f"g{k}", env_kwargs=dict(env_kwargs or {}))
            for k, task in enumerate(tasks) for g in range(budget)]


def counting_policy(tokenizer: Any, script: Callable[[int, int], str]) -> ScriptedPolicy:
    """Scripted policy whose reply depends on the turn and on a global call counter, so that siblings that
    sample the same turn separately get different replies (they diverge after the branch point)."""
    counter = itertools.count()

    def reply(messages: Sequence[Mapping[str, Any]]) -> str:
        return script(sum(1 for m in messages if m.get("role") == "assistant"), next(counter))

    return ScriptedPolicy(reply, tokenizer=tokenizer)


def by_id(trajectories: Sequence[Trajectory]) -> dict[str, Trajectory]:
    return {t.traj_id: t for t in trajectories}


def check_tree(trajectories: Sequence[Trajectory], budget: int) -> list[tuple[Trajectory, Trajectory]]:
    """Every group has ``budget`` members; each branch shares its parent's exact prefix tokens (the turns
    before the branch point and the tool result after them) and samples its own turn there."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    assert all(len(g) == budget for g in groups.values())
    ids = by_id(trajectories)
    pairs = []
    for t in trajectories:
        tree = t.metadata["tree"]
        if tree["origin"] != "branch":
            assert tree["parent"] is None
            continue
        parent, b = ids[tree["parent"]], tree["branch_turn"]
        assert parent.group_id == t.group_id and 1 <= b <= len(parent.turns)
        assert t.turns[:b] == parent.turns[:b]
        prefix = sum(len(x.prompt_token_ids) + len(x.action_token_ids) for x in t.turns[:b])
        assert t.token_view().input_ids[:prefix] == parent.token_view().input_ids[:prefix]
        if b < len(parent.turns):
            assert t.turns[b].prompt_token_ids == parent.turns[b].prompt_token_ids  # the same tool result
            assert t.turns[b].observation == parent.turns[b].observation
        pairs.append((parent, t))
    return pairs


def replays_exactly(trajectory: Trajectory, env_kwargs: Mapping[str, Any] | None = None, task: Task | None = None) -> bool:
    """The trajectory is the episode a fresh env (same seed and task) gives for its actions: so a branch's env
    was in its parent's state at the branch point."""
    env = gym.make(trajectory.env_id, **dict(env_kwargs or {}))
    try:
        obs, _ = env.reset(seed=trajectory.seed, options={"task": task} if task else None)
        for turn in trajectory.turns:
            if obs != turn.observation:
                return False
            obs, *_ = env.step(turn.action)
        return True
    finally:
        env.close()


# ---- degenerate case: alpha = beta = 0 ------------------------------------------------------------------
def test_without_branching_the_sampler_gives_exactly_the_engines_group_rollouts(model_dir: Path) -> None:
    model, tok = load_tiny_model(model_dir)
    policy = HFPolicy(model, tok, max_batch_size=64)
    tasks = load_suite("games-calc").split("train")[:3]
    specs = group_specs("agentgym/Calculator-v0", tasks, 4)
    plain = RolloutEngine(policy, rollout_config()).run(specs)
    sampler = BranchingSampler(policy, rollout_config(),
                               BranchingConfig(budget=4, initial_rollouts=2, branch_probability=0.0, entropy_weight=0.0))
    branched = sampler.run(specs)
    assert len(branched) == len(plain) == 12
    for a, b in zip(plain, branched):
        assert (a.group_id, a.seed, a.task_id) == (b.group_id, b.seed, b.task_id)
        assert a.token_view() == b.token_view() and a.outcome == b.outcome
        assert b.metadata["tree"]["origin"] == "initial"
    assert sampler.stats["branches_per_task"] == 0 and sampler.stats["branch_attempts"] == 0


def test_arpo_with_alpha_and_beta_zero_updates_exactly_like_grpo(model_dir: Path, tmp_path: Path) -> None:
    from agentgym.trainers.arpo import ArpoConfig, ArpoTrainer
    from agentgym.trainers.config import GrpoConfig
    from agentgym.trainers.grpo import GrpoTrainer

    common = dict(model=str(model_dir), suite="games-calc", steps=1, tasks_per_step=2, group_size=4,
                  max_tokens_per_turn=16, max_context_tokens=256, system_prompt="", eval_tasks=2, eval_every=0,
                  checkpoint_every=0, tensorboard=False, warmup_steps=0, clip_eps_high=0.2, seed=3)
    GrpoTrainer(GrpoConfig(output_dir=str(tmp_path / "grpo"), **common)).train()
    branching = BranchingConfig(initial_rollouts=2, branch_probability=0.0, entropy_weight=0.0)
    ArpoTrainer(ArpoConfig(output_dir=str(tmp_path / "arpo"), branching=branching, **common)).train()

    def train_metrics(run: str) -> dict[str, float]:
        lines = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return next(m for m in lines if "train/loss" in m)

    g, a = train_metrics("grpo"), train_metrics("arpo")
    for key in ("train/loss", "train/tokens", "train/score_mean", "train/grad_norm", "train/clip_frac"):
        assert a[key] == g[key], key
    assert a["arpo/branches_per_task"] == 0.0
    digest = [hashlib.sha256((tmp_path / run / "model" / "model.safetensors").read_bytes()).hexdigest()
              for run in ("grpo", "arpo")]
    assert digest[0] == digest[1]


# ---- the entropy rule -----------------------------------------------------------------------------------
@pytest.mark.parametrize("timing", ["paper", "code"])
def test_branches_happen_exactly_where_the_entropy_rose(model_dir: Path, timing: str) -> None:
    """alpha = 0 and a huge beta: a branch attempt succeeds iff the measured turn's entropy exceeds the
    trajectory's initial entropy (paper: the turn after the branch point; code: the turn before it)."""
    model, tok = load_tiny_model(model_dir)
    policy = HFPolicy(model, tok, max_batch_size=64)
    tasks = load_suite("games-calc").split("train")[:4]
    # The untrained model writes no tool calls; its void turns stand in for tool results here.
    config = BranchingConfig(budget=6, initial_rollouts=2, branch_probability=0.0, entropy_weight=1e9,
                             entropy_timing=timing, branch_after=("void",), seed=1)
    sampler = BranchingSampler(policy, rollout_config(max_context_tokens=600), config)
    trajectories = sampler.run(group_specs("agentgym/Calculator-v0", tasks, 6))
    pairs = check_tree(trajectories, 6)
    assert pairs, "no branch was made"
    for parent, child in pairs:
        b = child.metadata["tree"]["branch_turn"]
        measured = parent.metadata["segment_entropy"][b if timing == "paper" else b - 1]
        assert measured > parent.metadata["initial_entropy"]
        assert parent.turns[b - 1].kind == "void"
        assert child.metadata["segment_entropy"][:b] == parent.metadata["segment_entropy"][:b]
    assert sampler.stats["fork_copies"] == len(pairs) and sampler.stats["fork_replays"] == 0
    task_by_id = {t.id: t for t in tasks}
    assert all(replays_exactly(child, task=task_by_id[child.task_id]) for _, child in pairs)
    entropies = [h for t in trajectories for h in t.metadata["segment_entropy"]]
    assert all(0 < h < 20 for h in entropies)  # a sum over <= 20 positions of entropy / ln|V|


# ---- exact branching on three env families ----------------------------------------------------------------
def test_code_interpreter_branch_shares_the_sandbox_state_and_diverges_after(tokenizer: Any) -> None:
    """Replay fork: a sibling's sandbox holds every variable its shared turns defined; after the branch point
    each sibling runs its own code and sees only its own values."""

    def script(turn: int, call: int) -> str:
        if turn == 0:
            return "```python\nsecret = 6 * 7\nprint('set')\n```"
        if turn == 1:
            return f"```python\nprint(secret)\nmine = {call}\n```"
        if turn == 2:
            return f"```python\nprint(mine)  # call {call}\n```"
        return "\\boxed{42}"

    task = Task(id="t42", prompt="What is 6 * 7?", answer="42",
                metadata={"source": "champ", "answers": ["42"], "reference_code": "print(6 * 7)"})
    sampler = BranchingSampler(counting_policy(tokenizer, script), rollout_config(),
                               BranchingConfig(budget=3, initial_rollouts=1, branch_probability=1.0, entropy_weight=0.0))
    kwargs = {"max_turns": 6}
    trajectories = sampler.run(group_specs("agentgym/CodeInterpreter-v1", [task], 3, kwargs))
    pairs = check_tree(trajectories, 3)
    assert sampler.stats["fork_replays"] == 2 and sampler.stats["fork_copies"] == 0
    root, first, second = trajectories
    assert [(p.traj_id, c.metadata["tree"]["branch_turn"]) for p, c in pairs] == [(root.traj_id, 1), (root.traj_id, 2)]

    def mine(t: Trajectory) -> str:
        return t.turns[1].action.split("mine = ")[1].split("\n")[0]

    # Branch at turn 1: its own code reads `secret`, set only in the shared turn 0 ...
    assert first.turns[2].observation == "Code execution result: 42\n"
    # ... and defines its own `mine`, which is what it prints later (not the parent's).
    assert mine(first) != mine(root)
    assert first.turns[3].observation == f"Code execution result: {mine(first)}\n"
    assert root.turns[3].observation == f"Code execution result: {mine(root)}\n"
    # Branch at turn 2: shares turn 1 too, so it prints the parent's `mine` from its own, different action.
    assert second.turns[2].action != root.turns[2].action
    assert second.turns[3].observation == f"Code execution result: {mine(root)}\n"
    assert all(t.success for t in trajectories)
    assert all(replays_exactly(t, kwargs, task) for t in trajectories)


def test_guess_number_branch_copies_the_game_and_leaves_the_parent_untouched(tokenizer: Any) -> None:
    """Fork by copy: the sibling keeps the secret and the turn count; the parent's episode is unchanged."""
    task = Task(id="gn", prompt="Guess the number.", answer="37", metadata={"low": 1, "high": 100, "secret": 37})

    def script(turn: int, call: int) -> str:
        number = 50 if turn == 0 else 1 + call % 99  # distinct guesses after the first turn
        return f'<tool_call>{{"name": "guess", "arguments": {{"number": {number}}}}}</tool_call>'

    sampler = BranchingSampler(counting_policy(tokenizer, script), rollout_config(max_context_tokens=None),
                               BranchingConfig(budget=4, initial_rollouts=1, branch_probability=1.0, entropy_weight=0.0))
    trajectories = sampler.run(group_specs("agentgym/GuessNumber-v0", [task], 4))
    pairs = check_tree(trajectories, 4)
    assert pairs and sampler.stats["fork_copies"] == len(pairs) and sampler.stats["fork_replays"] == 0
    for t in trajectories:
        # Parents are untouched by their copies, and copies start in the parent's state (secret, turn count).
        assert replays_exactly(t, task=task)
        assert t.success or t.end_reason == "max_turns"
    for parent, child in pairs:
        b = child.metadata["tree"]["branch_turn"]
        assert b >= 1 and (b == len(parent.turns) or child.turns[b].action != parent.turns[b].action)
    # A copied prefix's calls are run once, by the parent: the tree runs fewer calls than its trajectories hold.
    calls = sum(len(turn.info.get("calls", ())) for t in trajectories for turn in t.turns)
    shared = sum(len(turn.info.get("calls", ())) for _, child in pairs
                 for turn in child.turns[: child.metadata["tree"]["branch_turn"]])
    assert shared > 0 and sampler.stats["tool_calls_per_episode"] == calls / len(trajectories)
    assert sampler.stats["tool_calls_run_per_episode"] == (calls - shared) / len(trajectories)


def test_search_branch_replays_the_session_and_scores_each_sibling(tokenizer: Any) -> None:
    pytest.importorskip("bm25s")
    from agentgym.errors import DependencyNotInstalled

    try:
        from agentgym.envs.search.sources import source_versions

        source_versions()
    except (ImportError, DependencyNotInstalled):
        pytest.skip("needs agentgym[search]")
    task = Task("peru", "What currency is used in the country whose capital is Lima?", "Sol",
                {"aliases": ["Sol", "PEN", "Peruvian Sol"],
                 "path": [{"query": "currency of Peru", "gold": ["country-peru"], "finds": "Sol"}]})

    def script(turn: int, call: int) -> str:
        if turn == 0:
            return '<tool_call>{"name": "search", "arguments": {"query": "Lima capital country currency"}}</tool_call>'
        answer = "Sol" if (call // 2) % 2 == 0 else "Euro"  # calls 2, 3: Euro; their branches (4, 5): Sol
        return f'<tool_call>{{"name": "answer", "arguments": {{"text": "{answer}"}}}}</tool_call>'

    sampler = BranchingSampler(counting_policy(tokenizer, script), rollout_config(max_context_tokens=None),
                               BranchingConfig(budget=4, initial_rollouts=2, branch_probability=1.0, entropy_weight=0.0))
    trajectories = sampler.run(group_specs("agentgym/Search-v1", [task], 4))
    pairs = check_tree(trajectories, 4)
    assert len(pairs) == 2 and sampler.stats["fork_replays"] == 2
    for parent, child in pairs:
        assert child.metadata["tree"]["branch_turn"] == 1
        assert child.turns[0].observation == parent.turns[0].observation
        assert child.turns[1].observation == parent.turns[1].observation  # the same search results
        assert replays_exactly(child, task=task)
        assert not parent.success and child.success  # the siblings diverged after the shared search
    # A replayed prefix runs its calls again: as many calls run as if every trajectory had been independent.
    assert sampler.stats["tool_calls_run_per_episode"] == sampler.stats["tool_calls_per_episode"]


# ---- failures and bad input -------------------------------------------------------------------------------
def test_a_replay_that_diverges_abandons_the_branch_and_restarts_fill_the_budget(tokenizer: Any) -> None:
    policy = counting_policy(tokenizer, lambda turn, call: '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>')
    sampler = BranchingSampler(policy, rollout_config(),
                               BranchingConfig(budget=3, initial_rollouts=1, branch_probability=1.0, entropy_weight=0.0))
    trajectories = sampler.run(group_specs("agentgym-test/Unseeded-v0", [Task("u", "Say something.")], 3))
    assert len(trajectories) == 3 and sampler.stats["replay_mismatches"] >= 1
    assert [t.metadata["tree"]["origin"] for t in trajectories] == ["initial", "restart", "restart"]
    assert all(t.error is None for t in trajectories)


def test_a_crash_in_a_branch_ends_only_that_branch(tokenizer: Any) -> None:
    def script(turn: int, call: int) -> str:
        if turn == 0:
            return '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
        return "crash" if call == 2 else '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'

    sampler = BranchingSampler(counting_policy(tokenizer, script), rollout_config(),
                               BranchingConfig(budget=2, initial_rollouts=1, branch_probability=1.0, entropy_weight=0.0))
    trajectories = sampler.run(group_specs("agentgym-test/Flaky-v0", [Task("f", "Echo.")], 2))
    assert [t.end_reason for t in trajectories] == ["answered", "error"]
    assert "simulated env bug" in trajectories[1].error and trajectories[1].metadata["tree"]["origin"] == "branch"


def test_bad_configs_and_inputs_fail_with_a_fix(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="initial_rollouts"):
        BranchingConfig(budget=4, initial_rollouts=8)
    with pytest.raises(ConfigError, match="entropy_timing"):
        BranchingConfig(entropy_timing="late")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="branch_after"):
        BranchingConfig(branch_after=("tool",))
    with pytest.raises(ConfigError, match="beam_size"):
        BranchingConfig(beam_size=0)
    with pytest.raises(ConfigError, match="vocab_size"):
        BranchingSampler(ScriptedPolicy(["x"]), rollout_config(), BranchingConfig())
    sampler = BranchingSampler(ScriptedPolicy(["x"], tokenizer=tokenizer), rollout_config(), BranchingConfig(budget=2, initial_rollouts=1))
    with pytest.raises(ConfigError, match="exactly budget=2"):
        sampler.run(group_specs("agentgym-test/Echo-v0", [Task("e", "x")], 3))
    # A text policy with entropy-guided branching: a clear error, not a silent coin flip.
    sampler = BranchingSampler(counting_policy(tokenizer, lambda t, c: '<tool_call>{"name": "echo", "arguments": {"text": "a"}}</tool_call>'),
                               rollout_config(), BranchingConfig(budget=2, initial_rollouts=1))
    with pytest.raises(ConfigError, match="neither top-k log-probs nor entropies"):
        sampler.run(group_specs("agentgym-test/Echo-v0", [Task("e", "x")], 2))


# ---- the shipped configs drive the trainer on their envs -------------------------------------------------
SMOKE = dict(steps=1, tasks_per_step=1, group_size=4, initial_rollouts=2, max_tokens_per_turn=16, max_context_tokens=512,
             micro_batch_size=8, mini_batches=1, eval_tasks=2, eval_every=0, checkpoint_every=0, tensorboard=False,
             system_prompt="", learning_rate=1e-4)


def test_arpo_code_config_trains_a_step_on_the_code_interpreter(model_dir: Path, tmp_path: Path) -> None:
    import yaml
    from agentgym.trainers.arpo import ArpoConfig, ArpoTrainer

    repo = Path(__file__).resolve().parents[2]
    values = yaml.safe_load((repo / "configs" / "arpo_code.yaml").read_text())
    values.pop("trainer")
    values.update(SMOKE, model=str(model_dir), suite="code-smoke", eval_suite=None, output_dir=str(tmp_path / "run"),
                  attribution="hard", hard_dedupe=True, device="cpu")  # the shipped config is a GPU recipe
    summary = ArpoTrainer(ArpoConfig.from_dict(values)).train()
    assert summary["eval_after"]["episodes"] == 2
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = next(m for m in metrics if "arpo/trajectories" in m)
    assert step["arpo/trajectories"] == 4 and step["train/episodes"] == 4
    assert (tmp_path / "run" / "model" / "config.json").is_file()


@pytest.mark.slow  # test_shipped_configs trains configs/arpo_search.yaml through the CLI in the default run
def test_arpo_search_config_trains_a_step_through_the_cli(model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("bm25s")
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    sets = {**SMOKE, "model": str(model_dir), "suite": "search-smoke", "output_dir": str(tmp_path / "run"),
            "device": "cpu", "dtype": "float32"}  # the shipped config is a GPU recipe
    cmd = [sys.executable, "-m", "agentgym.cli", "train", str(repo / "configs" / "arpo_search.yaml")]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "before ARPO" in result.stdout
    bad = subprocess.run(cmd[:5] + ["--set", "initial_rollouts=99"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert bad.returncode != 0 and "initial_rollouts" in bad.stderr and "group_size" in bad.stderr


def test_a_prompt_the_model_refuses_as_too_long_ends_its_trajectory_as_a_context_limit(tokenizer: Any) -> None:
    from agentgym.errors import ContextLengthExceeded
    from agentgym.policies import Generation, GenerationRequest

    class RefusesLongPrompts(ScriptedPolicy):
        async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
            if any(len(r.messages) > 4 for r in requests):  # a server refuses a batch with one too-long prompt
                raise ContextLengthExceeded("This model's maximum context length is 64 tokens.")
            return await super().act(requests)

    policy = RefusesLongPrompts(lambda messages: "guess(50)", tokenizer=tokenizer, max_batch_size=8)
    specs = [EpisodeSpec("agentgym/GuessNumber-v0", seed=10 * k + g, group_id=f"g{k}") for k in range(2) for g in range(3)]
    sampler = BranchingSampler(policy, rollout_config(max_context_tokens=None),
                               BranchingConfig(budget=3, initial_rollouts=3, branch_probability=0.0, entropy_weight=0.0))
    trajectories = sampler.run(specs)
    assert len(trajectories) == 6
    for trajectory in trajectories:
        assert trajectory.end_reason == "context_limit" and trajectory.error is None, trajectory.error
        assert len(trajectory.turns) == 2  # the third request carried five messages
