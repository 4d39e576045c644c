"""The text games: tools, error observations, termination, rewards, suites and their generators."""

from __future__ import annotations

import json
import random
from pathlib import Path

import gymnasium as gym
import pytest
from agentgym.envs.games import calculator, guess_number, maze
from agentgym.envs.games.calculator import CalcError, CalculatorEnv, evaluate
from agentgym.envs.games.guess_number import GuessNumberEnv
from agentgym.envs.games.maze import Maze, MazeEnv

import agentgym
from agentgym.errors import TaskError
from agentgym.suite import Task, TaskSuite
from agentgym.registration.suites import list_suites, load_suite

GAME_SUITES = ["games-calc", "games-guess", "games-maze"]

CALC_TASK = Task("t", "What is 27*42?", 1134, {"a": 27, "b": 42, "op": "*"})


# ---- calculator -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [("27*42", 1134), (" (3+4) * 5 ", 35), ("-7//2", -4), ("10-20", -10), ("2*3=", 6), ("+5", 5), ("((1))", 1)],
)
def test_evaluate_valid(expression: str, value: int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("1/2", "use //"),
        ("2**10", "exponents"),
        ("5//0", "division by zero"),
        ("1.5*2", "whole numbers"),
        ("x+1", "unknown name 'x'"),
        ("__import__('os').system('true')", "not supported"),
        ("(lambda: 1)()", "not supported"),
        ("'a'*3", "not a number"),
        ("", "empty"),
        ("1+" * 150 + "1", "limit is 200"),
        ("9" * 31, "at most 30 digits"),
        ("9" * 30 + "*" + "9" * 30 + "*" + "9" * 30, "more than 60 digits"),
        ("2 3", "cannot read"),
        ("1\x002", "cannot read"),
        ("5 % 3", "not supported"),
    ],
)
def test_evaluate_rejects_with_fix(expression: str, fragment: str) -> None:
    with pytest.raises(CalcError) as info:
        evaluate(expression)
    assert fragment in str(info.value)


def test_calculator_reference_flow_and_reward() -> None:
    env = gym.make("agentgym/Calculator-v0")
    obs, info = env.reset(seed=0, options={"task": CALC_TASK})
    assert obs == "What is 27*42?"
    assert info["max_turns"] == 4 and info["task_id"] == "t"
    assert "calc(27*42)" in info["instructions"] and "<tool_call>" in info["instructions"]
    obs, reward, terminated, truncated, info = env.step("I will compute. calc(27*42)")
    assert obs == "27*42 = 1134" and reward == 0.0 and not terminated and info["turn"]["kind"] == "tool_call"
    assert info["turn"]["calls"][0]["arguments"] == {"expression": "27*42"}
    hermes = '<tool_call>{"name": "answer", "arguments": {"value": 1134}}</tool_call>'
    obs, reward, terminated, truncated, info = env.step(hermes)
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["turn"]["kind"] == "answer" and info["turn"]["rewards"] == {"success": 1.0}
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "answered"}
    assert obs.startswith("Correct")


@pytest.mark.parametrize(("answer", "verdict"), [
    ("$1134", True), ("-$1134", False), ("$ 1134", True), ("$1,134", True), ("$1135", False), ("$$1134", False),
    ("1134$", False), ("$", False), ("$27*42", False),
])
def test_calculator_answer_check_reads_a_dollar_sign(answer: str, verdict: bool) -> None:
    """A word problem about money gets "$196": the sign is notation, the integer is what is graded."""
    from agentgym.envs.games.grading import grade_answer

    assert grade_answer(CALC_TASK, answer) is verdict


@pytest.mark.parametrize(("action", "reward"), [
    ('<tool_call>{"name": "answer", "arguments": {"value": "$1134"}}</tool_call>', 1.0),
    ('answer("$1,134")', 1.0), ('answer("1134")', 1.0), ('answer(1134)', 1.0), ('answer("$1135")', 0.0),
])
def test_calculator_answer_tool_takes_a_money_answer_to_the_grader(action: str, reward: float) -> None:
    """The tool's argument admits a string, so "$1134" reaches the grader instead of failing the integer type check."""
    env = gym.make("agentgym/Calculator-v0")
    env.reset(seed=0, options={"task": CALC_TASK})
    _, got, terminated, _, info = env.step(action)
    assert (got, terminated, info["outcome"]["end_reason"]) == (reward, True, "answered")


def test_calculator_wrong_answer_ends_without_reward() -> None:
    env = gym.make("agentgym/Calculator-v0")
    env.reset(seed=0, options={"task": CALC_TASK})
    obs, reward, terminated, _, info = env.step("answer(1133)")
    assert (reward, terminated) == (0.0, True)
    assert info["outcome"]["success"] is False and info["outcome"]["end_reason"] == "answered"
    assert "1134" in obs


def test_calculator_errors_are_observations() -> None:
    env = gym.make("agentgym/Calculator-v0")
    env.reset(seed=0, options={"task": CALC_TASK})
    obs, reward, terminated, truncated, info = env.step("answer([1134])")
    assert info["turn"]["kind"] == "invalid" and "value" in obs and not terminated
    obs, *_, info = env.step("calc(1/0)")
    assert "use //" in obs and info["turn"]["kind"] == "invalid"
    obs, *_, info = env.step("calc(7)")  # an int literal still reaches calc as an expression
    assert obs == "7 = 7" and info["turn"]["kind"] == "tool_call"
    obs, reward, terminated, truncated, info = env.step("no tool here")
    assert info["turn"]["kind"] == "void" and truncated and not terminated
    assert info["outcome"] == {"success": False, "score": 0.0, "end_reason": "max_turns"}


def test_calculator_sampled_tasks_follow_settings() -> None:
    env = CalculatorEnv(min_operand=3, max_operand=5, ops=("+",))
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        a, b = env.task.metadata["a"], env.task.metadata["b"]
        assert 3 <= a <= 5 and 3 <= b <= 5 and obs == f"What is {a}+{b}?"
    with pytest.raises(TaskError, match="subset"):
        CalculatorEnv(ops=("^",))


def test_calculator_task_without_metadata_uses_prompt() -> None:
    env = CalculatorEnv()
    env.reset(options={"task": Task("p", "What is (2+3)*4?")})
    assert env.step("answer(20)")[1] == 1.0


def test_calc_generator_distinct_and_validated() -> None:
    tasks = calculator.generate_tasks(random.Random(1), 64, min_operand=2, max_operand=9)
    assert len({t.prompt for t in tasks}) == 64 == len(tasks)
    assert all(t.answer == t.metadata["a"] * t.metadata["b"] for t in tasks)
    with pytest.raises(TaskError, match="only 64"):
        calculator.generate_tasks(random.Random(1), 65, min_operand=2, max_operand=9)
    with pytest.raises(TaskError, match="min_second"):
        calculator.generate_tasks(random.Random(1), 1, min_operand=0, max_operand=9, ops=["//"])
    split = calculator.generate_tasks(random.Random(2), 10, min_operand=10, max_operand=99, min_second=2, max_second=9)
    assert all(10 <= t.metadata["a"] <= 99 and 2 <= t.metadata["b"] <= 9 for t in split)


# ---- guess the number ---------------------------------------------------------------------------
GUESS_TASK = Task("g", "I am thinking of an integer between 1 and 100 (inclusive). Find it.", 37,
                  {"low": 1, "high": 100, "secret": 37})


def test_guess_feedback_and_solve() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    obs, info = env.reset(seed=0, options={"task": GUESS_TASK})
    assert info["max_turns"] == 9 and "between 1 and 100" in obs
    assert env.step("guess(50)")[0].startswith("lower")
    assert env.step('<tool_call>{"name": "guess", "arguments": {"number": 20}}</tool_call>')[0].startswith("higher")
    obs, reward, terminated, truncated, info = env.step("guess(37)")
    assert obs.startswith("correct!") and (reward, terminated, truncated) == (1.0, True, False)
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}


def test_guess_out_of_range_and_truncation() -> None:
    env = gym.make("agentgym/GuessNumber-v0")
    env.reset(seed=0, options={"task": GUESS_TASK})
    obs, reward, terminated, truncated, info = env.step("guess(101)")
    assert "between 1 and 100" in obs and info["turn"]["kind"] == "invalid" and reward == 0.0
    for _ in range(7):
        env.step("guess(1)")
    *_, terminated, truncated, info = env.step("guess(2)")
    assert truncated and not terminated and info["outcome"]["end_reason"] == "max_turns"


def test_guess_turn_budget_scales_with_range() -> None:
    env = GuessNumberEnv()
    _, info = env.reset(options={"task": Task("w", "wide", 999, {"low": 1, "high": 1000, "secret": 999})})
    assert info["max_turns"] == 12 and "12 turns" in info["instructions"]
    fixed = GuessNumberEnv(max_turns=3)
    assert fixed.reset(options={"task": GUESS_TASK})[1]["max_turns"] == 3
    with pytest.raises(TaskError, match="outside"):
        env.reset(options={"task": Task("bad", "x", None, {"low": 1, "high": 5, "secret": 9})})


# ---- maze ---------------------------------------------------------------------------------------
def test_maze_is_deterministic_and_perfect() -> None:
    a, b = Maze(6, 4, seed=7), Maze(6, 4, seed=7)
    assert a.open == b.open and a.open != Maze(6, 4, seed=8).open
    doors = sum(len(d) for d in a.open.values()) // 2
    assert doors == 6 * 4 - 1  # a spanning tree: every cell reachable, no loops
    assert all(a.shortest_path((0, 0), cell) or cell == (0, 0) for cell in a.open)


def test_maze_moves_walls_and_exit() -> None:
    task = maze.generate_tasks(random.Random(0), 1)[0]
    env = gym.make("agentgym/Maze-v0")
    obs, info = env.reset(seed=0, options={"task": task})
    grid = "\n".join(obs.splitlines()[1:-1])
    assert grid.count("@") == 1 and grid.count("E") == 1 and set(grid) <= set("#.@E\n")
    assert obs.splitlines()[-1].startswith("Open directions:")
    core = env.unwrapped
    start = core._pos
    blocked = next(d for d in ("north", "south", "east", "west") if d not in core._maze.open[start])
    obs, reward, terminated, _, info = env.step(f"move({blocked})")  # bare word: raw passthrough
    assert obs.startswith(f"A wall blocks {blocked}") and core._pos == start and not terminated
    assert info["turn"]["kind"] == "tool_call" and reward == 0.0
    obs, *_, info = env.step('move("up")')
    assert info["turn"]["kind"] == "invalid" and "north" in obs
    path = core._maze.shortest_path(core._pos, core._exit)
    assert core.max_turns == 2 * len(path) + 5
    for direction in path[:-1]:
        call = f'<tool_call>{{"name": "move", "arguments": {{"direction": "{direction}"}}}}</tool_call>'
        assert env.step(call)[1] == 0.0
    obs, reward, terminated, truncated, info = env.step(f'move("{path[-1]}")')
    assert (reward, terminated, truncated) == (1.0, True, False) and "reached the exit" in obs
    assert info["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}


def test_maze_metadata_turn_cap_and_bad_tasks() -> None:
    env = MazeEnv()
    meta = {"width": 3, "height": 3, "seed": 1, "start": [0, 0], "exit": [2, 2], "max_turns": 6}
    assert env.reset(options={"task": Task("m", "maze", None, meta)})[1]["max_turns"] == 6
    with pytest.raises(TaskError, match="not a cell"):
        env.reset(options={"task": Task("m", "maze", None, {**meta, "exit": [5, 5]})})
    with pytest.raises(TaskError, match="width, height, seed"):
        env.reset(options={"task": Task("m", "maze", None, {"width": 3})})


# ---- all games ------------------------------------------------------------------------------------
@pytest.mark.parametrize("env_cls", [CalculatorEnv, GuessNumberEnv, MazeEnv])
def test_sampled_episodes_are_seed_deterministic(env_cls: type) -> None:
    def episode(seed: int) -> tuple[str, dict]:
        env = env_cls()
        obs, _ = env.reset(seed=seed)
        return obs, dict(env.task.metadata)

    first = [episode(s) for s in range(5)]
    assert first == [episode(s) for s in range(5)]
    assert len({repr(meta) for _, meta in first}) > 1
    assert env_cls.description and "\n" not in env_cls.description


# ---- suites -------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", GAME_SUITES)
@pytest.mark.parametrize("split", ["train", "test"])
def test_reference_solver_solves_suite(name: str, split: str) -> None:
    report = load_suite(name).validate(split=split, limit=40)
    assert report.ok, str(report)
    assert report.checked == 40


@pytest.mark.parametrize("name", GAME_SUITES)
def test_suite_is_reproducible(name: str) -> None:
    path = Path(__file__).resolve().parents[3] / "tasks" / "suites" / f"{name}.yaml"
    first, second = TaskSuite.from_yaml(path), TaskSuite.from_yaml(path)
    assert [t.to_dict() for t in first] == [t.to_dict() for t in second]
    assert first.version >= 1 and first.env_id in agentgym.env_ids() and first.description
    assert len(first.train) > 0 and len(first.test) > 0
    assert len({t.prompt + repr(dict(t.metadata)) for t in first.train}) == len(first.train)


def test_test_splits_differ_visibly_from_train() -> None:
    calc = load_suite("games-calc")
    train_questions = {t.prompt for t in calc.train}
    assert not train_questions & {t.prompt for t in calc.test}  # no test question is ever trained on
    guess = load_suite("games-guess")
    assert {t.prompt for t in guess.train}.isdisjoint({t.prompt for t in guess.test})
    mazes = load_suite("games-maze")
    assert {t.metadata["width"] for t in mazes.train}.isdisjoint({t.metadata["width"] for t in mazes.test})


SMALL_SPACE_GENERATOR = """
import random
from agentgym.suite import Task

def draw(rng: random.Random, count: int, space: int = 12) -> list[Task]:
    return [Task(id=f"t{i}", prompt=f"task {rng.randrange(space)}") for i in range(count)]
"""


def _small_space_suite(tmp_path: Path, *, train: int, test: int, space: int, extra: str = "") -> Path:
    """A suite file whose generator draws from ``space`` possible tasks, so its splits repeat each other by chance."""
    (tmp_path / "small_space.py").write_text(SMALL_SPACE_GENERATOR)
    path = tmp_path / f"small-{train}-{test}-{space}.yaml"
    path.write_text(f"name: small\nversion: 1\nenv: agentgym/GuessNumber-v0\n{extra}generator: small_space:draw\n"
                    f"splits:\n  train:\n    count: {train}\n    space: {space}\n"
                    f"  test:\n    count: {test}\n    space: {space}\n")
    return path


def test_a_held_out_split_never_repeats_a_training_task(tmp_path: Path) -> None:
    """Splits are drawn independently, so a small task space repeats training tasks by chance; the loader draws
    those again. Every shipped suite holds its splits apart, except where its file says why it cannot."""
    suite = TaskSuite.from_yaml(_small_space_suite(tmp_path, train=6, test=5, space=12))
    assert len(suite.test) == 5 and not {t.prompt for t in suite.train} & {t.prompt for t in suite.test}
    assert len({t.prompt for t in suite.test}) == 5  # and no task twice within a split
    with pytest.raises(TaskError, match="held_out_may_repeat_train"):  # nothing left to hold out: say the fix
        TaskSuite.from_yaml(_small_space_suite(tmp_path, train=40, test=2, space=3))
    allowed = TaskSuite.from_yaml(_small_space_suite(tmp_path, train=40, test=2, space=3,
                                                     extra="held_out_may_repeat_train: true\n"))
    assert {t.prompt for t in allowed.test} <= {t.prompt for t in allowed.train}

    def content(task: Task) -> str:
        return json.dumps([task.prompt, task.answer, dict(task.metadata)], sort_keys=True, default=str)

    for name in list_suites():
        shipped = load_suite(name)
        if "train" not in shipped.splits or name == "credit-guess":  # 100 secrets, one prompt: see its file
            continue
        seen = {content(t) for t in shipped.train}
        for split, tasks in shipped.splits.items():
            if split != "train":
                assert not seen & {content(t) for t in tasks}, (name, split)


def test_credit_maze_validation_large_holds_no_training_maze_even_from_another_seed() -> None:
    """Many seeds build the same 4x4 maze, so avoiding the training seeds leaves training tasks in a held-out split
    (the 200-task validation split has 18); validation_large compares walls, start and exit, and holds none."""
    suite = load_suite("credit-maze")

    def identity(task: Task) -> tuple:
        m = task.metadata
        return maze.task_identity(m["width"], m["height"], m["seed"], tuple(m["start"]), tuple(m["exit"]))

    train = {identity(t) for t in suite.train}
    held = [identity(t) for t in suite.split("validation_large")]
    assert len(held) >= 400 and not train & set(held) and len(set(held)) == len(held)
    assert sum(identity(t) in train for t in suite.split("validation")) > 0  # what the seed check alone lets through
    # the split's `unlike` stream draws exactly the train split, so it excludes what the agent trains on
    redrawn = maze.generate_tasks(random.Random("credit-maze/1/0/train"), 1000, width=4, height=4, max_path=6)
    assert [t.metadata for t in redrawn] == [t.metadata for t in suite.train]
    with pytest.raises(TaskError, match="unlike must name another split"):
        maze.generate_tasks(random.Random(0), 2, width=4, height=4, unlike={"count": 3})


def test_credit_guess_validation_all_is_every_secret_once() -> None:
    """No 400 distinct guess tasks exist; evaluated on all 100 secrets, greedy success has no task-sampling error."""
    assert sorted(t.metadata["secret"] for t in load_suite("credit-guess").split("validation_all")) == list(range(1, 101))


def test_generators_are_deterministic() -> None:
    for generate, kwargs in [(calculator.generate_tasks, {}), (guess_number.generate_tasks, {}),
                             (maze.generate_tasks, {"width": 4, "height": 3})]:
        one = generate(random.Random("x"), 20, **kwargs)
        two = generate(random.Random("x"), 20, **kwargs)
        assert one == two and len({t.id for t in one}) == 20
    with pytest.raises(TaskError, match="holds only 10"):
        guess_number.generate_tasks(random.Random(0), 11, low=1, high=10)
    with pytest.raises(TaskError, match="sides"):
        maze.generate_tasks(random.Random(0), 1, width=1)


def test_maze_max_path_keeps_every_task_solvable_within_a_tight_turn_limit() -> None:
    tasks = maze.generate_tasks(random.Random(3), 60, width=4, height=4, max_path=6)
    for task in tasks:
        m = task.metadata
        assert len(Maze(4, 4, m["seed"]).shortest_path(tuple(m["start"]), tuple(m["exit"]))) <= 6
    with pytest.raises(TaskError, match="max_path"):
        maze.generate_tasks(random.Random(0), 1, width=4, height=4, max_path=2)
    suite = load_suite("credit-maze")  # the credit-assignment benchmark's suite: the reference solves every task
    env = suite.make_env()
    try:
        from agentgym.rollout import run_reference_episode

        assert all(run_reference_episode(env, t, seed=i).success for i, t in enumerate(suite.split("validation")[:40]))
    finally:
        env.close()
