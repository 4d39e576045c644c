"""Data parallelism (torch DDP over gloo, 2 CPU processes): the update with 2 ranks equals the single-process update
on the union of their data, a rank whose episodes all errored neither hangs nor changes the result, the number of
optimizer steps is exactly ``ppo_epochs x mini_batches``, and the whole loop runs under ``torchrun``. The same for
ArCHer and filtered BC: two steps on 2 ranks leave the actor, the critic and the target critic as one process
leaves them, also when all of one rank's episodes errored, and an ArCHer run writes its replay buffer once and
resumes under ``torchrun``.

The worker is this file itself: ``torchrun tests/trainers/test_data_parallel.py CASES OUT`` runs each case on every rank and
saves the parameters; pytest runs the same cases in one process on the data every rank held and compares. Every
launch has a timeout, so a deadlock fails the test instead of blocking the suite.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.helpers.torchrun import build_small_model, torchrun  # noqa: E402

SUITE = "games-calc"

#: name -> settings of one update case; ``ranks`` says which data each rank holds ("A", "B": healthy groups,
#: "E": episodes that all errored before producing a token, "S": two healthy rows only).
CASES: dict[str, dict[str, Any]] = {
    # rank 0 has 2 micro-batches and rank 1 has 3: rank 0 makes one zero-weight pass; KL term included
    "union": {"ranks": ["A", "B"], "config": {"micro_batch_size": 2, "reference_model": "initial", "kl_coef": 0.1}},
    "errored": {"ranks": ["A", "E"], "config": {"micro_batch_size": 2, "packing": True}},
    "lora": {"ranks": ["A", "B"], "config": {"micro_batch_size": 3, "lora": {"r": 4, "alpha": 8},
                                             "gradient_checkpointing": True}},
    # 5 rows into 4 mini-batches is 4 steps; rank 1's 2 rows leave it two empty mini-batches, still 4 steps
    "mini_batches": {"ranks": ["A", "S"], "config": {"micro_batch_size": 2, "mini_batches": 4, "ppo_epochs": 2}},
}


# ---- the data and one update (used by both the ranks and the single-process reference) ----------------------
def _trajectories(kind: str) -> list[Any]:
    """Fixed trajectories with token ids; each letter is its own set of groups with distinct scores."""
    from agentgym.trajectory import Trajectory, Turn

    g = torch.Generator().manual_seed(ord(kind))
    out = []
    sizes = {"A": 5, "B": 6, "E": 4, "S": 2}[kind]
    for i in range(sizes):
        turns = ()
        if kind != "E":
            turns = tuple(Turn(observation="o", action="a", info={"kind": "answer", "calls": []},
                               prompt_token_ids=tuple(torch.randint(3, 60, (int(torch.randint(2, 6, (1,), generator=g)),),
                                                                    generator=g).tolist()),
                               action_token_ids=tuple(torch.randint(3, 60, (int(torch.randint(1, 5, (1,), generator=g)),),
                                                                    generator=g).tolist()),
                               action_logprobs=None) for _ in range(1 + i % 2))
        score = float(i % 3) / 2
        out.append(Trajectory(env_id="agentgym/Calculator-v0", task_id=f"{kind}{i // 3}", seed=i, turns=turns,
                              outcome={"success": score >= 1.0, "score": score,
                                       "end_reason": "error" if kind == "E" else "answered"},
                              end_reason="error" if kind == "E" else "answered", group_id=f"{kind}/{i // 3}",
                              error="sandbox died" if kind == "E" else None))
    return out


def _config(model_dir: str, out: str, **overrides: Any) -> Any:
    from agentgym.trainers.config import GrpoConfig

    values: dict[str, Any] = dict(model=model_dir, suite=SUITE, output_dir=out, steps=1, tasks_per_step=4,
                                  group_size=4, eval_tasks=2, eval_every=0, checkpoint_every=0, system_prompt="",
                                  max_tokens_per_turn=8, max_context_tokens=128, tensorboard=False, seed=0)
    values.update(overrides)
    return GrpoConfig(**values)


def run_update(model_dir: str, out: str, data: str, **config: Any) -> dict[str, Any]:
    """One GRPO ``_learn`` on ``data``'s trajectories with ``config`` (in whatever world this process is in)."""
    from agentgym.trainers.grpo import GrpoTrainer

    trainer = GrpoTrainer(_config(model_dir, out, **config))
    torch.manual_seed(0)  # LoRA's initial adapters are drawn: the same on every rank and in the reference
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer._setup(None)
    trainer.optimizer = torch.optim.SGD([p for p in trainer.model.parameters() if p.requires_grad], lr=0.5)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    steps = []
    trainer.optimizer.register_step_post_hook(lambda *_: steps.append(1))
    stats = trainer._learn(0, [t for kind in data for t in _trajectories(kind)])
    params = torch.cat([p.detach().flatten().double() for p in trainer.model.parameters() if p.requires_grad])
    return {"params": params, "optimizer_steps": len(steps), "stats": stats}


def _worker(cases: list[str], model_dir: str, out: str) -> None:
    """Entry point under torchrun: every case on this rank's data, parameters saved per case and rank."""
    rank = int(os.environ["RANK"])
    for case in cases:
        result = run_update(model_dir, os.path.join(out, f"{case}-run"), CASES[case]["ranks"][rank],
                            **CASES[case]["config"])
        torch.save(result, os.path.join(out, f"{case}-rank{rank}.pt"))
    from agentgym.trainers.grpo import GrpoTrainer  # then the whole loop: 2 steps of 2 tasks x 4 episodes

    # weight decay moves the weights even in a step whose groups all score alike (zero advantages)
    trainer = GrpoTrainer(_config(model_dir, os.path.join(out, "loop-run"), steps=2, tasks_per_step=2,
                                  micro_batch_size=3, weight_decay=0.1, learning_rate=1e-3))
    trainer.train()
    torch.save(_flat(trainer.model), os.path.join(out, f"loop-rank{rank}.pt"))


def _flat(model: Any) -> Any:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_model(tmp_path_factory.mktemp("tiny") / "model", SUITE)


@pytest.fixture(scope="module")
def two_ranks(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every update case run once on 2 gloo ranks (one launch for all of them)."""
    out = tmp_path_factory.mktemp("ddp")
    torchrun([str(Path(__file__).resolve()), ",".join(CASES), str(model_dir), str(out)])
    return out


def _ranks(out: Path, case: str) -> list[dict[str, Any]]:
    return [torch.load(out / f"{case}-rank{r}.pt") for r in (0, 1)]


# ---- the tests --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["union", "lora"])
def test_two_ranks_equal_one_process_on_the_union(two_ranks: Path, model_dir: Path, tmp_path: Path, case: str) -> None:
    ranks = _ranks(two_ranks, case)
    single = run_update(str(model_dir), str(tmp_path), "".join(CASES[case]["ranks"]), **CASES[case]["config"])
    assert torch.equal(ranks[0]["params"], ranks[1]["params"]), "ranks must hold identical parameters"
    if case == "union":
        before = run_update(str(model_dir), str(tmp_path / "none"), "E", **CASES[case]["config"])["params"]
        assert not torch.allclose(single["params"], before), "the update must change the parameters"
    assert torch.allclose(ranks[0]["params"], single["params"], atol=1e-6, rtol=0), \
        float((ranks[0]["params"] - single["params"]).abs().max())
    for key in ("train/tokens", "train/loss", "train/clip_frac"):  # metrics are global, not rank 0's share
        assert ranks[0]["stats"][key] == pytest.approx(single["stats"][key], abs=1e-6), key


def test_rank_whose_episodes_all_errored_neither_hangs_nor_changes_the_update(two_ranks: Path, model_dir: Path,
                                                                              tmp_path: Path) -> None:
    ranks = _ranks(two_ranks, "errored")
    assert ranks[1]["stats"]["train/errors"] == 4.0 and ranks[1]["stats"]["train/tokens"] > 0
    single = run_update(str(model_dir), str(tmp_path), "A", **CASES["errored"]["config"])
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    assert torch.allclose(ranks[1]["params"], single["params"], atol=1e-6, rtol=0)


def test_mini_batch_count_is_exact(two_ranks: Path, model_dir: Path, tmp_path: Path) -> None:
    """``mini_batches: 4`` over 5 rows is 4 optimizer steps per epoch (``torch.chunk`` would give 3), on every
    rank, also on one that holds fewer rows than mini-batches."""
    ranks = _ranks(two_ranks, "mini_batches")
    assert [r["optimizer_steps"] for r in ranks] == [8, 8]
    assert torch.equal(ranks[0]["params"], ranks[1]["params"])
    single = run_update(str(model_dir), str(tmp_path), "A", **CASES["mini_batches"]["config"])
    assert single["optimizer_steps"] == 8 and single["stats"]["train/optimizer_steps"] == 8.0


def test_mini_batches_empty_on_every_rank_leave_the_parameters_alone(model_dir: Path, tmp_path: Path) -> None:
    """2 rows into 4 mini-batches: 4 optimizer steps, the two empty ones without gradients (skipped on every rank
    together, as the counts are global), so the parameters equal those of ``mini_batches: 2``."""
    two = run_update(str(model_dir), str(tmp_path / "2"), "S", micro_batch_size=1, mini_batches=2)
    four = run_update(str(model_dir), str(tmp_path / "4"), "S", micro_batch_size=1, mini_batches=4)
    assert (two["optimizer_steps"], four["optimizer_steps"]) == (2, 4)
    assert torch.equal(two["params"], four["params"])


def test_whole_loop_runs_data_parallel_with_gloo(two_ranks: Path, model_dir: Path) -> None:
    """``torchrun`` on the trainer itself: rollouts sharded, ranks end with identical, updated parameters."""
    rank0, rank1 = (torch.load(two_ranks / f"loop-rank{r}.pt") for r in (0, 1))
    assert torch.equal(rank0, rank1), "ranks must hold identical parameters after synchronised updates"
    from transformers import AutoModelForCausalLM

    assert not torch.equal(rank0, _flat(AutoModelForCausalLM.from_pretrained(model_dir)))
    metrics = [json.loads(line) for line in (two_ranks / "loop-run" / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("train/tokens", 0) > 0 and "train/loss" in m for m in metrics)
    assert [m["train/episodes_seen"] for m in metrics if "train/episodes_seen" in m][-1] == 2 * 2 * 4
    # rollout metrics cover both ranks' episodes (2 tasks x 4 per step), not rank 0's half
    assert [m["train/episodes"] for m in metrics if "train/episodes" in m] == [2 * 4, 2 * 4]


# ---- ArCHer and filtered BC ------------------------------------------------------------------------------------
#: name -> trainer, each step's data per rank (letters as in CASES) and config overrides. ``batch_size: 1`` leaves
#: rank 1 without rows in every micro-batch (zero-weight passes); 5 rows split 3 + 2.
REPLAY_CASES: dict[str, dict[str, Any]] = {
    "archer": {"trainer": "archer", "steps": [["A", "B"], ["S", "A"]],
               "config": {"batch_size": 5, "grad_accum_steps": 2, "critic_steps": 2, "actor_steps": 2}},
    "archer_errored": {"trainer": "archer", "steps": [["E", "A"], ["E", "B"]],
                       "config": {"batch_size": 1, "grad_accum_steps": 2, "critic_steps": 2, "actor_steps": 1}},
    "filtered_bc": {"trainer": "filtered_bc", "steps": [["A", "B"], ["S", "A"]],
                    "config": {"batch_size": 5, "grad_accum_steps": 2, "actor_steps": 2, "quantile": 0.5}},
    "filtered_bc_errored": {"trainer": "filtered_bc", "steps": [["A", "E"], ["B", "E"]],
                            "config": {"batch_size": 3, "actor_steps": 2, "quantile": 0.5}},
}


def _replay_config(trainer: str, model_dir: str, out: str, **overrides: Any) -> Any:
    from agentgym.trainers.archer import ArcherConfig
    from agentgym.trainers.filtered_bc import FilteredBCConfig

    values: dict[str, Any] = dict(model=model_dir, suite=SUITE, output_dir=out, steps=2, tasks_per_step=2,
                                  actor_warmup_steps=0, eval_tasks=2, eval_every=0, checkpoint_every=0,
                                  system_prompt="", max_tokens_per_turn=6, max_context_tokens=128, tensorboard=False,
                                  learning_rate=1e-3, seed=0)
    if trainer == "archer":
        values.update(critic_max_tokens=48, critic_learning_rate=1e-3, tau=0.5)
    values.update(overrides)
    return (ArcherConfig if trainer == "archer" else FilteredBCConfig)(**values)


def run_replay_updates(trainer_name: str, model_dir: str, out: str, steps: list[str], **config: Any) -> dict[str, Any]:
    """``_learn`` of ArCHer or filtered BC on each step's trajectories (``steps``: the data letters of each step),
    with the optimizers and initial critic of ``train()``, in whatever world this process is in."""
    from agentgym.trainers.archer import ArcherTrainer
    from agentgym.trainers.filtered_bc import FilteredBCTrainer
    from agentgym.trainers.seeding import mix_seed

    cfg = _replay_config(trainer_name, model_dir, out, **config)
    trainer = (ArcherTrainer if trainer_name == "archer" else FilteredBCTrainer)(cfg)
    trainer.model, trainer.tokenizer = trainer._load(model_dir)
    trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=cfg.learning_rate)
    trainer.scheduler = trainer._schedule(trainer.optimizer)
    trainer.policy = trainer._generation_policy(Path(model_dir))
    torch.manual_seed(mix_seed(cfg.seed, 17))
    trainer._setup(None)
    initial_critic = _flat(trainer.critic).double() if trainer_name == "archer" else None
    stats = [trainer._learn(step, [t for kind in data for t in _trajectories(kind)]) for step, data in enumerate(steps)]
    result = {"actor": _flat(trainer.model).double(), "stats": stats}
    if trainer_name == "archer":
        result.update(critic=_flat(trainer.critic).double(), initial_critic=initial_critic,
                      target=_flat(trainer.target_critic).double(),
                      replay=[t.to_dict() for t in trainer.replay])
    else:
        result["replay"] = [t.to_dict() for t in trainer.pool]
    return result


def _replay_worker(cases: list[str], model_dir: str, out: str) -> None:
    """Under torchrun: every replay case on this rank's data; then two steps of the whole ArCHer loop (a checkpoint
    after each), and the same run resumed from its step-1 checkpoint, as a relaunch after a crash would."""
    import shutil

    from agentgym.trainers.archer import ArcherTrainer

    rank = int(os.environ["RANK"])
    for case in cases:
        spec = REPLAY_CASES[case]
        result = run_replay_updates(spec["trainer"], model_dir, os.path.join(out, f"{case}-run"),
                                    [data[rank] for data in spec["steps"]], **spec["config"])
        torch.save(result, os.path.join(out, f"{case}-rank{rank}.pt"))
    run = Path(out) / "archer-loop"
    config = _replay_config("archer", model_dir, str(run), checkpoint_every=1, batch_size=3, critic_steps=1,
                            actor_steps=1, prior_episodes=3, critic_prior_steps=2)
    trainer = ArcherTrainer(config)
    trainer.train()
    trainer.world.barrier()  # rank 0 has written the final checkpoint
    torch.save({"actor": _flat(trainer.model), "critic": _flat(trainer.critic), "replay": len(trainer.replay)},
               os.path.join(out, f"archer-loop-rank{rank}.pt"))
    if rank == 0:
        shutil.copy(run / "replay.jsonl", Path(out) / "replay-uninterrupted.jsonl")
        (run / "checkpoints" / "latest").write_text("step-000001", encoding="utf-8")
    trainer.world.barrier()
    resumed = ArcherTrainer(config)
    resumed.train()
    torch.save({"actor": _flat(resumed.model), "critic": _flat(resumed.critic), "replay": len(resumed.replay)},
               os.path.join(out, f"archer-resumed-rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_ranks_replay(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every ArCHer / filtered-BC case and the ArCHer loop on 2 gloo ranks (one launch)."""
    out = tmp_path_factory.mktemp("ddp-replay")
    torchrun([str(Path(__file__).resolve()), "replay", ",".join(REPLAY_CASES), str(model_dir), str(out)])
    return out


@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_archer_and_filtered_bc_on_two_ranks_equal_one_process(two_ranks_replay: Path, model_dir: Path,
                                                                tmp_path: Path, case: str) -> None:
    """Two steps on 2 ranks: the same buffer on both ranks and in one process, and the same actor, critic and
    target critic (to float rounding: the ranks sum two shares of each micro-batch's gradient)."""
    spec = REPLAY_CASES[case]
    ranks = [torch.load(two_ranks_replay / f"{case}-rank{r}.pt", weights_only=False) for r in (0, 1)]
    single = run_replay_updates(spec["trainer"], str(model_dir), str(tmp_path), ["".join(d) for d in spec["steps"]],
                                **spec["config"])
    assert ranks[0]["replay"] == ranks[1]["replay"] == single["replay"], "each rank must hold the single-process buffer"
    sizes = {"A": 5, "B": 6, "E": 4, "S": 2}  # episodes per letter (_trajectories); E's all errored
    named = set()
    for step, data in enumerate(spec["steps"]):  # episodes are named by their index in the whole step
        letters = "".join(data)
        named |= {f"{step}:{k}" for k, kind in enumerate(c for c in letters for _ in range(sizes[c])) if kind != "E"}
    assert {t["episode"] for t in single["replay"]} == named
    from transformers import AutoModelForCausalLM

    before = _flat(AutoModelForCausalLM.from_pretrained(model_dir)).double()
    assert not torch.allclose(single["actor"], before), "the updates must change the actor"
    if spec["trainer"] == "archer":
        assert not torch.allclose(single["critic"], single["initial_critic"]), "and the critic"
    for key in ("actor", "critic", "target") if spec["trainer"] == "archer" else ("actor",):
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks must hold identical {key} parameters"
        assert torch.allclose(ranks[0][key], single[key], atol=1e-5, rtol=0), \
            (key, float((ranks[0][key] - single[key]).abs().max()))
    for mine, theirs in zip(ranks[0]["stats"], single["stats"]):  # metrics are global, not rank 0's share
        for key in ("critic/loss", "actor/loss", "replay/size", "pool/turns", "actor/advantage_mean"):
            if key in theirs:
                assert mine[key] == pytest.approx(theirs[key], abs=1e-4), key


def test_a_reading_rank_never_writes_the_replay_file(tmp_path: Path) -> None:
    """``persist=False`` (ranks other than 0): the file is read, but appends and roll-backs stay in memory, and a
    torn record is skipped without repairing the file (the writing rank does that)."""
    from agentgym.trainers.replay import ReplayBuffer, Transition

    turns = [Transition(state=f"s{i}", action="a", reward=0.0, next_state="n", terminated=False, truncated=False,
                        episode=f"0:{i}") for i in range(4)]
    path = tmp_path / "replay.jsonl"
    ReplayBuffer(path).extend(turns[:3])
    with path.open("ab") as fh:
        fh.write(b'{"state": "torn')
    before = path.read_bytes()
    reader = ReplayBuffer(path, persist=False)
    assert reader.total == 3 and [t.state for t in reader] == ["s0", "s1", "s2"]
    reader.extend(turns[3:])
    assert reader.total == 4 and len(reader) == 4
    reader.truncate(2)
    assert reader.total == 2 and [t.state for t in reader] == ["s0", "s1"]
    assert path.read_bytes() == before, "a reading rank must leave the file alone"


@pytest.mark.parametrize("encoder", ["policy", "minilm"])
def test_the_critic_loss_reaches_every_trainable_critic_parameter(model_dir: Path, encoder: str) -> None:
    """DDP's precondition for the critic (without ``find_unused_parameters``): a trainable parameter the loss never
    reaches (BERT's pooler under MiniLM) would stop the next update with a reduction error under torchrun."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym.errors import DependencyNotInstalled
    from agentgym.trainers.critic import UtteranceCritic

    try:
        critic = (UtteranceCritic.from_minilm(max_tokens=16) if encoder == "minilm" else UtteranceCritic.from_policy(
            AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir), max_tokens=16))
    except DependencyNotInstalled as exc:
        pytest.skip(str(exc))
    q, v = critic(["calc(2*3)", "answer"], ["6", "answer(6)"])
    (q.sum() + v.sum()).backward()
    assert [n for n, p in critic.named_parameters() if p.requires_grad and p.grad is None] == []


def test_archer_loop_writes_its_buffer_once_and_resumes_under_torchrun(two_ranks_replay: Path) -> None:
    """The whole ArCHer loop on 2 ranks, starting from 3 prior episodes (2 played on rank 0, 1 on rank 1) and a critic
    fit to them: identical weights, every turn of every rank in the buffer once (only rank 0 writes replay.jsonl),
    and resumed from its step-1 checkpoint (rank 0 rolls the file back, rank 1 reads it) it ends with the buffer
    and the weights of the uninterrupted run."""
    run = two_ranks_replay / "archer-loop"
    straight = [torch.load(two_ranks_replay / f"archer-loop-rank{r}.pt") for r in (0, 1)]
    resumed = [torch.load(two_ranks_replay / f"archer-resumed-rank{r}.pt") for r in (0, 1)]
    for key in ("actor", "critic"):
        assert torch.equal(straight[0][key], straight[1][key]) and torch.equal(resumed[0][key], resumed[1][key])
        assert torch.allclose(resumed[0][key], straight[0][key], atol=1e-6, rtol=0), key
    first = [json.loads(line) for line in (two_ranks_replay / "replay-uninterrupted.jsonl").read_text().splitlines()]
    assert len(first) == straight[0]["replay"] == straight[1]["replay"] > 0
    assert len({(r["episode"], r["turn"]) for r in first}) == len(first), "each turn is written once"
    assert {r["episode"].split(":")[0] for r in first} == {"prior", "0", "1"}
    assert {r["episode"] for r in first if r["episode"].startswith("prior:")} == {"prior:0", "prior:1", "prior:2"}
    assert {int(r["episode"].split(":")[1]) for r in first if r["episode"].startswith("0:")} == {0, 1}, \
        "both ranks' episodes are stored"
    assert [json.loads(line) for line in (run / "replay.jsonl").read_text().splitlines()] == first
    summary = json.loads((run / "summary.json").read_text())
    assert summary["resumed_from"].endswith("step-000001") and summary["episodes"] == 3 + 2 * 2


if __name__ == "__main__":  # a rank under torchrun: [replay] CASES MODEL_DIR OUT
    if sys.argv[1] == "replay":
        _replay_worker(sys.argv[2].split(","), sys.argv[3], sys.argv[4])
    else:
        _worker(sys.argv[1].split(","), sys.argv[2], sys.argv[3])
