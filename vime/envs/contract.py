"""Validators for what an env returns; shared by the runtime wrapper and the checker.

Each ``validate_*`` function raises :class:`~vime.errors.EnvCheckError` whose message
says what is wrong and how to fix it, or returns the value in canonical form.

Example:
    >>> validate_step_result(([], 1, True, False, {}))
    ([], 1.0, True, False, {})
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from vime.envs.spaces import messages_problem
from vime.errors import EnvCheckError
from vime.types import Message

_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
STEP_SHAPE = "(new_messages, reward, terminated, truncated, info)"


def validate_reset_result(result: Any) -> tuple[list[Message], dict[str, Any]]:
    """Check ``reset``'s return value: ``(messages, info)`` with a non-empty conversation.

    Example:
        >>> validate_reset_result(([{"role": "user", "content": "hi"}], {}))[0][0]["role"]
        'user'
    """
    if not (isinstance(result, tuple) and len(result) == 2):
        raise EnvCheckError(
            f"reset() must return a tuple (messages, info), got {_describe(result)}; "
            "end reset with `return messages, {}`"
        )
    messages, info = result
    problem = messages_problem(messages)
    if problem:
        raise EnvCheckError(f"reset() returned invalid messages: {problem}")
    if not messages:
        raise EnvCheckError(
            "reset() returned no messages; return the opening conversation, e.g. "
            "[{'role': 'user', 'content': 'What is 2+2?'}]"
        )
    if messages[-1]["role"] == "assistant":
        raise EnvCheckError(
            "reset() messages end with an assistant message, but the policy speaks next; "
            "end the opening conversation with a user (or tool) message"
        )
    _validate_info(info, "reset()")
    return messages, info


def validate_step_result(result: Any) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """Check ``step``'s return value and return it with ``reward`` as a Python float.

    Example:
        >>> validate_step_result(([{"role": "user", "content": "again?"}], 0.0, False, False, {}))[2]
        False
    """
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvCheckError(
            f"step() must return a 5-tuple {STEP_SHAPE}, got {_describe(result)}; "
            "Gymnasium's 4-tuple (obs, reward, done, info) is the old API: split done into "
            "terminated and truncated"
        )
    new_messages, reward, terminated, truncated, info = result
    problem = messages_problem(new_messages)
    if problem:
        raise EnvCheckError(f"step() returned invalid new_messages: {problem}")
    for msg in new_messages:
        if msg["role"] == "assistant":
            raise EnvCheckError(
                "step() returned an assistant message; return only the NEW messages the env "
                "adds (tool results, user turns); the collector appends the assistant turn itself"
            )
    reward = validate_reward(reward)
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, bool):
            raise EnvCheckError(
                f"step() returned {name}={flag!r} ({type(flag).__name__}); it must be a Python "
                f"bool: return bool({name})"
            )
    _validate_info(info, "step()")
    return new_messages, reward, terminated, truncated, info


def validate_reward(reward: Any) -> float:
    """A finite reward as a Python float, or :class:`EnvCheckError` naming the fix.

    Example:
        >>> validate_reward(1)
        1.0
    """
    if isinstance(reward, bool | np.bool_) or not isinstance(
        reward, int | float | np.integer | np.floating
    ):
        raise EnvCheckError(
            f"step() returned reward={reward!r:.60} ({type(reward).__name__}); it must be a "
            "finite float: return float(reward)"
        )
    value = float(reward)
    if not math.isfinite(value):
        raise EnvCheckError(
            f"step() returned reward={value}; rewards must be finite: score failures as 0.0 "
            "instead of NaN/inf"
        )
    return value


def validate_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Check ``env.tools``: ``None`` or a list of OpenAI function schemas with unique names.

    Example:
        >>> validate_tools([{"type": "function", "function": {"name": "add",
        ...     "description": "a+b", "parameters": {"type": "object", "properties": {}}}}])[0]["type"]
        'function'
    """
    if tools is None:
        return None
    shape = (
        "{'type': 'function', 'function': {'name': 'add', 'description': '...', "
        "'parameters': {'type': 'object', 'properties': {...}}}}"
    )
    if not isinstance(tools, list):
        raise EnvCheckError(f"env.tools must be None or a list of {shape}, got {_describe(tools)}")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"env.tools[{i}]"
        if not (isinstance(tool, dict) and tool.get("type") == "function"):
            raise EnvCheckError(f"{where} must be {shape}, got {tool!r:.80}")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise EnvCheckError(f"{where} has no 'function' dict; expected {shape}")
        name = fn.get("name")
        if not (isinstance(name, str) and _TOOL_NAME.match(name)):
            raise EnvCheckError(
                f"{where}.function.name={name!r} must be 1-64 characters of a-z, A-Z, 0-9, _ or -"
            )
        if name in seen:
            raise EnvCheckError(f"{where}: tool name {name!r} is used twice; names must be unique")
        seen.add(name)
        if not isinstance(fn.get("description", ""), str):
            raise EnvCheckError(f"{where}.function.description must be a str")
        params = fn.get("parameters")
        if not (isinstance(params, dict) and params.get("type") == "object"):
            raise EnvCheckError(
                f"{where}.function.parameters must be a JSON schema object "
                "{'type': 'object', 'properties': {...}, 'required': [...]}, "
                f"got {params!r:.80}"
            )
        props = params.get("properties", {})
        required = params.get("required", [])
        if not isinstance(props, dict):
            raise EnvCheckError(f"{where}.function.parameters.properties must be a dict")
        missing = [r for r in required if r not in props] if isinstance(required, list) else []
        if not isinstance(required, list) or missing:
            raise EnvCheckError(
                f"{where}.function.parameters.required must list names from 'properties'"
                + (f"; {missing} are not there" if missing else "")
            )
    return tools


def validate_metrics(metrics: Any) -> dict[str, float]:
    """Check ``episode_metrics()``: a dict of str to finite float.

    Example:
        >>> validate_metrics({"steps": 3})
        {'steps': 3.0}
    """
    if not isinstance(metrics, dict):
        raise EnvCheckError(
            f"episode_metrics() must return a dict[str, float], got {_describe(metrics)}; "
            "return {} when there is nothing to report"
        )
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise EnvCheckError(f"episode_metrics() key {key!r} must be a str")
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
            raise EnvCheckError(
                f"episode_metrics()[{key!r}]={value!r:.60} must be a number: return float(value)"
            )
        if not math.isfinite(float(value)):
            raise EnvCheckError(f"episode_metrics()[{key!r}]={value} must be finite")
        out[key] = float(value)
    return out


def _validate_info(info: Any, where: str) -> None:
    if not isinstance(info, dict):
        raise EnvCheckError(
            f"{where} returned info={_describe(info)}; info must be a dict: return {{}} if "
            "there is nothing to report"
        )


def _describe(value: Any) -> str:
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{type(value).__name__} {text}"
