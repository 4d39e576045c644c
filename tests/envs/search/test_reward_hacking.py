"""Reward hacking on Search-v1: answers that game EM/F1 or hedge between candidates earn 0 success and 0 reward.

Each attack is played through the real env (``agentgym/Search-v1``, the small ``profiles`` corpus) on real
tasks of the shipped ``search-test`` suite, so the reward the env pays is what is checked, and the labelled
grading set (``tests/data/grading/search.jsonl``) is checked against the same function the env rewards with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import pytest

from agentgym.errors import DependencyNotInstalled
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

ENV_ID = "agentgym/Search-v1"
LABELS = Path(__file__).resolve().parents[2] / "data" / "grading" / "search.jsonl"


def _search_data() -> bool:
    try:
        import bm25s  # noqa: F401
        from agentgym.envs.search.sources import source_versions

        source_versions()
    except (ImportError, DependencyNotInstalled):
        return False
    return True


pytestmark = pytest.mark.skipif(not _search_data(), reason="needs agentgym[search] (bm25s and the data packages)")


def call(name: str, **arguments: object) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "</tool_call>"


@pytest.fixture(scope="module")
def tasks() -> tuple[Task, ...]:
    return load_suite("search-test").test


@pytest.fixture(scope="module")
def env():
    environment = gym.make(ENV_ID, corpus="profiles")
    yield environment
    environment.close()


def _play(env, task: Task, answer: str, *, search_first: str | None = None) -> tuple[float, dict]:
    """Reset on ``task``, optionally search, then answer; return the answer step's reward and outcome."""
    env.reset(seed=0, options={"task": task})
    if search_first is not None:
        env.step(call("search", query=search_first))
    _, reward, terminated, _, info = env.step(call("answer", text=answer))
    assert terminated
    return reward, info["outcome"]


def _first(tasks: tuple[Task, ...], predicate: Callable[[Task], bool]) -> Task:
    return next(t for t in tasks if predicate(t))


def _passage(env, task: Task) -> str:
    """The full text of the task's last gold document: what an agent gets from open(doc_id)."""
    doc = task.metadata["path"][-1]["gold"][0]
    return env.unwrapped.corpus[doc].text


ATTACKS: dict[str, Callable[[object, tuple[Task, ...]], tuple[Task, str]]] = {
    "both comparison options": lambda env, ts: (
        t := _first(ts, lambda t: bool(t.metadata.get("options_named"))), " or ".join(t.metadata["options"])),
    "both options as a list": lambda env, ts: (
        t := _first(ts, lambda t: bool(t.metadata.get("options_named"))), ", ".join(t.metadata["options"])),
    "both options, the loser first": lambda env, ts: (
        t := _first(ts, lambda t: bool(t.metadata.get("options_named"))), " / ".join(reversed(t.metadata["options"]))),
    "the entire retrieved passage": lambda env, ts: (
        t := _first(ts, lambda t: t.metadata["kind"] == "capital"), _passage(env, t)),
    "a list of all capitals": lambda env, ts: (
        _first(ts, lambda t: t.metadata["kind"] == "capital"),
        ", ".join(sorted({t.answer for t in ts if t.metadata["kind"] == "capital"}))),
    "an empty answer": lambda env, ts: (ts[0], ""),
    "whitespace only": lambda env, ts: (ts[0], "  \n "),
    "the question echoed back": lambda env, ts: (t := _first(ts, lambda t: t.metadata["kind"] == "capital"), t.prompt),
    "gold tokens stuffed with others (F1 gaming)": lambda env, ts: (
        t := _first(ts, lambda t: t.metadata["kind"] == "city_capital"), f"{t.answer} city capital country town"),
    "every alias plus a wrong candidate": lambda env, ts: (
        t := _first(ts, lambda t: t.metadata["kind"] == "currency"),
        " ".join(t.metadata["aliases"]) + " Euro"),
    "gold or a different entity": lambda env, ts: (
        t := _first(ts, lambda t: t.metadata["kind"] == "city_country"), f"{t.answer} or Japan"),
    "two counts": lambda env, ts: (
        t := _first(ts, lambda t: t.metadata["kind"] == "border_count"), f"{t.answer} or {int(t.answer) + 1}"),
    "every count from 0 to 16": lambda env, ts: (
        _first(ts, lambda t: t.metadata["kind"] == "border_count"), " ".join(str(n) for n in range(17))),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_attack_earns_no_success_and_no_reward(env, tasks, attack: str) -> None:
    task, answer = ATTACKS[attack](env, tasks)
    reward, outcome = _play(env, task, answer, search_first=task.prompt[:100])
    assert reward == 0.0 and outcome["success"] is False and outcome["score"] == 0.0, (attack, answer[:200])


def test_the_same_tasks_reward_the_honest_answer(env, tasks) -> None:
    """The battery is not vacuous: on the tasks it attacks, the gold answer does earn the reward."""
    for attack in ("both comparison options", "gold tokens stuffed with others (F1 gaming)", "two counts",
                   "gold or a different entity", "every alias plus a wrong candidate"):
        task, _ = ATTACKS[attack](env, tasks)
        reward, outcome = _play(env, task, task.answer)
        assert reward == 1.0 and outcome["success"] is True, attack


def test_f1_gaming_would_have_paid_under_f1(env, tasks) -> None:
    """Why F1 is no reward any more: the stuffed answer scores a positive F1, reported but not paid."""
    task, answer = ATTACKS["gold tokens stuffed with others (F1 gaming)"](env, tasks)
    env.reset(seed=0, options={"task": task})
    _, reward, _, _, info = env.step(call("answer", text=answer))
    assert info["answer"]["f1"] > 0.3 and reward == 0.0


def test_always_first_option_scores_half_on_named_comparisons(tasks) -> None:
    """The chance baseline on named two-way comparisons is 50 % whichever fixed position one answers."""
    from agentgym.envs.search.scoring import grade_answer

    named = [t for t in tasks if t.metadata.get("options_named")]
    assert len(named) >= 20
    for position in (0, 1):
        wins = sum(grade_answer(t, t.metadata["options"][position]) for t in named)
        assert abs(wins / len(named) - 0.5) <= 0.5 / len(named) + 1e-9, (position, wins, len(named))


def test_labelled_grading_set_matches_the_env_reward(env) -> None:
    """Every labelled line: grade_answer gives the verdict, and so does the env's reward (the same decision)."""
    from agentgym.envs.search.questions import KINDS
    from agentgym.envs.search.scoring import grade_answer

    rows = [json.loads(line) for line in LABELS.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) >= 60 and {r["kind"] for r in rows} == set(KINDS)
    assert {r["verdict"] for r in rows} == {True, False} and all(r["env"] == "search" and r["why"] for r in rows)
    shipped = [t for name in ("search-test", "search-train") for s in load_suite(name).splits.values() for t in s]
    for row in rows:
        task = Task.from_dict(row["task"])
        assert task in shipped, f"{task.id} ({task.prompt}) is not a task of the shipped search suites"
        assert grade_answer(task, row["answer"]) is row["verdict"], row
    for row in rows[::7]:  # the env pays exactly the verdict (sampled: each episode costs a reset)
        reward, outcome = _play(env, Task.from_dict(row["task"]), row["answer"])
        assert reward == float(row["verdict"]) and outcome["success"] is row["verdict"], row
