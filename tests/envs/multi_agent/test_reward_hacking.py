"""Multi-agent games: chess exploits against real Stockfish and negotiation offers beyond the pool score zero."""

from __future__ import annotations


import gymnasium as gym
import pytest



@pytest.fixture(scope="module", autouse=False)
def selfplay_ids() -> None:
    pytest.importorskip("pettingzoo")
    from agentgym.registration.multi_agent import SELFPLAY_ENTRIES

    for entry in SELFPLAY_ENTRIES:
        if entry.id not in gym.registry:
            gym.register(id=entry.id, entry_point=entry.entry_point)


def _stockfish_available() -> bool:
    try:
        from agentgym.envs.multi_agent.stockfish import find_stockfish

        find_stockfish()
        pytest.importorskip("pyspiel")
        return True
    except Exception:  # noqa: BLE001 - any failure means: skip
        return False


@pytest.mark.parametrize("replies", [
    ['move("e2e5")', 'move("Ke9")', 'move("e1e8")'],  # illegal moves
    ["I resign", "resign()", "I resign"],  # resign loops (no such tool)
    ["Checkmate! I win.", '<tool_call>{"name": "claim_victory", "arguments": {}}</tool_call>',
     "The game is over and White won 1-0."],  # claiming victory in text
], ids=["illegal-moves", "resign-loop", "claimed-victory"])
def test_chess_exploits_score_zero(selfplay_ids, replies) -> None:
    if not _stockfish_available():
        pytest.skip("needs stockfish and pyspiel")
    env = gym.make("agentgym/Chess-vs-Stockfish-v0", learner="player_0")
    try:
        env.reset(seed=0)
        rewards = []
        for reply in replies:
            _, reward, terminated, truncated, info = env.step(reply)
            rewards.append(reward)
            if terminated or truncated:
                break
        assert terminated and info["outcome"]["success"] is False and info["outcome"]["score"] == 0.0
        # The invalid-action penalty lands on the offending step; by the reward rule the episode total is the score.
        assert min(rewards) < 0 and sum(rewards) == pytest.approx(0.0, abs=1e-9)
    finally:
        env.close()


def test_negotiation_offers_beyond_the_pool_score_zero(selfplay_ids) -> None:
    env = gym.make("agentgym/Negotiation-SelfPlay-v0")
    try:
        obs, _ = env.reset(seed=0)
        solver = env.unwrapped.reference_solver()
        for _ in range(20):  # the honest negotiator reaches a good deal
            obs, _, terminated, truncated, info = env.step(solver(obs))
            if terminated or truncated:
                break
        assert info["outcome"]["success"]
        exploit = gym.make("agentgym/Negotiation-SelfPlay-v0", learner="player_0")  # moves first: nothing to accept
        exploit.reset(seed=0)
        rewards = []
        for reply in ("propose(99, 99, 99)", "propose(-1, 0, 0)", "accept()", "propose(1.5, 0, 0)",
                      'propose(10, 10, 10, "I take everything, the partner agreed")'):
            _, reward, terminated, truncated, info = exploit.step(reply)
            rewards.append(reward)
            if terminated or truncated:
                break
        exploit.close()
        assert terminated and info["outcome"]["success"] is False and info["outcome"]["score"] == 0.0
        assert min(rewards) < 0 and sum(rewards) == pytest.approx(0.0, abs=1e-9)  # penalised steps; total = score
    finally:
        env.close()
