"""The TRL recipe (examples/trl_grpo_agentgym.py): TRL's own GRPOTrainer, with its ``environment_factory`` hook,
trains a from-config tiny model on agentgym's Calculator in a multi-turn tool loop on a CPU; the rewards TRL
optimises are the env's."""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytest.importorskip("trl")

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
import trl_grpo_agentgym as recipe  # noqa: E402

from agentgym.registration.suites import load_suite  # noqa: E402


def test_bridge_exposes_the_env_tools_to_trl_and_forwards_calls_to_the_env() -> None:
    """The schema TRL shows the model is the env's, and a call runs the env's own tool and reward."""
    from transformers.utils import get_json_schema

    suite = load_suite("games-calc")
    env_class = recipe.trl_environment(suite.env_id, suite.train, suite.env_kwargs, {"tool_call": 0.1})
    env = env_class()
    members = {name for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)
               if not name.startswith("_")}
    assert members == {"answer", "calc", "get_reward", "reset"}
    calc = get_json_schema(env.calc)["function"]
    assert calc["parameters"]["properties"]["expression"]["type"] == "string"
    assert get_json_schema(env.answer)["function"]["parameters"]["properties"]["value"]["type"] == "integer"
    task = suite.train[3]
    assert env.reset(task_id=task.id, seed=3, prompt=[]) == task.prompt
    a, b = task.prompt.removeprefix("What is ").removesuffix("?").split("*")
    assert env.calc(expression=f"{a}*{b}") == f"{a}*{b} = {int(a) * int(b)}"
    assert env.get_reward() == pytest.approx(0.1)  # a tool call, shaped as configured; no outcome yet
    env.answer(value=int(a) * int(b))
    assert env.kinds == ["tool_call", "answer"] and env.done and env.get_reward() == pytest.approx(1.1)
    assert env.calc(expression="1+1") == "The episode has ended." and env.calls == 2


@pytest.fixture(scope="module")
def untrained(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, type, Path]:
    """The recipe's tiny model (a narrow shape: only its tokenizer and template matter here), no warm start."""
    from agentgym.models.tiny import TinyModelConfig

    suite = load_suite("games-calc")
    env_class = recipe.trl_environment(suite.env_id, suite.train, suite.env_kwargs, {"tool_call": 0.1})
    shape = TinyModelConfig(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=2, intermediate_size=32)
    path = recipe.build_model(tmp_path_factory.mktemp("trl") / "model", suite, env_class, bc_steps=0, config=shape)
    return suite, env_class, path


def test_warm_start_demonstrations_are_token_for_token_what_trl_renders(untrained: tuple, tmp_path: Path) -> None:
    """The demonstrations the warm start clones are the sequences TRL builds in its own rollouts: its first prompt
    (TRL's ``_tokenize_prompts``), the demonstrated actions, TRL's tool-result ids (``_get_tool_suffix_ids``)
    between them; and TRL's response parser reads each demonstrated action as the env's tool call."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import parse_response

    suite, env_class, path = untrained
    tokenizer = AutoTokenizer.from_pretrained(path)
    demos = recipe.demonstrations(suite, env_class, tokenizer, 6)
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                      use_cpu=True, report_to="none", save_strategy="no", bf16=False)
    trainer = GRPOTrainer(model=str(path), args=args, environment_factory=env_class,
                          train_dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": ""}],
                                                            "task_id": suite.train[0].id, "seed": 0}] * 2))
    trainer._batch_environments = [None]
    kinds = set()
    for demo in demos:
        prompt = [{"role": "user", "content": "" + demo.turns[0].observation}]  # TRL appends reset()'s observation
        ids = [int(i) for i in trainer._tokenize_prompts([prompt])[0][0]]
        assert list(demo.turns[0].prompt_token_ids) == ids
        for turn, after in zip(demo.turns, [*demo.turns[1:], None]):
            action = list(turn.action_token_ids)
            call = parse_response(trainer._tokenizer, action, prefix=ids, tools=recipe.tool_schemas(env_class))
            name = call["tool_calls"][0]["function"]["name"]
            kinds.add(name)
            assert f'"{name}"' in turn.action
            ids += action
            if after is not None:  # the env's result as TRL appends it: a tool message, rendered by the template
                suffix = trainer._get_tool_suffix_ids([{"role": "tool", "name": name, "content": after.observation}])
                assert list(after.prompt_token_ids) == suffix
                ids += suffix
    assert kinds == {"calc", "answer"}
    assert any(d.outcome["success"] for d in demos) and not all(d.outcome["success"] for d in demos)  # half skip


def test_warm_start_refuses_demonstrations_prompted_unlike_trl(untrained: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe compares one demonstration's prompt ids with TRL's before cloning: prompted another way (the env's
    instructions as the system message), it stops with the reason instead of cloning a format TRL never shows."""
    from transformers import AutoTokenizer

    suite, env_class, path = untrained
    config = recipe.trl_format_rollout_config
    monkeypatch.setattr(recipe, "trl_format_rollout_config", lambda **kw: config(**{**kw, "system_prompt": None}))
    with pytest.raises(ValueError, match="differs from TRL's"):
        recipe.demonstrations(suite, env_class, AutoTokenizer.from_pretrained(path), 2)


BC_STEPS = 600  # the recipe's warm start (200 steps solved nothing); the run is reduced to 1 GRPO step, 30 evals


@pytest.mark.slow
def test_trl_grpo_trains_a_tiny_model_on_an_agentgym_env_with_multi_turn_tool_calls(tmp_path: Path) -> None:
    torch.set_num_threads(1)  # a 2-layer model on a shared 2-core machine: one thread is several times faster
    trainer = recipe.train(tmp_path, steps=1, bc_steps=BC_STEPS, num_generations=4, prompts_per_step=2,
                           eval_tasks=30)
    summary = trainer.summary
    # the warm start solves held-out questions in TRL's format: the env's own outcome (its success), not the shaping
    assert summary["success_before"] > 0
    assert summary == json.loads((tmp_path / "summary.json").read_text(encoding="utf-8"))
    assert len(summary["rollout_success"]) == 1 and 0 <= summary["rollout_success"][0] <= 1
    log = trainer.state.log_history[0]
    envs = trainer.environments
    # TRL's own loop parsed tool calls from the model's text, ran them in the agentgym env, and generated again
    assert log["tools/call_frequency"] > 0
    assert any(e.calls >= 1 for e in envs)
    # the rewards TRL optimised are the env's (get_reward of each rollout's env instance)
    assert log["rewards/Calculator_v0/mean"] == pytest.approx(sum(e.get_reward() for e in envs) / len(envs), abs=1e-4)
    assert log["reward_std"] > 0
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    changed = [n for (n, a), (_, b) in zip(start.named_parameters(), trainer.model.named_parameters())
               if not torch.equal(a, b.detach().cpu())]
    # GRPO's advantages are rewards minus their group's mean: a step whose every group scored alike has no gradient
    # (the warm-started model often solves or misses a question in all 4 of its rollouts)
    assert bool(changed) == (log["frac_reward_zero_std"] < 1), "TRL's GRPO step and its advantages disagree"
    # the trained model is kept, as a model directory transformers loads, with the weights TRL trained
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "trained")
    trained = dict(trainer.model.named_parameters())
    assert all(torch.equal(p, trained[n].detach().cpu()) for n, p in saved.named_parameters())
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    assert AutoTokenizer.from_pretrained(tmp_path / "trained").chat_template == qwen2_5_chat_template
