"""Tool-call parsers: assistant text → :class:`~vime.types.Action`.

A parser never raises. Each malformed call becomes one human-readable entry in
``Action.parse_errors`` that names what was wrong and what a valid call looks like; the
collector (or the env) answers it as an observation, so a bad call costs the policy a
turn instead of crashing the episode or poisoning the batch.

Formats:

- ``"hermes"`` (Hermes / Qwen2.5 / Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``,
  any number of them anywhere in the text.
- ``"llama3_json"`` (Llama 3.1+ JSON tool calling): the whole message is one JSON object
  ``{"name": ..., "parameters": {...}}`` (optionally after ``<|python_tag|>``), or several
  separated by ``;``. Text that does not start with ``{`` is plain text, not a call.
- ``"mistral"`` (Mistral instruct v3+): ``[TOOL_CALLS]`` followed by a JSON list of
  ``{"name": ..., "arguments": {...}}`` (or one such object); text before it is kept as text.
- ``"qwen3"`` and ``"qwen"``: the Hermes format (Qwen2.5 and Qwen3 write the same blocks).
- ``"none"``: no tool calls (plain-text envs such as math).

Example:
    >>> action = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    >>> action.tool_calls[0].name, action.tool_calls[0].arguments
    ('add', {'a': 1})
    >>> parse_tool_calls("<tool_call>{oops}</tool_call>").parse_errors[0][:40]
    'tool call 1: the JSON inside <tool_call>'
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from vime.types import Action, ToolCall

ToolParser = Callable[[str], Action]
"""A parser: assistant text in, :class:`Action` out (never raises)."""

HERMES_EXAMPLE = '<tool_call>\n{"name": "<tool name>", "arguments": {<arguments>}}\n</tool_call>'
LLAMA3_EXAMPLE = '{"name": "<tool name>", "parameters": {<arguments>}}'
MISTRAL_EXAMPLE = '[TOOL_CALLS][{"name": "<tool name>", "arguments": {<arguments>}}]'
MISTRAL_MARK = "[TOOL_CALLS]"

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)
_DECODER = json.JSONDecoder()


def _decode(text: str, pos: int = 0) -> tuple[Any, int] | str:
    """``(value, end)`` of the JSON value at ``text[pos:]``, or why it is not one.

    Not only ``JSONDecodeError``: an integer of over 4300 digits is a ``ValueError`` and
    deep nesting a ``RecursionError``; a policy can write either.

    Example:
        >>> _decode('{"a": 1} tail')
        ({'a': 1}, 8)
        >>> _decode("[" * 100_000)
        'nested too deeply'
    """
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError as err:
        return f"{err.msg} at char {err.pos}"
    except RecursionError:
        return "nested too deeply"
    except (
        ValueError
    ) as err:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        return str(err).split(";")[0]


def _check_call(obj: Any, index: int, args_key: str, example: str) -> ToolCall | str:
    """Validate one decoded call; return it, or the error message for the model."""
    where = f"tool call {index}"
    if not isinstance(obj, dict):
        return f"{where}: expected a JSON object, got {type(obj).__name__}. Write: {example}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'{where}: missing "name" (a non-empty string). Write: {example}'
    shown = name if len(name) <= 60 else name[:57] + "..."  # never echo a huge name back
    # Accept both key spellings: models trained on one format often emit the other.
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        # Some models emit arguments as a JSON-encoded string (the OpenAI wire format).
        decoded = _decode(args.strip()) if args.strip() else ({}, 0)
        if isinstance(decoded, str) or decoded[1] != len(args.strip()):
            return f'{where} ({shown}): "{args_key}" is a string that is not JSON. Write: {example}'
        args = decoded[0]
    if not isinstance(args, dict):
        return (
            f'{where} ({shown}): "{args_key}" must be a JSON object, got '
            f"{type(args).__name__}. Write: {example}"
        )
    return ToolCall(name=name.strip(), arguments=args, id=f"call_{index}")


def parse_hermes(text: str) -> Action:
    """Parse Hermes/Qwen ``<tool_call>{json}</tool_call>`` blocks.

    Example:
        >>> parse_hermes('Let me add.<tool_call>\\n{"name": "add", "arguments": {}}\\n</tool_call>').tool_calls[0].name
        'add'
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, match in enumerate(_HERMES_BLOCK.finditer(text), start=1):
        body, closing = match.group(1).strip(), match.group(2)
        if not closing:
            errors.append(f"tool call {i}: <tool_call> is never closed. Write: {HERMES_EXAMPLE}")
            continue
        decoded = _decode(body)
        if not isinstance(decoded, str) and decoded[1] != len(body):
            decoded = f"extra data at char {decoded[1]}"
        if isinstance(decoded, str):
            errors.append(
                f"tool call {i}: the JSON inside <tool_call> is invalid ({decoded}). "
                f"Write: {HERMES_EXAMPLE}"
            )
            continue
        result = _check_call(decoded[0], i, "arguments", HERMES_EXAMPLE)
        (calls.append(result) if isinstance(result, ToolCall) else errors.append(result))
    if not calls and not errors and "</tool_call>" in text:
        errors.append(f"tool call 1: </tool_call> without <tool_call>. Write: {HERMES_EXAMPLE}")
    return Action(text=text, tool_calls=calls, parse_errors=errors)


def parse_llama3_json(text: str) -> Action:
    """Parse Llama-3 JSON tool calls: the message is ``{"name":..., "parameters":{...}}``.

    Example:
        >>> parse_llama3_json('{"name": "add", "parameters": {"a": 1}}').tool_calls[0].arguments
        {'a': 1}
        >>> parse_llama3_json("The answer is 4.").tool_calls
        []
    """
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>") :].strip()
    if body.endswith("<|eom_id|>") or body.endswith("<|eot_id|>"):
        body = body[: -len("<|eom_id|>")].strip()
    if not body.startswith("{"):
        return Action(text=text)
    calls: list[ToolCall] = []
    errors: list[str] = []
    pos, index = 0, 1
    while pos < len(body):
        decoded = _decode(body, pos)
        if isinstance(decoded, str):
            errors.append(f"tool call {index}: invalid JSON ({decoded}). Write: {LLAMA3_EXAMPLE}")
            break
        obj, end = decoded
        result = _check_call(obj, index, "parameters", LLAMA3_EXAMPLE)
        (calls.append(result) if isinstance(result, ToolCall) else errors.append(result))
        # Several calls are separated by ';' (Llama 3.2 style) or whitespace.
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
        index += 1
    return Action(text=text, tool_calls=calls, parse_errors=errors)


def parse_mistral(text: str) -> Action:
    """Parse Mistral ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` calls.

    Example:
        >>> parse_mistral('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}}]</s>').tool_calls[0].arguments
        {'a': 1}
        >>> parse_mistral("[TOOL_CALLS][{oops").parse_errors[0][:40]
        'tool call 1: the JSON after [TOOL_CALLS]'
    """
    at = text.find(MISTRAL_MARK)
    if at < 0:
        return Action(text=text)
    body = text[at + len(MISTRAL_MARK) :].strip()
    if body.endswith("</s>"):
        body = body[: -len("</s>")].rstrip()
    decoded = _decode(body)
    if not isinstance(decoded, str) and decoded[1] != len(body):
        decoded = f"extra data at char {decoded[1]}"
    if isinstance(decoded, str):
        why = f"the JSON after {MISTRAL_MARK} is invalid ({decoded})"
        return Action(text=text, parse_errors=[f"tool call 1: {why}. Write: {MISTRAL_EXAMPLE}"])
    found = decoded[0] if isinstance(decoded[0], list) else [decoded[0]]
    if not found:
        why = f"{MISTRAL_MARK} lists no call"
        return Action(text=text, parse_errors=[f"tool call 1: {why}. Write: {MISTRAL_EXAMPLE}"])
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, obj in enumerate(found, start=1):
        result = _check_call(obj, i, "arguments", MISTRAL_EXAMPLE)
        (calls.append(result) if isinstance(result, ToolCall) else errors.append(result))
    return Action(text=text, tool_calls=calls, parse_errors=errors)


def parse_none(text: str) -> Action:
    """No tool calls: the whole text is the action (plain-text envs).

    Example:
        >>> parse_none("\\\\boxed{4}").text
        '\\\\boxed{4}'
    """
    return Action(text=text)


PARSERS: dict[str, ToolParser] = {
    "hermes": parse_hermes,
    "qwen": parse_hermes,
    "qwen3": parse_hermes,  # Qwen3 writes Hermes blocks (its <think> part is plain text)
    "llama3_json": parse_llama3_json,
    "mistral": parse_mistral,
    "none": parse_none,
}


def get_parser(name: str) -> ToolParser:
    """The parser registered under ``name`` (see :data:`PARSERS`).

    Example:
        >>> get_parser("hermes") is parse_hermes
        True
    """
    from vime.config import require_choice

    require_choice(name, "collector.tool_parser", PARSERS)
    return PARSERS[name]


def parse_tool_calls(text: str, parser: str = "hermes") -> Action:
    """Parse ``text`` with the parser named ``parser``.

    Example:
        >>> parse_tool_calls("no calls here").tool_calls
        []
    """
    return get_parser(parser)(text)
