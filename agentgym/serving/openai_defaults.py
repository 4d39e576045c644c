"""What a served model was trained with, published to clients, and the banner ``agentgym serve`` prints when ready.

A model trained here is prompted in a particular way: a system prompt (often none at all), a per-turn token budget
and the tokenizer's chat template. Its trainer writes the first two into the model directory's ``agentgym.json``
(:mod:`agentgym.policies.rollout_defaults`). In-process evaluation reads that file; a client of a server cannot, so
the server publishes it, as an extra ``agentgym`` field on the ``GET /v1/models`` model object (the way vLLM adds
``max_model_len``; OpenAI clients ignore unknown fields) and on ``GET /agentgym/defaults``. Without it a client sends
the env's long instructions and a 256-token budget to a model trained on neither, and every episode ends at the
context limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DEFAULTS_PATH", "PUBLISHED_KEYS", "format_banner", "served_defaults"]

#: The route that returns ``{"model": NAME, "defaults": {...}}``.
DEFAULTS_PATH = "/agentgym/defaults"
#: The ``agentgym.json`` keys a client may apply: anything else in the file stays private.
PUBLISHED_KEYS = ("system_prompt", "max_tokens", "stop", "suite", "constrain_actions")


def served_defaults(model_dir: str | Path | None, policy: Any) -> dict[str, Any]:
    """The defaults to publish for ``policy`` loaded from ``model_dir``.

    Only keys the file holds are published, so ``"system_prompt": null`` ("use each env's instructions") and a
    missing key ("nothing known") stay distinct from ``""`` (an empty system prompt). Added from the model itself:
    ``max_model_len`` (its context, when its config says) and ``chat_template`` (whether its tokenizer has one;
    clients in chat mode rely on the server's rendering).
    """
    found: dict[str, Any] = {}
    if model_dir is not None:
        from agentgym.policies.rollout_defaults import load_rollout_defaults

        found = load_rollout_defaults(model_dir)
    published = {k: found[k] for k in PUBLISHED_KEYS if k in found and _valid(k, found[k])}
    if not published:
        return {}
    from agentgym.serving.openai_generation import _max_model_len

    length = _max_model_len(policy)
    if length is not None:
        published["max_model_len"] = length
    tokenizer = getattr(policy, "tokenizer", None)
    published["chat_template"] = bool(getattr(tokenizer, "chat_template", None))
    return published


def _valid(key: str, value: Any) -> bool:
    """A hand-edited ``agentgym.json`` must not make the server publish what no client could apply."""
    if key == "system_prompt":
        return value is None or isinstance(value, str)
    if key == "max_tokens":
        return isinstance(value, int) and not isinstance(value, bool) and value > 0
    if key == "stop":
        return isinstance(value, list) and all(isinstance(s, str) and s for s in value)
    if key == "constrain_actions":
        return isinstance(value, bool)
    return isinstance(value, str)


def _shown_prompt(prompt: Any, width: int = 60) -> str:
    if prompt is None:
        return "each env's instructions"
    if prompt == "":
        return "none (empty)"
    text = " ".join(str(prompt).split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _shown_limits(limits: Any) -> str:
    """Per-request limits and the flags that raise them (a dataclass repr names neither)."""
    fields = (("max_body_bytes", "body bytes"), ("max_prompt_chars", "prompt chars"), ("max_n", "n"),
              ("max_request_tokens", "tokens per request"))
    if not all(hasattr(limits, name) for name, _ in fields):
        return str(limits)
    flags = " ".join("--" + name.replace("_", "-") for name, _ in fields)
    return ", ".join(f"{what} {getattr(limits, name)}" for name, what in fields) + f" (raise with {flags})"


def format_banner(*, model_dir: str | Path, name: str, url: str, defaults: Mapping[str, Any], limits: Any,
                  api_key: bool, record_dir: str | Path | None = None, load_s: float | None = None) -> str:
    """The lines ``agentgym serve`` prints once it answers: what is served where, and how to prompt it."""
    loaded = f" (loaded in {load_s:.0f} s)" if load_s is not None else ""
    lines = [f"agentgym serve: {name!r} from {model_dir} is ready{loaded}",
             f"  URL:            {url}/v1   (policy spec: openai:{url}/v1#{name})"]
    if defaults:
        lines.append(f"  system prompt:  {_shown_prompt(defaults.get('system_prompt'))}")
        if "max_tokens" in defaults:
            lines.append(f"  max tokens:     {defaults['max_tokens']} per turn")
        if defaults.get("stop"):
            lines.append(f"  stop:           {defaults['stop']!r}")
        lines.append(f"  published on:   {url}/v1/models and {url}{DEFAULTS_PATH} (agentgym eval applies them)")
    else:
        lines.append("  trained with:   unknown (no agentgym.json in the model directory): clients use their own "
                     "system prompt and max tokens")
    if defaults.get("max_model_len") is not None:
        lines.append(f"  context:        {defaults['max_model_len']} tokens")
    lines.append(f"  limits:         {_shown_limits(limits)}")
    lines.append("  access:         " + ("API key required" if api_key
                                         else "no API key: anyone who reaches the port may use it"))
    if record_dir is not None:
        lines.append(f"  recording to:   {record_dir}")
    return "\n".join(lines)
