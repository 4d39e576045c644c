"""Frozen dataclasses that are cheap to build: the records the rollout engine makes on every turn.

Why: on CPython 3.11 a frozen dataclass's generated ``__init__`` stores each field through
``object.__setattr__`` (the class's own ``__setattr__`` refuses writes), about 0.15 us a field. A turn builds a
:class:`~agentgym.policies.Generation` (9 fields), a :class:`~agentgym.trajectory.Turn` (12) and the engine's
``TurnResult``; with a free policy that was the largest single cost of the engine over a hand-written loop
(``benchmarks/rollout_throughput.py``). :func:`quick_init` gives such a class an ``__init__`` that writes the
instance ``__dict__`` directly: the same signature, defaults and default factories, the same instances (equality,
hashing, ``repr``, ``dataclasses.replace``, pickling are the dataclass's own), and still no way to assign a field
afterwards.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["quick_init"]

_T = TypeVar("_T")


def quick_init(cls: type[_T]) -> type[_T]:
    """Replace the generated ``__init__`` of the frozen dataclass ``cls`` with one that fills ``__dict__`` at once.

    Apply it above ``@dataclass(frozen=True)``. Only plain field lists qualify: every field in ``__init__``, no
    ``InitVar``, no ``__post_init__`` (validation would be skipped), no ``__slots__`` (there is no ``__dict__``).

    Raises:
        TypeError: ``cls`` is not such a dataclass.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"quick_init needs a frozen dataclass; {cls.__name__} is not one.")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"quick_init cannot keep {cls.__name__}'s __post_init__ or __slots__; leave it off there.")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    generated = list(inspect.signature(cls.__init__).parameters)[1:]  # an InitVar is a parameter but no field
    if set(generated) != set(names) or any(n == "self" or n.startswith("_quick") for n in names):
        raise TypeError(f"quick_init needs every field of {cls.__name__} in __init__ and nothing else.")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    signature, body = [], []
    for f in fields:
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            signature.append(f"{f.name}=_FACTORY")
            body.append(f"    if {f.name} is _FACTORY: {f.name} = _factory_{f.name}()")
        else:
            signature.append(f.name)
    keyword_only = {f.name for f in fields if f.kw_only}
    positional = [s for s, n in zip(signature, names) if n not in keyword_only]
    keywords = [s for s, n in zip(signature, names) if n in keyword_only]
    args = ", ".join(["self", *positional, *(["*", *keywords] if keywords else [])])
    body.append("    _quick_values = self.__dict__")
    body.extend(f"    _quick_values[{n!r}] = {n}" for n in names)
    exec(f"def __init__({args}) -> None:\n" + "\n".join(body), namespace)  # noqa: S102 - our own field names
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[misc]
    return cls


class _Factory:
    """Marks "no value given" for a field with a default factory (a fresh value per instance, as in dataclasses)."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
