"""Bug injection by AST mutation, applied as an edit of the exact tokens that change.

The AST picks *where* a bug can go; the edit itself is made on the source tokens, never by re-rendering a
node: a comparison flip replaces just the operator token, a swap exchanges the two argument texts and keeps
what lies between them, a removed statement takes its whole lines with it. Re-rendering (``ast.unparse``)
re-quotes strings, re-flows lines, drops comments and writes ``not x is y``, and a removed statement left as a
lone ``pass`` marks the spot: such traces let a policy find the bug by its formatting instead of by debugging,
so mutations that cannot be made as a pure token edit are not generated. Kinds follow SWE-smith's procedural
bugs: comparison and operator flips, off-by-one constants, removed statements, swapped arguments, inverted
conditions, and/or swaps.
"""

from __future__ import annotations

import ast
import bisect
import io
import random
import tokenize
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from agentgym.errors import TaskError

__all__ = ["KINDS", "Mutation", "apply_mutation", "candidate_mutations"]

COMPARE_FLIPS: dict[str, str] = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==",
                                 "is": "is not", "is not": "is", "in": "not in", "not in": "in"}
# The logical negation of each comparison: how an inverted condition reads in real code (`x is not None`,
# `a >= b`), rather than `not x is None`.
COMPARE_NEGATIONS: dict[str, str] = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "==",
                                     "is": "is not", "is not": "is", "in": "not in", "not in": "in"}
BINOP_FLIPS: dict[str, str] = {"+": "-", "-": "+", "*": "//", "//": "*", "/": "*", "%": "//", "<<": ">>",
                               ">>": "<<", "&": "|", "|": "&"}
KINDS = ("compare_flip", "operator_flip", "off_by_one", "remove_statement", "swap_arguments",
         "invert_condition", "boolean_flip")
_ATOMS = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)  # conditions that read naturally with `not ` in front
_REMOVABLE = (ast.Assign, ast.AugAssign, ast.Expr, ast.Return, ast.Raise)


@dataclass(frozen=True)
class Mutation:
    """One bug: replace ``original`` at (line, col)-(end_line, end_col) of ``file`` with ``replacement``.

    Columns are UTF-8 byte offsets, as in :mod:`ast`.
    """

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


class _Source:
    """One module's text with conversions between (line, byte column), (line, char column) and offsets."""

    def __init__(self, text: str, *, tokens: bool = True) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.tokens = list(tokenize.generate_tokens(io.StringIO(text).readline)) if tokens else []

    def offset(self, line: int, byte_col: int) -> int:
        if line == len(self.lines) + 1 and byte_col == 0:
            return len(self.text)
        return self.starts[line - 1] + len(self.lines[line - 1].encode("utf-8")[:byte_col].decode("utf-8", "replace"))

    def char_offset(self, line: int, char_col: int) -> int:
        return self.starts[line - 1] + char_col

    def byte_pos(self, offset: int) -> tuple[int, int]:
        """(line, UTF-8 byte column) of a character offset."""
        if offset == len(self.text) and self.text.endswith("\n"):
            return len(self.lines) + 1, 0
        line = bisect.bisect_right(self.starts, offset, hi=len(self.lines))
        return line, len(self.lines[line - 1][: offset - self.starts[line - 1]].encode("utf-8"))

    def node_span(self, node: ast.AST) -> tuple[int, int]:
        return (self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
                self.offset(node.end_lineno, node.end_col_offset))  # type: ignore[attr-defined]

    def tokens_between(self, start: int, stop: int) -> list[tokenize.TokenInfo]:
        """Significant tokens lying wholly inside [start, stop) (no comments, line breaks or indentation)."""
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
        return [t for t in self.tokens if t.type not in skip and self.char_offset(*t.start) >= start
                and self.char_offset(*t.end) <= stop]


def _span(source: str, line: int, col: int, end_line: int, end_col: int) -> tuple[int, int]:
    src = _Source(source, tokens=False)
    return src.offset(line, col), src.offset(end_line, end_col)


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


# An edit: (kind, start offset, stop offset, replacement text).
_Edit = tuple[str, int, int, str]


def _operator_edit(src: _Source, kind: str, left: ast.AST, right: ast.AST, table: dict[str, str]) -> _Edit | None:
    """Replace the operator token(s) between ``left`` and ``right`` using ``table``; None if none is found."""
    between = src.tokens_between(src.node_span(left)[1], src.node_span(right)[0])
    ops = [t for t in between if t.string not in ("(", ")")]
    if not ops:
        return None
    text = " ".join(t.string for t in ops)
    if text not in table:
        return None
    start, stop = src.char_offset(*ops[0].start), src.char_offset(*ops[-1].end)
    if src.text[start:stop] != text:  # e.g. `is  not` spread over odd whitespace: leave it alone
        return None
    return kind, start, stop, table[text]


def _swap_edit(src: _Source, call: ast.Call) -> _Edit | None:
    """Exchange the first two arguments' texts, keeping exactly what lies between them."""
    first, second = call.args[0], call.args[1]
    (a0, a1), (b0, b1) = src.node_span(first), src.node_span(second)
    middle = src.text[a1:b0]
    if middle.strip() != ",":  # parentheses or a comment around an argument: a swap would show
        return None
    left, right = src.text[a0:a1], src.text[b0:b1]
    if left == right:
        return None
    return "swap_arguments", a0, b1, right + middle + left


def _invert_edit(src: _Source, test: ast.expr) -> _Edit | None:
    """Negate a condition the way code is written: flip a comparison, drop or add a plain ``not``."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        return _operator_edit(src, "invert_condition", test.left, test.comparators[0], COMPARE_NEGATIONS)
    start = src.node_span(test)[0]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, _ATOMS):
        operand_start = src.node_span(test.operand)[0]
        if src.text[start:operand_start].rstrip() != "not" or "\n" in src.text[start:operand_start]:
            return None
        return "invert_condition", start, operand_start, ""
    if isinstance(test, _ATOMS):
        return "invert_condition", start, start, "not "
    return None  # `not (a and b)` needs added parentheses: visible


def _removal_edits(src: _Source, body: list[ast.stmt]) -> Iterator[_Edit]:
    """Delete one statement with its whole lines, where that leaves real code behind and nothing else moves."""
    if len(body) < 2:
        return
    for stmt in body:
        if not isinstance(stmt, _REMOVABLE) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        rest = [s for s in body if s is not stmt]
        if not any(not isinstance(s, ast.Pass) and not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                   for s in rest):
            continue  # what is left would be a stub (a docstring or pass): that reads as a removal
        others = {ln for s in rest for ln in range(s.lineno, (s.end_lineno or s.lineno) + 1)}
        if others & set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)):
            continue  # shares a line with another statement (`a = 1; b = 2`)
        start, stop = src.node_span(stmt)
        line_start = src.starts[stmt.lineno - 1]
        line_stop = src.starts[stmt.end_lineno]  # type: ignore[index]
        head, tail = src.text[line_start:start], src.text[stop:line_stop]
        if head.strip() or (tail.strip() and not tail.strip().startswith("#")):
            continue
        yield "remove_statement", line_start, line_stop, ""


def _edits(src: _Source, node: ast.AST) -> Iterator[_Edit]:
    """Every token-level mutation of one node."""
    edit: _Edit | None = None
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        edit = _operator_edit(src, "compare_flip", node.left, node.comparators[0], COMPARE_FLIPS)
    elif isinstance(node, ast.BinOp):
        edit = _operator_edit(src, "operator_flip", node.left, node.right, BINOP_FLIPS)
    elif isinstance(node, ast.Constant) and type(node.value) is int and 0 <= node.value <= 1000:
        start, stop = src.node_span(node)
        if src.text[start:stop] == str(node.value):  # not 0x10, 1_000 or 0o7: those would be re-spelled
            edit = "off_by_one", start, stop, str(node.value + 1 if node.value in (0, 1) else node.value - 1)
    elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
        edit = _operator_edit(src, "boolean_flip", node.values[0], node.values[1], {"and": "or", "or": "and"})
    elif isinstance(node, ast.Call) and len(node.args) >= 2 and not any(isinstance(a, ast.Starred)
                                                                         for a in node.args[:2]):
        edit = _swap_edit(src, node)
    if edit is not None:
        yield edit
    if isinstance(node, (ast.If, ast.While)) and not isinstance(node.test, ast.Constant):
        inverted = _invert_edit(src, node.test)
        if inverted is not None:
            yield inverted
    for field in ("body", "orelse"):
        body = getattr(node, field, None)
        if isinstance(body, list):
            yield from _removal_edits(src, body)


def candidate_mutations(source: str, file: str, rng: random.Random | None = None) -> list[Mutation]:
    """Every single-site, token-level mutation inside the functions of ``source`` (shuffled when ``rng`` is given)."""
    try:
        tree = ast.parse(source)
        src = _Source(source)
    except (SyntaxError, tokenize.TokenError) as exc:
        raise TaskError(f"{file} does not parse: {exc}") from exc
    walker = _FunctionWalker()
    walker.visit(tree)
    seen: set[tuple[int, int, str]] = set()
    found: list[Mutation] = []
    for function, node in walker.found:
        for kind, start, stop, replacement in _edits(src, node):
            original = source[start:stop]
            if (start, stop, replacement) in seen or original == replacement:
                continue
            seen.add((start, stop, replacement))
            found.append(Mutation(kind, file, function, *src.byte_pos(start), *src.byte_pos(stop), original,
                                  replacement))
    if rng is not None:
        rng.shuffle(found)
    return found
