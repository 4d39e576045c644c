"""Reset options that arrive over the network are data: checked against a schema with no path fields.

Why: a task's ``metadata`` tells an env how to build the episode, and some envs read server-side locations from
it: the SWE env's ``metadata["swebench"]["repo_path"]`` (a local git clone it extracts into the agent's
sandbox), Harbor's ``metadata["harbor"]["path"]`` (a task folder whose Dockerfile it builds). Trusted code
building tasks on the server may use those; a client of ``agentgym serve-env`` must not, or it points the env at
any repository or folder on the server and reads it through the agent's tools.

So a client's reset options pass :func:`check_reset_options` before the env sees them:

* options hold ``task_id`` (a string) or ``task`` (a dict), nothing else;
* a task dict holds ``id``, ``prompt``, ``answer`` and ``metadata``, nothing else;
* the metadata's top-level keys must be in the env family's allow-list (:data:`FAMILY_FIELDS`, keyed by the
  module of the env's class); families whose tasks always carry a server location (Harbor) take no task dicts
  at all, and the SWE env takes only the specs of its registered suites, unchanged (a spec names files inside the
  library tree and the tests to run);
* anywhere in the metadata, a key that names a location (``path``, ``repo``, ``dir``, ``file``, ``url``,
  ``image``, ... as a word of the key, e.g. ``repo_path``) or a string that looks like a filesystem location
  (absolute, ``~``, ``..`` components, ``file:``) is refused. A family may declare a key whose name only looks
  like a location (the search env's ``path`` is its question's chain of search hops) with its own check.

Envs this module does not know (plugins) get the last rule only; their authors should serve them with tasks named
by ``task_id``. Errors name the offending field and the fix.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from agentgym.errors import AgentGymError

__all__ = ["FAMILY_FIELDS", "ResetOptionsError", "check_reset_options", "family_of"]


class ResetOptionsError(AgentGymError):
    """A client's reset options were refused (unknown field, or a field that names a server location)."""


#: Words that, as a word of a key (split on ``_``, ``-``, ``.`` and camelCase), name a location.
LOCATION_WORDS = frozenset({"path", "paths", "dir", "dirs", "directory", "directories", "folder", "folders", "file",
                            "files", "filename", "filepath", "root", "cwd", "home", "repo", "repos", "repository",
                            "clone", "url", "urls", "uri", "image", "dockerfile", "mount", "mounts", "workdir",
                            "cache"})

_LOCATION_VALUE = re.compile(r"^\s*(/|~|\\\\|[A-Za-z]:[\\/]|file:)|(^|[\\/])\.\.([\\/]|$)", re.IGNORECASE)
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_TASK_KEYS = frozenset({"id", "prompt", "answer", "metadata"})
_MAX_DEPTH = 32


def _search_hops(value: Any, where: str) -> None:
    """The search env's ``path``: the question's chain of hops (``query``, ``gold`` entity ids, ``finds``)."""
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ResetOptionsError(f"{where} must be a list of hops (objects), got {type(value).__name__}.")
    for i, hop in enumerate(value):
        _check_value(hop, f"{where}[{i}]")


def _registered_swe_spec(value: Any, where: str) -> None:
    if not isinstance(value, Mapping) or value.get("id") not in _swe_specs():
        raise ResetOptionsError(
            f"{where}: clients may send SWE tasks only as the server has them (a task of a registered SWE suite, "
            "unchanged); this spec is not one. A spec names files inside the library tree and the tests to run, so "
            "the server does not take new ones from clients: add them to a suite on the server.")
    if dict(value) != _swe_specs()[value["id"]]:
        raise ResetOptionsError(f"{where}: the spec of task {value['id']!r} differs from the server's copy; send "
                                "the registered task unchanged.")


@functools.lru_cache(maxsize=1)
def _swe_specs() -> dict[str, dict[str, Any]]:
    """The specs of every registered suite served by the SWE env, by id (read once)."""
    import gymnasium as gym

    from agentgym.registration.suites import list_suites, load_suite

    specs: dict[str, dict[str, Any]] = {}
    for name in list_suites():
        try:
            suite = load_suite(name)
            entry = str(gym.spec(suite.env_id).entry_point)
        except Exception:  # noqa: BLE001 - a suite that does not load here serves no client either
            continue
        if "envs.swe.env" not in entry:
            continue
        for tasks in suite.splits.values():
            for task in tasks:
                spec = task.metadata.get("spec")
                if isinstance(spec, Mapping) and "id" in spec:
                    specs[str(spec["id"])] = dict(spec)
    return specs


def _refuse(reason: str) -> Callable[[Any, str], None]:
    def check(value: Any, where: str) -> None:
        raise ResetOptionsError(f"{where} is not accepted from clients: {reason}")

    return check


_ANY = None  # free-form JSON: the location rules apply inside it

#: Per env family (the module of the env's class), the metadata keys a client's task may carry, each with its
#: check (``None``: any JSON, with the location rules applied inside). A family mapped to ``None`` takes no task
#: dicts from clients.
FAMILY_FIELDS: dict[str, dict[str, Callable[[Any, str], None] | None] | None] = {
    "agentgym.envs.babyai": {"level": _ANY, "seed": _ANY, "max_turns": _ANY},
    "agentgym.envs.code_interpreter": {k: _ANY for k in (
        "answer_alternatives", "category", "codeio_mode", "dataset", "entry", "full_answer", "index", "problem_id",
        "reference_code", "reference_kind", "seed", "solution", "source", "task_id")},
    "agentgym.envs.games.calculator": {"a": _ANY, "b": _ANY, "op": _ANY},
    "agentgym.envs.games.guess_number": {"low": _ANY, "high": _ANY, "secret": _ANY},
    "agentgym.envs.games.maze": {k: _ANY for k in ("width", "height", "seed", "start", "exit", "max_turns")},
    "agentgym.envs.games.sokoban": {k: _ANY for k in ("boxes", "height", "optimal_moves", "rows", "seed", "width",
                                                      "max_turns")},
    "agentgym.envs.gui": {"task": _ANY, "seed": _ANY},
    "agentgym.envs.multi_agent": {"seat": _ANY, "setup": _ANY},
    "agentgym.envs.scienceworld": {"split": _ANY, "task_name": _ANY, "variation": _ANY, "max_turns": _ANY},
    "agentgym.envs.search": {"aliases": _ANY, "answer_position": _ANY, "entities": _ANY, "hops": _ANY, "kind": _ANY,
                             "options": _ANY, "options_named": _ANY, "type": _ANY,
                             "path": _search_hops},  # the question's chain of search hops, not a file path
    "agentgym.envs.swe.harbor": None,  # every Harbor task is a folder on the server (metadata['harbor']['path'])
    "agentgym.envs.swe": {"spec": _registered_swe_spec, "function": _ANY, "library": _ANY,
                          "swebench": _refuse("a SWE-bench task names a local clone on the server (repo_path). "
                                              "Load such tasks on the server (a suite) instead.")},
    "agentgym.envs.textworld": {k: _ANY for k in ("distribution", "game_seed", "kind", "level", "max_turns")},
    "agentgym.envs.web": {k: _ANY for k in ("aisle", "features", "options", "price_upper", "product_id", "query",
                                            "title")},
}


def family_of(env: Any) -> str:
    """The module of ``env``'s class (unwrapped): the key of :data:`FAMILY_FIELDS`."""
    return type(getattr(env, "unwrapped", env)).__module__


def _fields_for(family: str) -> tuple[bool, dict[str, Callable[[Any, str], None] | None] | None]:
    """(known, fields) for the longest :data:`FAMILY_FIELDS` prefix of ``family``."""
    best = max((k for k in FAMILY_FIELDS if family == k or family.startswith(k + ".")), key=len, default=None)
    return (False, None) if best is None else (True, FAMILY_FIELDS[best])


def _is_location_key(key: str) -> bool:
    return any(word.lower() in LOCATION_WORDS for word in _WORDS.findall(key)) or key.lower() in LOCATION_WORDS


def _check_value(value: Any, where: str, depth: int = 0) -> None:
    """The location rules, recursively: no location-naming keys, no location-looking strings."""
    if depth > _MAX_DEPTH:
        raise ResetOptionsError(f"{where} nests deeper than {_MAX_DEPTH} levels.")
    if isinstance(value, str):
        if _LOCATION_VALUE.search(value):
            raise ResetOptionsError(f"{where} = {value[:80]!r} looks like a location on the server (an absolute "
                                    "path, '~', '..' or a file: URL); clients send tasks as data only.")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            key = str(key)
            if _is_location_key(key):
                raise ResetOptionsError(f"{where}[{key!r}] names a location on the server; clients send tasks as "
                                        "data only. Put tasks that need server files in a suite on the server and "
                                        "name them with options={'task_id': ...}.")
            _check_value(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]", depth + 1)


def check_reset_options(options: Any, family: str) -> dict[str, Any] | None:
    """``options`` (from a client) if they are acceptable for an env of ``family``; else a clear error.

    Raises:
        ResetOptionsError: An unknown field, a wrong type, or a field that names a server location.
    """
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ResetOptionsError(f"options must be an object ({{'task_id': ...}} or {{'task': {{...}}}}), got "
                                f"{type(options).__name__}.")
    unknown = sorted(set(map(str, options)) - {"task", "task_id"})
    if unknown:
        raise ResetOptionsError(f"Unknown reset option(s) {unknown}: the server takes {{'task_id': str}} or "
                                "{'task': {'id', 'prompt', 'answer', 'metadata'}}.")
    if "task" in options and "task_id" in options:
        raise ResetOptionsError("Give options['task'] or options['task_id'], not both.")
    if "task" not in options and "task_id" not in options:
        return {}
    if "task_id" in options:
        if not isinstance(options["task_id"], str):
            raise ResetOptionsError(f"options['task_id'] must be a string, got {type(options['task_id']).__name__}.")
        return dict(options)
    task = options["task"]
    if not isinstance(task, Mapping):
        raise ResetOptionsError(f"options['task'] must be a task object, got {type(task).__name__}.")
    extra = sorted(set(map(str, task)) - _TASK_KEYS)
    if extra:
        raise ResetOptionsError(f"Unknown task field(s) {extra}: a task has {sorted(_TASK_KEYS)}.")
    if not isinstance(task.get("id"), str) or not isinstance(task.get("prompt"), str):
        raise ResetOptionsError("A task needs 'id' and 'prompt' strings.")
    metadata = task.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise ResetOptionsError(f"options['task']['metadata'] must be an object, got {type(metadata).__name__}.")
    known, fields = _fields_for(family)
    if known and fields is None:
        raise ResetOptionsError(f"This server's env ({family}) takes no task objects from clients: its tasks name "
                                "folders on the server. Name a task the server has with options={'task_id': ...}.")
    for key, value in metadata.items():
        where = f"options['task']['metadata'][{str(key)!r}]"
        if known and fields is not None:
            if key not in fields:
                raise ResetOptionsError(f"{where} is not a field this env ({family}) takes from clients; allowed: "
                                        f"{sorted(fields)}.")
            check = fields[key]
            if check is not None:
                check(value, where)
                continue
        elif _is_location_key(str(key)):
            _check_value({key: value}, "options['task']['metadata']")
        _check_value(value, where)
    return dict(options)
