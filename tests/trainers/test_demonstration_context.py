"""A BC warm start clones its demonstrations in the contexts the learner will act in: the run's context limit
and context strategy apply to the reference episodes too (a policy cloned on whole histories and then rolled out
with a window sees prompts it never trained on)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from agentgym.models.tiny import load_tiny_model  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.trainers import make_trainer  # noqa: E402
from agentgym.trainers.bc import behaviour_clone, collect_demonstrations  # noqa: E402
from agentgym.trainers.config import config_from_dict  # noqa: E402
from tests.helpers.tiny_models import build_maze_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def maze_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_maze_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_demonstrations_follow_the_context_strategy_and_clone_segment_by_segment(maze_model: Path) -> None:
    model, tokenizer = load_tiny_model(maze_model)
    suite = load_suite("games-maze")
    whole = collect_demonstrations(suite, "train", 6, tokenizer, system_prompt="")
    windowed = collect_demonstrations(suite, "train", 6, tokenizer, system_prompt="",
                                      context={"strategy": "window", "keep_turns": 1, "trigger_turns": 2})
    assert all(d.num_segments == 1 for d in whole)
    long = [d for d in windowed if len(d.turns) > 2]
    assert long and all(d.num_segments > 1 for d in long)
    # the same actions, each cloned from the rewritten prompt its segment starts with
    assert [[t.action for t in d.turns] for d in windowed] == [[t.action for t in d.turns] for d in whole]
    later = next(t for t in long[0].turns if t.segment_index == 1)
    assert len(later.prompt_token_ids) < sum(len(t.prompt_token_ids) + len(t.action_token_ids)
                                             for t in long[0].turns if t.segment_index == 0)
    result = behaviour_clone(model, tokenizer, windowed, steps=2, learning_rate=1e-3, batch_size=4, seed=0,
                             progress=False)
    assert math.isfinite(result["bc/final_loss"])


def test_the_trainer_warm_start_passes_its_context_and_limit(maze_model: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    class Collected(Exception):
        pass

    def capture(*args: Any, **kwargs: Any) -> list[Any]:
        seen.update(kwargs)
        raise Collected

    monkeypatch.setattr("agentgym.trainers.loop.collect_demonstrations", capture)
    context = {"strategy": "window", "keep_turns": 2}
    trainer = make_trainer(config_from_dict({
        "trainer": "grpo", "model": str(maze_model), "suite": "games-maze", "output_dir": str(tmp_path / "run"),
        "group_size": 2, "tasks_per_step": 2, "max_context_tokens": 768, "context": context, "warmstart": "bc", "eval_tasks": 2}))
    with pytest.raises(Collected):
        trainer.train()
    assert seen["max_context_tokens"] == 768 and dict(seen["context"]) == context
