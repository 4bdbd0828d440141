"""One bring-your-own-agent session: an agent's chat requests as one token-exact episode.

An agent program (the ``openai`` SDK, any framework) sends chat-completions requests
holding the whole conversation each time. :class:`AgentSession` turns them into one
:class:`~vime.agents.chat_tokens.ChatTokens` (or, with ``endpoint.sample_per_turn``, a
:class:`~vime.agents.turn_samples.TurnChatTokens`, where each request is the template's
own render of the conversation and may start a new training sample), as the collector does:

- the first request's messages and tools are rendered once (the prompt, loss_mask 0);
- each reply is sampled by vLLM from token ids and appended verbatim (loss_mask 1, with
  vLLM's log-probs and the weight version), then parsed into OpenAI ``tool_calls``;
- every later request must repeat the conversation so far, the replies unchanged, and add
  messages after it (tool results, a user turn): only those are tokenized (loss_mask 0).
  A request that rewrites history, or changes the tools, is refused with
  :class:`ConversationError` and changes nothing: one session is one episode, and a new
  conversation needs a new session. The last request sent again unchanged (the SDK
  retrying after a timeout) gets the same reply again, and nothing is recorded twice.

At the end the env grades the agent's last reply (one ``env.step``), and the session
becomes an :class:`~vime.types.Episode` like the collector's.

Example:
    >>> _normalized({"role": "assistant", "content": None, "refusal": None})
    {'role': 'assistant', 'content': ''}
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

from vime.agents.chat_tokens import ChatTokens
from vime.agents.policy_client import Completion
from vime.agents.tool_parsers import ToolParser
from vime.agents.turn_samples import ChatSettings, new_chat
from vime.types import Action, Message

_HERMES_BLOCK = re.compile(r"\s*<tool_call>.*?</tool_call>\s*", re.DOTALL)

# Message fields that reach the chat template; the SDK's others (refusal, audio, ...) do not.
_KEPT = ("role", "content", "name", "tool_call_id", "tool_calls")


class ConversationError(ValueError):
    """A request that does not continue its session's conversation (HTTP 400).

    Example:
        >>> ConversationError("messages[1]", "differs").param
        'messages[1]'
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def _text(content: Any) -> str:
    """Message content as text: ``None`` → ``""``, a list of text parts joined.

    Example:
        >>> _text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
        'ab'
    """
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def _calls(calls: Any) -> list[dict[str, Any]]:
    """Tool calls in one canonical form (arguments decoded), for comparing conversations."""
    out = []
    for call in calls or []:
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        args = fn.get("arguments", "")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except ValueError:
            pass
        call_id = call.get("id", "") if isinstance(call, dict) else ""
        out.append({"id": call_id, "function": {"name": fn.get("name", ""), "arguments": args}})
    return out


def _normalized(message: Any) -> Message:
    """A request message reduced to what the template reads (content as text, calls decoded).

    Example:
        >>> _normalized({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "5"}]})
        {'role': 'tool', 'content': '5', 'tool_call_id': 'c1'}
    """
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ConversationError("messages", f"each message needs a 'role', got {message!r:.80}")
    out: Message = {k: message[k] for k in _KEPT if message.get(k) is not None}
    out["content"] = _text(message.get("content"))
    if "tool_calls" in out:
        out["tool_calls"] = _calls(out["tool_calls"])
        if not out["tool_calls"]:
            del out["tool_calls"]
    return out


def visible_content(text: str, action: Action, parser: str) -> str:
    """The reply's ``content``: the sampled text without the tool calls parsed from it.

    Hermes/Qwen calls are cut out of the text; for other formats the whole message is the
    call, so the content is empty. Without calls the text is the content.

    Example:
        >>> from vime.agents.tool_parsers import parse_hermes
        >>> t = 'Adding.<tool_call>{"name": "add", "arguments": {}}</tool_call>'
        >>> visible_content(t, parse_hermes(t), "hermes")
        'Adding.'
    """
    if not action.tool_calls:
        return text
    if parser in ("hermes", "qwen"):
        return _HERMES_BLOCK.sub("\n", text).strip()
    return ""


class AgentSession:
    """The conversation state of one session (see the module docstring).

    ``settings`` (an :class:`~vime.agents.endpoint.EndpointConfig`) say how the
    conversation becomes tokens, as the collector's config does for its episodes.

    Example:
        >>> from transformers import AutoTokenizer
        >>> from vime.agents.endpoint import EndpointConfig
        >>> from vime.models.tiny import build_tiny_model
        >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
        >>> s = AgentSession(tok, "s1", EndpointConfig(sample_per_turn=True))
        >>> s.prepare([{"role": "user", "content": "Hi"}], None) == s.chat.request
        True
    """

    def __init__(self, tokenizer: Any, session_id: str, settings: ChatSettings) -> None:
        self.tokenizer = tokenizer
        self.session_id = session_id
        self.settings = settings
        self.chat: ChatTokens | None = None
        self.tools: list[dict[str, Any]] | None = None
        self.conversation: list[Message] = []  # the agent's view: its messages + our replies
        self.last_text = ""  # the last reply's sampled text (what the env grades)
        self.last_action: Action | None = None
        self._last_asked: list[Message] | None = None  # the messages of the last request served

    def repeats(self, messages: Any, tools: list[dict[str, Any]] | None) -> bool:
        """Whether a request is the last one sent again (an SDK retry after a timeout).

        Example:
            >>> from transformers import AutoTokenizer
            >>> from vime.models.tiny import build_tiny_model
            >>> from vime.agents.endpoint import EndpointConfig
            >>> tok = AutoTokenizer.from_pretrained(build_tiny_model())
            >>> s = AgentSession(tok, "s1", EndpointConfig())
            >>> s.repeats([{"role": "user", "content": "Hi"}], None)
            False
        """
        if self._last_asked is None or (tools or None) != self.tools:
            return False
        try:
            return [_normalized(m) for m in messages] == self._last_asked
        except (ConversationError, TypeError):
            return False

    def prepare(
        self, messages: Any, tools: list[dict[str, Any]] | None, budget: int | None = None
    ) -> list[int] | None:
        """Check a request against the conversation and append its new messages.

        Returns the prompt ids to sample from (the chat's ``request``), or None when they
        would exceed ``budget`` (nothing appended). Raises :class:`ConversationError` for a request that does not
        continue the conversation.
        """
        if not isinstance(messages, list) or not messages:
            raise ConversationError("messages", "must be a non-empty list of chat messages")
        asked = [_normalized(m) for m in messages]
        if self.chat is None:
            env_id = f"session {self.session_id}"
            chat = new_chat(self.tokenizer, asked, self.settings, tools, env_id)
            if budget is not None and len(chat.request) >= budget:
                return None
            self.chat, self.tools, self.conversation = chat, tools or None, asked
            self._last_asked = asked
            return chat.request
        self._check_continues(asked, tools)
        new = asked[len(self.conversation) :]
        if not self.chat.add_messages(new, max_total=budget):
            return None
        self.conversation = self._last_asked = asked
        return self.chat.request

    def _check_continues(self, asked: list[Message], tools: list[dict[str, Any]] | None) -> None:
        if (tools or None) != self.tools:
            raise ConversationError(
                "tools", "differ from the first request of this session; open a new session"
            )
        for i, had in enumerate(self.conversation):
            if i >= len(asked) or asked[i] != had:
                what = "is missing" if i >= len(asked) else f"differs: {asked[i]!r:.120}"
                raise ConversationError(
                    f"messages[{i}]",
                    f"messages[{i}] {what}; this session's conversation has {had!r:.120} "
                    "there. Send the whole conversation so far (the assistant replies "
                    "unchanged) plus the new messages, or open a new session.",
                )
        if len(asked) == len(self.conversation):
            raise ConversationError(
                "messages",
                f"adds nothing after the {len(asked)} messages already in this session; "
                "append the tool results or the next user message",
            )

    def reply(self, out: Completion, parse: ToolParser, parser: str, turn: int) -> Message:
        """Append a sampled turn; return the OpenAI assistant message sent to the agent."""
        assert self.chat is not None, "reply() before prepare()"
        text = self.chat.add_sampled(out.token_ids, out.logprobs, out.versions)
        action = parse(text)
        self.last_text = text
        message: Message = {"role": "assistant", "content": visible_content(text, action, parser)}
        if action.tool_calls:
            calls = []
            for i, call in enumerate(action.tool_calls):
                call.id = f"call_{turn}_{i}"  # unique in the session (the parser's restart)
                calls.append(call.to_openai())
            message["tool_calls"] = calls
        self.conversation = [*self.conversation, _normalized(message)]
        self.last_action = action
        return message


def completion_body(message: Message, out: Completion, model: str, prompt_len: int) -> dict:
    """The ``chat.completion`` JSON for one reply.

    Example:
        >>> out = Completion([5], [-0.1], "stop", 0, "http://h:1")
        >>> completion_body({"role": "assistant", "content": "hi"}, out, "m", 3)["usage"]
        {'prompt_tokens': 3, 'completion_tokens': 1, 'total_tokens': 4}
    """
    finish = "tool_calls" if message.get("tool_calls") else out.finish_reason
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": out.num_tokens,
            "total_tokens": prompt_len + out.num_tokens,
        },
    }
