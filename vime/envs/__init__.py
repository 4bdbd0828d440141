"""vime environments: the :class:`Env` contract, registration, the checker and task sources.

Example:
    >>> import vime
    >>> env = vime.make("vime/Math-v0")  # doctest: +SKIP
    >>> messages, info = env.reset(seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from vime.envs.base import Env
from vime.envs.checker import CheckResult, check_env, run_checks
from vime.envs.registration import EnvSpec, make, register, register_bundled, registry
from vime.envs.spaces import ActionSpace, MessagesSpace, message_problem, messages_problem
from vime.envs.tasks import TaskSource, TaskSourceConfig, load_tasks
from vime.envs.wrappers import ContractChecker, EpisodeGuard, TurnLimit, wrap

__all__ = [
    "ActionSpace",
    "CheckResult",
    "ContractChecker",
    "Env",
    "EnvSpec",
    "EpisodeGuard",
    "MessagesSpace",
    "TaskSource",
    "TaskSourceConfig",
    "TurnLimit",
    "check_env",
    "load_tasks",
    "make",
    "message_problem",
    "messages_problem",
    "register",
    "registry",
    "run_checks",
    "wrap",
]

register_bundled()
