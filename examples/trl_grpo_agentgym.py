"""TRL recipe: TRL's own ``GRPOTrainer`` trains a model on an agentgym env with multi-turn tool use.

TRL (>= 1.0) runs the multi-turn tool loop itself through ``environment_factory``: an environment class whose
public methods are tools, ``reset(**row)`` that returns the first observation, and ``get_reward()``. This file
bridges any agentgym env to that contract: :func:`trl_environment` builds such a class from the env's tool schemas
(each method forwards its call to the agentgym env as a Hermes ``<tool_call>``, so the env's own parser, tools
and rewards run), and the reward TRL optimises is the env's reward for the episode. TRL parses tool calls with
the tokenizer's response schema, which it knows for the chat templates of the families it supports (Qwen 2.5/3,
Llama 3, ...); the built-in tiny model therefore gets TRL's Qwen 2.5 template here.

    python examples/trl_grpo_agentgym.py --out runs/trl    # tiny model, BC warm start, 2 GRPO steps, evals

The tiny model is the quickstart's (a tokenizer trained on the suite's text) warm-started as the quickstart does
(``trainers.bc`` on 200 reference episodes, half of them skipping the tool, 600 steps), with the episodes
rendered token for token as TRL renders its prompts (checked before cloning). The recipe prints and writes to
``OUT/summary.json`` the held-out success of the warm-started and of the GRPO-trained model (greedy, the env's
own outcome) and the share of TRL's rollouts that solved their task; the trained model goes to ``OUT/trained``.
With a real model, pass ``--model DIR`` (a Qwen 2.5 / Qwen 3 checkpoint, used as it is: no tiny model, no warm
start).
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import time
from dataclasses import replace
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
            self.reward, self.done, self.calls, self.kinds, self.solved = 0.0, False, 0, [], False

        def reset(self, task_id: str, seed: int = 0, **_: Any) -> str:
            observation, _info = self.env.reset(seed=int(seed), options={"task": by_id[task_id]})
            self.reward, self.done, self.calls, self.kinds, self.solved = 0.0, False, 0, [], False
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
            self.solved = self.solved or bool((info.get("outcome") or {}).get("success", False))
            return str(observation)

        def get_reward(self) -> float:
            return self.reward

    for schema in schemas:
        setattr(AgentgymEnvironment, schema["name"], _tool_method(schema))
    AgentgymEnvironment.__name__ = AgentgymEnvironment.__qualname__ = env_id.split("/")[-1].replace("-", "_")
    return AgentgymEnvironment


# ---- the tiny model: the quickstart's model and warm start, in TRL's prompt format ---------------------------------
# TRL renders the first prompt with the Qwen 2.5 template and the bridge's tool schemas, then appends the model's
# own ids and each tool result's ids. The warm start clones reference episodes rendered the same way: agentgym's
# engine plays them with observations in the ``tool`` role, the bridge's schemas as the template's tools, and the
# reference solver's calls written as the template writes a tool call; ``trainers.bc`` then clones them.
def tool_schemas(env_class: type) -> list[dict[str, Any]]:
    """The tools TRL shows the model for ``env_class``, as chat-template tool dicts (its methods, read by
    transformers' ``get_json_schema``, in TRL's order)."""
    from transformers.utils import get_json_schema

    return [get_json_schema(getattr(env_class, name)) for name, _ in
            inspect.getmembers(env_class, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")]


class _TrlToolsEnv(gym.Wrapper):  # type: ignore[type-arg]
    """The agentgym env with ``info["tools"]`` replaced by the bridge's schemas, so the engine's chat template
    renders the same tools block TRL renders (the env's own schemas differ in key order and unions)."""

    def __init__(self, env_id: str, tools: Sequence[Mapping[str, Any]], **kwargs: Any) -> None:
        super().__init__(gym.make(env_id, disable_env_checker=True, **kwargs))
        self._tools = [dict(t) for t in tools]

    def reset(self, **kwargs: Any) -> Any:
        observation, info = self.env.reset(**kwargs)
        return observation, {**info, "tools": self._tools}


def trl_format_env_id(env_id: str, tools: Sequence[Mapping[str, Any]]) -> str:
    """A Gymnasium id for ``env_id`` whose reset shows ``tools`` (registered on first use in this process)."""
    trl_id = "agentgym-trl/" + env_id.split("/")[-1]
    kwargs = {"env_id": env_id, "tools": [dict(t) for t in tools]}
    registered = gym.registry.get(trl_id)
    if registered is None or registered.kwargs != kwargs:
        gym.register(trl_id, entry_point=_TrlToolsEnv, kwargs=kwargs, disable_env_checker=True)
    return trl_id


def tool_call_text(tokenizer: Any, name: str, arguments: Mapping[str, Any]) -> str:
    """An assistant tool call exactly as the tokenizer's chat template writes it after the generation prompt
    (what TRL's response parser reads back from the model's text)."""
    question = [{"role": "user", "content": "?"}]
    call = {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": dict(arguments)}}]}
    head = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(question + [call], tokenize=False)
    if not full.startswith(head) or tokenizer.eos_token not in full[len(head):]:
        raise ValueError("the chat template does not render a tool call after its generation prompt; use a template "
                         "TRL parses tool calls for (Qwen 2.5 / Qwen 3)")
    return full[len(head):].split(tokenizer.eos_token, 1)[0]


def tool_call_reference_policy(tokenizer: Any, *, shortcut_fraction: float, seed: int) -> Any:
    """The suite's reference (and shortcut) solver, its ``calc(E)`` / ``answer(N)`` replies rewritten as the
    template's tool calls, ids ending with EOS (the template's end of turn)."""
    from agentgym.policies import ReferencePolicy
    from agentgym.policies.base import Generation

    class ToolCallReference(ReferencePolicy):
        async def act(self, requests: Sequence[Any]) -> list[Generation]:
            out = []
            for generation in await super().act(requests):
                match = re.fullmatch(r"\s*(calc|answer)\((.*)\)\s*", generation.text, re.S)
                if match is None:
                    raise ValueError(f"unexpected reference reply {generation.text!r} (expected calc(E) or answer(N))")
                name, argument = match.groups()
                text = tool_call_text(tokenizer, name, {"expression": argument} if name == "calc"
                                      else {"value": int(argument)})
                ids = tuple(tokenizer.encode(text, add_special_tokens=False)) + (int(tokenizer.eos_token_id),)
                out.append(Generation(text=text, token_ids=ids))
            return out

    return ToolCallReference(tokenizer=tokenizer, shortcut_fraction=shortcut_fraction, seed=seed)


def trl_format_rollout_config(**overrides: Any) -> Any:
    """Engine settings that prompt as TRL does: no system message (the template's default one, with the tools),
    observations after the first as ``tool`` results."""
    from agentgym.policies import SamplingParams
    from agentgym.rollout import RolloutConfig

    return RolloutConfig(**{"system_prompt": "", "observation_role": "tool", "deterministic": True,
                            "sampling": SamplingParams(max_tokens=1), **overrides})


def trl_prompt_ids(tokenizer: Any, env_class: type, task: Task, seed: int = 0) -> list[int]:
    """The ids of the first prompt TRL's GRPOTrainer renders for ``task`` (an empty user turn, then ``reset``'s
    observation appended to it, rendered with the env's methods as tools and the generation prompt)."""
    environment = env_class()
    try:
        observation = environment.reset(task_id=task.id, seed=seed)
    finally:
        environment.env.close()
    methods = [getattr(environment, name) for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)
               if not name.startswith("_") and name not in ("reset", "get_reward")]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "" + observation}], tools=methods,
                                        add_generation_prompt=True, tokenize=True, return_dict=False)
    return [int(i) for i in ids]


def demonstrations(suite: Any, env_class: type, tokenizer: Any, count: int, *, shortcut_fraction: float = 0.5,
                   seed: int = 0) -> list[Any]:
    """Reference episodes on the first ``count`` training tasks (``shortcut_fraction`` of them skip the tool and
    answer a near miss, as in the quickstart's warm start), recorded by agentgym's engine in TRL's format.

    Raises:
        ValueError: If a demonstration's first prompt differs from the one TRL renders for its task (the clone
            would learn from prompts it never sees).
    """
    from agentgym.rollout import EpisodeSpec, RolloutEngine

    env_id = trl_format_env_id(suite.env_id, tool_schemas(env_class))
    tasks = suite.train[:count]
    specs = [EpisodeSpec(env_id, task=t, seed=seed + i, env_kwargs=dict(suite.env_kwargs)) for i, t in enumerate(tasks)]
    policy = tool_call_reference_policy(tokenizer, shortcut_fraction=shortcut_fraction, seed=seed)
    demos = [d for d in RolloutEngine(policy, trl_format_rollout_config(progress=False)).run(specs)
             if d.error is None and d.has_tokens]
    if not demos:
        raise ValueError(f"no demonstration of {suite.name} finished; check its reference solver")
    first = demos[0]
    task = next(t for t in tasks if t.id == first.task_id)
    if list(first.turns[0].prompt_token_ids or ()) != trl_prompt_ids(tokenizer, env_class, task, first.seed or 0):
        raise ValueError("the demonstrations' prompt differs from TRL's: the warm start would clone another format")
    return demos


def build_model(out: Path, suite: Any, env_class: type, *, bc_steps: int = 600, bc_demos: int = 200,
                bc_shortcut_fraction: float = 0.5, bc_batch_size: int = 32, bc_learning_rate: float = 1e-3,
                seed: int = 0, config: Any = None) -> Path:
    """The quickstart's tiny model (tokenizer trained on the suite's text) with TRL's Qwen 2.5 template,
    warm-started by ``trainers.bc`` on :func:`demonstrations` with the quickstart's settings.

    The template's system turn (its default system line and the tools block, the same in every prompt) is one
    added token: spelled out it is about 300 tokens, which would make each BC step several times slower than the
    rest of the episode costs; as one token the prompts are as short as the quickstart's."""
    import torch
    from tokenizers import AddedToken
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from agentgym.models.tiny import IM_END, IM_START, TinyModelConfig, build_tiny_model
    from agentgym.trainers.bc import behaviour_clone
    from agentgym.trainers.tiny_model import demonstration_texts

    path = build_tiny_model(out, texts=demonstration_texts(suite.name, 500), config=config or TinyModelConfig(seed=seed))
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.padding_side = "left"
    system_turn = tokenizer.decode(trl_prompt_ids(tokenizer, env_class, suite.train[0]))
    system_turn = system_turn.removeprefix(IM_START).split(IM_END, 1)[0]
    tokenizer.add_tokens([AddedToken(system_turn, normalized=False, special=False)])
    model = AutoModelForCausalLM.from_pretrained(path)
    model.resize_token_embeddings(len(tokenizer))
    tokenizer.save_pretrained(path)
    if bc_steps:
        demos = demonstrations(suite, env_class, tokenizer, bc_demos, shortcut_fraction=bc_shortcut_fraction,
                               seed=seed)
        behaviour_clone(model, tokenizer, demos, steps=bc_steps, learning_rate=bc_learning_rate,
                        batch_size=bc_batch_size, seed=seed, progress=False, threads=torch.get_num_threads())
    model.save_pretrained(path)
    return path


def success_rate(model_dir: Path, suite: Any, env_class: type, *, tasks: int = 50) -> float:
    """Greedy held-out success (the env's own outcome, no shaping) of a model on the suite's first ``tasks`` test
    questions, prompted as TRL prompts (:func:`trl_format_rollout_config`)."""
    from agentgym.policies import HFPolicy, SamplingParams
    from agentgym.rollout import RolloutEngine, episodes_for_suite, summarize

    env_id = trl_format_env_id(suite.env_id, tool_schemas(env_class))
    specs = [replace(s, env_id=env_id) for s in episodes_for_suite(suite, "test", limit=tasks)]
    config = trl_format_rollout_config(sampling=SamplingParams(max_tokens=48, temperature=0.0), progress=False)
    return float(summarize(RolloutEngine(HFPolicy.from_pretrained(model_dir), config).run(specs))["success_rate"])


def train(out: Path, *, model: str | None = None, steps: int = 2, bc_steps: int = 600, bc_demos: int = 200,
          num_generations: int = 4, prompts_per_step: int = 2, max_completion_length: int = 128, seed: int = 0,
          eval_tasks: int = 50, step_rewards: Mapping[str, float] | None = None) -> Any:
    """Run TRL's GRPO on games-calc's Calculator; returns the trainer (its ``environments``, log history and
    ``summary``, also written to ``out / "summary.json"``).

    The summary holds success read from the env's own outcome (never the shaping): ``success_before`` and
    ``success_after``, greedy held-out success of the warm-started and of the GRPO-trained model on ``eval_tasks``
    test questions prompted as TRL prompts (0 skips both), and ``rollout_success``, per GRPO step the share of
    TRL's own rollouts that solved their task. The trained model is saved to ``out / "trained"``
    (:func:`save_trained`)."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    started = time.perf_counter()
    suite = load_suite("games-calc")
    env_class = trl_environment(suite.env_id, suite.train, suite.env_kwargs,
                                {"tool_call": 0.1} if step_rewards is None else step_rewards)
    model_dir = Path(model) if model else build_model(out / "model", suite, env_class, bc_steps=bc_steps,
                                                      bc_demos=bc_demos, seed=seed)
    summary: dict[str, Any] = {"bc_steps": 0 if model else bc_steps, "bc_demos": 0 if model else bc_demos,
                               "grpo_steps": steps, "eval_tasks": eval_tasks}
    if eval_tasks:
        summary["success_before"] = success_rate(model_dir, suite, env_class, tasks=eval_tasks)
    rows = [{"prompt": [{"role": "user", "content": ""}], "task_id": t.id, "seed": i}  # the last training tasks:
            for i, t in enumerate(suite.train[-steps * prompts_per_step:])]  # never among the demonstrations
    args = GRPOConfig(output_dir=str(out / "grpo"), max_steps=steps, per_device_train_batch_size=prompts_per_step
                      * num_generations, num_generations=num_generations, max_completion_length=max_completion_length,
                      max_tool_calling_iterations=3, learning_rate=1e-3, temperature=1.0, beta=0.0, use_cpu=True,
                      logging_steps=1, report_to="none", save_strategy="no", seed=seed, shuffle_dataset=False,
                      dataloader_num_workers=0, bf16=False)
    rollout_success: list[float] = []

    class RolloutSuccess(TrainerCallback):  # type: ignore[misc]
        """After each step, the share of that step's rollouts (one env instance each) that solved their task."""

        def on_step_end(self, *_: Any, **__: Any) -> None:
            envs = trainer.environments or []
            rollout_success.append(sum(bool(e.solved) for e in envs) / max(1, len(envs)))

    trainer = GRPOTrainer(model=str(model_dir), args=args, train_dataset=Dataset.from_list(rows),
                          environment_factory=env_class, callbacks=[RolloutSuccess()])
    trainer.train()
    save_trained(trainer, out / "trained")
    summary["rollout_success"] = rollout_success
    if eval_tasks:
        summary["success_after"] = success_rate(out / "trained", suite, env_class, tasks=eval_tasks)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    trainer.summary = summary
    return trainer


def save_trained(trainer: Any, path: Path) -> Path:
    """Save the GRPO-trained model with its tokenizer (chat template included) as a Hugging Face model directory,
    loadable with ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained`` (or
    ``agentgym eval --policy hf:PATH``). ``save_strategy="no"`` keeps TRL from writing checkpoints during the
    run; this is the one copy that is kept."""
    trainer.save_model(str(path))
    trainer.processing_class.save_pretrained(str(path))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/trl")
    parser.add_argument("--model", default=None, help="a model directory (default: build the tiny model)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--bc-steps", type=int, default=600)
    parser.add_argument("--bc-demos", type=int, default=200)
    parser.add_argument("--eval-tasks", type=int, default=50, help="held-out questions per greedy eval (0: none)")
    args = parser.parse_args(argv)
    from agentgym.utils.cpu_threads import apply_cpu_threads

    apply_cpu_threads()  # as the quickstart: the thread count that suits this machine (AGENTGYM_CPU_THREADS overrides)
    out = Path(args.out)
    trainer = train(out, model=args.model, steps=args.steps, bc_steps=args.bc_steps, bc_demos=args.bc_demos,
                    eval_tasks=args.eval_tasks)
    for entry in trainer.state.log_history:
        print({k: v for k, v in entry.items() if "reward" in k or "tool" in k or k in ("loss", "step")})
    summary = trainer.summary
    if "success_before" in summary:
        print(f"held-out success (greedy, {summary['eval_tasks']} test questions, env outcome): warm start "
              f"{summary['success_before']:.2f} -> after GRPO {summary['success_after']:.2f}")
    print(f"TRL rollouts that solved their task, per GRPO step: {summary['rollout_success']}")
    print(f"summary: {out / 'summary.json'}; trained model: {out / 'trained'}; took {summary['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
