"""The config reference: every key a trainer's config file may set, with its type, default and documentation.

Why from the code: each field's documentation is the docstring under it in the config dataclass (and, for keys a
config writes flat but a nested dataclass holds, such as ARPO's branching settings, that class's ``Attributes:``
section), so ``agentgym train --help-config TRAINER`` and the generated docs page can never drift from what
:func:`agentgym.trainers.config.load_config` accepts.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from agentgym.errors import ConfigError, did_you_mean

__all__ = ["FieldDoc", "config_class", "field_docs", "format_help", "markdown_reference"]


@dataclass(frozen=True)
class FieldDoc:
    """One key of a config file."""

    name: str
    type: str
    default: str
    doc: str


def config_class(trainer: str) -> type:
    """The config class a ``trainer:`` key selects; unknown names fail with a 'did you mean'."""
    from agentgym.trainers.config import TRAINER_CONFIGS

    if trainer not in TRAINER_CONFIGS:
        names = sorted(TRAINER_CONFIGS)
        raise ConfigError(f"unknown trainer {trainer!r}.{did_you_mean(trainer, names)} Available: {', '.join(names)}.")
    module, _, name = TRAINER_CONFIGS[trainer].partition(":")
    return getattr(importlib.import_module(module), name)


def _attribute_docs(cls: type) -> dict[str, str]:
    """``field -> docstring`` of the string literals right under each annotated attribute, over the MRO (a
    subclass's redeclaration wins)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and \
                    isinstance(after.value.value, str):
                docs[node.target.id] = _plain(inspect.cleandoc(after.value.value))
        docs.update({k: v for k, v in _google_attributes(klass).items() if k not in docs})
    return docs


def _google_attributes(cls: type) -> dict[str, str]:
    """The ``Attributes:`` section of a class docstring (Google style), as ``name -> text``."""
    doc = inspect.getdoc(cls) or ""
    match = re.search(r"^Attributes:\n((?:[ \t]+.*\n?|\n)+)", doc, flags=re.M)
    if not match:
        return {}
    found: dict[str, str] = {}
    current = None
    for line in match.group(1).splitlines():
        item = re.match(r"^\s{4}(\w+): (.*)$", line)
        if item:
            current = item.group(1)
            found[current] = _plain(item.group(2).strip())
        elif current and line.strip():
            found[current] += " " + _plain(line.strip())
    return found


def _plain(text: str) -> str:
    """Docstring markup read as plain text: Sphinx roles and double backticks become single backticks."""
    return re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")


def _type_text(hint: Any) -> str:
    text = str(hint) if not isinstance(hint, type) else hint.__name__
    return re.sub(r"\b(typing|collections\.abc)\.", "", text).replace("NoneType", "None")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "required"
    if isinstance(value, tuple):
        value = list(value)
    if dataclasses.is_dataclass(value):
        return "(see its keys)"
    return "null" if value is None else repr(value).replace("'", '"') if isinstance(value, str) else \
        str(value).lower() if isinstance(value, bool) else repr(value)


def field_docs(cls: type) -> list[FieldDoc]:
    """Every key :meth:`config_keys` lists for ``cls``, in declaration order (nested settings after the field
    that holds them), with type, default and documentation."""
    hints = typing.get_type_hints(cls)
    docs = _attribute_docs(cls)
    keys = cls.config_keys()  # type: ignore[attr-defined]
    out: list[FieldDoc] = []
    seen: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.name in keys:
            out.append(FieldDoc(f.name, _type_text(hints[f.name]), _default_text(f), docs.get(f.name, "")))
            seen.add(f.name)
            continue
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        nested = factory() if factory is not None else f.default
        if not dataclasses.is_dataclass(nested):
            continue
        nested_cls = type(nested)
        nested_hints, nested_docs = typing.get_type_hints(nested_cls), _attribute_docs(nested_cls)
        for g in dataclasses.fields(nested_cls):
            if g.name in keys and g.name not in seen:
                out.append(FieldDoc(g.name, _type_text(nested_hints[g.name]), _default_text(g),
                                    nested_docs.get(g.name, "")))
                seen.add(g.name)
    missing = sorted(keys - seen - {f.name for f in dataclasses.fields(cls)})
    for name in missing:  # a key no field documents: listed all the same, so the reference stays complete
        out.append(FieldDoc(name, "", "", ""))
    return out


def format_help(trainer: str, width: int = 100) -> str:
    """``agentgym train --help-config TRAINER``: the config class's docstring, then each key with its type,
    default and doc, wrapped to ``width`` columns."""
    cls = config_class(trainer)
    summary = (inspect.getdoc(cls) or "").split("\n\n")[0]
    lines = [f"trainer: {trainer}  ({cls.__name__}) - {summary}", "",
             "Every key a config file may set (the file's 'trainer:' picks the class; --set FIELD=VALUE overrides):",
             ""]
    for d in field_docs(cls):
        lines.append(f"  {d.name}: {d.type} = {d.default}")
        for para in (d.doc or "(undocumented)").split("\n\n"):
            lines += textwrap.wrap(" ".join(para.split()), width=width, initial_indent="      ",
                                   subsequent_indent="      ")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def markdown_reference() -> str:
    """The docs page: one table per ``trainer:`` value, every key with type, default and documentation."""
    from agentgym.trainers.config import TRAINER_CONFIGS

    parts = ["# Config reference", "",
             "<!-- generated by docs/generate.py from the config dataclasses; edit their field docstrings -->", "",
             "Every key a trainer config file may set, per `trainer:` value, with its type, default and meaning, "
             "read from the config classes. The same text is printed by `agentgym train --help-config TRAINER`. "
             "`model: tiny:<suite>` names the built-in tiny model with a tokenizer trained on that suite's text "
             "(built and cached on first use).", ""]
    for trainer in TRAINER_CONFIGS:
        cls = config_class(trainer)
        summary = " ".join((inspect.getdoc(cls) or "").split("\n\n")[0].split())
        parts += [f"## `trainer: {trainer}`", "", f"`{cls.__name__}`: {summary}", "",
                  "| key | type | default | meaning |", "|---|---|---|---|"]
        for d in field_docs(cls):
            kind = _cell(d.type.replace(" | ", " or "))
            parts.append(f"| `{d.name}` | `{kind}` | `{_cell(d.default)}` | {_cell(d.doc)} |")
        parts.append("")
    return "\n".join(parts)
