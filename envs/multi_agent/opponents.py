"""Opponents: who plays the other seats when one seat of a game is turned into a single-agent env.

Every opponent answers with action *text*, exactly like a model, and the game parses it; so a scripted bot,
Stockfish, another LLM policy and a frozen copy of the learner all go through the same rules and the same
invalid-move handling. Opponents draw randomness only from the generator they get at ``reset`` (derived
from the episode seed), so self-play episodes replay exactly.

* :class:`RandomOpponent`: a uniformly random legal move.
* :class:`ScriptedOpponent`: the game's rule-based bot (``game.scripted_action``) or any function.
* :class:`StockfishOpponent`: Stockfish over UCI, at a configurable strength (chess only).
* :class:`PolicyOpponent`: any agentgym :class:`~agentgym.policies.base.Policy` (HF, vLLM, OpenAI, scripted).
* :class:`CheckpointOpponent`: a frozen checkpoint of the learner, loaded on first use.
* :class:`League`: samples one member per episode (e.g. past checkpoints), and can grow during training.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.agent import ChatAgent
from agentgym.errors import ConfigError
from agentgym.policy import Generation, Policy, SamplingParams
from agentgym.utils.coroutines import run_blocking

from .chess import START_FEN
from .stockfish import StockfishConfig, StockfishEngine

__all__ = [
    "CheckpointOpponent",
    "League",
    "Opponent",
    "PolicyOpponent",
    "RandomOpponent",
    "ScriptedOpponent",
    "StockfishOpponent",
]


class Opponent(abc.ABC):
    """Plays one seat of a game.

    Attributes:
        name: Shown in observations and trajectories.
        cheap: True when ``act`` is pure in-process computation (no subprocess, no model); the self-play env
            then lets the rollout engine step it inline.
    """

    name: str = "opponent"
    cheap: bool = True

    def reset(self, game: Any, agent: str, rng: np.random.Generator) -> None:
        """A new game starts; ``rng`` is the opponent's only source of randomness for it."""
        self._rng = rng

    @abc.abstractmethod
    def act(self, game: Any, agent: str) -> str:
        """The action text for ``agent``, whose turn it is in ``game``."""

    def close(self) -> None:
        """Release engines, models or threads (idempotent)."""

    @property
    def rng(self) -> np.random.Generator:
        rng = getattr(self, "_rng", None)
        if rng is None:
            raise ConfigError(f"{type(self).__name__}.act() was called before reset(game, agent, rng).")
        return rng


class RandomOpponent(Opponent):
    """A uniformly random legal move (from the game's action catalogue)."""

    name = "random"

    def act(self, game: Any, agent: str) -> str:
        legal = game.legal_actions(agent)
        if not legal:
            raise ConfigError(f"{type(game).__name__} lists no legal move for {agent}; RandomOpponent needs an action "
                              "catalogue and an ongoing game.")
        return legal[int(self.rng.integers(len(legal)))]


class ScriptedOpponent(Opponent):
    """A rule-based bot: the game's own ``scripted_action`` by default, or ``bot(game, agent, rng) -> text``."""

    def __init__(self, bot: Callable[[Any, str, np.random.Generator], str] | None = None, *, name: str = "scripted") -> None:
        self.bot = bot
        self.name = name

    def act(self, game: Any, agent: str) -> str:
        if self.bot is not None:
            return self.bot(game, agent, self.rng)
        return game.scripted_action(agent, self.rng)


class StockfishOpponent(Opponent):
    """Stockfish as a chess opponent (a separate process spoken to over UCI).

    Args:
        config: Strength and process settings; the default is the lowest level (skill 0, depth 1).
        engine: Share an existing engine instead of starting one (then ``close`` leaves it running).
    """

    cheap = False

    def __init__(self, config: StockfishConfig | None = None, *, engine: StockfishEngine | None = None) -> None:
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else StockfishEngine(config)
        self.name = f"stockfish(skill={self.engine.config.skill_level})"

    def act(self, game: Any, agent: str) -> str:
        if not hasattr(game, "uci_moves") or not hasattr(game, "play_uci"):
            raise ConfigError(f"StockfishOpponent plays chess only; {type(game).__name__} is not a ChessEnv.")
        start = None if game.start_fen == START_FEN else game.start_fen
        return game.play_uci(self.engine.best_move(game.uci_moves, start_fen=start, rng=self.rng))

    def close(self) -> None:
        if self._owns_engine:
            self.engine.close()



class PolicyOpponent(Opponent):
    """Any agentgym policy as an opponent: it sees the seat's text observations and instructions.

    Args:
        policy: The policy (its tokenizer, if any, is used for exact prompts as in the rollout engine).
        sampling: Sampling parameters for its turns.
        system_prompt: Replaces the game's instructions for this seat (a role prompt), if given.
        name: Shown in observations and trajectories (default: the policy's name).
        close_policy: Close the policy when the opponent is closed.
    """

    cheap = False

    def __init__(self, policy: Policy, *, sampling: SamplingParams | None = None, system_prompt: str | None = None,
                 name: str | None = None, close_policy: bool = False) -> None:
        self.policy = policy
        self.sampling = sampling or SamplingParams(max_tokens=128)
        self.system_prompt = system_prompt
        self.name = name or policy.name
        self.close_policy = close_policy
        self._agent: ChatAgent | None = None
        self._episode = 0

    def reset(self, game: Any, agent: str, rng: np.random.Generator) -> None:
        super().reset(game, agent, rng)
        self._agent = None
        self._episode += 1

    def act(self, game: Any, agent: str) -> str:
        text = game.observe(agent)["text"]
        if self._agent is None:
            self._agent = ChatAgent(self.policy.tokenizer, system_prompt=self.system_prompt)
            self._agent.start(game.instructions(agent), text)
        else:
            self._agent.add_observation(text)
        seed = None if self.sampling.seed is None else int(self.rng.integers(2**31 - 1))
        sampling = SamplingParams(self.sampling.max_tokens, self.sampling.temperature, self.sampling.top_p,
                                  self.sampling.stop, seed)
        request = self._agent.request(sampling, episode_id=f"opponent-{id(self)}-{self._episode}")
        generations: list[Generation] = run_blocking(self.policy.act([request]))
        self._agent.record_action(generations[0])
        return generations[0].text

    def close(self) -> None:
        if self.close_policy:
            self.policy.close()


class CheckpointOpponent(Opponent):
    """A frozen copy of the learner from a saved checkpoint, loaded on first use.

    Args:
        path: A model directory (what the trainers save), loaded with ``HFPolicy.from_pretrained``.
        loader: Custom ``path -> Policy`` (e.g. a vLLM engine), instead of the HF loader.
        sampling: Sampling parameters of the frozen policy.
    """

    cheap = False

    def __init__(self, path: str | Path, *, loader: Callable[[str], Policy] | None = None,
                 sampling: SamplingParams | None = None) -> None:
        self.path = str(path)
        self.loader = loader
        self.sampling = sampling
        self.name = f"checkpoint:{Path(self.path).name}"
        self._inner: PolicyOpponent | None = None
        self._lock = threading.Lock()

    def _load(self) -> PolicyOpponent:
        with self._lock:
            if self._inner is None:
                if self.loader is not None:
                    policy = self.loader(self.path)
                else:
                    if not Path(self.path).exists():
                        raise ConfigError(f"Checkpoint {self.path!r} does not exist; pass the model directory a "
                                          "trainer saved.")
                    from agentgym.policies.hf import HFPolicy

                    policy = HFPolicy.from_pretrained(self.path)
                self._inner = PolicyOpponent(policy, sampling=self.sampling, name=self.name, close_policy=True)
            return self._inner

    def reset(self, game: Any, agent: str, rng: np.random.Generator) -> None:
        super().reset(game, agent, rng)
        self._load().reset(game, agent, rng)

    def act(self, game: Any, agent: str) -> str:
        return self._load().act(game, agent)

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()


class League(Opponent):
    """A pool of opponents; each episode plays one member drawn with the episode's RNG.

    Use it for fictitious self-play: add a :class:`CheckpointOpponent` for each saved checkpoint of the
    learner with :meth:`add_checkpoint`, so the learner keeps beating its past selves.

    Args:
        members: The initial pool (at least one).
        weights: Sampling weights (default: uniform).
    """

    def __init__(self, members: Sequence[Opponent], weights: Sequence[float] | None = None) -> None:
        if not members:
            raise ConfigError("A League needs at least one member opponent.")
        self.members: list[Opponent] = list(members)
        self.weights: list[float] = [1.0] * len(self.members) if weights is None else [float(w) for w in weights]
        self._check_weights()
        self.current: Opponent = self.members[0]
        self.name = "league"

    def _check_weights(self) -> None:
        if len(self.weights) != len(self.members) or any(not w >= 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ConfigError("League weights must be one non-negative number per member, with a positive sum.")

    @property
    def cheap(self) -> bool:  # type: ignore[override]
        return all(m.cheap for m in self.members)

    def add(self, member: Opponent, weight: float = 1.0) -> None:
        """Add a member (e.g. the latest frozen checkpoint)."""
        self.members.append(member)
        self.weights.append(float(weight))
        self._check_weights()

    def add_checkpoint(self, path: str | Path, weight: float = 1.0, **kwargs: Any) -> CheckpointOpponent:
        """Add a frozen checkpoint of the learner; returns the new member."""
        member = CheckpointOpponent(path, **kwargs)
        self.add(member, weight)
        return member

    def reset(self, game: Any, agent: str, rng: np.random.Generator) -> None:
        super().reset(game, agent, rng)
        p = np.asarray(self.weights) / sum(self.weights)
        self.current = self.members[int(rng.choice(len(self.members), p=p))]
        self.current.reset(game, agent, rng)
        self.name = f"league/{self.current.name}"

    def act(self, game: Any, agent: str) -> str:
        return self.current.act(game, agent)

    def close(self) -> None:
        for member in self.members:
            member.close()
