"""vime environments: the :class:`Env` contract, registration, the checker, task sources and
the tool kit (:func:`tool`, :class:`Toolset`, :class:`ToolEnv`) of tool-using envs.

Example:
    >>> import vime
    >>> env = vime.make("vime/Math-v0")
    >>> messages, info = env.reset(seed=0)
    >>> messages[-1]["role"]
    'user'
"""

from __future__ import annotations

from vime.envs.answers import extract_boxed
from vime.envs.base import Env
from vime.envs.checker import CheckResult, check_env, run_checks
from vime.envs.registration import (
    EnvMaker,
    EnvSpec,
    make,
    preflight_env,
    register,
    register_bundled,
    registry,
)
from vime.envs.spaces import ActionSpace, MessagesSpace, message_problem, messages_problem
from vime.envs.task_source import TaskSource, TaskSourceConfig
from vime.envs.tasks import load_tasks
from vime.envs.tool_context import ToolContext
from vime.envs.toolkit import Tool, ToolEnv, ToolError, Toolset, tool
from vime.envs.wrappers import ContractChecker, EpisodeGuard, TurnLimit, wrap

__all__ = [
    "ActionSpace",
    "CheckResult",
    "ContractChecker",
    "Env",
    "EnvMaker",
    "EnvSpec",
    "EpisodeGuard",
    "MessagesSpace",
    "TaskSource",
    "TaskSourceConfig",
    "Tool",
    "ToolContext",
    "ToolEnv",
    "ToolError",
    "Toolset",
    "TurnLimit",
    "check_env",
    "extract_boxed",
    "load_tasks",
    "make",
    "message_problem",
    "messages_problem",
    "preflight_env",
    "register",
    "registry",
    "run_checks",
    "tool",
    "wrap",
]

register_bundled()
