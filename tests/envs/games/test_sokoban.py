"""Sokoban: push rules, the solver, the reverse-play generator, the env's tools, state keys and the suite."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest
from agentgym.envs.games import sokoban
from agentgym.envs.games.sokoban import Puzzle, SokobanEnv, solve

from agentgym.errors import TaskError
from agentgym.rollout import run_reference_episode
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

ROOM = ["######",
        "#@$_.#",
        "#____#",
        "######"]


def test_push_rules_and_solver() -> None:
    p = Puzzle.parse(ROOM)
    assert p.push("up") is None  # wall
    moved, pushed = p.push("right")  # type: ignore[misc]
    assert pushed and moved.player == (1, 2) and moved.boxes == ((1, 3),)
    assert solve(p) == ["right", "right"]
    two = Puzzle.parse(["#######", "#@$$_.#", "#.____#", "#######"])
    assert two.push("right") is None  # two boxes in a row do not move
    cornered = Puzzle.parse(["#####", "#$_.#", "#_@_#", "#####"])  # box in a corner, target elsewhere
    assert solve(cornered) is None
    assert solve(Puzzle.parse(["####", "#@*#", "####"])) == []


def _shortest_by_push(puzzle: Puzzle, max_states: int) -> list[str] | None:
    """Breadth-first search written over ``Puzzle.push`` itself: what the solver must return."""
    from collections import deque

    if puzzle.solved():
        return []
    parents: dict = {(puzzle.player, puzzle.boxes): None}
    queue = deque([puzzle])
    while queue:
        current = queue.popleft()
        for name in sokoban.DIRECTIONS:
            result = current.push(name)
            if result is None or (result[0].player, result[0].boxes) in parents:
                continue
            key = (result[0].player, result[0].boxes)
            parents[key] = ((current.player, current.boxes), name)
            if result[0].solved():
                path = []
                while parents[key] is not None:
                    key, move = parents[key]
                    path.append(move)
                return path[::-1]
            if len(parents) > max_states:
                return None
            queue.append(result[0])
    return None


def test_the_solver_is_the_shortest_search_over_push_and_keeps_its_state_limit() -> None:
    rng = random.Random(7)
    for i in range(40):
        width, height, boxes = rng.randrange(5, 9), rng.randrange(5, 8), rng.randrange(1, 4)
        try:
            puzzle, plan = sokoban.generate_puzzle(random.Random(i), width, height, boxes, attempts=20)
        except TaskError:
            continue
        assert plan == _shortest_by_push(puzzle, 200_000)
        for limit in (1, 5, 40):  # a search cut short gives up exactly where the plain search does
            assert solve(puzzle, limit) == _shortest_by_push(puzzle, limit)
    cornered = Puzzle.parse(["#####", "#$_.#", "#_@_#", "#####"])
    assert solve(cornered) is None and _shortest_by_push(cornered, 200_000) is None


@pytest.mark.parametrize("rows", [[], ["##", "###"], ["#@$.?#"], ["#$.#"], ["#@@$.#"], ["#@$$.#"]])
def test_bad_grids_are_refused(rows: list[str]) -> None:
    with pytest.raises(TaskError):
        Puzzle.parse(rows)


def test_generated_puzzles_are_solvable_distinct_and_held_out() -> None:
    train = sokoban.generate_tasks(random.Random(0), 30, boxes=[1, 2])
    assert train == sokoban.generate_tasks(random.Random(0), 30, boxes=[1, 2])
    assert {t.metadata["boxes"] for t in train} == {1, 2}
    for task in train:
        puzzle = Puzzle.parse(task.metadata["rows"])
        plan = solve(puzzle)
        assert plan is not None and len(plan) == task.metadata["optimal_moves"] >= 4
        for move in plan:  # the proof: replaying the shortest solution solves the puzzle
            puzzle = puzzle.push(move)[0]  # type: ignore[index]
        assert puzzle.solved()
    test = sokoban.generate_tasks(random.Random(0), 30, seeds="test")
    assert all(t.metadata["seed"] >= 2**30 > s.metadata["seed"] for t in test for s in train)
    assert {sokoban.room_half(t.metadata["rows"]) for t in train} == {"train"}
    assert {sokoban.room_half(t.metadata["rows"]) for t in test} == {"test"}
    with pytest.raises(TaskError, match="sides"):
        sokoban.generate_tasks(random.Random(0), 1, width=3)
    with pytest.raises(TaskError, match="boxes"):
        sokoban.generate_tasks(random.Random(0), 1, boxes=0)


def test_env_moves_reward_and_state_key() -> None:
    env = gym.make("agentgym/Sokoban-v0")
    task = Task("s", "Push the box.", None, {"rows": ROOM})
    obs, info = env.reset(seed=0, options={"task": task})
    core = env.unwrapped
    assert "#@$_.#" in obs and info["max_turns"] == 3 * 2 + 10
    start_key = core.state_key()
    obs, reward, term, _, step = env.step('move("up")')
    assert "blocks" in obs and core.state_key() == start_key and reward == 0 and not term
    env.step('move("down")')
    assert core.state_key() != start_key
    env.step('<tool_call>{"name": "move", "arguments": {"direction": "up"}}</tool_call>')
    assert core.state_key() == start_key  # the same position, reached by another path
    obs, reward, term, _, step = env.step("I think I should push the box right")
    assert step["turn"]["kind"] == "void" and not term
    obs, reward, term, _, step = env.step('move("sideways")')
    assert step["turn"]["kind"] == "invalid"
    forked = core.fork()
    obs, reward, term, _, step = env.step('move("right") move("right")')
    assert term and reward == 1.0 and step["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved"}
    assert forked.state_key() == start_key  # the copy did not move
    with pytest.raises(TaskError, match="rows"):
        env.reset(options={"task": Task("x", "p", None, {"width": 6})})
    with pytest.raises(TaskError, match="starts solved"):
        env.reset(options={"task": Task("x", "p", None, {"rows": ["####", "#@*#", "####"]})})
    env.close()


def test_reference_solver_replans_after_a_detour() -> None:
    env = gym.make("agentgym/Sokoban-v0")
    task = sokoban.generate_tasks(random.Random(5), 1, boxes=2)[0]
    env.reset(seed=0, options={"task": task})
    solver = env.unwrapped.reference_solver()
    env.step(solver(""))
    for move in ("left", "up", "right", "down"):  # wander off the plan (maybe pushing a box), then let it finish
        env.step(f'move("{move}")')
    if solve(env.unwrapped._puzzle) is None:
        pytest.skip("the detour made this puzzle unsolvable")
    for _ in range(60):
        _, _, term, trunc, step = env.step(solver(""))
        if term or trunc:
            break
    assert step["outcome"]["success"]


@pytest.mark.parametrize("split", ["train", "test"])
def test_suite_validates_and_test_split_differs(split: str) -> None:
    suite = load_suite("sokoban")
    report = suite.validate(split=split, limit=25)
    assert report.ok and report.checked == 25, str(report)
    assert {t.metadata["width"] for t in suite.train}.isdisjoint({t.metadata["width"] for t in suite.test})
    assert {t.metadata["seed"] for t in suite.split("validation")}.isdisjoint(t.metadata["seed"] for t in suite.train)
    train_rooms = {tuple(t.metadata["rows"]) for t in suite.train}
    for held_out in ("validation", "test"):  # no held-out room is a training room, not even by chance
        assert train_rooms.isdisjoint(tuple(t.metadata["rows"]) for t in suite.split(held_out))
    traj = run_reference_episode(suite.make_env(), suite.test[0], seed=0)
    assert traj.outcome["success"] and len({t.state_key for t in traj.turns}) == len(traj.turns)


@pytest.mark.slow
def test_whole_suite_validates() -> None:
    suite = load_suite("sokoban")
    for split in ("train", "test", "validation"):
        report = suite.validate(split=split)
        assert report.ok, str(report)


def test_gym_sokoban_reward_pays_moves_boxes_and_the_solve_and_cannot_be_farmed() -> None:
    """``reward="gym-sokoban"``: -0.1 a move (bumps included), +1 / -1 for a box onto / off a target, +10 solved;
    the step rewards sum to the return, solved or cut, and no reply is cheaper than a move."""
    two_boxes = Task("two", "Push the 2 boxes.", None, {"rows": ["########",
                                                                  "#______#",
                                                                  "#@$.___#",
                                                                  "#___$._#",
                                                                  "#______#",
                                                                  "########"]})
    env = gym.make("agentgym/Sokoban-v0", reward="gym-sokoban", max_turns=8)
    env.reset(options={"task": two_boxes})
    forked = env.unwrapped.fork()
    paid = []
    # a bump, an unreadable reply, a box onto its target and off again, the walk round it (two moves in one reply
    # pay twice), and the box pushed back on
    for action in ('move("left")', "no idea", 'move("right")', 'move("right")', 'move("up")',
                   'move("right") move("right")', 'move("down")', 'move("left")'):
        _, reward, term, trunc, info = env.step(action)
        paid.append(round(reward, 6))
    assert paid == [-0.1, -0.1, 0.9, -1.1, -0.1, -0.2, -0.1, 0.9]
    assert info["turn"]["rewards"] == pytest.approx({"step": -0.1, "box_on_target": 1.0})
    # on, off and on again earns one box's +1 less the moves: a cut episode keeps exactly what it earned
    assert trunc and not term
    assert info["outcome"] == {"success": False, "score": pytest.approx(sum(paid)), "end_reason": "max_turns"}
    assert forked._earned == 0.0 and forked.state_key() != env.unwrapped.state_key()  # the fork did not move

    one_box = Task("one", "Push the box.", None, {"rows": ROOM})
    solved = gym.make("agentgym/Sokoban-v0", reward="gym-sokoban")
    obs, _ = solved.reset(options={"task": one_box})
    solver, total, done = solved.unwrapped.reference_solver(), 0.0, False
    while not done:
        obs, reward, term, trunc, info = solved.step(solver(obs))
        total, done = total + reward, term or trunc
    assert info["outcome"] == {"success": True, "score": pytest.approx(10 + 1 - 0.2), "end_reason": "solved"}
    assert total == pytest.approx(info["outcome"]["score"])

    plain = gym.make("agentgym/Sokoban-v0")  # the default pays only the solve
    plain.reset(options={"task": one_box})
    assert [plain.step(a)[1] for a in ('move("up")', 'move("right")', 'move("right")')] == [0.0, 0.0, 1.0]
    with pytest.raises(TaskError, match="reward must be one of"):
        gym.make("agentgym/Sokoban-v0", reward="dense")
    for e in (env, solved, plain):
        e.close()
