"""Structured output: decoding constrained to JSON that validates against a schema (``response_format``
``json_schema`` / ``json_object``, vLLM's ``guided_json``).

Why: a client that asks for JSON of a given shape (the ``openai`` SDK's ``.parse()`` with a pydantic model) must get
JSON of that shape every time, even from a model that was never trained to write it; validating afterwards and
retrying cannot promise that. So the sampler only ever offers tokens that keep the reply a prefix of some valid
document, and the reply ends (the end-of-turn token is allowed) only once the document is complete.

How: a character-level pushdown automaton built from the schema (:class:`JsonSchema`) says whether a character may
come next in a given state. For each state the sampler reaches, every vocabulary token's text is run through the
automaton, walking a trie of the token texts so that shared prefixes are checked once, and the result (allowed ids,
the states they lead to) is cached per state. States hold no string contents or digits, only the position in the
grammar, so a handful of them cover a whole schema.

Length: a reply that runs out of ``max_tokens`` inside a string is not JSON. Each state knows how many characters
at least close the document (:meth:`JsonSchema.close_cost`); a token is allowed only if, after it, the document can
still be closed with the tokens left (one token per character at worst: tokenizers hold every single ASCII
character as a token), so every reply is complete and valid by construction, whatever the model prefers.

The supported schema subset (anything else is refused with :class:`UnsupportedSchema`, naming the keyword):
``type`` object (``properties``, ``required``, ``additionalProperties: false``; an object without ``properties``
takes any keys), string, integer, number, boolean, null, array (``items`` of one schema); ``enum``; ``const``;
local ``$ref`` into ``$defs``/``definitions`` (not recursive); and annotations that do not constrain values
(``title``, ``description``, ``default``, ``examples``, ``$schema``, ``$id``, ``strict``). Output is compact JSON (an
optional space after ``:`` and ``,``); strings and keys are written with ASCII escapes where needed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.errors import AgentGymError, ConfigError

__all__ = ["JsonConstraint", "JsonSchema", "TokenVocabulary", "UnsupportedSchema"]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id", "$comment", "strict",
                          "deprecated", "readOnly", "writeOnly"})
_OBJECT_KEYS = frozenset({"type", "properties", "required", "additionalProperties", "$defs", "definitions"})
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_ESCAPES = '"\\/bfnrt'
#: Most memoised steps and costs kept per schema.
_MEMO = 1 << 18


class UnsupportedSchema(AgentGymError, ValueError):
    """A JSON schema uses something constrained decoding here does not implement.

    Attributes:
        keyword: The keyword at fault (``minLength``, ``anyOf``, ...).
        path: Where in the schema (``#/properties/name``).
    """

    def __init__(self, message: str, keyword: str, path: str) -> None:
        super().__init__(message)
        self.keyword = keyword
        self.path = path


@dataclass(frozen=True)
class _Node:
    kind: str  # string | integer | number | literal | array | object | any
    literals: tuple[str, ...] = ()
    item: int = -1
    props: tuple[tuple[str, str, int], ...] = ()  # (name, its JSON key literal, node)
    required: frozenset[str] = frozenset()
    free_keys: bool = False


class JsonSchema:
    """The character automaton of one schema (``None``: any JSON object, OpenAI's ``json_object`` mode).

    A state is a tuple of frames (the innermost last); ``()`` is a complete document. Frames: ``("V", node)`` a
    value to start, ``("S", esc)`` inside a free string, ``("L", literals, prefix)`` part of one of fixed texts
    (enum values, keys), ``("N", integer_only, phase)`` a number, ``("O", node, seen_keys, phase)`` an object and
    ``("A", node, phase)`` an array.

    Raises:
        UnsupportedSchema: See the module docstring for what is supported.
    """

    #: Most characters of a schema (as compact JSON), and most automaton nodes it may compile to. Why: a client
    #: sends the schema, and every new automaton state costs the decode thread one scan of the vocabulary; a
    #: schema whose ``$ref``s fan out (each of 20 definitions using the next twice) would otherwise compile to
    #: millions of nodes in the server.
    MAX_SCHEMA_CHARS = 32_768
    MAX_NODES = 2_048

    def __init__(self, schema: Mapping[str, Any] | None) -> None:
        if schema is not None:
            try:
                size = len(json.dumps(schema, separators=(",", ":")))
            except (TypeError, ValueError, RecursionError):
                raise UnsupportedSchema("a JSON schema must be plain JSON data.", "schema", "#") from None
            if size > self.MAX_SCHEMA_CHARS:
                raise UnsupportedSchema(f"the schema has {size} characters as JSON; the limit is "
                                        f"{self.MAX_SCHEMA_CHARS}. Send a smaller schema.", "schema", "#")
        self.nodes: list[_Node] = []
        self._minlen: list[int] = []
        self._defs: dict[str, Any] = {}
        self._resolving: set[str] = set()
        self._steps: dict[tuple[Any, ...], tuple[Any, ...] | None] = {}
        self._costs: dict[tuple[Any, ...], int] = {}
        # Nodes of values that an object without properties holds (any JSON), made first so every state can use them.
        self._any = self._add(_Node("any"))
        self._free = self._add(_Node("object", free_keys=True))
        self._any_number = self._add(_Node("number"))
        if schema is None:
            self.root = self._free
        else:
            if not isinstance(schema, Mapping):
                raise UnsupportedSchema(f"a JSON schema must be an object, got {schema!r}.", "schema", "#")
            for key in ("$defs", "definitions"):
                defs = schema.get(key)
                if isinstance(defs, Mapping):
                    self._defs.update({f"#/{key}/{name}": value for name, value in defs.items()})
            self.root = self._compile(schema, "#")
        self.start: tuple[Any, ...] = (("V", self.root),)

    # ---- compiling ----------------------------------------------------------------------------------------------
    def _add(self, node: _Node) -> int:
        if len(self.nodes) >= self.MAX_NODES:
            raise UnsupportedSchema(f"the schema compiles to more than {self.MAX_NODES} nodes (a $ref used many times "
                                    "is expanded at each use). Send a smaller schema.", "schema", "#")
        self.nodes.append(node)
        self._minlen.append(0)
        index = len(self.nodes) - 1
        self._minlen[index] = self._node_minlen(node)
        return index

    def _node_minlen(self, node: _Node) -> int:
        if node.kind == "string":
            return 2
        if node.kind in ("integer", "number", "any"):
            return 1
        if node.kind == "literal":
            return min(len(t) for t in node.literals)
        if node.kind == "array" or node.free_keys:
            return 2
        required = [(key, n) for name, key, n in node.props if name in node.required]
        return 2 + sum(len(key) + 1 + self._minlen[n] for key, n in required) + max(0, len(required) - 1)

    def _compile(self, schema: Any, path: str) -> int:
        if not isinstance(schema, Mapping):
            raise UnsupportedSchema(f"{path}: a schema must be an object, got {schema!r}.", "schema", path)
        if "$ref" in schema:
            ref = schema["$ref"]
            extra = set(schema) - {"$ref"} - _ANNOTATIONS
            if extra:
                raise UnsupportedSchema(f"{path}: keywords next to $ref are not supported ({', '.join(sorted(extra))})."
                                        , sorted(extra)[0], path)
            if not isinstance(ref, str) or ref not in self._defs:
                raise UnsupportedSchema(f"{path}: $ref {ref!r} is not supported: only local references into $defs or "
                                        "definitions are.", "$ref", path)
            if ref in self._resolving:
                raise UnsupportedSchema(f"{path}: $ref {ref!r} is recursive; recursive schemas are not supported.",
                                        "$ref", path)
            self._resolving.add(ref)
            try:
                return self._compile(self._defs[ref], ref)
            finally:
                self._resolving.discard(ref)
        if "enum" in schema or "const" in schema:
            key = "enum" if "enum" in schema else "const"
            values = schema[key] if key == "enum" else [schema["const"]]
            if not isinstance(values, list) or not values:
                raise UnsupportedSchema(f"{path}: 'enum' must be a non-empty list, got {values!r}.", key, path)
            self._check_keys(schema, {key, "type"}, path)
            return self._add(_Node("literal", literals=tuple(dict.fromkeys(json.dumps(v) for v in values))))
        kind = schema.get("type")
        if isinstance(kind, list):
            raise UnsupportedSchema(f"{path}: a list of types {kind!r} is not supported; give one type.", "type", path)
        if kind is None:
            self._check_keys(schema, {"$defs", "definitions"}, path)  # names a combinator (anyOf, ...) if there is one
            raise UnsupportedSchema(f"{path}: a schema without 'type' (or enum/const/$ref) is not supported.", "type",
                                    path)
        if kind in ("string", "integer", "number"):
            self._check_keys(schema, {"type"}, path)
            return self._add(_Node(kind))
        if kind == "boolean":
            self._check_keys(schema, {"type"}, path)
            return self._add(_Node("literal", literals=("true", "false")))
        if kind == "null":
            self._check_keys(schema, {"type"}, path)
            return self._add(_Node("literal", literals=("null",)))
        if kind == "array":
            self._check_keys(schema, {"type", "items"}, path)
            items = schema.get("items")
            if items is None:
                raise UnsupportedSchema(f"{path}: an array needs 'items' (one schema for every item).", "items", path)
            return self._add(_Node("array", item=self._compile(items, path + "/items")))
        if kind == "object":
            return self._compile_object(schema, path)
        raise UnsupportedSchema(f"{path}: type {kind!r} is not a JSON schema type.", "type", path)

    def _compile_object(self, schema: Mapping[str, Any], path: str) -> int:
        self._check_keys(schema, _OBJECT_KEYS, path)
        additional = schema.get("additionalProperties", False if "properties" in schema else True)
        properties = schema.get("properties")
        if properties is None:
            if additional not in (True, None) and additional != {}:
                raise UnsupportedSchema(f"{path}: an object without 'properties' takes any keys here; "
                                        "'additionalProperties' other than true is not supported.",
                                        "additionalProperties", path)
            if schema.get("required"):
                raise UnsupportedSchema(f"{path}: 'required' needs 'properties'.", "required", path)
            return self._add(_Node("object", free_keys=True))
        if additional is not False:
            raise UnsupportedSchema(f"{path}: 'additionalProperties' {additional!r} next to 'properties' is not "
                                    "supported; omit it or set it to false.", "additionalProperties", path)
        if not isinstance(properties, Mapping):
            raise UnsupportedSchema(f"{path}: 'properties' must be an object.", "properties", path)
        required = schema.get("required", [])
        if not isinstance(required, list) or any(r not in properties for r in required):
            raise UnsupportedSchema(f"{path}: 'required' must list names from 'properties', got {required!r}.",
                                    "required", path)
        props = tuple((str(name), json.dumps(str(name)), self._compile(sub, f"{path}/properties/{name}"))
                      for name, sub in properties.items())
        return self._add(_Node("object", props=props, required=frozenset(required)))

    @staticmethod
    def _check_keys(schema: Mapping[str, Any], allowed: set[str] | frozenset[str], path: str) -> None:
        for key in schema:
            if key not in allowed and key not in _ANNOTATIONS:
                raise UnsupportedSchema(
                    f"{path}: the JSON schema keyword {key!r} is not supported by constrained decoding here. "
                    "Supported: type (object, string, integer, number, boolean, null, array), properties, required, "
                    "additionalProperties: false, items, enum, const, $ref into $defs, and annotations (title, "
                    "description, default, examples).", key, path)

    # ---- stepping ----------------------------------------------------------------------------------------------
    def min_length(self) -> int:
        """Fewest characters of a valid document."""
        return self._minlen[self.root]

    def step(self, state: tuple[Any, ...], ch: str) -> tuple[Any, ...] | None:
        """The state after ``ch``, or ``None`` when ``ch`` cannot come next (memoised: a vocabulary scan asks the same
        question once per token that shares the state)."""
        key = (state, ch)
        if key in self._steps:
            return self._steps[key]
        if len(self._steps) > _MEMO:
            self._steps.clear()
        after = self._steps[key] = self._step(state, ch)
        return after

    def _step(self, state: tuple[Any, ...], ch: str) -> tuple[Any, ...] | None:
        if not state:
            return None
        frame = state[-1]
        rest = state[:-1]
        tag = frame[0]
        if tag == "V":
            return self._start_value(rest, frame[1], ch)
        if tag == "S":
            esc = frame[1]
            if esc == 0:
                if ch == '"':
                    return self._completed(rest, None)
                if ch == "\\":
                    return rest + (("S", 1),)
                return state if ch >= " " else None
            if esc == 1:
                if ch == "u":
                    return rest + (("S", 2),)
                return rest + (("S", 0),) if ch in _ESCAPES else None
            if ch not in _HEX:
                return None
            return rest + (("S", 0 if esc == 5 else esc + 1),)
        if tag == "L":
            prefix = frame[2] + ch
            matches = tuple(t for t in frame[1] if t.startswith(prefix))
            if not matches:
                return None
            if prefix in matches:
                return self._completed(rest, prefix)
            return rest + (("L", matches, prefix),)
        if tag == "N":
            return self._number(state, rest, frame, ch)
        if tag == "O":
            return self._object(rest, frame, ch)
        if tag == "A":
            return self._array(rest, frame, ch)
        return None

    def _start_value(self, rest: tuple[Any, ...], index: int, ch: str) -> tuple[Any, ...] | None:
        node = self.nodes[index]
        kind = node.kind
        if kind == "any":
            if ch == '"':
                return rest + (("S", 0),)
            if ch == "{":
                return rest + (("O", self._free, frozenset(), "{"),)
            if ch == "[":
                return rest + (("A", index, "["),)
            if ch == "-" or ch in _DIGITS:
                return self._start_value(rest, self._any_number, ch)
            if ch in "tfn":
                return self.step(rest + (("L", ("true", "false", "null"), ""),), ch)
            return None
        if kind == "string":
            return rest + (("S", 0),) if ch == '"' else None
        if kind in ("integer", "number"):
            integer = kind == "integer"
            if ch == "-":
                return rest + (("N", integer, "-"),)
            if ch == "0":
                return rest + (("N", integer, "0"),)
            return rest + (("N", integer, "d"),) if ch in _DIGITS else None
        if kind == "literal":
            return self.step(rest + (("L", node.literals, ""),), ch)
        if kind == "array":
            return rest + (("A", index, "["),) if ch == "[" else None
        if kind == "object":
            return rest + (("O", index, frozenset(), "{"),) if ch == "{" else None
        return None

    def _number(self, state: tuple[Any, ...], rest: tuple[Any, ...], frame: tuple[Any, ...],
                ch: str) -> tuple[Any, ...] | None:
        _, integer, phase = frame
        if phase in ("-", "."):
            if ch not in _DIGITS:
                return None
            if phase == "-":
                return rest + (("N", integer, "0" if ch == "0" else "d"),)
            return rest + (("N", integer, "f"),)
        if ch in _DIGITS and phase in ("d", "f"):
            return state
        if ch == "." and not integer and phase in ("0", "d"):
            return rest + (("N", integer, "."),)
        # The number ends here; the character belongs to what holds it (nothing may follow a top-level value).
        after = self._completed(rest, None)
        return self.step(after, ch) if after else None

    def _completed(self, rest: tuple[Any, ...], text: str | None) -> tuple[Any, ...]:
        """The state once the innermost value (or key) ends: its holder moves on."""
        if not rest:
            return ()
        holder = rest[-1]
        outer = rest[:-1]
        if holder[0] == "O":
            _, index, seen, phase = holder
            if phase == "key":
                if text is None:  # a free key (any string)
                    return outer + (("O", index, seen, (":", None)),)
                name = next(n for n, key, _ in self.nodes[index].props if key == text)
                return outer + (("O", index, seen | {name}, (":", name)),)
            return outer + (("O", index, seen, ","),)
        return outer + (("A", holder[1], ","),)

    def _value_node(self, index: int, name: str | None) -> int:
        if name is None:
            return self._any
        return next(n for p, _, n in self.nodes[index].props if p == name)

    def _unseen(self, index: int, seen: frozenset[str]) -> tuple[str, ...]:
        return tuple(key for name, key, _ in self.nodes[index].props if name not in seen)

    def _object(self, rest: tuple[Any, ...], frame: tuple[Any, ...], ch: str) -> tuple[Any, ...] | None:
        _, index, seen, phase = frame
        node = self.nodes[index]
        free = node.free_keys
        if isinstance(phase, tuple):  # (":", name) / ("sp", name) / ("v", name)
            step, name = phase
            if step == ":":
                return rest + (("O", index, seen, ("sp", name)),) if ch == ":" else None
            if step == "sp" and ch == " ":
                return rest + (("O", index, seen, ("v", name)),)
            holder = rest + (("O", index, seen, "val"),)
            return self._start_value(holder, self._value_node(index, name), ch)
        if phase == "{" and ch == "}":
            return self._completed(rest, None) if node.required <= seen else None
        if phase in ("{", '"', ", "):
            if phase == ", " and ch == " ":
                return rest + (("O", index, seen, '"'),)
            if ch != '"':
                return None
            holder = rest + (("O", index, seen, "key"),)
            if free:
                return holder + (("S", 0),)
            keys = self._unseen(index, seen)
            return holder + (("L", keys, '"'),) if keys else None
        if phase == ",":
            if ch == "}":
                return self._completed(rest, None) if node.required <= seen else None
            if ch == "," and (free or self._unseen(index, seen)):
                return rest + (("O", index, seen, ", "),)
        return None

    def _array(self, rest: tuple[Any, ...], frame: tuple[Any, ...], ch: str) -> tuple[Any, ...] | None:
        _, index, phase = frame
        item = self.nodes[index].item if self.nodes[index].kind == "array" else self._any
        if phase in ("[", ",") and ch == "]":
            return self._completed(rest, None)
        if phase == ",":
            return rest + (("A", index, ", "),) if ch == "," else None
        if phase == ", " and ch == " ":
            return rest + (("A", index, "v"),)
        return self._start_value(rest + (("A", index, "val"),), item, ch)

    # ---- how far from the end ------------------------------------------------------------------------------------
    def accepting(self, state: tuple[Any, ...]) -> bool:
        """Whether the document may end here (complete, or a top-level number with all its digits)."""
        return not state or (len(state) == 1 and state[0][0] == "N" and state[0][2] in ("0", "d", "f"))

    def close_cost(self, state: tuple[Any, ...]) -> int:
        """Fewest characters that complete the document from ``state`` (memoised)."""
        cost = self._costs.get(state)
        if cost is None:
            if len(self._costs) > _MEMO:
                self._costs.clear()
            cost = self._costs[state] = self._close_cost(state)
        return cost

    def _close_cost(self, state: tuple[Any, ...]) -> int:
        total = 0
        i = len(state) - 1
        while i >= 0:
            frame = state[i]
            if frame[0] == "L" and i > 0 and state[i - 1][0] == "O" and state[i - 1][3] == "key":
                _, index, seen, _ = state[i - 1]
                total += min(len(key) - len(frame[2]) + self._after_key(index, seen, name)
                             for name, key, _ in self.nodes[index].props if key in frame[1])
                i -= 2
                continue
            total += self._frame_cost(frame)
            i -= 1
        return total

    def _entry(self, index: int, name: str) -> int:
        key, node = next((k, n) for p, k, n in self.nodes[index].props if p == name)
        return len(key) + 1 + self._minlen[node]

    def _after_value(self, index: int, seen: frozenset[str]) -> int:
        missing = [n for n in self.nodes[index].required if n not in seen]
        return 1 + sum(1 + self._entry(index, n) for n in missing)

    def _after_key(self, index: int, seen: frozenset[str], name: str) -> int:
        node = next(n for p, _, n in self.nodes[index].props if p == name)
        return 1 + self._minlen[node] + self._after_value(index, seen | {name})

    def _frame_cost(self, frame: tuple[Any, ...]) -> int:
        tag = frame[0]
        if tag == "V":
            return self._minlen[frame[1]]
        if tag == "S":
            return (1, 2, 5, 4, 3, 2)[frame[1]]
        if tag == "L":
            return min(len(t) - len(frame[2]) for t in frame[1])
        if tag == "N":
            return 1 if frame[2] in ("-", ".") else 0
        if tag == "A":
            _, index, phase = frame
            if phase in ("[", ",", "val"):
                return 1
            item = self.nodes[index].item if self.nodes[index].kind == "array" else self._any
            return self._minlen[item] + 1
        _, index, seen, phase = frame
        node = self.nodes[index]
        if node.free_keys:
            costs = {"{": 1, "key": 3, "val": 1, ",": 1, ", ": 5, '"': 5}
            if isinstance(phase, tuple):
                return 3 if phase[0] == ":" else 2
            return costs[phase]
        if isinstance(phase, tuple):
            step, name = phase
            value = self._minlen[self._value_node(index, name)]
            return (1 if step == ":" else 0) + value + self._after_value(index, seen)
        if phase in ("val", ","):
            return self._after_value(index, seen)
        # "{", or after a comma ('"', ", "): the missing required entries, their commas and the closing brace; after
        # a comma with none missing, one more entry first.
        missing = [n for n in node.required if n not in seen]
        if missing:
            return sum(self._entry(index, n) for n in missing) + len(missing) - 1 + 1
        if phase == "{":
            return 1
        return min(self._entry(index, n) for n, _, _ in node.props if n not in seen) + 1


class TokenVocabulary:
    """Each token's text as it reads inside a reply, in a trie (built once per tokenizer).

    Special tokens and tokens that are not whole characters (a byte of a multi-byte character decodes to U+FFFD)
    are left out: they never continue JSON here.
    """

    def __init__(self, tokenizer: Any) -> None:
        special = set(getattr(tokenizer, "all_special_ids", None) or ())
        size = len(tokenizer)
        anchor = list(tokenizer.encode("a", add_special_tokens=False))
        # Decoded after an anchor token, so that a leading space is kept (SentencePiece drops it at the start).
        base = tokenizer.decode(anchor, clean_up_tokenization_spaces=False)
        texts = tokenizer.batch_decode([anchor + [i] for i in range(size)], clean_up_tokenization_spaces=False)
        self.trie: dict[str, Any] = {}
        self.size = size
        for token_id, text in enumerate(texts):
            text = text[len(base):] if text.startswith(base) else ""
            if token_id in special or not text or "\ufffd" in text:
                continue
            node = self.trie
            for ch in text:
                node = node.setdefault(ch, {})
            node.setdefault("", []).append(token_id)


class JsonConstraint:
    """A :class:`~agentgym.policy.TokenConstraint`: the reply is one JSON document valid under ``schema``.

    Args:
        schema: A JSON schema (see the module docstring), or ``None`` for any JSON object.
        vocabulary: The tokenizer's :class:`TokenVocabulary`.
        max_states: Most automaton states whose allowed tokens are cached.
    """

    def __init__(self, schema: Mapping[str, Any] | None, vocabulary: TokenVocabulary, max_states: int = 4096) -> None:
        self.schema = JsonSchema(schema)
        self.vocabulary = vocabulary
        self.max_states = max_states
        self._cache: dict[tuple[Any, ...], tuple[Any, Any, list[tuple[Any, ...]], dict[int, int]]] = {}

    @property
    def min_tokens(self) -> int:
        """Fewest tokens a complete reply needs (one per character at worst, plus the end-of-turn token)."""
        return self.schema.min_length() + 1

    def start(self, max_tokens: int) -> tuple[tuple[Any, ...], int]:
        """The state of a new reply of at most ``max_tokens`` tokens.

        Raises:
            ConfigError: ``max_tokens`` is too small for the shortest valid document.
        """
        if max_tokens < self.min_tokens:
            raise ConfigError(f"The JSON schema's shortest document needs up to {self.min_tokens} tokens with the "
                              f"end-of-turn token, but max_tokens is {max_tokens}; raise max_tokens.")
        return self.schema.start, max_tokens

    def _scan(self, state: tuple[Any, ...]) -> tuple[Any, Any, list[tuple[Any, ...]], dict[int, int]]:
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        import torch

        ids: list[int] = []
        costs: list[int] = []
        nexts: list[tuple[Any, ...]] = []
        step, cost = self.schema.step, self.schema.close_cost
        stack = [(self.vocabulary.trie, state)]
        while stack:
            node, at = stack.pop()
            for ch, child in node.items():
                if ch == "":
                    continue
                after = step(at, ch)
                if after is None:
                    continue
                if "" in child:
                    c = cost(after)
                    for token_id in child[""]:
                        ids.append(token_id)
                        costs.append(c)
                        nexts.append(after)
                stack.append((child, after))
        entry = (torch.tensor(ids, dtype=torch.long), torch.tensor(costs, dtype=torch.long), nexts,
                 {t: i for i, t in enumerate(ids)})
        if len(self._cache) >= self.max_states:
            self._cache.clear()
        self._cache[state] = entry
        return entry

    def allowed(self, state: tuple[tuple[Any, ...], int]) -> tuple[Sequence[int], bool]:
        """Token ids that may come next, and whether the reply may end here (the end-of-turn token)."""
        at, left = state
        ids, costs, _, _ = self._scan(at)
        # After this token, ``left - 1`` tokens remain, one of them the end-of-turn token.
        return ids[costs <= left - 2], self.schema.accepting(at)

    def advance(self, state: tuple[tuple[Any, ...], int], token: int) -> tuple[tuple[Any, ...], int]:
        """The state after ``token`` (unchanged for a token that was not allowed, e.g. the end token)."""
        at, left = state
        _, _, nexts, index = self._scan(at)
        position = index.get(int(token))
        return (at if position is None else nexts[position]), left - 1
