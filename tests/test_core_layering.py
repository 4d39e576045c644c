"""The core (``agentgym/``) imports no trainer: rollouts, branching, policies and envs work without
``agentgym.trainers``. ``envs``, ``tools``, ``tasks`` and ``trainers`` import the core, never the other way round,
so the core runs without the trainers' dependencies; ARPO's entropy helpers that the core sampler needs
live in the core (:mod:`agentgym.rollout.branch_rule`). The only core modules allowed to import trainers are the two
application entry points, which exist to run them: ``agentgym/cli.py`` (``agentgym train``) and
``agentgym/quickstart.py`` (``make quickstart``)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "agentgym"
ENTRY_POINTS = {CORE / "cli.py", CORE / "quickstart.py"}
TRAINERS = "agentgym.trainers"


def _absolute(module: str | None, level: int, path: Path, core: Path) -> str:
    """The absolute module a (possibly relative) ``from`` import names, for a file inside ``core``."""
    if level == 0 or not path.is_relative_to(core):
        return module or ""
    package = ["agentgym", *path.parent.relative_to(core).parts]
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_trainer(name: str) -> bool:
    return name == TRAINERS or name.startswith(TRAINERS + ".")


def trainer_imports(path: Path, core: Path = CORE) -> list[str]:
    """Every import of ``agentgym.trainers`` in a core file, at any depth (lazy imports inside functions too):
    ``import``, absolute or relative ``from`` imports, and ``importlib.import_module``/``__import__`` of a literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module, node.level, path, core)
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        trainers = [n for n in names if _is_trainer(n)]
        if trainers:  # one line per import statement
            found.append(f"{path}:{node.lineno} imports {trainers[-1]}")
    return found


def test_no_core_module_imports_a_trainer() -> None:
    offenders = [hit for path in sorted(CORE.rglob("*.py")) if path not in ENTRY_POINTS for hit in trainer_imports(path)]
    assert offenders == [], ("the core must not depend on trainers; move the shared code into agentgym/ and let the "
                             "trainer re-export it:\n" + "\n".join(offenders))


def test_the_entry_points_are_the_only_exceptions_and_they_exist() -> None:
    assert all(path.is_file() for path in ENTRY_POINTS)
    assert trainer_imports(CORE / "cli.py"), "cli.py runs trainers; if it no longer does, drop it from ENTRY_POINTS"


def test_the_check_sees_lazy_relative_and_dynamic_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from agentgym.trainers.algorithms.arpo import segment_entropy\n"
                     "import agentgym.trainers\nfrom agentgym import trainers\n"
                     "import importlib\nimportlib.import_module('agentgym.trainers.grpo')\n"
                     "from agentgym import rollout\n", encoding="utf-8")
    assert len(trainer_imports(probe)) == 4
    nested = tmp_path / "agentgym" / "policies" / "probe.py"  # relative imports resolve against the file's package
    nested.parent.mkdir(parents=True)
    nested.write_text("from ..trainers import grpo\nfrom . import base\n", encoding="utf-8")
    hits = trainer_imports(nested, core=tmp_path / "agentgym")
    assert [hit.split(" imports ")[1] for hit in hits] == ["agentgym.trainers.grpo"]
