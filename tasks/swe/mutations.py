"""Bug injection by AST mutation, applied as a minimal text edit.

Each candidate replaces the source text of one node (located by line/column) with the unparsed mutated
node, so the buggy file differs from the original in exactly one small span: comments and formatting
elsewhere are untouched and the diff looks like a real one-line bug. Mutation kinds follow SWE-smith's
procedural bugs: comparison and operator flips, off-by-one constants, removed statements, swapped
arguments, inverted conditions, and/or swaps.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from agentgym.errors import TaskError

__all__ = ["Mutation", "apply_mutation", "candidate_mutations"]

COMPARE_FLIPS: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                                   ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
                                   ast.In: ast.NotIn, ast.NotIn: ast.In}
BINOP_FLIPS: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
                                 ast.Div: ast.Mult, ast.Mod: ast.FloorDiv, ast.LShift: ast.RShift,
                                 ast.RShift: ast.LShift, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
KINDS = ("compare_flip", "operator_flip", "off_by_one", "remove_statement", "swap_arguments",
         "invert_condition", "boolean_flip")


@dataclass(frozen=True)
class Mutation:
    """One bug: replace ``original`` at (line, col)-(end_line, end_col) of ``file`` with ``replacement``."""

    kind: str
    file: str
    function: str
    line: int
    col: int
    end_line: int
    end_col: int
    original: str
    replacement: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Mutation:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def _span(source: str, line: int, col: int, end_line: int, end_col: int) -> tuple[int, int]:
    # ast columns are UTF-8 byte offsets; convert per line.
    lines = source.splitlines(keepends=True)
    starts = _offsets(source)

    def char_offset(ln: int, byte_col: int) -> int:
        return starts[ln - 1] + len(lines[ln - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    return char_offset(line, col), char_offset(end_line, end_col)


def apply_mutation(source: str, mutation: Mutation) -> str:
    """The buggy source; raises :class:`TaskError` when the original text is not where the mutation says."""
    start, stop = _span(source, mutation.line, mutation.col, mutation.end_line, mutation.end_col)
    if source[start:stop] != mutation.original:
        raise TaskError(f"{mutation.file}:{mutation.line}: expected {mutation.original!r} there, found "
                        f"{source[start:stop]!r}; the source tree does not match the task's library version.")
    return source[:start] + mutation.replacement + source[stop:]


class _FunctionWalker(ast.NodeVisitor):
    """Collect (qualified function name, node) for every node inside a function body."""

    def __init__(self) -> None:
        self.scope: list[str] = []
        self.found: list[tuple[str, ast.AST]] = []

    def _scoped(self, node: ast.AST, name: str) -> None:
        self.scope.append(name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._scoped(node, node.name)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.scope.append(node.name)
        self.found.append((".".join(self.scope), node))  # its own body: top-level statements can be removed
        for child in node.body:
            for inner in ast.walk(child):
                self.found.append((".".join(self.scope), inner))
        self.scope.pop()
        # nested defs are reached through ast.walk above; do not visit them again

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]


def _mutants(node: ast.AST) -> Iterator[tuple[str, ast.AST, str]]:
    """(kind, node to replace, replacement source) for one node."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARE_FLIPS:
        mutated = ast.Compare(node.left, [COMPARE_FLIPS[type(node.ops[0])]()], node.comparators)
        yield "compare_flip", node, ast.unparse(mutated)
    elif isinstance(node, ast.BinOp) and type(node.op) in BINOP_FLIPS:
        yield "operator_flip", node, ast.unparse(ast.BinOp(node.left, BINOP_FLIPS[type(node.op)](), node.right))
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 1000:
        yield "off_by_one", node, str(node.value + 1 if node.value in (0, 1) else node.value - 1)
    elif isinstance(node, ast.BoolOp):
        other = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "boolean_flip", node, ast.unparse(ast.BoolOp(other, node.values))
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred) for a in node.args[:2]):
        args = [node.args[1], node.args[0], *node.args[2:]]
        yield "swap_arguments", node, ast.unparse(ast.Call(node.func, args, node.keywords))
    if isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
        test = node.test
        inverted = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else \
            ast.UnaryOp(ast.Not(), test)
        yield "invert_condition", test, ast.unparse(inverted)
    for field in ("body", "orelse"):
        body = getattr(node, field, None)
        if isinstance(body, list) and len(body) >= 2:
            for stmt in body:
                if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Expr, ast.Return, ast.Raise)) \
                        and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                    yield "remove_statement", stmt, "pass"


def candidate_mutations(source: str, file: str, rng: random.Random | None = None) -> list[Mutation]:
    """Every single-site mutation inside the functions of ``source`` (shuffled when ``rng`` is given)."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise TaskError(f"{file} does not parse: {exc}") from exc
    walker = _FunctionWalker()
    walker.visit(tree)
    seen: set[tuple[int, int, int, int, str]] = set()
    found: list[Mutation] = []
    for function, node in walker.found:
        for kind, target, replacement in _mutants(node):
            if not hasattr(target, "end_lineno") or target.end_lineno is None:
                continue
            key = (target.lineno, target.col_offset, target.end_lineno, target.end_col_offset, replacement)
            if key in seen:
                continue
            seen.add(key)
            start, stop = _span(source, *key[:4])
            original = source[start:stop]
            if original == replacement:
                continue
            found.append(Mutation(kind, file, function, *key[:4], original, replacement))
    if rng is not None:
        rng.shuffle(found)
    return found
