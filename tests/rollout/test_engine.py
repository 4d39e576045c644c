"""The rollout engine: batching across episodes, isolation of failing envs, groups, streaming."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import pytest

from agentgym.errors import ConfigError
from agentgym.policies import Generation, GenerationRequest, Policy, ScriptedPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine, summarize
from agentgym.storage import TrajectoryWriter, read_trajectories
from tests.helpers.envs import EchoEnv

REPO = Path(__file__).resolve().parents[2]

ECHO = '<tool_call>{"name": "echo", "arguments": {"text": "hi"}}</tool_call>'
STOP = '<tool_call>{"name": "stop", "arguments": {}}</tool_call>'


class CountingPolicy(ScriptedPolicy):
    """Scripted replies that also record batch sizes."""

    def __init__(self, replies: Sequence[str], **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(replies, **kwargs)
        self.batch_sizes: list[int] = []

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        self.batch_sizes.append(len(requests))
        return await super().act(requests)


def test_engine_batches_policy_calls_across_episodes() -> None:
    policy = CountingPolicy([ECHO, STOP], delay_s=0.01)
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(40)]
    trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=40)).run(specs)
    assert len(trajectories) == 40 and all(t.success for t in trajectories)
    assert [t.seed for t in trajectories] == list(range(40)), "results keep the order of the specs"
    assert sum(policy.batch_sizes) == 80
    assert len(policy.batch_sizes) < 20, f"expected batched calls, got {policy.batch_sizes}"
    assert all(len(t.turns) == 2 and t.turns[0].info["kind"] == "tool_call" for t in trajectories)


class MadeOnPolicy(ScriptedPolicy):
    """Echo then stop, noting which thread built each episode's env."""

    def __init__(self) -> None:
        super().__init__([ECHO, STOP])
        self.made_on: dict[str, str] = {}

    def begin_episode(self, episode_id: str, env) -> None:  # type: ignore[no-untyped-def]
        self.made_on[episode_id] = getattr(env.unwrapped, "made_on", "?")


def test_cheap_envs_are_built_on_the_event_loop_and_others_on_env_workers() -> None:
    """``cheap_steps`` envs (pure computation) cost no worker-thread round trip to build; any other env is built on
    the engine's env workers, so a slow constructor (a browser, a sandbox) never blocks the event loop."""
    for env_id, cheap in (("agentgym-test/CheapEcho-v0", True), ("agentgym-test/Flaky-v0", False)):
        policy = MadeOnPolicy()
        trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=8)).run(
            [EpisodeSpec(env_id, seed=i) for i in range(8)])
        assert all(t.success for t in trajectories)
        on_loop = {name == threading.main_thread().name for name in policy.made_on.values()}
        assert on_loop == {cheap}, (env_id, policy.made_on)


def test_failing_or_hanging_env_ends_only_its_own_episode(tmp_path: Path) -> None:
    def reply(messages):  # type: ignore[no-untyped-def]
        task = messages[1]["content"]
        n = int(task.split()[1].rstrip("."))
        return {0: "crash", 1: "hang", 2: "die"}.get(n % 5, STOP)

    specs = [EpisodeSpec("agentgym-test/Flaky-v0", seed=i) for i in range(30)]
    config = RolloutConfig(max_in_flight=30, step_timeout_s=1.0)
    start = time.perf_counter()
    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        trajectories = RolloutEngine(ScriptedPolicy(reply), config).run(specs, writer=writer)
    assert time.perf_counter() - start < 4.5, "a hanging env must not hold up the run beyond its timeout"
    assert len(trajectories) == 30
    by_kind: dict[str, list[str]] = {}
    for t in trajectories:
        by_kind.setdefault(t.end_reason, []).append(t.error or "")
        if t.end_reason == "error":
            assert t.error and ("simulated" in t.error or "step_timeout_s" in t.error)
    assert set(by_kind) <= {"error", "answered"}
    assert "answered" in by_kind and "error" in by_kind
    summary = summarize(trajectories)
    assert summary["errors"] == len(by_kind["error"])
    assert len(list(read_trajectories(tmp_path / "t.jsonl"))) == 30


def test_policy_failure_ends_episodes_with_error() -> None:
    class Broken(Policy):
        name = "broken"

        async def act(self, requests):  # type: ignore[no-untyped-def]
            raise ConnectionError("server down")

    trajectories = RolloutEngine(Broken()).run([EpisodeSpec("agentgym-test/Echo-v0", seed=0)])
    assert trajectories[0].end_reason == "error" and "server down" in (trajectories[0].error or "")


def test_groups_and_reference_policy_on_task_specs() -> None:
    from agentgym.policies import ReferencePolicy
    from agentgym.suite import Task

    task = Task(id="t0", prompt="Say 1.")
    specs = [EpisodeSpec("agentgym-test/Echo-v0", task=task, seed=s, group_id="g0") for s in range(4)]
    trajectories = RolloutEngine(ReferencePolicy()).run(specs)
    assert {t.group_id for t in trajectories} == {"g0"} and all(t.task_id == "t0" for t in trajectories)
    assert all(t.success for t in trajectories)


def test_rollout_config_validation() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        RolloutConfig(max_in_flight=0)
    with pytest.raises(ConfigError, match="step_timeout_s"):
        RolloutConfig(step_timeout_s=0)


class SleepyEnv(EchoEnv):
    """Echo env whose every step sleeps ``delay_s`` (a slow but healthy tool) or, with ``hang``, never returns."""

    def __init__(self, delay_s: float = 0.0, hang: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(**kwargs)
        self.delay_s = delay_s
        self.hang = hang

    def step(self, action):  # type: ignore[no-untyped-def]
        if self.hang:
            threading.Event().wait()
        time.sleep(self.delay_s)
        return super().step(action)


if "agentgym-test/Sleepy-v0" not in gym.registry:
    gym.register(id="agentgym-test/Sleepy-v0", entry_point=SleepyEnv)


def test_step_timeout_counts_only_execution_not_queueing() -> None:
    # 2 workers, 2 slow (0.8 s per step) and 4 faster (0.3 s) episodes of 2 steps, timeout 1 s: calls wait
    # behind each other for well over 1 s (timing from submission, all 6 came back "error"), but no single
    # call runs for 1 s, so none may error.
    specs = [EpisodeSpec("agentgym-test/Sleepy-v0", seed=i, env_kwargs={"delay_s": 0.8 if i < 2 else 0.3})
             for i in range(6)]
    config = RolloutConfig(max_in_flight=6, env_workers=2, step_timeout_s=1.0)
    engine = RolloutEngine(ScriptedPolicy([ECHO, STOP]), config)
    start = time.perf_counter()
    trajectories = engine.run(specs)
    elapsed = time.perf_counter() - start
    assert [t.end_reason for t in trajectories] == ["answered"] * 6, [t.error for t in trajectories]
    assert elapsed > 2.5, "the steps really ran (5.6 s of sleeping on 2 workers)"
    assert engine.stats["errors"] == 0


class PreparedEnv(EchoEnv):
    """Echo env whose tasks need 1.5 s of building each run (``prepare_tasks``), more than the step timeout; an
    episode whose task was not built first fails at reset."""

    built: list[list[str]] = []

    @classmethod
    def prepare_tasks(cls, tasks):  # type: ignore[no-untyped-def]
        time.sleep(1.5)
        cls.built.append(sorted(t.id for t in tasks))

    def _begin_episode(self, task):  # type: ignore[no-untyped-def]
        if not any(task.id in ids for ids in PreparedEnv.built):
            raise RuntimeError(f"task {task.id} was not built before its episode")
        return super()._begin_episode(task)


if "agentgym-test/Prepared-v0" not in gym.registry:
    gym.register(id="agentgym-test/Prepared-v0", entry_point=PreparedEnv)


@pytest.mark.parametrize("sampler", ["engine", "branching"])
def test_env_classes_build_their_tasks_once_a_run_before_any_episode_and_outside_the_step_timeout(sampler: str) -> None:
    from agentgym.rollout.branching import BranchingConfig, BranchingSampler
    from agentgym.suite import Task

    PreparedEnv.built.clear()
    tasks = [Task(id=f"t{k}", prompt="echo something") for k in range(3)]
    specs = [EpisodeSpec("agentgym-test/Prepared-v0", task=tasks[i % 3], seed=i, group_id=str(i % 3)) for i in range(6)]
    config = RolloutConfig(max_in_flight=6, step_timeout_s=1.0)
    if sampler == "engine":
        trajectories = RolloutEngine(ScriptedPolicy([ECHO, STOP]), config).run(specs)
    else:
        trajectories = BranchingSampler(ScriptedPolicy([ECHO, STOP]), config,
                                        BranchingConfig(budget=2, initial_rollouts=2, entropy_weight=0.0)).run(specs)
    assert [t.end_reason for t in trajectories] == ["answered"] * 6, [t.error for t in trajectories]
    assert PreparedEnv.built == [["t0", "t1", "t2"]]  # each distinct task once, in one call


class UnpreparableEnv(EchoEnv):
    @classmethod
    def prepare_tasks(cls, tasks):  # type: ignore[no-untyped-def]
        raise OSError("disk full")


if "agentgym-test/Unpreparable-v0" not in gym.registry:
    gym.register(id="agentgym-test/Unpreparable-v0", entry_point=UnpreparableEnv)


def test_a_failed_preparation_leaves_the_episodes_to_build_in_reset(caplog: pytest.LogCaptureFixture) -> None:
    from agentgym.suite import Task

    specs = [EpisodeSpec("agentgym-test/Unpreparable-v0", task=Task(id="t", prompt="echo"), seed=i) for i in range(2)]
    trajectories = RolloutEngine(ScriptedPolicy([ECHO, STOP]), RolloutConfig()).run(specs)
    assert [t.end_reason for t in trajectories] == ["answered"] * 2
    assert "preparing 1 task(s) failed (OSError: disk full)" in caplog.text


def test_the_error_warning_names_the_reason_the_env_gave() -> None:
    """An env that ends an episode with an error (a crashed browser) reports why on its last turn, not in
    ``Trajectory.error``; the engine's warning must still say why, not "first: None"."""
    from agentgym.rollout import error_reason
    from agentgym.trajectory import Trajectory, Turn

    def ended(error: str | None, turn_errors: list[str] | None) -> Trajectory:
        last = Turn(observation="page", action="scroll()", info={"errors": turn_errors})
        turns = () if turn_errors is None else (last,)
        return Trajectory(env_id="e", task_id="t", seed=0, turns=turns, outcome={"end_reason": "error"},
                          end_reason="error", error=error)

    assert error_reason(ended("TimeoutError: env call exceeded", ["ignored"])) == "TimeoutError: env call exceeded"
    assert error_reason(ended(None, ["a bad call", "the browser process died"])) == "the browser process died"
    assert "gave no reason" in error_reason(ended(None, [])) and "gave no reason" in error_reason(ended(None, None))


def test_hanging_step_ends_its_episode_and_a_new_worker_takes_over(caplog: pytest.LogCaptureFixture) -> None:
    # One worker only: the hanging step holds it forever, yet the other episodes still finish promptly.
    specs = [EpisodeSpec("agentgym-test/Sleepy-v0", seed=0, env_kwargs={"hang": True})]
    specs += [EpisodeSpec("agentgym-test/Sleepy-v0", seed=i) for i in range(1, 4)]
    engine = RolloutEngine(ScriptedPolicy([STOP]), RolloutConfig(env_workers=1, step_timeout_s=0.5))
    start = time.perf_counter()
    trajectories = engine.run(specs)
    assert time.perf_counter() - start < 10
    assert [t.end_reason for t in trajectories] == ["error", "answered", "answered", "answered"]
    assert "step_timeout_s=0.5" in (trajectories[0].error or "")
    assert engine.stats["errors"] == 1
    assert "1 of 4 episodes ended with end_reason='error'" in caplog.text, "trainers drop these: it must show"


def test_a_step_that_never_returns_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import tests.conftest, tests.rollout.test_engine
        from agentgym.policies import ScriptedPolicy
        from agentgym.rollout import EpisodeSpec, RolloutConfig, RolloutEngine
        specs = [EpisodeSpec("agentgym-test/Sleepy-v0", seed=0, env_kwargs={{"hang": True}})]
        out = RolloutEngine(ScriptedPolicy(["x"]), RolloutConfig(step_timeout_s=0.3)).run(specs)
        print(out[0].end_reason)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "error"


def test_gymnasium_time_limit_is_a_truncation_not_an_error() -> None:
    # gym.make(id, max_episode_steps=2) wraps the env in Gymnasium's TimeLimit, which truncates before the
    # env's own max_turns and adds no outcome: the engine must call that max_turns, with an outcome.
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=0, env_kwargs={"max_turns": 10, "max_episode_steps": 2}),
             EpisodeSpec("agentgym/GuessNumber-v0", seed=0, env_kwargs={"max_episode_steps": 2})]
    trajectories = RolloutEngine(ScriptedPolicy([ECHO])).run(specs)
    for t in trajectories:
        assert t.end_reason == "max_turns" and t.error is None, (t.env_id, t.end_reason, t.error)
        assert t.outcome == {"success": False, "score": 0.0, "end_reason": "max_turns"} and len(t.turns) == 2
    assert summarize(trajectories)["errors"] == 0


def test_reference_episode_under_a_time_limit_is_a_truncation() -> None:
    from agentgym.rollout import run_reference_episode
    from agentgym.registration.suites import load_suite

    task = load_suite("games-maze").split("test")[0]
    env = gym.make("agentgym/Maze-v0", max_episode_steps=1)
    try:
        trajectory = run_reference_episode(env, task, seed=0)
    finally:
        env.close()
    assert trajectory.end_reason in ("max_turns", "solved", "answered")
    if len(trajectory.turns) == 1 and not trajectory.success:
        assert trajectory.end_reason == "max_turns"


def test_a_run_relaxes_the_garbage_collector_and_gives_its_thresholds_back() -> None:
    """The engine raises the youngest generation's threshold only while it runs; overlapping runs in two threads
    restore the interpreter's own thresholds when the last one ends, and ``gc_threshold=None`` changes nothing."""
    import gc

    from agentgym.utils.gc_tuning import relaxed_gc

    before = gc.get_threshold()
    seen: list[tuple[int, ...]] = []

    class Peeking(ScriptedPolicy):
        async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
            seen.append(gc.get_threshold())
            return await super().act(requests)

    RolloutEngine(Peeking([STOP]), RolloutConfig(gc_threshold=50_000)).run([EpisodeSpec("agentgym-test/Echo-v0", seed=0)])
    assert seen and seen[-1][0] == 50_000 and seen[-1][1:] == before[1:]
    assert gc.get_threshold() == before
    RolloutEngine(Peeking([STOP]), RolloutConfig(gc_threshold=None)).run([EpisodeSpec("agentgym-test/Echo-v0", seed=0)])
    assert seen[-1] == before

    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with relaxed_gc(30_000):
            inside.set()
            release.wait(10)

    other = threading.Thread(target=hold)
    other.start()
    assert inside.wait(10)
    with relaxed_gc(40_000):  # overlaps the other thread's block, which ends first
        release.set()
        other.join(10)
        assert gc.get_threshold()[0] == 30_000  # the first block's setting holds until the last block ends
    assert gc.get_threshold() == before
    with pytest.raises(ConfigError, match="gc_threshold"):
        RolloutConfig(gc_threshold=0)


def test_a_request_shares_the_conversation_and_no_policy_can_rewrite_it() -> None:
    """Requests share the agent's messages instead of copying them every turn; the messages refuse changes, so a
    policy that edits one in place gets an error that says to copy it, and the episode's history stays as sampled."""
    import copy
    import json
    import pickle

    from agentgym.agent import ChatAgent, Message
    from agentgym.policies import SamplingParams

    agent = ChatAgent()
    agent.start("Guess the number.", "Pick one in 1-10.")
    agent.record_action(Generation(text="guess(5)"))
    agent.add_observation("Higher.")
    request = agent.request(SamplingParams())
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.messages[-1] is agent.messages[-1]  # shared, not copied
    for edit in (lambda m: m.__setitem__("content", "Lower."), lambda m: m.update(content="Lower."),
                 lambda m: m.pop("content"), lambda m: m.clear(), lambda m: m.setdefault("name", "x")):
        with pytest.raises(TypeError, match=r"dict\(message\)"):
            edit(request.messages[-1])
    mine = dict(request.messages[-1])
    mine["content"] = "Lower."  # a copy is an ordinary dict
    assert agent.messages[-1]["content"] == "Higher." and json.loads(json.dumps(request.messages))[-1] == {
        "role": "user", "content": "Higher."}
    for clone in (pickle.loads(pickle.dumps(agent.messages)), copy.deepcopy(agent.messages)):
        assert clone == agent.messages and all(type(m) is Message for m in clone)
    fork = agent.fork()
    fork.record_action(Generation(text="guess(8)"))
    assert len(fork.messages) == 5 and len(agent.messages) == 4  # forks go on separately


def test_a_run_never_formats_its_trajectories_on_the_way_out() -> None:
    """``asyncio.run`` on the main thread formats ``repr`` of its finished task, result included (CPython 3.11):
    for a list of trajectories with token ids, milliseconds a run. ``run_coroutine`` returns the result unformatted."""
    import asyncio

    from agentgym.rollout import run_coroutine

    formatted: list[int] = []

    class Loud:
        def __repr__(self) -> str:
            formatted.append(1)
            return "Loud()"

    async def make() -> list[Loud]:
        return [Loud()]

    result = run_coroutine(make())
    assert len(result) == 1 and isinstance(result[0], Loud) and formatted == []
    # What RolloutEngine.run used: the cost this guards against, where the Python has it. asyncio.run formats the
    # task only when it installs its own Ctrl-C handler: on the main thread, over Python's default one (a test
    # worker may have been left another).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        asyncio.run(make())
    finally:
        signal.signal(signal.SIGINT, previous)
    if sys.version_info[:2] == (3, 11):
        assert formatted

    async def fail() -> None:
        raise ValueError("from the episode")

    with pytest.raises(ValueError, match="from the episode"):
        run_coroutine(fail())


def test_ctrl_c_while_the_loop_is_built_leaves_nothing_to_complain_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C that lands inside ``new_event_loop`` (a narrow window, hit by one training run in thousands) used to
    leave a half-built loop whose finalizer printed a traceback, and the episode coroutines unawaited."""
    import asyncio
    import gc
    import warnings

    from agentgym.rollout import run_coroutine

    built = asyncio.events.new_event_loop

    def interrupted_while_building() -> asyncio.AbstractEventLoop:
        signal.raise_signal(signal.SIGINT)  # delivered at once, half-way through building the loop
        return built()

    monkeypatch.setattr(asyncio.events, "new_event_loop", interrupted_while_building)
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    started: list[int] = []

    async def episode() -> int:
        started.append(1)
        return 1

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with warnings.catch_warnings(record=True) as caught, pytest.raises(KeyboardInterrupt):
            warnings.simplefilter("always")
            run_coroutine(episode())
        gc.collect()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert started == [] and unraisable == []
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    monkeypatch.undo()
    assert run_coroutine(episode()) == 1  # and the next run works


def test_interrupts_held_delays_ctrl_c_to_the_end_of_the_region() -> None:
    from agentgym.utils.coroutines import interrupts_held

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    reached = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with interrupts_held():
                signal.raise_signal(signal.SIGINT)
                reached.append("after the signal")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    assert reached == ["after the signal"]


class RefusesLongPrompts(ScriptedPolicy):
    """Echoes, in batches, but refuses (as a server would, for the whole request) any batch holding a
    conversation longer than ``limit`` messages: only episode 0 is scripted to grow that long."""

    def __init__(self, limit: int) -> None:
        super().__init__(lambda messages: ECHO, max_batch_size=8)
        self.limit = limit
        self.refused = 0

    async def act(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        from agentgym.errors import ContextLengthExceeded

        if any(len(r.messages) > self.limit and r.episode_id.endswith("-0") for r in requests):
            self.refused += 1
            raise ContextLengthExceeded("This model's maximum context length is 64 tokens.")
        return await super().act(requests)


def test_a_prompt_too_long_for_the_model_ends_only_its_episode_as_a_context_limit() -> None:
    policy = RefusesLongPrompts(limit=4)
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i, env_kwargs={"max_turns": 4}) for i in range(8)]
    trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=8, deterministic=True)).run(specs)
    first, *others = trajectories
    assert first.end_reason == "context_limit" and first.error is None and len(first.turns) == 2
    assert policy.refused >= 2  # the batch with it, then the request on its own
    for trajectory in others:  # its batch-mates were asked again alone and went on
        assert trajectory.end_reason == "max_turns" and trajectory.error is None and len(trajectory.turns) == 4
    assert summarize(trajectories)["errors"] == 0


def test_a_context_limit_scores_the_episode_as_its_env_scores_a_truncation() -> None:
    """An episode the engine ends at the context limit gets the outcome its env gives any truncation (here, like
    TextWorld, the points earned; before, always 0 while the progress rewards stayed paid), and its turns' rewards
    still sum to that score."""
    policy = RefusesLongPrompts(limit=4)
    specs = [EpisodeSpec("agentgym-test/Progress-v0", seed=i, env_kwargs={"max_turns": 4}) for i in range(4)]
    first, *others = RolloutEngine(policy, RolloutConfig(max_in_flight=4, deterministic=True)).run(specs)
    assert first.end_reason == "context_limit" and len(first.turns) == 2
    assert first.outcome["score"] == pytest.approx(0.5) and first.outcome["end_reason"] == "context_limit"
    assert sum(t.reward for t in first.turns) == pytest.approx(first.outcome["score"])
    for trajectory in others:  # the same rule at the env's own turn limit
        assert trajectory.end_reason == "max_turns" and trajectory.outcome["score"] == pytest.approx(1.0)


def test_truncate_episode_pays_what_the_reward_rule_still_owes_and_ends_the_episode() -> None:
    from agentgym.env import AgentEnv
    from agentgym.errors import AgentGymError
    from tests.helpers.envs import ProgressEnv

    class ScoresTruncationsZero(ProgressEnv):  # the contract's default: a truncation without finish() scores 0
        _pay_outcome = AgentEnv._pay_outcome

    env = ScoresTruncationsZero(max_turns=6)
    with pytest.raises(AgentGymError, match="reset"):
        env.truncate_episode("context_limit")
    env.reset(seed=0)
    paid = sum(env.step(ECHO)[1] for _ in range(2))
    outcome, due = env.truncate_episode("context_limit")
    assert outcome == {"success": False, "score": 0.0, "end_reason": "context_limit"}
    assert paid == pytest.approx(0.5) and due == pytest.approx(-0.5)
    with pytest.raises(AgentGymError, match="over"):
        env.step(ECHO)
    with pytest.raises(AgentGymError, match="over"):
        env.truncate_episode("context_limit")
    env.reset(seed=1)  # and the next episode starts as usual
    assert env.step(STOP)[4]["outcome"]["score"] == 1.0


def test_env_threads_start_only_when_calls_need_them_and_never_beyond_the_limit() -> None:
    from agentgym.rollout import EnvExecutor

    def live() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("lazy-env")]

    executor = EnvExecutor(4, name="lazy-env")
    try:
        assert live() == []  # an all-inline rollout never starts one
        for i in range(5):  # one after another: the idle thread takes each
            assert executor.submit(lambda x=i: x * 2).result(timeout=10) == i * 2
        assert len(live()) == 1
        gate = threading.Event()
        futures = [executor.submit(gate.wait, 10) for _ in range(12)]
        time.sleep(0.2)
        assert len(live()) == 4  # twelve waiting calls, four threads
        gate.set()
        assert all(f.result(timeout=10) for f in futures)
    finally:
        executor.shutdown()
    deadline = time.monotonic() + 5
    while live() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert live() == []


def test_a_stuck_env_call_is_replaced_and_the_other_calls_still_run() -> None:
    from agentgym.rollout import EnvExecutor

    executor = EnvExecutor(1, name="stuck-env")
    release = threading.Event()
    try:
        started = threading.Event()

        def stuck() -> str:
            started.set()
            release.wait(20)
            return "late"

        slow = executor.submit(stuck)
        assert started.wait(10)
        waiting = executor.submit(lambda: "next")  # queued behind the stuck call: the only worker is busy
        (worker,) = [t for t in threading.enumerate() if t.name.startswith("stuck-env")]
        executor.replace_stuck_worker(worker)
        assert waiting.result(timeout=10) == "next"  # the replacement took it
        assert executor.submit(lambda: "more").result(timeout=10) == "more"
    finally:
        release.set()
        executor.shutdown()
    assert slow.result(timeout=10) == "late"


def test_a_call_queued_behind_a_call_that_then_gets_stuck_still_runs() -> None:
    """The worker that finished X took the queued A without going idle; A got stuck. B, submitted after A's
    replacement, must still find a thread (a stale "idle" note from the worker would leave B waiting forever)."""
    from agentgym.rollout import EnvExecutor

    executor = EnvExecutor(1, name="stale-env")
    finish_x, release_a, a_started = threading.Event(), threading.Event(), threading.Event()
    try:
        x = executor.submit(finish_x.wait, 10)
        a = executor.submit(lambda: (a_started.set(), release_a.wait(20)))
        finish_x.set()
        assert x.result(timeout=10) and a_started.wait(10)
        (worker,) = [t for t in threading.enumerate() if t.name.startswith("stale-env")]
        executor.replace_stuck_worker(worker)
        assert executor.submit(lambda: "b").result(timeout=10) == "b"
    finally:
        release_a.set()
        executor.shutdown()
    assert a.result(timeout=10)


def test_a_refused_first_prompt_is_a_warning_once_not_a_quiet_run_of_empty_episodes(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A first prompt the model refuses means a setting (system prompt, max_tokens) does not fit the model: every
    episode would end context_limit with no turns, so the run says so, once."""
    import agentgym.rollout.turns as turns

    monkeypatch.setattr(turns, "_first_prompt_refusal_logged", False)
    policy = RefusesLongPrompts(limit=0)
    specs = [EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(8)]
    with caplog.at_level("WARNING", logger="agentgym.rollout"):
        trajectories = RolloutEngine(policy, RolloutConfig(max_in_flight=8)).run(specs)
    first = trajectories[0]
    assert first.end_reason == "context_limit" and first.turns == () and first.error is None
    warnings = [r for r in caplog.records if "first prompt" in r.getMessage()]
    assert len(warnings) == 1 and "lower sampling.max_tokens" in warnings[0].getMessage()


class CountingCheapEcho(ScriptedPolicy):
    """Echo then stop, noting each episode's env object."""

    def __init__(self) -> None:
        super().__init__([ECHO, STOP])
        self.envs: list[object] = []

    def begin_episode(self, episode_id: str, env) -> None:  # type: ignore[no-untyped-def]
        self.envs.append(env)


def _without_timing(trajectories):  # type: ignore[no-untyped-def]
    return [(t.seed, t.task_id, [(turn.observation, turn.action, turn.reward, turn.info) for turn in t.turns],
             t.outcome) for t in trajectories]


def test_later_runs_reuse_the_idle_cheap_envs_of_earlier_runs_with_the_same_episodes() -> None:
    """Trainers build an engine per step: a step must not rebuild every ``cheap_steps`` env, and an env that served an
    earlier run must give exactly the episodes a fresh one gives."""
    from agentgym.rollout import IDLE_CHEAP_ENVS

    IDLE_CHEAP_ENVS.clear()
    specs = [EpisodeSpec("agentgym-test/CheapEcho-v0", seed=i) for i in range(6)]
    first, second = CountingCheapEcho(), CountingCheapEcho()
    fresh = RolloutEngine(first, RolloutConfig(max_in_flight=6)).run(specs)
    assert len(IDLE_CHEAP_ENVS) == 6
    reused = RolloutEngine(second, RolloutConfig(max_in_flight=6)).run(specs)
    assert {id(e) for e in second.envs} == {id(e) for e in first.envs}, "the second run builds no env"
    assert _without_timing(reused) == _without_timing(fresh)
    assert len(IDLE_CHEAP_ENVS) == 6


def test_envs_that_are_not_cheap_or_failed_are_never_kept_across_runs() -> None:
    from agentgym.rollout import IDLE_CHEAP_ENVS

    IDLE_CHEAP_ENVS.clear()
    RolloutEngine(ScriptedPolicy([ECHO, STOP])).run([EpisodeSpec("agentgym-test/Echo-v0", seed=i) for i in range(3)])
    assert len(IDLE_CHEAP_ENVS) == 0, "envs that may hold browsers or sandboxes close with their run"
    policy = CountingCheapEcho()
    policy.replies = lambda messages: (_ for _ in ()).throw(RuntimeError("policy bug"))  # every episode errors
    trajectories = RolloutEngine(policy).run([EpisodeSpec("agentgym-test/CheapEcho-v0", seed=i) for i in range(3)])
    assert all(t.end_reason == "error" for t in trajectories)
    assert len(IDLE_CHEAP_ENVS) == 0, "an env whose episode failed is discarded, not kept"


def test_an_id_registered_again_never_gets_the_idle_envs_of_its_old_class() -> None:
    from agentgym.rollout import IDLE_CHEAP_ENVS
    from tests.helpers.envs import CheapEchoEnv

    class Renamed(CheapEchoEnv):
        pass

    env_id = "agentgym-test/ReRegistered-v0"
    IDLE_CHEAP_ENVS.clear()
    try:
        gym.register(id=env_id, entry_point="tests.helpers.envs:CheapEchoEnv")
        RolloutEngine(ScriptedPolicy([ECHO, STOP])).run([EpisodeSpec(env_id, seed=0)])
        assert len(IDLE_CHEAP_ENVS) == 1
        del gym.registry[env_id]
        gym.register(id=env_id, entry_point=Renamed)
        policy = CountingCheapEcho()
        RolloutEngine(policy).run([EpisodeSpec(env_id, seed=0)])
        assert [type(e.unwrapped) for e in policy.envs] == [Renamed]
    finally:
        gym.registry.pop(env_id, None)
        IDLE_CHEAP_ENVS.clear()


def test_idle_cheap_envs_are_bounded_in_all_and_the_least_recently_used_close_first() -> None:
    """Runs whose episodes each pass other env kwargs must not pile idle envs up without end."""
    from agentgym.rollout import IdleCheapEnvs

    store, spec = IdleCheapEnvs(limit=4), object()
    a, b, c = [object(), object()], [object(), object()], [object()]
    assert store.keep("a", spec, a) == [] and store.keep("b", spec, b) == []
    assert store.keep("c", spec, c) == [a[0]], "the group used least recently gives way first"
    assert len(store) == 4
    assert store.take("a", spec) is a[1] and store.take("a", spec) is None
    assert store.keep("a", object(), [object()]) == [], "a new registration of an emptied id"
    assert store.take("b", object()) is None, "another registration of the id: its envs are dropped"
    assert len(store) == 2


def test_engines_running_at_once_in_threads_never_share_an_env() -> None:
    """Idle envs are handed out under a lock: two engines in two threads (an async rollout worker beside an
    evaluation) never get the same env for episodes that overlap."""
    from agentgym.rollout import IDLE_CHEAP_ENVS

    IDLE_CHEAP_ENVS.clear()
    lock, in_use, clashes = threading.Lock(), set(), []

    class Tracking(ScriptedPolicy):
        def __init__(self) -> None:
            super().__init__([ECHO, ECHO, STOP], delay_s=0.001)
            self.envs: dict[str, int] = {}

        def begin_episode(self, episode_id: str, env) -> None:  # type: ignore[no-untyped-def]
            with lock:
                if id(env) in in_use:
                    clashes.append(episode_id)
                in_use.add(id(env))
                self.envs[episode_id] = id(env)

        def end_episode(self, episode_id: str) -> None:
            with lock:
                in_use.discard(self.envs.pop(episode_id, None))

    def work() -> None:
        for _ in range(5):
            RolloutEngine(Tracking(), RolloutConfig(max_in_flight=8)).run(
                [EpisodeSpec("agentgym-test/CheapEcho-v0", seed=i) for i in range(16)])

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not clashes and 0 < len(IDLE_CHEAP_ENVS) <= 16


def test_envs_built_with_kwargs_shown_by_address_are_not_kept_beyond_their_run() -> None:
    """A key made from ``<object at 0x...>`` could match a later, different object at the same address: such envs
    serve the rest of their run only. Plain kwargs and tasks (shown by value) are kept."""
    from agentgym.rollout import IDLE_CHEAP_ENVS
    from agentgym.rollout.env_reuse import _shown_by_value
    from agentgym.suite import Task

    assert _shown_by_value({"tasks": (Task(id="t", prompt="p", metadata={"n": [1, 2.5]}),), "max_turns": 3})
    assert not _shown_by_value({"hook": object()}) and not _shown_by_value({"f": print})
    assert not _shown_by_value({"tasks": _TasksByAddress()})
    IDLE_CHEAP_ENVS.clear()
    RolloutEngine(ScriptedPolicy([ECHO, STOP])).run(
        [EpisodeSpec("agentgym-test/CheapEcho-v0", seed=0, env_kwargs={"max_turns": 3})])
    assert len(IDLE_CHEAP_ENVS) == 1
    RolloutEngine(ScriptedPolicy([ECHO, STOP])).run(
        [EpisodeSpec("agentgym-test/CheapEcho-v0", seed=0, env_kwargs={"tasks": _TasksByAddress()})])
    assert len(IDLE_CHEAP_ENVS) == 1


class _TasksByAddress(list):  # type: ignore[type-arg]
    """A task list whose repr is its address, as a user's own container might be."""

    def __repr__(self) -> str:
        return object.__repr__(self)


def test_loops_that_play_tasks_one_by_one_build_them_first(caplog: pytest.LogCaptureFixture) -> None:
    """Suite validation (and the tiny model's tokenizer corpus) play tasks in turn on one env: they too let the class
    build every task first, once, so a reset never waits on its own build; a failed build is logged, not fatal."""
    from agentgym.reference import prepare_env_tasks
    from agentgym.suite import Task, TaskSuite

    PreparedEnv.built.clear()
    tasks = tuple(Task(id=f"v{k}", prompt="echo something") for k in range(3))
    suite = TaskSuite(name="prepared", version=1, env_id="agentgym-test/Prepared-v0", splits={"train": tasks})
    report = suite.validate("train")
    assert report.failures == () and PreparedEnv.built == [["v0", "v1", "v2"]]
    env = gym.make("agentgym-test/Unpreparable-v0")
    try:
        assert prepare_env_tasks(env, tasks[:1], label="unpreparable")  # the wrapped env's class: it ran, and failed
    finally:
        env.close()
    assert "unpreparable: preparing 1 task(s) failed (OSError: disk full)" in caplog.text
    assert not prepare_env_tasks(EchoEnv, tasks)  # a class that builds nothing is not called
