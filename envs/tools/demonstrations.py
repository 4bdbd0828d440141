"""Scripted multi-turn demonstrations for vime/Tools-v0 (the warm start's episodes).

A demonstration is the list of the assistant's turns, as text the collector would parse:
first a calculator call in the Hermes tool-call format (the one the tiny model's chat
template describes and ``collector.tool_parser=hermes`` reads), then the result in
``\\boxed{}``. The tool's result between the two turns is not written here: the warm
start steps the real env with the first turn and renders its answer with
:class:`~vime.agents.chat_tokens.ChatTokens`, exactly as the collector does
(:mod:`vime.rl.warm_start`).

The second turn needs the calculator's answer, which equals the task's ``answer`` for a
correct call; the warm start checks that each demonstration earns the full reward.

Example:
    >>> turns = demonstration({"id": "t", "question": "What is 6 * 7?", "answer": "42", "expression": "6 * 7"})
    >>> print(turns[0])
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "6 * 7"}}
    </tool_call>
    >>> turns[1]
    '\\\\boxed{42}'
"""

from __future__ import annotations

import json
from typing import Any

from vime.errors import DataError


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One Hermes tool call, as the tiny model's chat template writes one.

    Example:
        >>> tool_call_text("submit", {"answer": "4"})
        '<tool_call>\\n{"name": "submit", "arguments": {"answer": "4"}}\\n</tool_call>'
    """
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def demonstration(task: dict[str, Any]) -> list[str]:
    """The assistant's turns for a task with an ``expression`` (a calculator call, the box).

    Tasks without one (the bundled ``mul``/``primes``/... families) have no scripted
    demonstration: a :class:`DataError` says so.
    """
    expression = task.get("expression")
    if not isinstance(expression, str) or not expression:
        raise DataError(
            f"tools task {task.get('id')!r} has no 'expression': only calculator tasks "
            "(vime.suites.tools.tasks:calculator_tasks) have demonstrations; set "
            "env.builtin_tasks to it or model.warm_start_steps=0"
        )
    return [
        tool_call_text("calculator", {"expression": expression}),
        f"\\boxed{{{task['answer']}}}",
    ]
