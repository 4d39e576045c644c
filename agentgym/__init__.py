"""agentgym: environments, LLM policies and turn-level RL trainers for multi-turn LLM agents.

Importing this package registers every environment id with Gymnasium (``gym.make("agentgym/Calculator-v0")``)
and stays light: no torch, vllm, playwright, docker or ray is imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.utils.source_tree import bind_namespace_folders

bind_namespace_folders(Path(__file__).resolve().parent)  # before anything imports agentgym.envs & co.

from agentgym.registration.catalogue import env_ids, register_all  # noqa: E402
from agentgym.env import AgentEnv
from agentgym.errors import (
    AgentGymError,
    ConfigError,
    DependencyNotInstalled,
    EnvCrashed,
    RegistrationError,
    TaskError,
    ToolError,
)
from agentgym.parsers import (
    CodeBlockParser,
    CompositeParser,
    FunctionCallParser,
    HermesParser,
    TagParser,
)
from agentgym.spaces import UnicodeText
from agentgym.suite import Task, TaskSuite
from agentgym.registration.suites import list_suites, load_suite
from agentgym.toolset import Tool, ToolCall, ToolResult, ToolSet, tool
from agentgym.trajectory import Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "AgentEnv",
    "AgentGymError",
    "CodeBlockParser",
    "CompositeParser",
    "ConfigError",
    "DependencyNotInstalled",
    "EnvCrashed",
    "FunctionCallParser",
    "HermesParser",
    "RegistrationError",
    "TagParser",
    "Task",
    "TaskError",
    "TaskSuite",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSet",
    "Trajectory",
    "Turn",
    "UnicodeText",
    "__version__",
    "env_ids",
    "list_suites",
    "load_suite",
    "make",
    "make_multi_agent",
    "make_multi_agent_parallel",
    "multi_agent_ids",
    "tool",
]

register_all()


def make(env_id: str, **kwargs: Any) -> Any:
    """``gym.make`` with a 'did you mean' error for unknown agentgym ids."""
    import gymnasium as gym

    from agentgym.registration.catalogue import get_entry

    if env_id.startswith("agentgym"):
        get_entry(env_id)
    return gym.make(env_id, **kwargs)


def make_multi_agent(env_id: str, **kwargs: Any) -> Any:
    """The turn-based (PettingZoo AEC) form of a multi-agent game; needs ``agentgym[multiagent]``."""
    from agentgym.registration.multi_agent import make_multi_agent as _make

    return _make(env_id, **kwargs)


def make_multi_agent_parallel(env_id: str, **kwargs: Any) -> Any:
    """The simultaneous-move (PettingZoo Parallel) form of a game that has one."""
    from agentgym.registration.multi_agent import make_multi_agent_parallel as _make

    return _make(env_id, **kwargs)


def multi_agent_ids() -> list[str]:
    """Ids of the multi-agent games (``agentgym list`` shows them too)."""
    from agentgym.registration.multi_agent import multi_agent_ids as _ids

    return _ids()
