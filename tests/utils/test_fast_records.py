"""quick_init: a frozen dataclass built faster is still the same dataclass."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from agentgym.utils.fast_records import quick_init
from agentgym.policies import Generation, GenerationRequest
from agentgym.trajectory import Trajectory, Turn


def _record_class(name: str) -> Any:
    """The same frozen dataclass each call (positional, default, factory and keyword-only fields), named ``name``."""

    @dataclass(frozen=True)
    class Record:
        name: str
        count: int = 0
        tags: list[str] = field(default_factory=list)
        note: str = field(default="", kw_only=True)

    Record.__name__ = Record.__qualname__ = name  # module-level names, so pickle finds them
    return Record


Plain = _record_class("Plain")
Quick = quick_init(_record_class("Quick"))


def test_quick_init_takes_the_same_arguments_and_builds_the_same_values() -> None:
    assert str(inspect.signature(Quick)) == str(inspect.signature(Plain))
    for args, kwargs in [(("a",), {}), (("a", 2, ["x"]), {"note": "n"}), ((), {"name": "b", "count": 3})]:
        quick, plain = Quick(*args, **kwargs), Plain(*args, **kwargs)
        assert dataclasses.asdict(quick) == dataclasses.asdict(plain)
        assert repr(quick).removeprefix("Quick") == repr(plain).removeprefix("Plain")
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick("a", 1, [], "positional note")  # type: ignore[misc]
    assert Quick("a").tags is not Quick("a").tags  # a fresh default per instance, as the factory says


def test_a_quick_record_stays_frozen_hashable_and_copyable() -> None:
    record = Quick("a", 2, note="n")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.count = 3  # type: ignore[misc]
    assert record == Quick("a", 2, note="n") and record != Quick("a", 3, note="n")
    assert dataclasses.replace(record, count=5) == Quick("a", 5, note="n")
    assert pickle.loads(pickle.dumps(record)) == record and copy.deepcopy(record) == record
    hashable = Quick("a", 2, tags=None, note="n")  # type: ignore[arg-type]
    assert hash(hashable) == hash(Quick("a", 2, tags=None, note="n"))  # type: ignore[arg-type]


def test_quick_init_refuses_what_it_would_silently_skip() -> None:
    @dataclass
    class Mutable:
        x: int

    @dataclass(frozen=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("negative")

    @dataclass(frozen=True)
    class WithInitVar:
        x: int
        scale: dataclasses.InitVar[int] = 1

    for cls in (Mutable, Checked, WithInitVar, dict):
        with pytest.raises(TypeError, match="quick_init"):
            quick_init(cls)


@pytest.mark.parametrize("record", [
    Turn(observation="o", action="a", info={"kind": "void"}),
    Generation(text="t", token_ids=(1, 2), logprobs=(-0.5, -0.1)),
    GenerationRequest(messages=({"role": "user", "content": "hi"},), episode_id="e"),
    Trajectory(env_id="e", task_id="t", seed=1, turns=(Turn(observation="o", action="a"),), outcome={}, end_reason="x",
               policy="p"),
])
def test_the_engines_per_turn_records_use_it_and_round_trip(record: Any) -> None:
    cls = type(record)
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    assert "_quick_values" in cls.__init__.__code__.co_varnames  # the fast init, not the generated one
    assert dataclasses.replace(record) == record and pickle.loads(pickle.dumps(record)) == record
