"""An agent program written only against the ``openai`` package: it plays one env session through the agentgym
recording gateway (``agentgym serve MODEL --record DIR``), which records its calls token-exactly for training.

    python examples/gateway_agent.py http://127.0.0.1:8000/s/<session>/<token>/v1

The base URL is the one ``POST /v1/sessions`` returns: it names the session and carries its token; the env is played by the gateway (``/env/reset``, ``/env/step``), reached
with the client's generic ``post``. Nothing here imports agentgym.
"""

from __future__ import annotations

import sys
from typing import Any

import openai


def play(base_url: str, *, max_turns: int = 8, max_tokens: int = 24, temperature: float = 1.0) -> dict[str, Any]:
    """Play one episode: the first observation as the user message, each reply as the action, until done."""
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=2, timeout=120) as client:
        model = client.models.list().data[0].id
        start = client.post("/env/reset", body={}, cast_to=object)
        messages: list[dict[str, str]] = [{"role": "user", "content": start["observation"]}]
        result: dict[str, Any] = {"done": False}
        for _ in range(max_turns):
            reply = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                   temperature=temperature)
            action = reply.choices[0].message.content or ""
            result = client.post("/env/step", body={"action": action}, cast_to=object)
            if result["done"]:
                break
            messages += [{"role": "assistant", "content": action}, {"role": "user", "content": result["observation"]}]
        return result


if __name__ == "__main__":
    outcome = play(sys.argv[1]).get("outcome") or {}
    print(f"success={outcome.get('success')} score={outcome.get('score')}")
