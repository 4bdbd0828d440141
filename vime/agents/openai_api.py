"""The OpenAI chat API's request rules and error shape, for the own-agent endpoint.

:func:`check_chat_request` refuses, as the OpenAI API does, a ``/chat/completions``
request that the ``openai`` SDK's types do not allow: an unknown message role, a message
without its required fields (``content``; a tool message's ``tool_call_id``), a tool
that is not ``{"type": "function", "function": {"name": ...}}``, a tool message that
answers no tool call of the assistant message before it, an assistant's tool call left
unanswered, ``n``/``temperature``/... out of range, ``stream_options`` without
``stream``. Each refusal is an :class:`ApiError`: HTTP 400 with OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``), the message naming the field.

Beyond OpenAI's rules, parts the text-only policy cannot read (an image, audio, a file)
and ``custom`` tools are refused rather than dropped, and a ``developer`` message becomes
a ``system`` message (what it means for a model before o1; chat templates know only
``system`` and would drop it).

:func:`json_errors` is the aiohttp middleware that answers every error of the server
in that shape, unknown routes (404) and wrong methods (405) included.

Example:
    >>> check_chat_request({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]})
    Traceback (most recent call last):
    ...
    vime.agents.openai_api.ApiError: Invalid value for 'messages[0].role': 'wizard'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool'.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 128  # OpenAI's bound on choices per request
# (low, high, integers only) for the numeric options; None is allowed for each (the default).
_RANGES: dict[str, tuple[float | None, float | None, bool]] = {
    "n": (1, MAX_N, True),
    "max_tokens": (1, None, True),
    "max_completion_tokens": (1, None, True),
    "temperature": (0, 2, False),
    "top_p": (0, 1, False),
    "presence_penalty": (-2, 2, False),
    "frequency_penalty": (-2, 2, False),
    "top_logprobs": (0, 20, True),
}
_PARTS = {  # content part types each role may send (what the SDK's types allow)
    "system": ("text",),
    "developer": ("text",),
    "tool": ("text",),
    "assistant": ("text", "refusal"),
    "user": ("text", "image_url", "input_audio", "file"),
}
_FUNCTION_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ApiError(Exception):
    """A request answered with an OpenAI-style JSON error.

    Example:
        >>> ApiError(400, "Missing required parameter: 'model'.", "model").body()["error"]["type"]
        'invalid_request_error'
    """

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        error = {"message": str(self), "type": kind, "param": self.param, "code": self.code}
        return {"error": error}

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=headers)


def invalid(param: str | None, message: str, code: str | None = None) -> ApiError:
    """An HTTP 400 naming ``param``."""
    return ApiError(400, message, param, code)


def missing(param: str) -> ApiError:
    return ApiError(
        400, f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    )


def bad_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        param,
        "invalid_type",
    )


def bad_value(param: str, value: Any, allowed: tuple[str, ...], why: str = "") -> ApiError:
    supported = ", ".join(repr(a) for a in allowed)
    message = f"Invalid value for '{param}': {value!r:.60}. Supported values are: {supported}."
    return ApiError(400, message + (f" {why}" if why else ""), param, "invalid_value")


def check_bearer(authorization: str, token: str) -> None:
    """Raise OpenAI's 401 (``invalid_api_key``) unless ``authorization`` is ``Bearer <token>``.

    Example:
        >>> check_bearer("Bearer t1", "t1")
        >>> check_bearer("Bearer t2", "t1")
        Traceback (most recent call last):
        ...
        vime.agents.openai_api.ApiError: Incorrect API key for this session: use the OPENAI_API_KEY that vime gave the agent with its OPENAI_BASE_URL.
    """
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise ApiError(
            401,
            "No API key: send the session's key as 'Authorization: Bearer KEY' (the "
            "OPENAI_API_KEY that vime gave the agent).",
            code="invalid_api_key",
        )
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        raise ApiError(
            401,
            "Incorrect API key for this session: use the OPENAI_API_KEY that vime gave the "
            "agent with its OPENAI_BASE_URL.",
            code="invalid_api_key",
        )


def _kind(value: Any) -> str:
    """The JSON type of ``value`` as OpenAI's messages name it.

    Example:
        >>> _kind(True), _kind(3), _kind([])
        ('a boolean', 'an integer', 'an array')
    """
    kinds = [(bool, "a boolean"), (int, "an integer"), (float, "a decimal"), (str, "a string")]
    kinds += [(list, "an array"), (dict, "an object"), (type(None), "null")]
    return next((name for t, name in kinds if isinstance(value, t)), type(value).__name__)


def check_chat_request(body: Any) -> dict[str, Any]:
    """The request body if OpenAI would accept it (``developer`` read as ``system``), else
    raise :class:`ApiError` naming the field.

    Example:
        >>> body = {"model": "m", "messages": [{"role": "developer", "content": "Be brief."}]}
        >>> check_chat_request(body)["messages"][0]["role"]
        'system'
    """
    if not isinstance(body, dict):
        raise bad_type("body", "a JSON object", body)
    if body.get("model") is None:
        raise missing("model")
    if not isinstance(body["model"], str):
        raise bad_type("model", "a string", body["model"])
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if not isinstance(messages, list):
        raise bad_type("messages", "an array", messages)
    if not messages:
        why = "Invalid 'messages': empty array. Expected at least one message."
        raise invalid("messages", why, "empty_array")
    for i, message in enumerate(messages):
        _check_message(f"messages[{i}]", message)
    _check_tool_replies(messages)
    _check_tools(body.get("tools"), body.get("tool_choice"))
    _check_options(body)
    as_system = [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]
    return {**body, "messages": as_system}


def _check_message(param: str, message: Any) -> None:
    if not isinstance(message, dict):
        raise bad_type(param, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{param}.role")
    if role not in ROLES:
        why = "A function result is a 'tool' message now." if role == "function" else ""
        raise bad_value(f"{param}.role", role, ROLES, why)
    content, calls = message.get("content"), message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            why = f"'{param}.tool_calls': only an assistant message has tool calls."
            raise invalid(f"{param}.tool_calls", why)
        _check_tool_calls(f"{param}.tool_calls", calls)
    if content is None:
        # An assistant message may be only tool calls (or a refusal); others need content.
        if role != "assistant" or not (
            calls or message.get("refusal") or message.get("function_call")
        ):
            raise missing(f"{param}.content")
    else:
        _check_content(f"{param}.content", content, role)
    if role == "tool":
        if message.get("tool_call_id") is None:
            raise missing(f"{param}.tool_call_id")
        if not isinstance(message["tool_call_id"], str):
            raise bad_type(f"{param}.tool_call_id", "a string", message["tool_call_id"])
    if message.get("name") is not None and not isinstance(message["name"], str):
        raise bad_type(f"{param}.name", "a string", message["name"])


def _check_content(param: str, content: Any, role: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise bad_type(param, "one of a string or array of objects", content)
    allowed = _PARTS[role]
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise bad_type(where, "an object", part)
        kind = part.get("type")
        if kind is None:
            raise missing(f"{where}.type")
        if kind not in allowed:
            raise bad_value(f"{where}.type", kind, allowed)
        if kind in ("image_url", "input_audio", "file"):
            raise invalid(
                f"{where}.type",
                f"'{where}' is a {kind!r} part, and the policy behind this endpoint reads text "
                "only; send the content as text parts or a string.",
                "invalid_value",
            )
        if kind in ("text", "refusal"):
            if part.get(kind) is None:
                raise missing(f"{where}.{kind}")
            if not isinstance(part[kind], str):
                raise bad_type(f"{where}.{kind}", "a string", part[kind])


def _check_tool_calls(param: str, calls: Any) -> None:
    if not isinstance(calls, list):
        raise bad_type(param, "an array", calls)
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise bad_type(where, "an object", call)
        for key in ("id", "type", "function"):
            if call.get(key) is None:
                raise missing(f"{where}.{key}")
        if not isinstance(call["id"], str):
            raise bad_type(f"{where}.id", "a string", call["id"])
        if call["type"] != "function":
            raise bad_value(f"{where}.type", call["type"], ("function",))
        _check_function(f"{where}.function", call["function"], ("name", "arguments"))


def _check_function(param: str, fn: Any, required: tuple[str, ...]) -> None:
    """A tool call's or a tool's ``function``: an object with string ``required`` fields."""
    if not isinstance(fn, dict):
        raise bad_type(param, "an object", fn)
    for key in required:
        if fn.get(key) is None:
            raise missing(f"{param}.{key}")
        if not isinstance(fn[key], str):
            raise bad_type(f"{param}.{key}", "a string", fn[key])


def _check_tool_replies(messages: list[dict[str, Any]]) -> None:
    """OpenAI's rule: the tool messages right after an assistant message with
    ``tool_calls`` answer its calls, each of them, and a tool message answers nothing else.

    Example:
        >>> call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        >>> _check_tool_replies([{"role": "assistant", "tool_calls": [call]},
        ...                      {"role": "user", "content": "?"}])
        Traceback (most recent call last):
        ...
        vime.agents.openai_api.ApiError: An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'; messages[0]'s calls c1 have none.
    """
    asked: list[str] = []  # the ids of the calls that the current run of tool messages answers
    answered: set[str] = set()
    owner = -1  # the index of the assistant message that made them
    for i, message in enumerate([*messages, {"role": "end"}]):
        if message["role"] == "tool":
            call_id = message["tool_call_id"]
            if not asked:
                why = (
                    f"'messages[{i}]': a message with role 'tool' must answer a tool call of "
                    "the assistant message (with 'tool_calls') before it."
                )
                raise invalid(f"messages[{i}].role", why)
            if call_id not in asked:
                why = (
                    f"'messages[{i}].tool_call_id' is {call_id!r:.60}, and messages[{owner}] "
                    f"has no tool call with that id (its ids: {', '.join(asked)})."
                )
                raise invalid(f"messages[{i}].tool_call_id", why)
            answered.add(call_id)
            continue
        if left := [c for c in asked if c not in answered]:
            why = (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                f"responding to each 'tool_call_id'; messages[{owner}]'s calls "
                f"{', '.join(left)} have none."
            )
            raise invalid(f"messages[{owner}].tool_calls", why)
        asked = [c["id"] for c in message.get("tool_calls") or []]
        answered, owner = set(), i


def _check_tools(tools: Any, choice: Any) -> None:
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_type("tools", "an array", tools)
        if not tools:
            why = "Invalid 'tools': empty array. Leave 'tools' out for no tools."
            raise invalid("tools", why, "empty_array")
        for j, tool in enumerate(tools):
            _check_tool(f"tools[{j}]", tool)
    if choice is None:
        return
    names = [t["function"]["name"] for t in tools or []]
    if not tools and choice != "none":
        why = "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified."
        raise invalid("tool_choice", why)
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise bad_value("tool_choice", choice, ("none", "auto", "required"))
    elif not isinstance(choice, dict):
        raise bad_type("tool_choice", "a string or an object", choice)
    elif choice.get("type") == "function":
        _check_function("tool_choice.function", choice.get("function"), ("name",))
        if choice["function"]["name"] not in names:
            raise bad_value(
                "tool_choice.function.name",
                choice["function"]["name"],
                tuple(names),
                "It names no tool of 'tools'.",
            )
    elif choice.get("type") != "allowed_tools":
        raise bad_value("tool_choice.type", choice.get("type"), ("function", "allowed_tools"))


def _check_tool(param: str, tool: Any) -> None:
    if not isinstance(tool, dict):
        raise bad_type(param, "an object", tool)
    if tool.get("type") is None:
        raise missing(f"{param}.type")
    if tool["type"] != "function":
        why = "Custom tools are not served here: the tool parser reads function calls only."
        raise bad_value(
            f"{param}.type", tool["type"], ("function",), why if tool["type"] == "custom" else ""
        )
    if tool.get("function") is None:
        raise missing(f"{param}.function")
    fn = tool["function"]
    _check_function(f"{param}.function", fn, ("name",))
    if not _FUNCTION_NAME.match(fn["name"]):
        why = f"Invalid '{param}.function.name': {fn['name']!r:.80} does not match the pattern"
        raise invalid(f"{param}.function.name", why + " '^[a-zA-Z0-9_-]{1,64}$'.", "invalid_value")
    for key, kind, expected in (
        ("description", str, "a string"),
        ("parameters", dict, "an object"),
    ):
        if fn.get(key) is not None and not isinstance(fn[key], kind):
            raise bad_type(f"{param}.function.{key}", expected, fn[key])


def _check_options(body: dict[str, Any]) -> None:
    for key, bounds in _RANGES.items():
        if body.get(key) is not None:
            _check_range(key, body[key], *bounds)
    stream, options = body.get("stream"), body.get("stream_options")
    if stream is not None and not isinstance(stream, bool):
        raise bad_type("stream", "a boolean", stream)
    if options is not None:
        if not stream:
            why = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
            raise invalid("stream_options", why)
        if not isinstance(options, dict):
            raise bad_type("stream_options", "an object", options)
        usage = options.get("include_usage")
        if usage is not None and not isinstance(usage, bool):
            raise bad_type("stream_options.include_usage", "a boolean", usage)


def _check_range(
    key: str, value: Any, low: float | None, high: float | None, integer: bool
) -> None:
    """Refuse ``value`` unless it is a number (an integer if ``integer``) in [low, high].

    Example:
        >>> _check_range("n", 0, 1, 128, True)
        Traceback (most recent call last):
        ...
        vime.agents.openai_api.ApiError: Invalid 'n': integer below minimum value. Expected a value >= 1, but got 0 instead.
    """
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if not numeric or (integer and not isinstance(value, int)):
        raise bad_type(key, "an integer" if integer else "a number", value)
    word = "integer" if integer else "decimal"
    if low is not None and value < low:
        side, sign, bound = "below minimum", ">=", low
    elif high is not None and value > high:
        side, sign, bound = "above maximum", "<=", high
    else:
        return
    why = f"Invalid '{key}': {word} {side} value. Expected a value {sign} {bound:g}"
    code = f"{word}_{side.replace(' ', '_')}_value"  # OpenAI's: integer_below_min_value
    raise invalid(key, f"{why}, but got {value} instead.", code.replace("imum", ""))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every error as OpenAI's JSON error: aiohttp's own (404 unknown route, 405
    wrong method, 413 body too large) and an unexpected exception (500, logged).

    Example:
        >>> app = web.Application(middlewares=[json_errors])
    """
    try:
        return await handler(request)
    except ApiError as err:
        return err.response()
    except web.HTTPException as err:
        if err.status < 400:
            raise
        headers = {"Allow": err.headers["Allow"]} if "Allow" in err.headers else None
        return ApiError(err.status, _http_message(request, err)).response(headers)
    except Exception as err:  # a bug here must still reach the agent as JSON
        logger.exception("the endpoint failed on %s %s", request.method, request.path)
        return ApiError(500, f"internal error: {type(err).__name__}: {err}").response()


def _http_message(request: web.Request, err: web.HTTPException) -> str:
    """What an aiohttp error means to an agent (the route or method it should use)."""
    where = f"{request.method} {request.path}"
    if err.status == 404:
        return (
            f"Invalid URL ({where}): a session serves POST /sessions/{{id}}/v1/chat/completions "
            "and GET /sessions/{id}/v1/models (OPENAI_BASE_URL=http://HOST:PORT/sessions/{id}/v1)"
        )
    if err.status == 405:
        allowed = ", ".join(sorted(getattr(err, "allowed_methods", ()) or ()))
        return f"Method not allowed ({where}); this route takes {allowed}"
    return f"{err.reason} ({where}): {err.text or ''}".rstrip(": ")
