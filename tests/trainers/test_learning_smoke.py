"""The learning smoke runs of the new benchmark envs (``benchmarks/credit_assignment.py --tasks sokoban`` and
``--tasks babyai``, configs/gigpo_sokoban.yaml and configs/gigpo_babyai.yaml): each shipped config validates as
GiGPO, matches the benchmark's settings, and its held-out split is held out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentgym.registration.suites import load_suite
from agentgym.trainers.config import load_config
from agentgym.trainers.gigpo import GigpoConfig
from tests.helpers.scripts import load_script

#: the trainer's defaults, for settings the benchmark leaves out of a run's config when they keep their default
DEFAULTS = {f.name: f.default for f in dataclasses.fields(GigpoConfig)}

REPO = Path(__file__).resolve().parents[2]
# config -> (task, held-out split, the benchmark command of its learning result: the flags that differ from the
# benchmark's defaults)
RUNS = {
    "gigpo_sokoban.yaml": ("sokoban", "test", ["--tasks", "sokoban", "--methods", "gigpo", "--jobs", "1",
                                               "--eval-every", "8", "--max-bc-steps", "150", "--bc-check-every", "50"]),
    "gigpo_sokoban_512.yaml": ("sokoban", "validation", [
        "--tasks", "sokoban", "--methods", "gigpo", "--seeds", "2", "--jobs", "2", "--demos", "500", "--max-bc-steps",
        "400", "--bc-check-every", "50", "--bc-target", "0.45", "--eval-split", "validation", "--eval-tasks", "400",
        "--constrain-actions", "--tasks-per-step", "64", "--steps", "16", "--eval-every", "4", "--loss-agg",
        "seq-mean-token-mean", "--learning-rate", "2e-4"]),
    "gigpo_babyai.yaml": ("babyai", "test", ["--tasks", "babyai", "--methods", "gigpo", "--jobs", "3", "--eval-every",
                                             "8", "--max-bc-steps", "100", "--bc-target", "0.15"]),
}


def _benchmark():
    return load_script("benchmarks/credit_assignment.py")


@pytest.mark.parametrize("name", sorted(RUNS))
def test_config_validates_as_gigpo(name: str) -> None:
    config = load_config(REPO / "configs" / name)
    assert isinstance(config, GigpoConfig) and config.trainer_name == "gigpo"
    assert (config.eval_split, config.warmstart) == (RUNS[name][1], "bc")
    assert config.system_prompt == "" and config.max_context_tokens > config.max_tokens_per_turn


@pytest.mark.parametrize("name", sorted(RUNS))
def test_config_matches_the_benchmark_run(name: str, tmp_path: Path) -> None:
    """The config reproduces a benchmark run: same split, sizes, learning rate, turn budget and learner settings
    (only the warm start differs in form: the config runs BC itself, the benchmark shares one BC checkpoint across
    seeds)."""
    bench = _benchmark()
    task, _, flags = RUNS[name]
    args = bench.parse_args(flags)
    run = bench.run_config(bench.TASKS[task], "gigpo", 0, tmp_path / "model", tmp_path / "out", args)
    config = load_config(REPO / "configs" / name).to_dict()
    for key in ("suite", "eval_split", "steps", "tasks_per_step", "group_size", "learning_rate", "warmup_steps",
                "eval_every", "eval_tasks", "max_tokens_per_turn", "max_context_tokens", "temperature", "system_prompt",
                "loss_agg", "constrain_actions"):
        assert config[key] == run.get(key, DEFAULTS[key]), key  # the benchmark writes a learner setting only when set
    # the tiny model of the run's suite, built on first use (the benchmark's --build-only builds its own copy, whose
    # tokenizer saw 200 reference episodes where tiny:<suite> uses 500)
    assert config["model"] == f"tiny:{config['suite']}"
    if name == "gigpo_sokoban_512.yaml":  # the warm start of the same size: 500 demonstrations, 400 steps of 32
        assert (config["bc_demos"], config["bc_steps"], config["bc_batch_size"]) == (
            args.demos, args.max_bc_steps, args.bc_batch_size)


@pytest.mark.parametrize("suite_name", ["sokoban", "babyai-goto"])
def test_held_out_tasks_never_occur_in_training(suite_name: str) -> None:
    """The test split (the smoke runs' held-out split) shares no task and no seed with training."""
    suite = load_suite(suite_name)
    test = suite.split("test")
    assert len(test) == 100 and not {t.id for t in suite.train} & {t.id for t in test}
    train_seeds = {t.metadata["seed"] for t in suite.train}
    assert not train_seeds & {t.metadata["seed"] for t in test}
    if suite_name == "babyai-goto":
        report = suite.validate(split="test", limit=6)  # the reference solver solves its held-out rooms
        assert report.ok and report.checked == 6, str(report)
    if suite_name == "sokoban":  # and no room: the same room could come from two seeds
        train_rooms = {tuple(t.metadata["rows"]) for t in suite.train}
        validation = suite.split("validation")  # the training size held out: small rooms recur by chance, so the
        # rooms are split by a hash too (in suite version 1, 7 of these 100 repeated a training room)
        for held_out in (test, validation):
            assert not train_rooms & {tuple(t.metadata["rows"]) for t in held_out}
        assert not train_seeds & {t.metadata["seed"] for t in validation}


def test_device_and_demonstration_flags_are_checked_before_any_work(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``--device`` and ``--demos`` (the GPU smoke runs) fail as usage errors that say the fix; a CUDA run puts the
    device into every trainer config, a CPU run leaves the config (and so the resume fingerprints) as before."""
    bench = _benchmark()
    for flags, message in ((["--device", "tpu"], "--device must be cpu or cuda"),
                           (["--demos", "0"], "--demos must be >= 1"),
                           (["--max-context-tokens", "100"], "--max-context-tokens must be >= 256"),
                           (["--tasks", "sokoban", "--demos", "501"], "has only 500 training tasks"),
                           (["--tasks", "guess", "--demos", "101"], "has only 100 training tasks"),
                           (["--tasks", "sokoban", "--eval-split", "train"], "pick one of those")):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(flags)
        assert exc.value.code == 2 and message in capsys.readouterr().err, flags
    cuda = bench.parse_args(["--tasks", "babyai", "--device", "cuda", "--demos", "2000", "--bc-batch-size", "64"])
    cpu = bench.parse_args(["--tasks", "babyai"])
    task = bench.TASKS["babyai"]
    on_gpu = bench.run_config(task, "gigpo", 0, tmp_path, tmp_path / "out", cuda)
    assert on_gpu["device"] == "cuda" and on_gpu["max_in_flight"] == bench.GPU_IN_FLIGHT
    on_cpu = bench.run_config(task, "gigpo", 0, tmp_path, tmp_path / "out", cpu)
    assert "device" not in on_cpu and "max_in_flight" not in on_cpu  # the trainer's default: CPU fingerprints stay
    longer = bench.parse_args(["--tasks", "babyai", "--max-context-tokens", "2048"])
    assert bench.run_config(task, "gigpo", 0, tmp_path, tmp_path / "out", longer)["max_context_tokens"] == 2048
    assert bench.run_config(task, "gigpo", 0, tmp_path, tmp_path / "out", cpu)["max_context_tokens"] == task.max_context_tokens
    assert bench.run_config(task, "gigpo", 0, tmp_path, tmp_path / "out", cpu)["eval_split"] == "test"
    same_size = bench.parse_args(["--tasks", "sokoban", "--eval-split", "validation"])
    assert bench.run_config(bench.TASKS["sokoban"], "grpo", 0, tmp_path, tmp_path / "out", same_size)["eval_split"] \
        == "validation"


def test_an_interrupted_warm_start_resumes_from_its_last_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm start is saved after every chunk of BC (a GPU lease or a CI job can end mid-way): a run killed during
    its second check leaves the first chunk's checkpoint and record, and the next run continues from there."""
    import agentgym.trainers.bc as bc

    bench = _benchmark()
    cloned: list[int] = []
    monkeypatch.setattr(bc, "behaviour_clone", lambda *args, steps, seed, **kwargs: cloned.append(seed))
    checks = iter([0.1, KeyboardInterrupt, 0.2])

    def check(*args: object, **kwargs: object) -> float:
        value = next(checks)
        if value is KeyboardInterrupt:
            raise KeyboardInterrupt
        return value  # type: ignore[return-value]

    monkeypatch.setattr(bench, "greedy_success", check)
    task = bench.TASKS["guess"]
    with pytest.raises(KeyboardInterrupt):
        bench.warm_start(task, tmp_path, target=0.9, max_bc_steps=20, chunk=10, demos=4, log=lambda *a: None)
    saved = next(tmp_path.glob("warm-guess*"))
    assert (saved / "config.json").is_file() and (saved / "warm_start.json").is_file()
    out, info = bench.warm_start(task, tmp_path, target=0.9, max_bc_steps=20, chunk=10, demos=4, log=lambda *a: None)
    assert cloned == [0, 10, 10] and info["bc_steps"] == 20  # the chunk from step 10 ran again; 0-10 did not
    assert out == saved and [list(point) for point in info["train_success_curve"]] == [[10, 0.1], [20, 0.2]]


def test_the_shuffled_control_and_env_kwargs_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--methods grpo_shuffled`` runs GRPO with ``advantage_control: shuffle`` (the same values, dealt out at
    random among the batch's episodes every step); ``--env-kwargs`` reaches every RL run's config, and only when set."""
    bench = _benchmark()
    args = bench.parse_args(["--tasks", "sokoban", "--methods", "grpo,grpo_shuffled", "--constrain-actions",
                             "--env-kwargs", '{"reward": "gym-sokoban"}'])
    task = bench.TASKS["sokoban"]
    control = bench.run_config(task, "grpo_shuffled", 0, tmp_path, tmp_path / "control", args)
    assert control["trainer"] == "grpo" and control["env_kwargs"] == {"reward": "gym-sokoban"}
    assert control["advantage_control"] == "shuffle"  # the trainers' own control
    assert "advantage_control" not in bench.run_config(task, "grpo", 0, tmp_path, tmp_path / "g", args)
    assert control["micro_batch_size"] == 16 and "actor_steps" not in control  # still configured as a group method
    assert bench.run_config(task, "archer", 0, tmp_path, tmp_path / "a", args)["actor_steps"] == 3
    assert "env_kwargs" not in bench.run_config(task, "grpo", 0, tmp_path, tmp_path / "out", bench.parse_args(["--tasks", "sokoban"]))
    assert "grpo_shuffled" not in bench.parse_args([]).methods  # a control, never run by default
    for flags, message in ((["--env-kwargs", "[1]"], "must be a JSON object"), (["--env-kwargs", "{x"], "JSON object such as"),
                           (["--methods", "grpo_shufled"], "unknown ['grpo_shufled']"),
                           (["--seeds", "0"], "to run seed 0 alone write --seeds 1 or --seeds 0,")):
        with pytest.raises(SystemExit):
            bench.parse_args(flags)
        assert message in capsys.readouterr().err, flags


def test_the_default_warm_start_clones_every_training_task_of_a_suite_with_fewer_than_200(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Guess-the-number has 100 training tasks (every secret once): the default warm start clones all of them into the
    default cache, where asking for 200 demonstrations used to stop the run (and with it the ARPO study)."""
    import agentgym.trainers.bc as bc

    bench = _benchmark()
    cloned: list[int] = []
    monkeypatch.setattr(bc, "behaviour_clone", lambda model, tokenizer, demos, **kwargs: cloned.append(len(demos)))
    monkeypatch.setattr(bench, "greedy_success", lambda *args, **kwargs: 0.5)
    out, info = bench.warm_start(bench.TASKS["guess"], tmp_path, target=0.25, max_bc_steps=25, log=lambda *a: None)
    assert out == tmp_path / "warm-guess" and info["demonstrations"] == 100 and cloned == [100]
    with pytest.raises(ValueError, match="has only 100 training tasks"):
        bench.warm_start(bench.TASKS["guess"], tmp_path, target=0.25, max_bc_steps=25, demos=101, log=lambda *a: None)
