"""The package's layers, read from the code: each module imports only its own layer or lower ones, and no
modules import each other in a circle. Lazy imports inside functions count (a circle that only closes at run time
is still a module that cannot be understood, or imported first, on its own); imports under ``if TYPE_CHECKING:``
do not (they never run). Deprecated aliases (old paths kept for one release) are outside the layers.

The table, lowest first (see CONTRIBUTING.md):

1. ``utils``: caches, progress, images, procfs, lazy attributes, deprecation; and ``errors``, the one exception
   hierarchy that every layer raises, utilities included.
2. the contract: spaces, env, toolset, parsers, trajectory, policy (the interface every policy implements and its records),
   agent, suite, reference (a task's reference solution played through its env), storage, testing, and ``rewards``
   (rubrics and the judge interface: envs take ``reward=rubric``, so it must sit below them; what calls a judge
   policy lives in ``rollout``).
3. ``registration``: the catalogue, plugins, suites by name; and ``agentgym`` itself, whose ``__init__``
   registers every id.
4. ``models`` and ``policies``.
5. ``rollout``.
6. ``serving``, ``integrations``, ``trainers`` and ``viewer`` (the trajectory viewer app).
7. ``cli``.

``envs``, ``tools`` and ``tasks`` sit beside the core: they may import utils, the contract and registration (and
each other), never policies, rollout, serving or trainers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Source folder -> the package it is installed as (pyproject's package-dir).
FOLDERS = {"agentgym": "agentgym", "envs": "agentgym.envs", "tools": "agentgym.tools",
           "trainers": "agentgym.trainers", "tasks": "agentgym.tasks"}

CONTRACT = ("spaces", "env", "toolset", "parsers", "trajectory", "policy", "agent", "suite", "reference", "storage", "testing",
            "rewards")
#: (layer number, name, module prefixes); a module belongs to the first row whose prefix matches it, a prefix
#: with ``=`` matches that module alone.
LAYERS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "utils", ("agentgym.utils", "agentgym.errors")),
    (2, "contract", tuple(f"agentgym.{name}" for name in CONTRACT)),
    (3, "registration", ("agentgym.registration", "=agentgym")),
    (3, "envs, tools and tasks", ("agentgym.envs", "agentgym.tools", "agentgym.tasks")),
    (4, "models and policies", ("agentgym.models", "agentgym.policies")),
    (5, "rollout", ("agentgym.rollout",)),
    (6, "serving, integrations, trainers and the viewer", ("agentgym.serving", "agentgym.integrations", "agentgym.trainers",
                                                           "agentgym.viewer")),
    (7, "cli", ("agentgym.cli",)),
)
SIDE_BY_SIDE = {"envs, tools and tasks", "registration"}  # the env packages and registration may import each other


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def is_package(self) -> bool:
        return self.path.name == "__init__.py"


def modules(repo: Path = REPO) -> dict[str, Module]:
    """Every module of the installed ``agentgym`` namespace, by dotted name."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((repo / folder).rglob("*.py")):
            parts = list(path.relative_to(repo / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([package, *parts])
            found[name] = Module(name, path)
    return found


def is_deprecated_alias(module: Module) -> bool:
    """An old path kept for one release: its body calls ``moved_module``."""
    return "moved_module(__name__" in module.path.read_text(encoding="utf-8")


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """Ids of the statements under ``if TYPE_CHECKING:`` (they never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    return skipped


def imported_names(module: Module) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of every import in a module, at any depth, resolving relative imports; a ``from X
    import y`` yields ``X.y`` (the caller keeps it if it is a module) and ``X``."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    skipped = _type_checking_blocks(tree)
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def import_graph(found: dict[str, Module]) -> dict[str, dict[str, int]]:
    """module -> {module it imports: first line}; names are resolved to the nearest module that exists."""
    graph: dict[str, dict[str, int]] = {}
    for name, module in found.items():
        if is_deprecated_alias(module):
            continue
        edges: dict[str, int] = {}
        for line, target in imported_names(module):
            while target and target not in found:
                target = target.rpartition(".")[0]
            if target and target != name and not is_deprecated_alias(found[target]):
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def layer_of(name: str) -> tuple[int, str]:
    for number, label, prefixes in LAYERS:
        if any(name == prefix.lstrip("=") or (not prefix.startswith("=") and name.startswith(prefix + "."))
               for prefix in prefixes):
            return number, label
    raise AssertionError(f"{name} is in no layer: add it to the table in tests/project/test_layers.py and CONTRIBUTING.md")


ENV_SIDE_ALLOWED = {"utils", "contract", "registration", "envs, tools and tasks"}
#: (importer, imported) -> why this upward import is the design, not a shortcut. Keep it short.
EXCEPTIONS = {
    ("agentgym.envs.multi_agent.opponents", "agentgym.policies.hf"):
        "CheckpointOpponent plays a saved checkpoint, so it builds a policy from it, lazily, on first use "
        "(policies never import envs, so no circle)",
}


def upward_imports(graph: dict[str, dict[str, int]], found: dict[str, Module]) -> list[str]:
    """Imports that go against the table, as ``path:line: importer (layer) imports target (layer)``."""
    offenders = []
    for name, edges in sorted(graph.items()):
        own, own_label = layer_of(name)
        for target, line in sorted(edges.items()):
            theirs, their_label = layer_of(target)
            if own_label == "envs, tools and tasks":
                wrong = their_label not in ENV_SIDE_ALLOWED
            else:
                wrong = theirs > own and not {own_label, their_label} <= SIDE_BY_SIDE
            if wrong and (name, target) not in EXCEPTIONS:
                offenders.append(f"{found[name].path}:{line}: {name} ({own_label}) imports {target} ({their_label})")
    return offenders


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, dict[str, int]], dict[str, Module]]:
    found = modules()
    return import_graph(found), found


def test_every_module_imports_only_its_own_layer_or_lower_ones(graph) -> None:
    edges, found = graph
    offenders = upward_imports(edges, found)
    assert offenders == [], "imports against the layer table (move the shared code down, or the importer up):\n" + \
        "\n".join(offenders)


def test_no_modules_import_each_other_in_a_circle(graph) -> None:
    edges, _ = graph
    found = circles(edges)
    assert found == [], "import circles (lazy imports included); split out what both sides need:\n" + \
        "\n".join(" <-> ".join(component) for component in found)


def test_each_exception_is_still_an_import(graph) -> None:
    edges, _ = graph
    stale = [pair for pair in EXCEPTIONS if pair[1] not in edges.get(pair[0], {})]
    assert stale == [], f"these exceptions no longer happen; remove them from EXCEPTIONS: {stale}"


def test_every_module_is_in_a_layer(graph) -> None:
    edges, _ = graph
    for name in edges:
        layer_of(name)


def test_the_reader_sees_lazy_relative_dynamic_and_not_type_checking_imports(tmp_path: Path) -> None:
    root = tmp_path / "agentgym"
    (root / "rollout").mkdir(parents=True)
    (root / "utils").mkdir()
    for folder in ("envs", "tools", "trainers", "tasks"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "rollout" / "__init__.py").write_text("")
    (root / "utils" / "__init__.py").write_text("")
    (root / "rollout" / "engine.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                "    from agentgym.cli import main\n")
    (root / "utils" / "cache.py").write_text("def f():\n    from ..rollout import engine\n"
                                             "import importlib\nimportlib.import_module('agentgym.envs')\n")
    found = modules(tmp_path)
    edges = import_graph(found)
    assert set(edges["agentgym.utils.cache"]) == {"agentgym.rollout.engine", "agentgym.envs"}
    assert edges["agentgym.rollout.engine"] == {}
    assert len(upward_imports(edges, found)) == 2
    (root / "rollout" / "engine.py").write_text("from agentgym.utils import cache\n")
    assert circles(import_graph(modules(tmp_path))) == [["agentgym.rollout.engine", "agentgym.utils.cache"]]
