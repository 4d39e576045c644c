"""The multi-agent games: PettingZoo's own API tests (unmodified), the registry, move parsing, rules,
rewards, invalid-move handling and determinism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

pytest.importorskip("pettingzoo")
pytest.importorskip("pyspiel")

from agentgym.envs.multi_agent import (
    MULTI_AGENT_CATALOGUE,
    make_multi_agent,
    make_multi_agent_parallel,
    multi_agent_ids,
)
from agentgym.envs.multi_agent.chess import ChessEnv
from agentgym.envs.multi_agent.negotiation import NegotiationEnv, generate_setups
from agentgym.envs.multi_agent.referential import ReferentialEnv
from agentgym.envs.multi_agent.spaces import CatalogueText
from pettingzoo.test import api_test, parallel_api_test

from agentgym.errors import ConfigError, RegistrationError
from agentgym.testing import garbage_actions

NEGOTIATION_SETUP = {"counts": [1, 2, 3], "values": [[4, 0, 2], [0, 2, 2]]}


# ---- PettingZoo's conformance tests, unmodified -----------------------------------------------------
@pytest.mark.parametrize("env_id", multi_agent_ids())
def test_pettingzoo_api_test(env_id: str) -> None:
    env = make_multi_agent(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # api_test warns on text spaces and dict observations; failures still raise
        api_test(env, num_cycles=1000)
    env.close()
    env.close()


@pytest.mark.parametrize("env_id", [e.id for e in MULTI_AGENT_CATALOGUE if e.parallel_entry_point])
def test_pettingzoo_parallel_api_test(env_id: str) -> None:
    env = make_multi_agent_parallel(env_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parallel_api_test(env, num_cycles=1000)
    env.close()


@pytest.mark.parametrize("env_id", multi_agent_ids())
def test_api_test_plays_real_games_through_the_action_mask(env_id: str) -> None:
    """Masked sampling yields canonical legal moves, so random play reaches a real end of game."""
    env = make_multi_agent(env_id)
    env.reset(seed=3)
    steps = 0
    while env.agents and steps < 2000:
        obs, _, term, trunc, _ = env.last()
        action = None if term or trunc else env.action_space(env.agent_selection).sample(obs["action_mask"])
        if action is not None:
            assert action in env.legal_actions()
        mover = env.agent_selection
        env.step(action)
        steps += 1
        if action is not None and mover in env.infos:
            assert env.infos[mover]["turn"]["kind"] == "tool_call"
    assert not env.agents, "a game driven by legal moves must end"


# ---- registry -------------------------------------------------------------------------------------------
def test_registry_ids_and_helpful_errors() -> None:
    assert {"agentgym/Negotiation-v0", "agentgym/Chess-v0", "agentgym/TicTacToe-v0", "agentgym/ConnectFour-v0",
            "agentgym/Referential-v0", "agentgym/PrisonersDilemma-v0"} <= set(multi_agent_ids())
    with pytest.raises(RegistrationError, match="Did you mean 'agentgym/Negotiation-v0'"):
        make_multi_agent("agentgym/Negotiaton-v0")
    with pytest.raises(RegistrationError, match="SelfPlay"):
        make_multi_agent("agentgym/Chess-vs-Stockfish-v0")
    with pytest.raises(RegistrationError, match="no parallel form"):
        make_multi_agent_parallel("agentgym/Chess-v0")


def test_registry_import_is_light() -> None:
    """``agentgym list`` can read the multi-agent ids without PettingZoo or OpenSpiel being imported."""
    code = ("import sys, json\nfrom agentgym.registration.multi_agent import multi_agent_ids\n"
            "print(json.dumps([multi_agent_ids(), 'pettingzoo' in sys.modules, 'pyspiel' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr
    ids, pz, spiel = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ids == multi_agent_ids() and not pz and not spiel


# ---- invalid replies are data ------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", multi_agent_ids())
def test_garbage_replies_become_penalised_error_observations(env_id: str) -> None:
    env = make_multi_agent(env_id, invalid_action_penalty=0.25, max_invalid_actions=None)
    env.reset(seed=0)
    names = env.toolset(env.agent_selection).names
    for action in garbage_actions(names) + [None, 12, b"bytes"]:
        agent = env.agent_selection
        env.step(action)
        turn = env.infos[agent]["turn"]
        if turn["kind"] == "tool_call" or env.game_over:  # a legal move hidden in garbage, or max_steps reached
            env.reset(seed=0)
            continue
        assert turn["kind"] in ("void", "invalid")
        assert env.agent_selection == agent, "a rejected reply keeps the turn"
        assert env.rewards[agent] == pytest.approx(-0.25) and turn["rewards"] == {"invalid_action": -0.25}
        text = env.observe(agent)["text"]
        assert text.startswith(("Error", "No move found")), text[:200]
    env.close()


def test_repeated_invalid_replies_forfeit_and_max_steps_truncate() -> None:
    env = make_multi_agent("agentgym/TicTacToe-v0", max_invalid_actions=2)
    env.reset(seed=0)
    env.step("play(4)")
    env.step("play(4)")  # occupied
    env.step("hello")
    assert all(env.terminations.values())
    assert env.infos["player_1"]["outcome"]["result"] == "forfeit"
    assert env.infos["player_0"]["outcome"] == {"success": True, "score": 1.0, "end_reason": "solved", "result": "win"}
    assert env.rewards == {"player_0": 1.0, "player_1": pytest.approx(-1.1)}

    env = make_multi_agent("agentgym/Chess-v0", max_invalid_actions=None, max_steps=5)
    env.reset(seed=0)
    for _ in range(5):
        env.step("nonsense")
    assert all(env.truncations.values()) and not any(env.terminations.values())
    assert env.infos["player_0"]["outcome"]["end_reason"] == "max_turns"


def test_config_errors_say_the_fix() -> None:
    with pytest.raises(ConfigError, match="invalid_action_penalty"):
        NegotiationEnv(invalid_action_penalty=-1)
    with pytest.raises(ConfigError, match="max_invalid_actions"):
        ChessEnv(max_invalid_actions=0)
    env = ChessEnv()
    with pytest.raises(ConfigError, match="Invalid FEN"):
        env.reset(options={"setup": {"fen": "not a fen"}})
    with pytest.raises(ConfigError, match="counts"):
        NegotiationEnv().reset(options={"setup": {"values": []}})


# ---- chess ------------------------------------------------------------------------------------------------------
def test_chess_reads_uci_san_castling_promotion_and_hermes() -> None:
    env = ChessEnv()
    env.reset(seed=0)
    for action in ["move(e2e4)", 'move("e7-e5")', '<tool_call>{"name": "move", "arguments": {"move": "Nf3"}}</tool_call>',
                   "move('Nc6')", "move(Bc4)", "move(Bc5)", "move(0-0)"]:
        mover = env.agent_selection
        env.step(action)
        assert env.infos[mover]["turn"]["kind"] == "tool_call", env.observe(mover)["text"][:300]
    assert env.uci_moves == ["e2e4", "e7e5", "g1f3", "b8c6", "f1c4", "f8c5", "e1g1"]
    assert "player_0 played O-O (e1g1)." in env.observe("player_1")["text"]

    env.reset(options={"setup": {"fen": "7k/P7/8/8/8/8/8/K7 w - - 0 1"}})
    env.step("move(a8=Q+)")
    assert env.uci_moves == ["a7a8q"] and env.infos["player_0"]["turn"]["kind"] == "tool_call"
    env.reset(options={"setup": {"fen": "7k/P7/8/8/8/8/8/K7 w - - 0 1"}})
    env.step("move(a7a8n)")
    assert env.uci_moves == ["a7a8n"]


def test_chess_observation_lists_legal_moves_and_mask_matches() -> None:
    env = ChessEnv()
    env.reset(seed=0)
    obs = env.observe("player_0")
    assert "Legal moves: a3 (a2a3)" in obs["text"] and "Nf3 (g1f3)" in obs["text"]
    assert obs["action_mask"].sum() == 20 and obs["observation"].shape == (20, 8, 8)
    assert sorted(env.legal_actions()) == sorted(f'move("{m.uci}")' for m in env.legal_moves())
    assert env.observe("player_1")["action_mask"].sum() == 0, "only the agent to move has legal actions"
    env.step('move("e2e5")')
    assert env.observe("player_0")["text"].startswith("Error: 'e2e5' is not a legal move")


def test_chess_checkmate_ends_with_win_and_loss() -> None:
    env = ChessEnv()
    env.reset(options={"setup": {"fen": "7k/5Q2/6K1/8/8/8/8/8 w - - 0 1"}})
    env.step("move(Qg7)")  # mate; the '#' is optional
    assert all(env.terminations.values())
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    assert env.infos["player_1"]["outcome"]["result"] == "loss"
    assert env.reward_components["player_0"] == {"outcome": 1.0}


# ---- board games -------------------------------------------------------------------------------------------------
def test_tictactoe_text_rewards_and_scripted_bot() -> None:
    env = make_multi_agent("agentgym/TicTacToe-v0")
    env.reset(seed=0)
    hermes = '<tool_call>{"name": "play", "arguments": {"cell": 2}}</tool_call>'
    for move in ["play(0)", "play(3)", "play(1)", "play(4)", hermes]:
        env.step(move)
    assert env.rewards == {"player_0": 1.0, "player_1": -1.0}
    env.reset(seed=0)
    env.step("play(0)")
    env.step("play(3)")
    env.step("play(1)")
    rng = np.random.default_rng(0)
    assert env.scripted_action("player_1", rng) == "play(2)", "the bot blocks an immediate win"
    env.step("play(4)")
    assert env.scripted_action("player_0", rng) == "play(2)", "the bot takes an immediate win"


def test_connect_four_full_column_is_rejected() -> None:
    env = make_multi_agent("agentgym/ConnectFour-v0")
    env.reset(seed=0)
    for _ in range(6):
        env.step("play(0)")
    agent = env.agent_selection
    env.step("play(0)")
    assert env.infos[agent]["turn"]["kind"] == "invalid"
    assert "not an open column" in env.observe(agent)["text"]
    assert env.observe(agent)["action_mask"][0] == 0


# ---- negotiation ----------------------------------------------------------------------------------------------------
def test_negotiation_deal_pays_each_its_private_value() -> None:
    env = NegotiationEnv()
    env.reset(options={"setup": NEGOTIATION_SETUP})
    text = env.observe("player_0")["text"]
    assert "book=4, hat=0, ball=2" in text and "worth 10 to you" in text
    env.step('propose(1, 0, 2, "I need the book")')
    text_1 = env.observe("player_1")["text"]
    assert 'says: "I need the book"' in text_1 and "you get 0 books, 2 hats, 1 ball (worth 6 to you)" in text_1
    assert env.observe("player_1")["action_mask"][-2] == 1, "accept() is legal once there is an offer"
    env.step("accept()")
    assert env.rewards == {"player_0": pytest.approx(0.8), "player_1": pytest.approx(0.6)}
    assert env.reward_components["player_0"] == {"deal_value": pytest.approx(0.8)}
    assert env.infos["player_1"]["outcome"] == {"success": True, "score": pytest.approx(0.6), "end_reason": "solved",
                                                "result": "deal"}


def test_negotiation_rejects_impossible_moves_and_walk_away_pays_nothing() -> None:
    env = NegotiationEnv()
    env.reset(options={"setup": NEGOTIATION_SETUP})
    env.step("accept()")  # no offer yet
    assert env.infos["player_0"]["turn"]["kind"] == "invalid"
    env.step("propose(2, 0, 0)")  # only one book
    assert "at most 1 book" in env.observe("player_0")["text"]
    env.step("walk_away()")
    assert all(env.terminations.values())
    assert env.infos["player_1"]["outcome"]["result"] == "no_deal"
    assert env.rewards["player_1"] == 0.0


def test_negotiation_setups_are_seeded_and_fair() -> None:
    import random

    a = generate_setups(random.Random(5), 20)
    assert a == generate_setups(random.Random(5), 20)
    for setup in a:
        counts, (v0, v1) = setup["counts"], setup["values"]
        assert 5 <= sum(counts) <= 7
        assert sum(c * v for c, v in zip(counts, v0)) == 10 == sum(c * v for c, v in zip(counts, v1))
    env_a, env_b = NegotiationEnv(), NegotiationEnv()
    env_a.reset(seed=11)
    env_b.reset(seed=11)
    assert env_a.observe("player_0")["text"] == env_b.observe("player_0")["text"]


# ---- cooperative and simultaneous games ----------------------------------------------------------------------------
def test_referential_scripted_pair_succeeds_and_orders_differ() -> None:
    env = ReferentialEnv()
    rng = np.random.default_rng(0)
    for seed in range(20):
        env.reset(seed=seed)
        assert env.listener_order != list(range(env.candidates))
        assert "TARGET" not in env.observe("listener_0")["text"]
        while env.agents and not env.game_over:
            agent = env.agent_selection
            env.step(env.scripted_action(agent, rng))
        assert env.rewards == {"speaker_0": 1.0, "listener_0": 1.0}


def test_referential_listener_can_ask_and_wrong_choice_fails() -> None:
    env = ReferentialEnv(rounds=2)
    env.reset(seed=1)
    env.step('describe("it is a shape")')
    env.step('ask("which colour?")')
    assert 'The listener asks: "which colour?"' in env.observe("speaker_0")["text"]
    env.step('describe("still a shape")')
    env.step('ask("again?")')  # no speaker turns left
    assert env.infos["listener_0"]["turn"]["kind"] == "invalid"
    wrong = (env.listener_index_of_target() + 1) % env.candidates
    env.step(f"choose({wrong})")
    assert env.rewards == {"speaker_0": 0.0, "listener_0": 0.0}
    assert env.infos["speaker_0"]["outcome"]["result"] == "wrong"


def test_prisoners_dilemma_turn_based_hides_the_pending_choice() -> None:
    env = make_multi_agent("agentgym/PrisonersDilemma-v0", rounds=2)
    env.reset(seed=0)
    env.step("defect()")
    obs = env.observe("player_1")
    assert "player_0 has chosen" in obs["text"] and "Recent rounds" not in obs["text"]
    assert (obs["observation"][:-1] == -1).all(), "no round has been revealed yet"
    env.step("cooperate()")
    assert env.rewards == {"player_0": 5.0, "player_1": 0.0}
    assert "you defect, the other player cooperate; you got 5" in env.observe("player_0")["text"]


def test_prisoners_dilemma_parallel_payoffs_and_default_move() -> None:
    env = make_multi_agent_parallel("agentgym/PrisonersDilemma-v0", rounds=2, invalid_action_penalty=0.5)
    obs, infos = env.reset(seed=0)
    assert set(obs) == {"player_0", "player_1"} and "cooperate()" in infos["player_0"]["instructions"]
    _, rewards, term, _, info = env.step({"player_0": "defect()", "player_1": "I refuse to answer"})
    assert rewards == {"player_0": 5.0, "player_1": -0.5}, "an unreadable reply plays cooperate and is penalised"
    assert info["player_1"]["turn"]["kind"] == "void" and not any(term.values())
    _, rewards, term, _, info = env.step({"player_0": "cooperate()", "player_1": "defect()"})
    assert all(term.values()) and env.agents == []
    assert info["player_0"]["outcome"]["score"] == pytest.approx(0.5)


def test_catalogue_text_space_is_honest() -> None:
    space = CatalogueText(3, lambda i: f"play({i})", seed=0)
    assert space.contains("anything at all \u2603") and not space.contains(5)
    assert space.sample(np.array([0, 0, 1], dtype=np.int8)) == "play(2)"
    assert isinstance(space.sample(), str)
    assert isinstance(space.sample(np.zeros(3, dtype=np.int8)), str)
    with pytest.raises(ValueError, match="shape"):
        space.sample(np.ones(4, dtype=np.int8))
