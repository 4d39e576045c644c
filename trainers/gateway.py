"""GRPO where a black-box agent program plays every episode through the recording gateway.

The one online loop (:class:`~agentgym.trainers.loop.OnlineTrainer`) with a different sampler: each step, the
trainer opens ``tasks_per_step x group_size`` env sessions on a :mod:`agentgym.serving.gateway` served in-process in front
of the training model itself, runs the agent program once per session (``agent(base_url)``, where ``base_url`` is
the session's ``http://127.0.0.1:PORT/s/<session>/<token>/v1``), and learns with GRPO from the recorded sessions
(:func:`~agentgym.serving.sessions.sessions_to_trajectories`). The agent program is anything that talks the OpenAI API, e.g.
the ``openai``-only loop in ``examples/gateway_agent.py``; it never sees agentgym. Held-out evaluation runs the
same program on the eval split's tasks with fixed seeds, so "success" is the agent program's success.

Sub-agents. An agent program may spawn sub-agents that call the model under their own gateway sessions, linked
to the episode's session (the ``X-Agentgym-Parent-Session`` header). ``subagents`` says how their turns train:
``merge`` (the default) makes them part of the parent episode: every row of the episode (its segments and its
sub-agents' segments) gets the one advantage of the episode's return, and only the episode counts once in its
group's statistics; ``separate`` makes each sub-agent session an episode of its own, in a group of the sub-agents
of the same task's rollouts.

The recorded log-probs are not needed for the update (GRPO recomputes the old policy's log-probs at
``temperature``), but the sampling temperature must be the config's: a session sampled at another temperature is
refused with a message saying so.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError
import torch

from agentgym.rollout import summarize
from agentgym.suite import Task
from agentgym.trainers.grpo_config import GrpoConfig
from agentgym.trainers.batch import TrainingBatch
from agentgym.trainers.grpo import GrpoTrainer
from agentgym.trainers.seeding import mix_seed
from agentgym.trajectory import Trajectory

__all__ = ["AgentProgram", "GatewayGrpoTrainer", "episode_leaders"]

logger = logging.getLogger(__name__)

#: The agent program: plays one session given its base URL (the session is in the URL); its return is ignored.
AgentProgram = Callable[[str], Any]


def episode_leaders(trajectories: list[Trajectory]) -> torch.Tensor:
    """``[N]`` bool: the first row of each episode (``metadata["episode"]``, else the trajectory itself).

    Why: a merged episode is many rows (its segments, its sub-agents' segments) with one return; counting each row
    in the group's mean and std would weigh an episode by how many rows it split into.
    """
    seen: set[str] = set()
    out = []
    for t in trajectories:
        episode = str(t.metadata.get("episode") or t.traj_id)
        out.append(episode not in seen)
        seen.add(episode)
    return torch.tensor(out, dtype=torch.bool)


class GatewayGrpoTrainer(GrpoTrainer):
    """``GatewayGrpoTrainer(config, agent).train()``: GRPO on sessions an agent program plays through the gateway.

    Args:
        config: A GRPO config (``max_in_flight`` bounds how many sessions run at once).
        agent: The agent program, called as ``agent(base_url)`` once per session, from worker threads.
        subagents: ``merge`` or ``separate``: how the turns of sub-agent sessions train (see the module docstring).
        split_segments: Read a session whose history the agent rewrote as one trajectory per segment instead of one
            trajectory in segments (the rows, advantages and statistics are the same; see
            :func:`~agentgym.serving.sessions.sessions_to_trajectories`).
    """

    supports_distributed = False

    def __init__(self, config: GrpoConfig, agent: AgentProgram, *, subagents: str = "merge",
                 split_segments: bool = False) -> None:
        from agentgym.serving.sessions import SUBAGENT_MODES

        if subagents not in SUBAGENT_MODES:
            raise ConfigError(f"subagents must be 'merge' (a sub-agent's turns are part of its parent's episode) or "
                              f"'separate' (each sub-agent session is an episode of its own), got {subagents!r}.")
        if not callable(agent):
            raise ConfigError(f"agent must be a callable agent(base_url) that plays one session, got {agent!r}.")
        if getattr(config, "constrain_actions", False):
            raise ConfigError("constrain_actions does not apply to gateway training: the agent program writes its "
                              "own requests (and its own action format); set constrain_actions: false.")
        super().__init__(config)
        self.agent = agent
        self.subagents = subagents
        self.split_segments = split_segments
        self.record_dir = Path(config.output_dir) / "sessions"
        self._server: Any = None
        self.session_stats: dict[str, float] = {}

    def _setup(self, resume_from: Path | None) -> None:
        super()._setup(resume_from)
        from agentgym.serving.openai_server import ServerThread

        self._server = ServerThread(self.policy, model_name="policy", max_batch_size=self.config.max_in_flight,
                                    record_dir=self.record_dir)
        self._server.start()
        self.gateway = self._server.app.state.gateway
        self.root_url = self._server.base_url.removesuffix("/v1")

    def train(self) -> dict[str, Any]:
        try:
            return super().train()
        finally:
            if self._server is not None:
                self._server.stop()
                self._server = None

    def _play(self, sessions: list[str]) -> None:
        """Run the agent program once per session, ``max_in_flight`` at a time (their calls batch on the server)."""
        workers = max(1, min(self.config.max_in_flight, len(sessions)))
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="agent") as pool:
            futures = [pool.submit(self.agent, self.gateway.session_base_url(self.root_url, sid))
                       for sid in sessions]
            for future, sid in zip(futures, sessions):
                try:
                    future.result()
                except Exception:  # the program's failure is the episode's: recorded as an open session, skipped
                    logger.exception("The agent program failed in session %s", sid)

    def _run_sessions(self, tag: str, plan: list[tuple[Task, int, str]], suite: Any) -> tuple[list[Trajectory],
                                                                                               dict[str, float]]:
        """Open one session per (task, seed, group) of ``plan``, let the agent play them, read them back."""
        from agentgym.serving.sessions import sessions_to_trajectories

        sessions = [self.gateway.open_session(f"{tag}-{i}", env_id=suite.env_id, task=task, seed=seed,
                                              group_id=group, env_kwargs=dict(suite.env_kwargs))
                    for i, (task, seed, group) in enumerate(plan)]
        self.model.eval()
        self._play(sessions)
        recorded = sessions_to_trajectories(self.record_dir, sessions, subagents=self.subagents,
                                            split_segments=self.split_segments)
        for t in recorded.trajectories:
            temperature = t.metadata.get("temperature")
            if temperature is not None and abs(float(temperature) - self.config.temperature) > 1e-6:
                raise ConfigError(f"Session {t.metadata['session']} sampled at temperature {temperature}, but the "
                                  f"trainer computes log-probs at temperature {self.config.temperature}: make the agent "
                                  "program sample at the config's temperature (or set the config's to its).")
        return recorded.trajectories, recorded.stats()

    def _sample(self, step: int) -> list[Trajectory]:
        cfg = self.config
        plan = [(task, mix_seed(cfg.seed, step, k, g) % (2**31), f"{step}/{k}")
                for k, task in enumerate(self._tasks_for_step(step)) for g in range(cfg.group_size)]
        trajectories, self.session_stats = self._run_sessions(f"s{step}", plan, self.suite)
        return trajectories

    def _token_advantages(self, trajectories: list[Trajectory], scores: torch.Tensor, stats_mask: torch.Tensor,
                          usable: list[int], batch: TrainingBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """GRPO's group advantage, with each episode counted once in its group's statistics (its rows share the
        episode's return, so they all get the same advantage)."""
        return super()._token_advantages(trajectories, scores, stats_mask & episode_leaders(trajectories), usable,
                                         batch)

    def _rollout_metrics(self, trajectories: list[Trajectory]) -> dict[str, float]:
        return dict(self.session_stats)

    def _evaluate(self, step: int) -> dict[str, Any]:
        """Held-out success of the agent program (the eval split's tasks, seeds 0..n-1)."""
        started = time.perf_counter()
        trajectories, stats = self._run_sessions(f"e{step}", [(t, i, f"eval/{step}/{i}")
                                                              for i, t in enumerate(self.eval_tasks)],
                                                  self.eval_suite)
        # one trajectory per session: a session's sub-agents (and, with split_segments, its later segments) count
        # with it
        firsts = [t for t in trajectories if t.metadata.get("segment", 0) == 0 and t.metadata.get("parent") is None]
        result: dict[str, Any] = summarize(firsts)
        result["success_rate"] = sum(t.success for t in firsts) / max(len(self.eval_tasks), 1)
        result["sessions_ended"] = stats["gateway/sessions"]
        result["mismatches"] = stats["gateway/mismatches"]
        result["wall_s"] = time.perf_counter() - started
        self._log(step, {**{f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))},
                         "eval/episodes_seen": float(self.episodes)})
        return result
