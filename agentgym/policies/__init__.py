"""Policies: wrappers that turn a model (or a script) into an agent.

Heavy backends are imported lazily: ``from agentgym.policies import HFPolicy`` imports torch only then.
"""

from __future__ import annotations

from typing import Any

from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.policies.scripted import ReferencePolicy, ScriptedPolicy
from agentgym.utils.lazy import lazy_attributes

__all__ = [
    "Generation", "GenerationRequest", "HFPolicy", "OpenAIPolicy", "Policy", "ReferencePolicy",
    "SamplingParams", "ScriptedPolicy", "VLLMPolicy", "make_policy",
]

__getattr__, __dir__ = lazy_attributes(__name__, {
    "HFPolicy": "agentgym.policies.hf",
    "OpenAIPolicy": "agentgym.policies.openai",
    "VLLMPolicy": "agentgym.policies.vllm",
})


def make_policy(spec: str, **kwargs: Any) -> Policy:
    """Build a policy from a CLI spec string.

    Specs: ``reference`` (each env's solver), ``hf:MODEL``, ``vllm:MODEL`` (an in-process vLLM
    engine; needs a CUDA GPU and ``agentgym[vllm]``), ``openai:BASE_URL[#MODEL]``
    (e.g. ``openai:http://127.0.0.1:8000/v1#tiny``). ``MODEL`` is a local model directory or a Hub id
    (``org/name[@revision]``) already in the local Hugging Face cache; nothing is downloaded.
    """
    from agentgym.errors import ConfigError, did_you_mean

    kind, _, rest = spec.partition(":")
    if kind == "reference":
        return ReferencePolicy(**kwargs)
    if kind == "hf":
        if not rest:
            raise ConfigError("Policy spec 'hf:' needs a model directory or cached Hub id, e.g. hf:runs/tiny/model.")
        from agentgym.policies.hf import HFPolicy

        return HFPolicy.from_pretrained(rest, **kwargs)
    if kind == "vllm":
        if not rest:
            raise ConfigError("Policy spec 'vllm:' needs a model directory or cached Hub id, e.g. "
                              "vllm:runs/tiny/model.")
        from agentgym.policies.vllm import VLLMPolicy

        return VLLMPolicy(rest, **kwargs)
    if kind == "openai":
        if not rest:
            raise ConfigError("Policy spec 'openai:' needs a base URL, e.g. openai:http://127.0.0.1:8000/v1#model.")
        from agentgym.policies.openai import OpenAIPolicy

        base_url, _, model = rest.partition("#")
        return OpenAIPolicy(base_url=base_url, model=model or None, **kwargs)
    raise ConfigError(
        f"Unknown policy spec {spec!r}.{did_you_mean(kind, ['reference', 'hf', 'vllm', 'openai'])} "
        "Use reference, hf:MODEL, vllm:MODEL (MODEL: a directory or cached Hub id) or openai:BASE_URL[#MODEL]."
    )
