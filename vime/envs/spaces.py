"""Gymnasium spaces for chat environments: a conversation in, an assistant turn out.

An observation is a list of OpenAI-format messages; an action is a
:class:`vime.types.Action`. Both spaces can ``sample()`` (random text) so that
``gymnasium.utils.env_checker.check_env`` can drive any vime env.

Example:
    >>> space = MessagesSpace()
    >>> [{"role": "user", "content": "What is 2+2?"}] in space
    True
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium
import numpy as np

from vime.types import Action, Message

ROLES = ("system", "user", "assistant", "tool")
_ALPHABET = np.array(list(string.ascii_letters + string.digits + " .,+-*/=?"))


def message_problem(msg: Any) -> str | None:
    """Why ``msg`` is not a valid OpenAI chat message, or ``None`` if it is.

    ``content`` is a string, or a list of ``{"type": "text", "text": str}`` parts; an
    assistant message may carry ``tool_calls`` instead of content.

    Example:
        >>> message_problem({"role": "user", "content": "hi"}) is None
        True
        >>> message_problem({"role": "bot", "content": "hi"})
        "role 'bot' is not one of ('system', 'user', 'assistant', 'tool')"
    """
    if not isinstance(msg, dict):
        return f"a message must be a dict like {{'role': 'user', 'content': '...'}}, got {type(msg).__name__}"
    role = msg.get("role")
    if role not in ROLES:
        return f"role {role!r} is not one of {ROLES}"
    if "content" not in msg:
        return f"{role} message has no 'content' key (use '' for an empty message)"
    content = msg["content"]
    if content is None and role == "assistant" and msg.get("tool_calls"):
        pass  # OpenAI allows content=None next to tool calls
    elif isinstance(content, list):
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                return f"{role} message content parts must be {{'type': 'text', 'text': str}}, got {part!r:.80}"
    elif not isinstance(content, str):
        return f"{role} message content must be a str, got {type(content).__name__} (convert it with str())"
    calls = msg.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return f"only assistant messages carry tool_calls, got them on a {role} message"
        if not isinstance(calls, list) or not all(
            isinstance(c, dict)
            and isinstance(c.get("function"), dict)
            and isinstance(c["function"].get("name"), str)
            for c in calls
        ):
            return "tool_calls must be a list of {'type': 'function', 'function': {'name': str, 'arguments': str}}"
    return None


def messages_problem(messages: Any) -> str | None:
    """Why ``messages`` is not a list of valid messages, or ``None``.

    Example:
        >>> messages_problem([{"role": "user", "content": "hi"}]) is None
        True
    """
    if not isinstance(messages, list):
        return f"messages must be a list of dicts, got {type(messages).__name__}"
    for i, msg in enumerate(messages):
        problem = message_problem(msg)
        if problem:
            return f"message [{i}]: {problem}"
    return None


class MessagesSpace(gymnasium.Space[list[Message]]):
    """The space of conversations: lists of OpenAI-format messages.

    Example:
        >>> MessagesSpace(seed=0).sample()[0]["role"]
        'user'
    """

    def __init__(self, max_text_length: int = 64, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_text_length = max_text_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """One random user message (for checkers; real envs produce their own)."""
        return [{"role": "user", "content": _random_text(self.np_random, self.max_text_length)}]

    def contains(self, x: Any) -> bool:
        return messages_problem(x) is None

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessagesSpace)


class ActionSpace(gymnasium.Space[Action]):
    """The space of assistant turns: :class:`vime.types.Action` (text + parsed tool calls).

    Example:
        >>> isinstance(ActionSpace(seed=0).sample(), Action)
        True
    """

    def __init__(self, max_text_length: int = 64, seed: int | None = None) -> None:
        super().__init__(shape=None, dtype=None, seed=seed)
        self.max_text_length = max_text_length

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> Action:
        """A random text answer with no tool calls (what an untrained policy might say)."""
        return Action(text=_random_text(self.np_random, self.max_text_length))

    def contains(self, x: Any) -> bool:
        return isinstance(x, Action) and isinstance(x.text, str)

    def __repr__(self) -> str:
        return "ActionSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ActionSpace)


def _random_text(rng: np.random.Generator, max_length: int) -> str:
    n = int(rng.integers(1, max_length + 1))
    return "".join(rng.choice(_ALPHABET, size=n))
