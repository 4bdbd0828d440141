"""Several replies to one request (``n > 1``), and which of them a session records.

A session records one conversation, so of the ``n`` choices of a reply it records one:
**the choice that the agent's next request continues** (the request's messages begin
with the conversation so far and that choice's assistant message, unchanged; of choices
with the same message, which differ in their token ids only, the first). Until that
request comes, and if the session ends first (the agent exits, a limit ends it), it
records choice 0. A request that continues none of them is refused, as any request that
does not continue its session is, and the choice is still open.

Each choice is sampled by the engine from the same prompt (one request per choice; with
``endpoint.seed`` choice 0 has the seed that ``n=1`` would have, and choice k a seed of
its own), and each becomes a :class:`Choice`: a fork of the session with that choice
appended, and its :class:`~vime.types.Turn`. Choosing is swapping in the fork: the
recording is then token for token what it would be had the agent asked with ``n=1`` and
got that choice.

Example:
    >>> from transformers import AutoTokenizer
    >>> from vime.agents.agent_session import AgentSession
    >>> from vime.agents.endpoint import EndpointConfig
    >>> from vime.models.tiny import build_tiny_model
    >>> s = AgentSession(AutoTokenizer.from_pretrained(build_tiny_model()), "s1", EndpointConfig())
    >>> _ = s.prepare([{"role": "user", "content": "Hi"}], None)
    >>> twin = fork(s)
    >>> twin.chat.tokens.append(7); len(twin.chat.tokens) == len(s.chat.tokens) + 1
    True
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from vime.agents.agent_session import AgentSession, ConversationError, completion_body
from vime.agents.policy_client import Completion
from vime.errors import TemplateError
from vime.types import Message, Turn


@dataclass
class Choice:
    """One choice of a reply: the session with it appended, its turn, what the agent got."""

    session: AgentSession
    turn: Turn
    message: Message
    out: Completion


def fork(session: AgentSession) -> AgentSession:
    """A copy of ``session`` that appending to leaves ``session`` as it is (the tokenizer
    and settings shared). See the module docstring."""
    twin = copy.copy(session)
    if session.chat is not None:
        chat = copy.copy(session.chat)
        for name, value in vars(chat).items():
            if isinstance(value, list):  # tokens, loss_mask, messages, ...: appended in place
                setattr(chat, name, list(value))
        twin.chat = chat
    return twin


def continued(choices: list[Choice], messages: Any, tools: Any) -> Choice | None:
    """The first choice whose conversation the request (``messages``, ``tools``) continues.

    Each is tried on a fork, with no token budget: the check passes or fails before
    anything is appended, and the fork keeps whatever was.
    """
    for choice in choices:
        try:
            fork(choice.session).prepare(messages, tools, 0)
        except ConversationError:
            continue
        except TemplateError:  # the conversation matched; the render fails (on any choice)
            return choice
        return choice
    return None


def reply_body(choices: list[Choice], model: str, prompt_len: int) -> dict[str, Any]:
    """The ``chat.completion`` JSON with one entry of ``choices`` per choice; the usage
    counts the prompt once and the sampled tokens of every choice (as OpenAI's does).

    Example:
        >>> out = Completion([5, 6], [-0.1, -0.2], "stop", 0, "http://h:1")
        >>> c = Choice(None, None, {"role": "assistant", "content": "hi"}, out)  # type: ignore[arg-type]
        >>> body = reply_body([c, c], "m", 3)
        >>> [ch["index"] for ch in body["choices"]], body["usage"]["total_tokens"]
        ([0, 1], 7)
    """
    body = completion_body(choices[0].message, choices[0].out, model, prompt_len)
    if len(choices) == 1:
        return body
    body["choices"] = [
        {**completion_body(c.message, c.out, model, prompt_len)["choices"][0], "index": k}
        for k, c in enumerate(choices)
    ]
    sampled = sum(c.out.num_tokens for c in choices)
    body["usage"] = {
        "prompt_tokens": prompt_len,
        "completion_tokens": sampled,
        "total_tokens": prompt_len + sampled,
    }
    return body
