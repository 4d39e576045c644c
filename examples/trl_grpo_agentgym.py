"""TRL recipe: TRL's own ``GRPOTrainer`` trains a model on an agentgym env with multi-turn tool use.

TRL (>= 1.0) runs the multi-turn tool loop itself through ``environment_factory``: an environment class whose
public methods are tools, ``reset(**row)`` that returns the first observation, and ``get_reward()``. This file
bridges any agentgym env to that contract: :func:`trl_environment` builds such a class from the env's tool schemas
(each method forwards its call to the agentgym env as a Hermes ``<tool_call>``, so the env's own parser, tools
and rewards run), and the reward TRL optimises is the env's reward for the episode. TRL parses tool calls with
the tokenizer's response schema, which it knows for the chat templates of the families it supports (Qwen 2.5/3,
Llama 3, ...); the built-in tiny model therefore gets TRL's Qwen 2.5 template here.

    python examples/trl_grpo_agentgym.py --out runs/trl    # builds a tiny model, BC warm start, 2 GRPO steps

Runs on a CPU in one to two minutes (one torch thread is fastest on a busy 2-core machine). With a real model,
pass ``--model DIR`` (a Qwen 2.5 / Qwen 3 checkpoint, used as it is: no tiny model, no warm start).
"""

from __future__ import annotations

import argparse
import inspect
import json
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

import agentgym  # noqa: F401 - registers the env ids
from agentgym.suite import Task
from agentgym.registration.suites import load_suite

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}


def _tool_method(schema: Mapping[str, Any]) -> Callable[..., str]:
    """A method with the tool's name, typed keyword parameters and a Google docstring (what TRL reads through
    transformers' ``get_json_schema`` to show the tool to the model); calling it steps the env with the call."""
    name, params = schema["name"], schema.get("parameters") or {}
    properties: Mapping[str, Any] = params.get("properties") or {}
    required = set(params.get("required") or ())

    def method(self: Any, **arguments: Any) -> str:
        return self._call(name, arguments)

    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for pname, spec in properties.items():
        # a union (``anyOf``) is shown as its first member: transformers' schema reader takes one Python type
        first = spec.get("type") or next((str(o.get("type")) for o in spec.get("anyOf") or () if o.get("type")), None)
        kind = _JSON_TYPES.get(str(first), str)
        annotations[pname] = kind
        parameters.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, annotation=kind,
                                            default=inspect.Parameter.empty if pname in required else None))
    annotations["return"] = str
    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    args = "".join(f"\n    {p}: {(s.get('description') or p)}" for p, s in properties.items())
    method.__doc__ = f"{schema.get('description') or name}\n\nArgs:{args}\n\nReturns:\n    The env's observation."
    return method


def trl_environment(env_id: str, tasks: Sequence[Task], env_kwargs: Mapping[str, Any] | None = None,
                    step_rewards: Mapping[str, float] | None = None) -> type:
    """A TRL ``environment_factory`` class for ``env_id`` (one instance per rollout, reset per episode).

    ``reset(task_id=..., seed=...)`` takes the dataset row's columns and starts that task; every tool of the env is
    a method; ``get_reward()`` is the episode's env reward so far (the outcome once the episode ended) plus, per
    turn, ``step_rewards[kind]`` for the kind the env gave the turn (``tool_call``, ``answer``, ``void``,
    ``invalid``): the same shaping as agentgym's own GRPO ``step_rewards`` (D-RA). A call after the episode ended is
    answered, not run (TRL may keep generating until its own limits).
    """
    probe = gym.make(env_id, **dict(env_kwargs or {}))
    try:
        _, info = probe.reset(seed=0, options={"task": tasks[0]})
        schemas = [t["function"] for t in info["tools"]]
    finally:
        probe.close()
    by_id = {t.id: t for t in tasks}

    class AgentgymEnvironment:
        def __init__(self) -> None:
            self.env = gym.make(env_id, **dict(env_kwargs or {}))
            self.reward, self.done, self.calls, self.kinds = 0.0, False, 0, []

        def reset(self, task_id: str, seed: int = 0, **_: Any) -> str:
            observation, _info = self.env.reset(seed=int(seed), options={"task": by_id[task_id]})
            self.reward, self.done, self.calls, self.kinds = 0.0, False, 0, []
            return str(observation)

        def _call(self, name: str, arguments: Mapping[str, Any]) -> str:
            if self.done:
                return "The episode has ended."
            self.calls += 1
            action = "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}) + "</tool_call>"
            observation, reward, terminated, truncated, info = self.env.step(action)
            kind = str((info.get("turn") or {}).get("kind", ""))
            self.kinds.append(kind)
            self.reward += float(reward) + float((step_rewards or {}).get(kind, 0.0))
            self.done = bool(terminated or truncated)
            return str(observation)

        def get_reward(self) -> float:
            return self.reward

    for schema in schemas:
        setattr(AgentgymEnvironment, schema["name"], _tool_method(schema))
    AgentgymEnvironment.__name__ = AgentgymEnvironment.__qualname__ = env_id.split("/")[-1].replace("-", "_")
    return AgentgymEnvironment


# ---- the tiny model: TRL's Qwen 2.5 template and a behaviour-cloning warm start ---------------------------------
def demonstrations(suite: Any, count: int, tools: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """Episodes as chats in the tool-calling format of the template: half are reference episodes (calc, its result,
    answer), half skip the tool and answer a rounded guess (wrong), as in the quickstart's warm start, so the cloned
    policy sometimes uses the tool and sometimes not, and GRPO has something to choose between."""
    from agentgym.envs.games.calculator import evaluate

    chats = []
    for i, task in enumerate(suite.train[:count]):
        expression = task.prompt.removeprefix("What is ").removesuffix("?")
        value = evaluate(expression)

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return {"role": "assistant", "content": "",
                    "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}

        if i % 2:
            a, b = (int(x) for x in expression.split("*"))
            chats.append([{"role": "user", "content": task.prompt}, call("answer", {"value": round(a, -1) * b})])
            continue
        chats.append([{"role": "user", "content": task.prompt}, call("calc", {"expression": expression}),
                      {"role": "tool", "name": "calc", "content": f"{expression} = {value}"},
                      call("answer", {"value": value})])
    return chats


def build_model(out: Path, suite: Any, tools: Sequence[Mapping[str, Any]], *, bc_steps: int, seed: int = 0,
                bc_demos: int = 64, bc_batch_size: int = 4, bc_learning_rate: float = 1e-2,
                hidden_size: int = 64, num_layers: int = 2) -> Path:
    """A from-config tiny model whose tokenizer speaks TRL's Qwen 2.5 template, cloned on reference episodes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from jinja2 import Template

    from agentgym.models.tiny import TinyModelConfig, build_tiny_model

    chats = demonstrations(suite, bc_demos, tools)
    # the tokenizer learns the template's boilerplate (tool schemas in the system prompt) so prompts stay short
    template = Template(qwen2_5_chat_template)
    corpus = [template.render(messages=c, tools=tools, add_generation_prompt=False) for c in chats]
    config = TinyModelConfig(hidden_size=hidden_size, num_layers=num_layers, num_heads=2, num_kv_heads=2,
                             intermediate_size=2 * hidden_size, vocab_size=1024, seed=seed)
    path = build_tiny_model(out, texts=corpus * 4, config=config)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(path)
    if bc_steps:
        model = AutoModelForCausalLM.from_pretrained(path)
        def length(messages: list[dict[str, Any]], generation_prompt: bool) -> int:
            return len(tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False,
                                                     add_generation_prompt=generation_prompt))

        # the loss is on the assistant replies only (not the shared system prompt, the question or tool results)
        examples = []
        for chat in chats:
            ids = tokenizer.apply_chat_template(chat, tools=tools, tokenize=True, return_dict=False)
            labels = [-100] * len(ids)
            for i, message in enumerate(chat):
                if message["role"] == "assistant":
                    start, end = length(chat[:i], True), length(chat[: i + 1], False)
                    labels[start:end] = ids[start:end]
            examples.append((ids, labels))
        optimizer = torch.optim.AdamW(model.parameters(), lr=bc_learning_rate)
        rng = random.Random(seed)
        model.train()
        for _ in range(bc_steps):
            batch = rng.sample(examples, min(bc_batch_size, len(examples)))
            width = max(len(ids) for ids, _ in batch)
            ids = torch.tensor([list(b) + [tokenizer.pad_token_id] * (width - len(b)) for b, _ in batch])
            labels = torch.tensor([list(lab) + [-100] * (width - len(lab)) for _, lab in batch])
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.save_pretrained(path)
    return path


def train(out: Path, *, model: str | None = None, steps: int = 2, bc_steps: int = 300, num_generations: int = 4,
          prompts_per_step: int = 2, max_completion_length: int = 128, seed: int = 0,
          step_rewards: Mapping[str, float] | None = None) -> Any:
    """Run TRL's GRPO on games-calc's Calculator; returns the trainer (its ``environments`` and log history).

    The trained model is saved to ``out / "trained"`` (:func:`save_trained`)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    suite = load_suite("games-calc")
    env_class = trl_environment(suite.env_id, suite.train, suite.env_kwargs,
                                {"tool_call": 0.1} if step_rewards is None else step_rewards)
    probe = env_class()
    tools = [{"type": "function", "function": schema} for schema in _schemas(probe)]
    model_dir = Path(model) if model else build_model(out / "model", suite, tools, bc_steps=bc_steps, seed=seed)
    rows = [{"prompt": [{"role": "user", "content": ""}], "task_id": t.id, "seed": i}
            for i, t in enumerate(suite.train[100:100 + steps * prompts_per_step])]
    args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=steps, per_device_train_batch_size=prompts_per_step
                      * num_generations, num_generations=num_generations, max_completion_length=max_completion_length,
                      max_tool_calling_iterations=3, learning_rate=1e-3, temperature=1.0, beta=0.0, use_cpu=True,
                      logging_steps=1, report_to="none", save_strategy="no", seed=seed, shuffle_dataset=False,
                      dataloader_num_workers=0, bf16=False)
    trainer = GRPOTrainer(model=str(model_dir), args=args, train_dataset=Dataset.from_list(rows),
                          environment_factory=env_class)
    trainer.train()
    save_trained(trainer, out / "trained")
    return trainer


def save_trained(trainer: Any, path: Path) -> Path:
    """Save the GRPO-trained model with its tokenizer (chat template included) as a Hugging Face model directory,
    loadable with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (or
    ``agentgym eval --policy hf:PATH``). ``save_strategy="no"`` keeps TRL from writing checkpoints during the
    run; this is the one copy that is kept."""
    trainer.save_model(str(path))
    trainer.processing_class.save_pretrained(str(path))
    return path


def _schemas(environment: Any) -> list[dict[str, Any]]:
    from transformers.utils import get_json_schema

    return [get_json_schema(getattr(environment, name))["function"] for name, _ in
            inspect.getmembers(type(environment), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/trl")
    parser.add_argument("--model", default=None, help="a model directory (default: build the tiny model)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bc-steps", type=int, default=300)
    args = parser.parse_args(argv)
    trainer = train(Path(args.out), model=args.model, steps=args.steps, bc_steps=args.bc_steps)
    for entry in trainer.state.log_history:
        print({k: v for k, v in entry.items() if "reward" in k or "tool" in k or k in ("loss", "step")})
    print(f"trained model: {Path(args.out) / 'trained'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
