"""Each env is described once, in its class docstring; this module reads that docstring.

The docstring has fixed sections, in the style of Gymnasium's env pages::

    One-line summary (what ``agentgym list`` shows).

    ## Description
    ## Tools            one ``- `name(args)`: what it does`` line per tool
    ## Reward
    ## Episode end
    ## Arguments        the constructor arguments
    ## Version history

:func:`env_doc` imports an id's class and parses its docstring into an :class:`EnvDoc` (the docs site builds one
page per env family from these). :func:`entry_point_summary` reads only the summary line, from the module's
source with :mod:`ast`, so that ``agentgym list`` stays fast and never imports an env's heavy dependencies.

Nothing here is imported by ``import agentgym``: importing an env class may import heavy dependencies.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass

from agentgym.errors import RegistrationError
from agentgym.registration.summaries import entry_point_summary

__all__ = ["SECTIONS", "EnvDoc", "ToolDoc", "entry_point_summary", "env_doc", "parse_env_docstring"]

#: The sections every env class docstring has, in this order.
SECTIONS: tuple[str, ...] = ("Description", "Tools", "Reward", "Episode end", "Arguments", "Version history")

#: A tool line's description starts with this when the tool exists only under some constructor arguments.
OPTIONAL_TOOL_MARK = "(only with"

_HEADING = re.compile(r"^##\s+(.+?)\s*$")
_TOOL_LINE = re.compile(r"^[-*]\s+`([A-Za-z_]\w*)[^`]*`\s*:?\s*(.*)$")


@dataclass(frozen=True)
class ToolDoc:
    """One line of a docstring's ``## Tools`` section.

    Attributes:
        name: The tool's name, as the model calls it.
        signature: The call as written in the docstring, e.g. ``calc(expression)``.
        text: What the tool does (one line).
        optional: True when the tool exists only under some constructor arguments (the text starts with
            ``(only with ...)``), so it is not among the tools of a default-made env.
    """

    name: str
    signature: str
    text: str
    optional: bool = False


@dataclass(frozen=True)
class EnvDoc:
    """An env's description, parsed from its class docstring.

    Every section except ``tools`` is Markdown text, ready to paste under its heading on a docs page.

    Attributes:
        env_id: The registered id (``agentgym/Calculator-v0``).
        class_path: The entry point, ``module:Class``.
        summary: The docstring's first line.
        description: ``## Description``.
        tools: ``## Tools``, one :class:`ToolDoc` per tool line.
        reward: ``## Reward``.
        episode_end: ``## Episode end``.
        arguments: ``## Arguments``.
        version_history: ``## Version history``.
    """

    env_id: str
    class_path: str
    summary: str
    description: str
    tools: tuple[ToolDoc, ...]
    reward: str
    episode_end: str
    arguments: str
    version_history: str

    @property
    def tool_names(self) -> tuple[str, ...]:
        """Every documented tool's name, optional ones included."""
        return tuple(t.name for t in self.tools)


def parse_env_docstring(doc: str | None, *, where: str) -> dict[str, str]:
    """Split an env class docstring into its summary and sections.

    Args:
        doc: The docstring (as :func:`inspect.getdoc` or :func:`ast.get_docstring` return it, dedented).
        where: What the docstring belongs to, for error messages (``module:Class``).

    Returns:
        ``{"summary": ..., "Description": ..., "Tools": ..., ...}``, each value stripped Markdown text.

    Raises:
        RegistrationError: The docstring is missing, has no summary line, or lacks a section (named).
    """
    if not doc or not doc.strip():
        raise RegistrationError(f"{where} has no docstring; an env class documents itself with a one-line summary "
                                f"and the sections {', '.join('## ' + s for s in SECTIONS)}.")
    lines = inspect.cleandoc(doc).splitlines()
    parts: dict[str, list[str]] = {"summary": []}
    current = "summary"
    for line in lines:
        match = _HEADING.match(line)
        if match:
            current = match.group(1)
            if current in parts:
                raise RegistrationError(f"{where}'s docstring has the section '## {current}' twice; merge them.")
            parts[current] = []
        else:
            parts[current].append(line)
    sections = {name: "\n".join(body).strip() for name, body in parts.items()}
    summary_lines = sections["summary"].split("\n\n", 1)[0].split("\n")
    if not sections["summary"] or len(summary_lines) != 1:
        raise RegistrationError(f"{where}'s docstring must start with a one-line summary followed by a blank line.")
    missing = [name for name in SECTIONS if name not in sections]
    if missing:
        raise RegistrationError(f"{where}'s docstring lacks the section '## {missing[0]}' "
                                f"(every env class docstring has {', '.join('## ' + s for s in SECTIONS)}).")
    empty = [name for name in SECTIONS if not sections[name]]
    if empty:
        raise RegistrationError(f"{where}'s docstring has an empty section '## {empty[0]}'; write what it says.")
    return sections


def _parse_tools(text: str, *, where: str) -> tuple[ToolDoc, ...]:
    items: list[list[str]] = []  # one list of lines per tool item (its first line, then indented continuations)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(("- ", "* ")):
            items.append([stripped])
        elif stripped and items and line.startswith(" "):
            items[-1].append(stripped)
    tools = []
    for item in items:
        match = _TOOL_LINE.match(item[0])
        if match is None:
            raise RegistrationError(f"{where}: the '## Tools' line {item[0]!r} should read "
                                    "'- `name(args)`: what it does'.")
        signature = item[0][item[0].index("`") + 1:].split("`", 1)[0]
        description = " ".join([match.group(2).strip(), *item[1:]]).strip()
        tools.append(ToolDoc(match.group(1), signature, description, description.startswith(OPTIONAL_TOOL_MARK)))
    if not tools:
        raise RegistrationError(f"{where}: '## Tools' lists no tool; write one '- `name(args)`: ...' line per tool.")
    return tuple(tools)


def doc_of_class(cls: type, *, env_id: str, class_path: str) -> EnvDoc:
    """The :class:`EnvDoc` of an env class (its own docstring, not one inherited from a base class)."""
    sections = parse_env_docstring(cls.__dict__.get("__doc__"), where=class_path)
    return EnvDoc(
        env_id=env_id,
        class_path=class_path,
        summary=sections["summary"].split("\n", 1)[0],
        description=sections["Description"],
        tools=_parse_tools(sections["Tools"], where=class_path),
        reward=sections["Reward"],
        episode_end=sections["Episode end"],
        arguments=sections["Arguments"],
        version_history=sections["Version history"],
    )


def entry_point_doc(entry_point: str, env_id: str = "") -> EnvDoc:
    """The :class:`EnvDoc` of a ``module:Class`` entry point (imports the class).

    This is how ids outside Gymnasium's registry are documented, e.g. the multi-agent (PettingZoo) games:
    ``entry_point_doc(entry.aec_entry_point, entry.id)``.
    """
    module_name, _, attr = entry_point.partition(":")
    cls = getattr(importlib.import_module(module_name), attr)
    return doc_of_class(cls, env_id=env_id, class_path=entry_point)


def env_doc(env_id: str) -> EnvDoc:
    """The :class:`EnvDoc` of a registered Gymnasium id: imports the entry point's class and parses its docstring.

    Args:
        env_id: An id of the catalogue or of an installed plugin (``agentgym/Calculator-v0``; the ``agentgym:``
            module prefix is accepted).

    Raises:
        RegistrationError: The id is unknown ('did you mean' included), its entry point is not a ``module:Class``
            string, or the class docstring lacks a section (named in the message).
    """
    import gymnasium as gym

    from agentgym.registration.catalogue import get_entry

    bare = env_id.split(":", 1)[1] if env_id.startswith("agentgym:") else env_id
    if bare in gym.registry:
        entry_point = gym.registry[bare].entry_point
    else:
        entry_point = get_entry(bare).entry_point  # unknown id: RegistrationError with 'did you mean'
    if not isinstance(entry_point, str):
        raise RegistrationError(f"{bare} is registered with a callable entry point ({entry_point!r}); register it with "
                                "a 'module:Class' string so its docstring can be found.")
    return entry_point_doc(entry_point, bare)
