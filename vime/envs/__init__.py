"""vime environments: the :class:`Env` contract, registration, the checker and task sources.

Example:
    >>> import vime
    >>> env = vime.make("vime/Math-v0")  # doctest: +SKIP
    >>> messages, info = env.reset(seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

from vime.envs.base import Env
from vime.envs.spaces import ActionSpace, MessagesSpace, message_problem, messages_problem

__all__ = [
    "ActionSpace",
    "Env",
    "MessagesSpace",
    "message_problem",
    "messages_problem",
]
