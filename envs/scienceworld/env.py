"""``agentgym/ScienceWorld-v0``: the 30 ScienceWorld task types, played with ``command(text)``.

ScienceWorld (Wang et al., 2022) is an interactive elementary-science simulator written in Scala; the
``scienceworld`` package runs it in a JVM and talks to it over py4j. The reward is the simulator's own score,
divided by 100 and paid on the step that earns it (a failed task scores -100, so -1.0); the episode ends when the
simulator says the task is complete. A truncated episode keeps the score it earned (ScienceWorld's usual metric).

Two scoring protocols (:data:`PROTOCOLS`). ``"agentgym"`` (the default) keeps the simulator's -100 for a failed
task, so a policy that blunders into a wrong ``focus`` is worse off than one that does nothing, and sizes the turn
budget to the task (twice the gold path plus 20, up to 4 commands a turn). ``"upstream"`` reproduces the protocol of
the published ReAct and SwiftSage evaluations (SwiftSage's ``eval_agent_react.py`` / ``eval_agent_fast_slow.py``
run without ``--no_stop``; Lin et al., 2023): a failed task scores 0, one command per step, the episode ends after
100 simulator moves (their ``--env_step_limit``, counted as the package counts it: "look around" and other free
actions cost none) or 200 commands (their loop bound, twice the limit), and the ``"easy"`` simplifications.

Variation splits are the package's own: each task type's variations ``0 .. n_train-1`` are train, the next
``n_dev`` dev and the rest test (:data:`VARIATIONS`, checked against the simulator by the tests). Starting a JVM
takes seconds, so simulators are pooled per process: an env takes an idle one on its first reset and gives it back
on ``close()``; every episode starts with ``load(task, variation)``, which rebuilds the whole world.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import random
import re
import shutil
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from agentgym.env import AgentEnv, ReferenceSolver
from agentgym.envs.games._common import games_parser
from agentgym.errors import AgentGymError, ConfigError, DependencyNotInstalled, EnvCrashed, TaskError
from agentgym.parsers import ToolCallParser
from agentgym.suite import Task
from agentgym.toolset import ToolResult, ToolSet, tool

__all__ = ["PROTOCOLS", "SPLITS", "UPSTREAM", "UPSTREAM_STEP_LIMIT", "VARIATIONS", "JavaNotFound", "ScienceWorldEnv",
           "generate_tasks", "task_for", "variations"]

#: (train, dev, test) variation counts per task type, as scienceworld 1.2 splits them (contiguous, in that order).
VARIATIONS: dict[str, tuple[int, int, int]] = {
    "boil": (14, 7, 9), "change-the-state-of-matter-of": (14, 7, 9), "chemistry-mix": (16, 8, 8),
    "chemistry-mix-paint-secondary-color": (18, 9, 9), "chemistry-mix-paint-tertiary-color": (18, 9, 9),
    "find-animal": (150, 75, 75), "find-living-thing": (150, 75, 75), "find-non-living-thing": (150, 75, 75),
    "find-plant": (150, 75, 75), "freeze": (14, 7, 9), "grow-fruit": (62, 31, 33), "grow-plant": (62, 31, 33),
    "identify-life-stages-1": (6, 3, 5), "identify-life-stages-2": (4, 2, 4),
    "inclined-plane-determine-angle": (84, 42, 42), "inclined-plane-friction-named-surfaces": (692, 346, 348),
    "inclined-plane-friction-unnamed-surfaces": (80, 40, 42), "lifespan-longest-lived": (62, 31, 32),
    "lifespan-longest-lived-then-shortest-lived": (62, 31, 32), "lifespan-shortest-lived": (62, 31, 32),
    "measure-melting-point-known-substance": (218, 109, 109),
    "measure-melting-point-unknown-substance": (150, 75, 75), "melt": (14, 7, 9),
    "mendelian-genetics-known-plant": (60, 30, 30), "mendelian-genetics-unknown-plant": (240, 120, 120),
    "power-component": (10, 5, 5), "power-component-renewable-vs-nonrenewable-energy": (10, 5, 5),
    "test-conductivity": (450, 225, 225), "test-conductivity-of-unknown-substances": (300, 150, 150),
    "use-thermometer": (270, 135, 135),
}
SPLITS = ("train", "dev", "test")
MAX_COMMAND_CHARS = 200
#: Scoring protocols: ours (failure -1, budget sized to the task) and the published baselines' (failure 0, 100 moves).
PROTOCOLS = ("agentgym", "upstream")
#: What ``protocol="upstream"`` fixes: SwiftSage's evaluation scripts' defaults (``--env_step_limit 100``, a loop
#: of at most twice that many model actions, ``--simplification_str easy``) and one action per model call.
UPSTREAM = {"max_turns": 200, "max_calls_per_turn": 1, "simplifications": "easy"}
UPSTREAM_STEP_LIMIT = 100
#: The pooled simulators' own step limit under the default protocol: never reached, our turn budget ends episodes.
_NO_STEP_LIMIT = 1_000_000
_COMMAND_OK = re.compile(r"[ -~]+")


class JavaNotFound(DependencyNotInstalled):
    """ScienceWorld's simulator needs a Java runtime and none is on ``PATH``."""

    def __init__(self) -> None:
        AgentGymError.__init__(
            self, "ScienceWorld's simulator needs a Java runtime (Java 8 or newer) and 'java' is not on PATH. "
            "Install one, e.g. 'sudo apt-get install default-jre-headless' (Debian/Ubuntu; 'make system-deps' does "
            "it).")
        self.package, self.extra = "java", "scienceworld"


#: (task name, variation, simplifications) -> the gold path first drawn for it in this process.
_GOLD_PATHS: dict[tuple[str, int, str], tuple[str, ...]] = {}

def variations(task_name: str, split: str) -> range:
    """The variation indices of ``task_name`` in ``split`` (train, dev or test)."""
    if task_name not in VARIATIONS:
        from agentgym.errors import did_you_mean

        raise TaskError(f"Unknown ScienceWorld task {task_name!r}.{did_you_mean(task_name, VARIATIONS)}")
    if split not in SPLITS:
        raise TaskError(f"ScienceWorld split must be one of {SPLITS}, got {split!r}.")
    n_train, n_dev, n_test = VARIATIONS[task_name]
    start = {"train": 0, "dev": n_train, "test": n_train + n_dev}[split]
    return range(start, start + {"train": n_train, "dev": n_dev, "test": n_test}[split])


def task_for(task_name: str, index: int, split: str) -> Task:
    """The task of the ``index``-th variation of ``task_name`` in ``split``."""
    pool = variations(task_name, split)
    if not 0 <= index < len(pool):
        raise TaskError(f"{task_name} has {len(pool)} {split} variations; index {index} is out of range.")
    variation = pool[index]
    return Task(id=f"sw-{task_name}-{split}-v{variation}", prompt=f"ScienceWorld task: {task_name}.", answer=None,
                metadata={"task_name": task_name, "variation": variation, "split": split})


def generate_tasks(rng: random.Random, count: int, *, split: str = "train",
                   task_names: Sequence[str] | None = None) -> list[Task]:
    """Draw ``count`` distinct (task type, variation) pairs of ``split``, spread evenly over the task types.

    Task types take turns (in a shuffled order), each contributing a random unused variation, so every task type
    is present once ``count`` reaches their number; a type whose variations are used up drops out.
    """
    names = list(task_names or VARIATIONS)
    pools = {n: list(variations(n, split)) for n in names}
    total = sum(len(p) for p in pools.values())
    if count > total:
        raise TaskError(f"{split} has only {total} variations of {len(names)} task types; asked for {count}.")
    for pool in pools.values():
        rng.shuffle(pool)
    order = list(names)
    rng.shuffle(order)
    tasks: list[Task] = []
    while len(tasks) < count:
        for name in order:
            if pools[name] and len(tasks) < count:
                variation = pools[name].pop()
                tasks.append(task_for(name, variation - variations(name, split).start, split))
    return tasks


# ---- a per-process pool of simulators (a JVM each) ----------------------------------------------------
_IDLE: list[Any] = []
_LOCK = threading.Lock()


def _acquire() -> Any:
    with _LOCK:
        if _IDLE:
            return _IDLE.pop()
    try:
        from scienceworld import ScienceWorldEnv as Simulator
    except ImportError as exc:
        raise DependencyNotInstalled("scienceworld", "scienceworld", "agentgym/ScienceWorld-v0") from exc
    if shutil.which("java") is None:
        raise JavaNotFound()
    try:
        return Simulator("", envStepLimit=_NO_STEP_LIMIT)
    except Exception as exc:  # noqa: BLE001 - the JVM did not come up
        raise EnvCrashed(f"ScienceWorld's JVM did not start: {type(exc).__name__}: {exc}") from exc


def _release(simulator: Any) -> None:
    with _LOCK:
        _IDLE.append(simulator)


@atexit.register
def _shutdown() -> None:
    with _LOCK:
        while _IDLE:
            try:
                _IDLE.pop().close()
            except Exception:  # noqa: BLE001 - the JVM may already be gone at exit
                pass


class ScienceWorldEnv(AgentEnv):
    """ScienceWorld's 30 science task types (a Java simulator): `command("open door to kitchen")`.

    ## Description

    ScienceWorld (Wang et al., 2022) is an interactive elementary-science simulator written in Scala: boil, melt,
    grow a plant, test conductivity, Mendelian genetics and more. The `scienceworld` package runs it in a JVM and
    talks to it over py4j, so it needs Java. Variation splits are the package's own (train, dev, test per task
    type). Starting a JVM takes seconds, so simulators are pooled per process: an env takes an idle one on its first
    reset and gives it back on `close()`; every episode loads its task variation afresh. With `valid_actions`, every
    observation also lists the simulator's valid actions (an easier variant).

    ## Tools

    - `command(text)`: type one command, e.g. `look around`, `open door to kitchen`, `go to kitchen`, `focus on
      dove`.

    ## Reward

    The simulator's own score divided by 100, paid on the step that earns it (component `score`); a failed task
    scores -100, so -1.0. A truncated episode keeps the score it earned (ScienceWorld's usual metric). Success means
    a score of 100.

    With `protocol="upstream"` a failed task scores 0 instead (the step that fails pays back what was earned), as
    the published ReAct and SwiftSage evaluation scripts count it (SwiftSage's `eval_agent_react.py` and
    `eval_agent_fast_slow.py` without `--no_stop`): use it to compare with published numbers. The default keeps
    -1.0 because a wrong `focus` ends the task, and a policy that guesses should score below one that stops.

    ## Episode end

    Terminated when the simulator says the task is over (complete or failed; with `protocol="upstream"` also
    after 100 simulator moves, end reason `step_limit`, keeping the score earned); truncated after `max_turns`
    turns.

    ## Arguments

    - `protocol`: `"agentgym"` (default) or `"upstream"`. Upstream means what the published ReAct / SwiftSage
      numbers use: failure scores 0, one command per turn, the episode ends after 100 simulator moves (free actions
      such as `look around` cost none) or 200 turns, simplifications `"easy"`; giving a
      different `max_turns`, `max_calls_per_turn` or `simplifications` with it is an error, since the numbers
      would no longer be comparable.
    - `max_turns`: turns before truncation. `None` (default): twice the gold path plus 20 (upstream: 200).
    - `tasks`: tasks to draw from (see `generate_tasks`).
    - `task_names`: task types of the default pool, drawn from when no tasks are given.
    - `pool_size`: the first `pool_size` train variations of each of `task_names` form the default pool.
    - `valid_actions`: append the simulator's valid actions to every observation (a long list; an easier variant).
    - `simplifications`: ScienceWorld's simplification string (`""`, `"easy"` or a comma list such as
      `"teleportAction,openDoors"`). `None` (default): `""` (upstream: `"easy"`). The default is the full
      simulator: `"easy"` teleports, opens every door and removes the electrical and self-watering actions, which
      hides part of what the task types test.
    - `max_action_chars`: see `AgentEnv`.
    - `max_calls_per_turn`: see `AgentEnv`. `None` (default): 4 (upstream: 1).
    - `render_mode`: `"ansi"` or `None`.

    ## Version history

    - v0: the first version; `protocol="upstream"` added later (the default protocol is unchanged).
    """

    description: ClassVar[str] = "ScienceWorld's 30 task types played with command(text); the simulator's score."
    native_format_hint: ClassVar[str] = (
        'You may also write a command as a plain function call, e.g. command("look around").')

    def __init__(
        self,
        *,
        max_turns: int | None = None,
        tasks: Sequence[Task] | None = None,
        task_names: Sequence[str] = ("find-non-living-thing",),
        pool_size: int = 1,
        valid_actions: bool = False,
        simplifications: str | None = None,
        max_action_chars: int = 20_000,
        max_calls_per_turn: int | None = None,
        render_mode: str | None = None,
        protocol: str = "agentgym",
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ConfigError(f"ScienceWorld protocol must be one of {PROTOCOLS}, got {protocol!r}: 'upstream' scores "
                              "as the published ReAct/SwiftSage evaluations do, 'agentgym' is the default.")
        given = {"max_turns": max_turns, "max_calls_per_turn": max_calls_per_turn, "simplifications": simplifications}
        if protocol == "upstream":
            clash = {k: v for k, v in given.items() if v is not None and v != UPSTREAM[k]}
            if clash:
                raise ConfigError(f"protocol='upstream' fixes {UPSTREAM} so that scores compare with published ones; "
                                  f"it cannot be combined with {clash}. Drop those arguments, or use "
                                  "protocol='agentgym' to choose them freely.")
            max_turns = UPSTREAM["max_turns"]
        self.protocol = protocol
        defaults = UPSTREAM if protocol == "upstream" else {"max_calls_per_turn": 4, "simplifications": ""}
        if max_calls_per_turn is None:
            max_calls_per_turn = int(defaults["max_calls_per_turn"])
        if simplifications is None:
            simplifications = str(defaults["simplifications"])
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}.")
        self._pool = [task_for(name, i, "train") for name in task_names for i in range(pool_size)]
        if not self._pool:
            raise ValueError("task_names must name at least one ScienceWorld task type.")
        self._valid_hint = bool(valid_actions)
        self._simplifications = str(simplifications)
        self._fixed_max_turns = max_turns
        self._sim: Any = None
        self._loaded: tuple[str, int] | None = None
        self._dirty = True  # whether the loaded world has changed since its load
        self._first_obs = ""
        self._info: dict[str, Any] = {}
        self._gold: list[str] = []
        self._sim_score = 0.0
        super().__init__(max_turns=100 if max_turns is None else max_turns, tasks=tasks,
                         max_action_chars=max_action_chars, max_calls_per_turn=max_calls_per_turn,
                         render_mode=render_mode)

    @tool
    def command(self, text: str) -> str | ToolResult:
        """Type one command, e.g. "look around", "open door to kitchen", "go to kitchen", "focus on dove".

        Args:
            text: The command in plain English (ScienceWorld's action templates).
        """
        if self._sim is None or self._loaded is None:
            return ToolResult.error("Error: no task is loaded; call reset() first.")
        if self._finished:
            return ToolResult.error("Error: the task is over; this command was not run.")
        text = " ".join(str(text).split())
        if not text:
            return ToolResult.error('Error: the command is empty. Type a command such as "look around".')
        if len(text) > MAX_COMMAND_CHARS or not _COMMAND_OK.fullmatch(text):
            return ToolResult.error(f"Error: a command is one line of plain ASCII text of at most {MAX_COMMAND_CHARS} "
                                    'characters, such as "open door to kitchen".')
        self._dirty = True
        try:
            observation, _, done, self._info = self._sim.step(text)
        except Exception as exc:  # noqa: BLE001 - the JVM or py4j died: infrastructure, not a model mistake
            self._discard()
            raise EnvCrashed(f"ScienceWorld failed on {text!r}: {type(exc).__name__}: {exc}") from exc
        score = float(self._info["score"])
        if score != self._sim_score:
            self.add_reward("score", (score - self._sim_score) / 100.0)
            self._sim_score = score
        if done:
            success = score >= 100.0
            final, reason = score / 100.0, "solved" if success else "failed"
            if self.protocol == "upstream":
                if score < 0:
                    final = 0.0  # the published scripts count a failed task as 0, not the simulator's -100
                elif not success:
                    reason = "step_limit"  # the package ended it after UPSTREAM_STEP_LIMIT moves
            self.finish(success=success, score=final, reason=reason)
        else:
            observation += self._hint()
        return ToolResult(str(observation), metadata={"score": score})

    def _hint(self) -> str:
        if not self._valid_hint:
            return ""
        return "\n\nValid actions: " + ", ".join(self._info.get("valid") or [])

    def _discard(self) -> None:
        """Forget a simulator that failed (it is not returned to the pool)."""
        sim, self._sim, self._loaded = self._sim, None, None
        try:
            sim.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- AgentEnv hooks ------------------------------------------------------------------------
    def _build_tools(self) -> ToolSet:
        return ToolSet([self.command])

    def _build_parser(self) -> ToolCallParser:
        return games_parser(["command"], {"command": "text"})

    def _sample_task(self, rng: np.random.Generator) -> Task:
        return self._pool[int(rng.integers(len(self._pool)))]

    def _begin_episode(self, task: Task) -> str:
        try:
            name, variation = str(task.metadata["task_name"]), int(task.metadata["variation"])
        except (KeyError, TypeError, ValueError):
            raise TaskError(f"ScienceWorld task {task.id!r} needs metadata task_name and variation (int); make "
                            "tasks with agentgym.envs.scienceworld.env.generate_tasks or task_for.") from None
        if name not in VARIATIONS or not 0 <= variation < sum(VARIATIONS[name]):
            raise TaskError(f"ScienceWorld task {task.id!r}: {name!r} variation {variation} does not exist.")
        if self._sim is None:
            self._sim = _acquire()
        # The package's own move counter ends an upstream episode, as it does in the published scripts.
        self._sim.envStepLimit = UPSTREAM_STEP_LIMIT if self.protocol == "upstream" else _NO_STEP_LIMIT
        # A world that no command has touched since its load is exactly a fresh load: skip the (slow) reload.
        if self._dirty or self._loaded != (name, variation):
            try:
                self._sim.load(name, variation, self._simplifications, generateGoldPath=True)
                self._first_obs, self._info = self._sim.reset()
                # The simulator draws a gold path at random on every load (find-non-living-thing may focus on the
                # cup, the thermometer or the jar of the same world); the first one drawn in this process is kept
                # so the reference solver repeats itself, as every env's solver must for a given task.
                key = (name, variation, self._simplifications)
                self._gold = list(_GOLD_PATHS.setdefault(key, tuple(self._sim.get_gold_action_sequence())))
            except Exception as exc:  # noqa: BLE001
                self._discard()
                raise EnvCrashed(f"ScienceWorld could not load {name} variation {variation}: {exc}") from exc
            self._loaded, self._dirty = (name, variation), False
        self._sim_score = float(self._info.get("score", 0.0))
        if self._fixed_max_turns is None:
            self.max_turns = int(task.metadata.get("max_turns", 2 * len(self._gold) + 20))
        description = self._sim.get_task_description()
        return f"{description}\n\n{self._first_obs}{self._hint()}"

    def _task_instructions(self) -> str:
        return (
            "You are in ScienceWorld, a simulated house with a garden and a workshop. Do the science task you are "
            'given by typing one command per turn with the command tool, e.g. "look around", "open door to '
            'kitchen", "go to kitchen", "pick up thermometer", "focus on dove", "move dove to red box", "wait1". '
            f"Points are given for progress; focusing on the wrong object can fail the task. You have {self.max_turns} "
            "turns."
        )

    def _pay_outcome(self) -> None:
        """A truncated task keeps the points it earned (ScienceWorld's score), not zero."""
        if not self._finished:
            self._score = self._sim_score / 100.0
        super()._pay_outcome()

    def state_key(self) -> str:
        """The room the agent is in (with what it holds and sees) and the score, digested: the same situation
        reached along different paths gives the same key, whatever the last command's text was."""
        look, inventory = str(self._info.get("look", "")), str(self._info.get("inv", ""))
        room = re.match(r"This room is called the ([^.]+)\.", look)
        digest = hashlib.sha1(f"{look}\n{inventory}".encode()).hexdigest()[:16]
        return f"scienceworld {room.group(1) if room else '?'} score {self._sim_score:g} {digest}"

    def reference_solver(self) -> ReferenceSolver:
        """The simulator's gold action sequence for this variation, one command per turn from the start."""
        actions = list(self._gold)

        def solve(observation: str) -> str:
            action = actions.pop(0) if actions else "look around"
            return f"command({json.dumps(action)})"  # the native call: the shortest text a model must clone

        return solve

    def close(self) -> None:
        if self._sim is not None:
            sim, self._sim = self._sim, None
            self._dirty = True
            _release(sim)
        super().close()
