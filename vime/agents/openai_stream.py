"""A finished ``chat.completion`` sent as OpenAI's stream (``stream=true``).

The own-agent endpoint samples each reply whole (vLLM returns the ids, the log-probs and
the weight version of the turn at once) and records it exactly as without streaming; only
the answer's shape differs. :func:`chunks` turns the reply into OpenAI's
``chat.completion.chunk`` objects, per choice: the role, the content, each tool call (its
id and name, then its arguments), a last chunk with the ``finish_reason``; then, with
``stream_options.include_usage``, one chunk with no choices and the usage.
:func:`send_stream` writes them as server-sent events (``data: {...}``), then
``data: [DONE]``. The agent gets its first chunk when the turn is sampled.

Example:
    >>> reply = {"id": "c1", "created": 0, "model": "m", "usage": {"total_tokens": 3},
    ...          "choices": [{"index": 0, "finish_reason": "stop",
    ...                       "message": {"role": "assistant", "content": "Hi"}}]}
    >>> [c["choices"][0]["delta"] for c in chunks(reply, include_usage=False)]
    [{'role': 'assistant', 'content': ''}, {'content': 'Hi'}, {}]
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from aiohttp import web


def chunks(reply: dict[str, Any], *, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of ``reply`` (a ``chat.completion``), in order."""
    head = {
        "id": reply["id"],
        "object": "chat.completion.chunk",
        "created": reply["created"],
        "model": reply["model"],
        "system_fingerprint": None,
    }
    if include_usage:  # OpenAI: every chunk has the field, null until the last one
        head["usage"] = None

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    for choice in reply["choices"]:
        index, message = choice["index"], choice["message"]
        yield chunk(index, {"role": "assistant", "content": ""})
        if message.get("content"):
            yield chunk(index, {"content": message["content"]})
        for i, call in enumerate(message.get("tool_calls") or []):
            fn = call["function"]
            named = {"name": fn["name"], "arguments": ""}
            opening = {"index": i, "id": call["id"], "type": "function", "function": named}
            yield chunk(index, {"tool_calls": [opening]})
            arguments = {"index": i, "function": {"arguments": fn["arguments"]}}
            yield chunk(index, {"tool_calls": [arguments]})
        yield chunk(index, {}, choice["finish_reason"])
    if include_usage:
        yield {**head, "choices": [], "usage": reply["usage"]}


async def send_stream(
    request: web.Request, reply: dict[str, Any], *, include_usage: bool
) -> web.StreamResponse:
    """Answer ``request`` with ``reply`` as server-sent events (see the module docstring)."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    events = [f"data: {json.dumps(c)}\n\n" for c in chunks(reply, include_usage=include_usage)]
    await response.write(("".join(events) + "data: [DONE]\n\n").encode())
    await response.write_eof()
    return response
