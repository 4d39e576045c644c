"""Env ids on the command line: the catalogue's, those a suite YAML registers, and the suites that use an id.

An env a suite YAML defines (its ``entry_point``) is registered only when the suite loads, so ``play``,
``serve-env`` and ``eval`` look it up among the shipped and plugin suites (read as YAML only: loading every suite
would build every task set) before calling an id unknown; an unknown one gets a "did you mean" over every id and
suite a user could have meant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

__all__ = ["register_env_id", "suite_env_ids", "suite_registering", "suites_using"]


def _suite_specs() -> list[tuple[Path, dict[str, Any]]]:
    import yaml

    from agentgym.registration import suites

    found = []
    for path in suites._suite_files():
        if path.suffix not in (".yaml", ".yml"):
            continue
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(spec, dict):
            found.append((path, spec))
    return found


def suite_registering(env_id: str) -> Path | None:
    """The shipped or plugin suite file whose ``entry_point`` registers ``env_id``, else ``None``."""
    for path, spec in _suite_specs():
        if spec.get("env") == env_id and "entry_point" in spec:
            return path
    return None


def suites_using(env_id: str) -> list[str]:
    """Names of the shipped and plugin suites whose tasks run in ``env_id``."""
    return sorted({path.stem for path, spec in _suite_specs() if spec.get("env") == env_id})


def suite_env_ids() -> list[str]:
    """Every env id a shipped or plugin suite runs in (for a "did you mean")."""
    return sorted({str(spec["env"]) for _, spec in _suite_specs() if isinstance(spec.get("env"), str)})


def register_env_id(env_id: str, suite: str | None = None) -> Any:
    """Make ``env_id`` makeable and return the suite that registered it (``None`` for a catalogue id).

    ``suite`` (a name or YAML path) is loaded first when given; otherwise a shipped or plugin suite that registers
    ``env_id`` is found and loaded. Raises :class:`ConfigError` with a "did you mean" for an id nobody registers.
    """
    import gymnasium as gym

    import agentgym  # noqa: F401 - registers the catalogue ids
    from agentgym.errors import TaskError
    from agentgym.registration.suites import list_suites, load_suite

    loaded = None
    try:
        if suite is not None:
            loaded = load_suite(suite)
        elif env_id not in gym.registry:
            found = suite_registering(env_id)
            if found is not None:
                loaded = load_suite(str(found))
    except TaskError as exc:
        raise ConfigError(str(exc)) from None
    if env_id.startswith("agentgym") and env_id not in gym.registry:
        from agentgym.registration.catalogue import get_entry

        get_entry(env_id)  # RegistrationError with a 'did you mean' over the catalogue's ids
    if env_id not in gym.registry:
        known = [k for k in sorted(gym.registry) if "/" in k or k.startswith("agentgym")]
        hint = did_you_mean(env_id, known + list_suites())
        raise ConfigError(f"Unknown environment id {env_id!r}.{hint} Run 'agentgym list' to see all ids; an env that "
                          "a suite YAML registers (entry_point) is found with --suite PATH.yaml.")
    return loaded
