"""End-to-end rollouts with real token-level policies: exact loss masks, and server/in-process parity.

The loss-mask contract: with the tiny model's real tokenizer and chat template, the tokens under mask 1
are exactly the sampled action tokens (they decode to the assistant turns), no observation or template
token is under mask 1, and the whole sequence decodes to what the chat template renders for the
conversation. ``OpenAIPolicy`` must pass the same rollout test through ``agentgym serve`` on 127.0.0.1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from agentgym.models.tiny import TinyModelConfig, build_tiny_model  # noqa: E402
from agentgym.policies import Policy, ReferencePolicy, SamplingParams  # noqa: E402
from agentgym.policies.hf import HFPolicy  # noqa: E402
from agentgym.rollout import RolloutConfig, RolloutEngine, episodes_for_suite  # noqa: E402
from agentgym.registration.suites import load_suite  # noqa: E402
from agentgym.trajectory import Trajectory  # noqa: E402

SYSTEM = "Solve the task with the tools."
SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, intermediate_size=128)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", config=SMALL)


@pytest.fixture(scope="module")
def hf_policy(model_dir: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(model_dir)


def _rollout(policy: Policy, *, temperature: float, limit: int = 4, group_size: int = 2) -> list[Trajectory]:
    suite = load_suite("games-calc")
    specs = episodes_for_suite(suite, "test", limit=limit, group_size=group_size)
    config = RolloutConfig(sampling=SamplingParams(max_tokens=12, temperature=temperature, seed=0),
                           system_prompt=SYSTEM, max_in_flight=16)
    return RolloutEngine(policy, config).run(specs)


def _messages_up_to(traj: Trajectory, n_turns: int, tokenizer: Any) -> list[dict[str, str]]:
    """The conversation as chat messages, with assistant content exactly as sampled (special tokens kept)."""
    messages = [{"role": "system", "content": SYSTEM}]
    for i, turn in enumerate(traj.turns[:n_turns]):
        messages.append({"role": "user", "content": turn.observation})
        ids = list(turn.action_token_ids or ())
        if ids and ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>"):
            ids = ids[:-1]
        messages.append({"role": "assistant", "content": tokenizer.decode(ids, skip_special_tokens=False)})
    return messages


def assert_exact_token_view(trajectories: list[Trajectory], tokenizer: Any) -> None:
    """The checks of the loss-mask contract, for any token-level policy."""
    assert trajectories and all(t.error is None for t in trajectories), [t.error for t in trajectories]
    for traj in trajectories:
        assert traj.has_tokens
        view = traj.token_view()
        masked = [tok for tok, m in zip(view.input_ids, view.loss_mask) if m]
        assert masked == [tok for turn in traj.turns for tok in turn.action_token_ids]
        for i, turn in enumerate(traj.turns):
            # the sampled ids decode to the action text the env received
            assert tokenizer.decode(list(turn.action_token_ids), skip_special_tokens=True) == turn.action
            # everything placed before an action is unmasked and carries the observation
            prompt_text = tokenizer.decode(list(turn.prompt_token_ids), skip_special_tokens=False)
            assert turn.observation in prompt_text
            assert prompt_text.endswith("<|im_start|>assistant\n")
            # the whole sequence up to this action is exactly what the chat template renders
            rendered = tokenizer.apply_chat_template(_messages_up_to(traj, i, tokenizer) + [
                {"role": "user", "content": turn.observation}], tokenize=False, add_generation_prompt=True)
            prefix_len = sum(len(t.prompt_token_ids) + len(t.action_token_ids) for t in traj.turns[:i])
            prefix_len += len(turn.prompt_token_ids)
            assert tokenizer.decode(list(view.input_ids[:prefix_len]), skip_special_tokens=False) == rendered
        # the observation after the last action is recorded, rendered as the next prompt would be
        assert traj.final_observation is not None
        final_ids = list(traj.metadata["final_prompt_token_ids"])
        rendered = tokenizer.apply_chat_template(_messages_up_to(traj, len(traj.turns), tokenizer) + [
            {"role": "user", "content": traj.final_observation}], tokenize=False, add_generation_prompt=True)
        assert tokenizer.decode(list(view.input_ids) + final_ids, skip_special_tokens=False) == rendered


def test_loss_mask_is_exact_for_clean_actions(hf_policy: HFPolicy) -> None:
    """Reference actions (encoded + <|im_end|>): mask-1 tokens decode to exactly the assistant turns."""
    tokenizer = hf_policy.tokenizer
    trajectories = _rollout(ReferencePolicy(tokenizer=tokenizer), temperature=0.0)
    assert all(t.success for t in trajectories)
    assert_exact_token_view(trajectories, tokenizer)
    for traj in trajectories:
        view = traj.token_view()
        segments: list[list[int]] = [[]]
        for tok, m in zip(view.input_ids, view.loss_mask):
            if m:
                segments[-1].append(tok)
            elif segments[-1]:
                segments.append([])
        segments = [s for s in segments if s]
        decoded = [tokenizer.decode(s, skip_special_tokens=False) for s in segments]
        assert decoded == [turn.action + "<|im_end|>" for turn in traj.turns]
        assert len(traj.turns) == 2 and traj.num_tool_calls == 2


def test_hf_policy_rollout_has_exact_token_view(hf_policy: HFPolicy) -> None:
    trajectories = _rollout(hf_policy, temperature=1.0)
    assert_exact_token_view(trajectories, hf_policy.tokenizer)
    for traj in trajectories:
        for turn in traj.turns:
            assert len(turn.action_logprobs) == len(turn.action_token_ids) == len(turn.action_entropies)
            assert all(lp <= 0.0 for lp in turn.action_logprobs)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Any:
    """``agentgym serve MODEL_DIR`` as a user runs it: a separate process on 127.0.0.1."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentgym.cli", "serve", str(model_dir), "--port", str(port),
                             "--model-name", "tiny"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.time() + 120
    while True:
        try:
            if httpx.get(base_url + "/models", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError(f"agentgym serve did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    yield base_url
    proc.terminate()
    proc.wait(timeout=30)


def test_openai_policy_passes_the_same_rollout_test_through_agentgym_serve(
    served: str, model_dir: Path, hf_policy: HFPolicy
) -> None:
    from agentgym.policies.openai import OpenAIPolicy

    policy = OpenAIPolicy(base_url=served, model="tiny", mode="completions", tokenizer=str(model_dir))
    try:
        remote = _rollout(policy, temperature=1.0)
        assert_exact_token_view(remote, policy.tokenizer)
        # Greedy decoding: the served model and the in-process model act identically, token for token.
        remote_greedy = _rollout(policy, temperature=0.0, group_size=1)
    finally:
        policy.close()
    local_greedy = _rollout(hf_policy, temperature=0.0, group_size=1)
    assert [[t.action_token_ids for t in traj.turns] for traj in remote_greedy] == [
        [t.action_token_ids for t in traj.turns] for traj in local_greedy
    ]
    for r, loc in zip(remote_greedy, local_greedy):
        for a, b in zip(r.turns, loc.turns):
            assert a.action_logprobs == pytest.approx(b.action_logprobs, abs=1e-4)
