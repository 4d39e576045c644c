"""The core (``agentgym/``) imports no trainer: rollouts, branching, policies and envs work without
``agentgym.trainers`` (DESIGN: trainers import the core, never the other way round). Only the two application
entry points, which exist to run trainers, may import them."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "agentgym"
ENTRY_POINTS = {"cli.py", "quickstart.py"}  # `agentgym train` and `make quickstart` run trainers by design


def trainer_imports(path: Path) -> list[str]:
    """Every import of ``agentgym.trainers`` in a file, at any depth (lazy imports inside functions too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + ([f"{node.module}.{a.name}" for a in node.names] if node.module == "agentgym" else [])
        found += [f"{path}:{node.lineno} imports {n}" for n in names
                  if n == "agentgym.trainers" or n.startswith("agentgym.trainers.")]
    return found


def test_no_core_module_imports_a_trainer() -> None:
    offenders = [hit for path in sorted(CORE.rglob("*.py")) if path.name not in ENTRY_POINTS
                 or path.parent != CORE for hit in trainer_imports(path)]
    assert offenders == [], "the core must not depend on trainers; move the shared code into agentgym/:\n" + "\n".join(offenders)


def test_the_check_sees_lazy_and_from_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from agentgym.trainers.algorithms.arpo import segment_entropy\n"
                     "import agentgym.trainers\nfrom agentgym import trainers\n", encoding="utf-8")
    assert len(trainer_imports(probe)) == 3
