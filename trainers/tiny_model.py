"""``model: tiny:<suite>`` in a trainer config: the built-in tiny model with a tokenizer trained on that suite's text.

Why: the tiny model learns a task on a CPU in minutes only when its tokenizer has seen the task's text (a
calculator tokenizer splits a maze into bytes), so a config names the suite the tokenizer comes from, and the
model is built on first use and cached under the agentgym cache root (``AGENTGYM_CACHE_DIR``), keyed by the suite
and the model's shape. Building takes seconds to a minute (the suite's reference episodes are played to collect the
tokenizer corpus) and logs each stage; later runs reuse the directory. ``make quickstart`` builds its model with the
same corpus (:func:`demonstration_texts`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path

from agentgym.errors import ConfigError

__all__ = ["TINY_PREFIX", "TOKENIZER_EPISODES", "demonstration_texts", "is_tiny_spec", "tiny_model_dir"]

logger = logging.getLogger(__name__)

TINY_PREFIX = "tiny:"
"""How a config's ``model`` names a built-in tiny model: ``tiny:<suite name or suite YAML path>``."""
TOKENIZER_EPISODES = 500
"""Reference episodes whose text trains the tokenizer (the quickstart's count)."""


def is_tiny_spec(model: str) -> bool:
    """Whether a config's ``model`` names a tiny model to build (``tiny:<suite>``)."""
    return isinstance(model, str) and model.startswith(TINY_PREFIX)


def demonstration_texts(suite_name: str, limit: int) -> list[str]:
    """Instructions, observations and reference actions of ``limit`` training tasks (the tokenizer corpus); for
    every other task also the env's shortcut answer, so imperfect demonstrations tokenize as well."""
    from agentgym.reference import prepare_env_tasks
    from agentgym.registration.suites import load_suite
    from agentgym.rollout import run_reference_episode

    suite = load_suite(suite_name)
    env = suite.make_env()
    texts: list[str] = []
    try:
        prepare_env_tasks(env, suite.train[:limit], label=suite.name)  # e.g. TextWorld's games, built in parallel
        _, info = env.reset(seed=0)
        texts.append(info["instructions"])
        try:
            shortcut = env.unwrapped.shortcut_solver()
        except NotImplementedError:  # e.g. the maze: every demonstration is then a reference one
            shortcut = None
        for i, task in enumerate(suite.train[:limit]):
            traj = run_reference_episode(env, task, seed=i)
            for turn in traj.turns:
                texts += [turn.observation, turn.action]
            texts.append(shortcut(traj.turns[0].observation) if shortcut is not None and i % 2 else "")
    finally:
        env.close()
    return [t for t in texts if t]


def tiny_model_dir(spec: str, *, config: object | None = None) -> Path:
    """The directory of the tiny model ``spec`` (``tiny:<suite>``) names, built and cached on first use.

    Args:
        spec: ``tiny:`` and a suite name (``agentgym list --suites``) or a suite YAML path.
        config: A :class:`agentgym.models.tiny.TinyModelConfig` (default: its defaults, as the quickstart).

    Raises:
        ConfigError: If the suite is unknown (with a 'did you mean') or names no suite.
    """
    from agentgym.errors import TaskError
    from agentgym.models.tiny import TinyModelConfig, build_tiny_model
    from agentgym.registration.suites import load_suite
    from agentgym.utils.cache import build_once, cache_root

    suite_name = spec[len(TINY_PREFIX):].strip() if is_tiny_spec(spec) else ""
    if not suite_name:
        raise ConfigError(f"model {spec!r}: write tiny:<suite>, e.g. tiny:games-maze (the tiny model with a tokenizer "
                          "trained on that suite's text).")
    try:
        suite = load_suite(suite_name)
    except TaskError as exc:
        raise ConfigError(f"model {spec!r}: {exc}") from None
    shape = config if config is not None else TinyModelConfig()
    key = hashlib.sha256(json.dumps({"suite": suite.name, "episodes": TOKENIZER_EPISODES, "shape": asdict(shape)},
                                    sort_keys=True).encode()).hexdigest()[:12]
    target = cache_root() / "tiny-models" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', suite.name)}-{key}"

    def build(tmp: Path) -> None:
        started = time.perf_counter()
        logger.info("building %s once (cached in %s): playing up to %d reference episodes of %s for the tokenizer",
                    spec, target, TOKENIZER_EPISODES, suite.name)
        texts = demonstration_texts(suite_name, TOKENIZER_EPISODES)
        logger.info("%s: training the tokenizer on %d texts and initialising the model", spec, len(texts))
        build_tiny_model(tmp, texts=texts, config=shape)
        logger.info("%s: built in %.0f s", spec, time.perf_counter() - started)

    return build_once(target, build)
