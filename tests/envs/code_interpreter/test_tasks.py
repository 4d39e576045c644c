"""Task data of the code-interpreter env: reasoning-gym suites, CHAMP, reference code and scoring."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("champ_dataset")

from agentgym.envs.code_interpreter.answers import grade_answer
from agentgym.envs.code_interpreter.tasks import (
    DATASETS,
    champ_tasks,
    codeio_sample_is_safe,
    generate_tasks,
)

from agentgym.errors import TaskError
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

SUITES_DIR = Path(__file__).resolve().parents[3] / "tasks" / "suites"
SMOKE_CONFIGS = {"count_primes": {"max_n": 300}, "prime_factorization": {"max_value": 300}}
WRONG = "#"  # no digit, letter, fraction or JSON: wrong for every task kind


@pytest.fixture(scope="module")
def smoke():
    return load_suite("code-smoke")


@pytest.fixture(scope="module")
def train():
    return load_suite("code-train")


@pytest.fixture(scope="module")
def test_suite():
    return load_suite("code-test")


@pytest.fixture(scope="module")
def champ():
    return load_suite("champ")


def _run_reference(task: Task, cwd: Path) -> str:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    proc = subprocess.run([sys.executable, "-c", task.metadata["reference_code"]], capture_output=True, check=False,
                          text=True, encoding="utf-8", timeout=60, cwd=cwd, env=env)
    assert proc.returncode == 0, f"{task.metadata['task_id']}: reference code failed:\n{proc.stderr[-2000:]}"
    return proc.stdout.strip()


def _check_references(tasks: list[Task], cwd: Path) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        outputs = list(pool.map(lambda t: _run_reference(t, cwd), tasks))
    failures = [(t.metadata["task_id"], out[:120], str(t.answer)[:120])
                for t, out in zip(tasks, outputs) if not grade_answer(t, out)]
    assert not failures, f"reference code output not graded correct: {failures}"


# ---- generation -------------------------------------------------------------------------------
def test_same_seed_gives_identical_tasks() -> None:
    a = generate_tasks(random.Random(7), 27, seed=123_000, configs=SMOKE_CONFIGS)
    b = generate_tasks(random.Random(7), 27, seed=123_000, configs=SMOKE_CONFIGS)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in b]
    c = generate_tasks(random.Random(7), 27, seed=456_000, configs=SMOKE_CONFIGS)
    assert [t.prompt for t in a] != [t.prompt for t in c]


def test_suite_loading_is_deterministic(smoke) -> None:
    again = load_suite(str(SUITES_DIR / "code-smoke.yaml"))  # a path bypasses load_suite's cache
    for split in ("train", "test"):
        assert [t.to_dict() for t in smoke.split(split)] == [t.to_dict() for t in again.split(split)]


def test_mix_is_even_and_every_dataset_is_represented(smoke, train, test_suite) -> None:
    for tasks in (smoke.train, smoke.test, train.train, test_suite.test):
        counts = collections.Counter(t.metadata["dataset"] for t in tasks)
        assert set(counts) == set(DATASETS)
        assert max(counts.values()) - min(counts.values()) <= 1
    assert len(smoke.train) == len(smoke.test) == 16
    assert len(train.train) == 2000 and len(test_suite.test) == 300


def test_train_and_test_are_disjoint(smoke, train, test_suite) -> None:
    train_seeds = {t.metadata["seed"] for t in train.train}
    test_seeds = {t.metadata["seed"] for t in test_suite.test}
    assert train_seeds.isdisjoint(test_seeds)
    train_prompts = {t.prompt for t in train.train}
    assert not [t.id for t in test_suite.test if t.prompt in train_prompts]
    assert not {t.prompt for t in smoke.test} & {t.prompt for t in smoke.train}
    for tasks in (train.train, test_suite.test):  # no repeats inside a split either
        assert len({t.prompt for t in tasks}) == len(tasks)
        assert len({t.metadata["task_id"] for t in tasks}) == len(tasks)


def test_task_metadata(smoke, test_suite) -> None:
    for task in [*smoke, *test_suite.test]:
        meta = task.metadata
        assert meta["source"] == "reasoning_gym" and meta["dataset"] in DATASETS
        assert isinstance(meta["seed"], int) and isinstance(meta["index"], int)
        assert task.prompt == meta["entry"]["question"] and task.answer == meta["entry"]["answer"]
        assert json.loads(json.dumps(meta)) == dict(meta)  # JSON-safe, loss-free
        expected_kind = "literal" if meta["dataset"] == "gsm_symbolic" else "computed"
        assert meta["reference_kind"] == expected_kind, meta["task_id"]
        if meta["dataset"] == "codeio":
            assert meta["codeio_mode"] == "output"


def test_generate_tasks_rejects_bad_arguments() -> None:
    with pytest.raises(TaskError, match="unknown"):
        generate_tasks(random.Random(0), 3, seed=0, datasets=["no_such_dataset"])
    with pytest.raises(TaskError, match="holdout"):
        generate_tasks(random.Random(0), 3, seed=0, holdout="sometimes")


def test_codeio_safety_filter() -> None:
    ok = {"code_sample": "import math\ndef main_solution(x):\n    return math.sqrt(x)\n",
          "input_generator": "from random import Random\n"
                             "def generate_inputs(rng: Random):\n    return {'x': rng.random()}\n"}
    assert codeio_sample_is_safe(ok)
    for bad_code in ("import os\ndef main_solution():\n    return os.getcwd()\n",
                     "def main_solution(p):\n    return open(p).read()\n",
                     "import random as r\ndef main_solution():\n    return r.random()\n",
                     "def main_solution(xs):\n    return list(set(xs))\n",
                     "import numpy as np\ndef main_solution():\n    return float(np.random.rand())\n"):
        assert not codeio_sample_is_safe({**ok, "code_sample": bad_code}), bad_code


# ---- reference code ---------------------------------------------------------------------------
def test_reference_code_of_smoke_tasks_gets_full_score(smoke, tmp_path) -> None:
    _check_references(list(smoke), tmp_path)


def test_reference_code_of_test_sample_gets_full_score(test_suite, tmp_path) -> None:
    _check_references(random.Random(0).sample(list(test_suite.test), 100), tmp_path)
    assert not list(tmp_path.iterdir()), "reference code wrote files"


def test_computed_reference_code_does_not_just_print_the_answer(test_suite) -> None:
    for task in test_suite.test:
        code = task.metadata["reference_code"]
        if task.metadata["reference_kind"] == "computed":
            assert f"print({task.answer!a})" not in code


# ---- scoring ----------------------------------------------------------------------------------
def test_grade_answer_gold_wrong_and_none(smoke) -> None:
    for task in smoke:
        assert grade_answer(task, task.answer), task.metadata["task_id"]
        assert grade_answer(task, f"  {task.answer}\n")
        assert not grade_answer(task, None)
        assert not grade_answer(task, "")
        assert not grade_answer(task, WRONG)


def test_grade_answer_never_raises() -> None:
    broken = Task("x", "q", "1", {"source": "reasoning_gym", "dataset": "basic_arithmetic", "entry": {}})
    assert grade_answer(broken, "1")  # a number kind needs only the gold answer
    broken_fraction = Task("x", "q", "1/2", {"source": "reasoning_gym", "dataset": "fraction_simplification"})
    assert not grade_answer(broken_fraction, "1/2")  # no metadata to check the reduced form against
    assert grade_answer(Task("y", "q", "42", {}), "42")
    assert not grade_answer(Task("z", "q", "42", {"source": "reasoning_gym", "dataset": "nope"}), "42")


# ---- CHAMP ------------------------------------------------------------------------------------
def test_champ_has_all_270_problems(champ) -> None:
    tasks = champ.split("test")
    assert len(tasks) == 270 and set(champ.splits) == {"test"}
    assert len({t.metadata["problem_id"] for t in tasks}) == 270
    for task in tasks:
        meta = task.metadata
        assert isinstance(task.answer, str) and task.answer.strip(), meta["problem_id"]
        assert task.prompt.strip() and meta["source"] == "champ" and meta["reference_kind"] == "literal"
        assert meta["solution"].strip() and task.answer in meta["answer_alternatives"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(meta["reference_code"], {})  # noqa: S102 - our own literal print
        assert out.getvalue().strip() == task.answer


def test_champ_short_answers() -> None:
    from agentgym.envs.code_interpreter.champ import _champ_short_answers as short

    assert short("The limit exists and is equal to @@2/3@@") == ["2/3"]
    assert short("@@C(10, 5)@@, or equivalently @@252@@") == ["252", "C(10, 5)"]
    assert short("100 (i.e., all values)") == ["100"]
    assert short("0 is the only possible value") == ["0"]
    assert short("No integer solutions") == ["No integer solutions"]
    assert short("@@x=2, y=1@@") == ["x=2, y=1"]


def test_champ_sample_and_scoring(champ) -> None:
    a = champ_tasks(random.Random(3), 20)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in champ_tasks(random.Random(3), 20)]
    assert len({t.metadata["problem_id"] for t in a}) == 20
    with pytest.raises(TaskError):
        champ_tasks(random.Random(0), 271)
    by_id = {t.metadata["problem_id"]: t for t in champ.split("test")}
    for pid in ("P_Combinatorics_1", "P_Sequence_29", "P_Combinatorics_2"):
        task = by_id[pid]
        assert grade_answer(task, task.answer)
        assert not grade_answer(task, "123456789")
        assert not grade_answer(task, None)
    assert grade_answer(by_id["P_Combinatorics_2"], "C(10, 5)")  # every accepted form counts


def test_generating_tasks_from_several_threads_leaves_stdout_alone():
    """Envs are built in a rollout's worker threads; generation swaps sys.stdout while reasoning-gym prints, and
    two threads doing it at once used to leave a StringIO in place for good (every later print vanished)."""
    import random
    import sys
    import threading

    from agentgym.envs.code_interpreter.tasks import generate_tasks

    real_stdout, real_stderr = sys.stdout, sys.stderr
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(len(generate_tasks(random.Random(i), 18, seed=1000 * i))))
               for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [18] * 4
    assert sys.stdout is real_stdout and sys.stderr is real_stderr
