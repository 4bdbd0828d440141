"""Scripted episodes for the one-line bug family (the warm start of ``env=swe``).

A demonstration is the assistant's four turns, as text the collector parses (Hermes tool
calls): view the file, ``str_replace`` the line the issue names, run the tests, submit.
The tool results between the turns are not written here: the warm start steps the real
env (its pooled sandbox, its tools, the hidden tests at ``submit``) and renders them as
the collector does (:mod:`vime.rl.warm_start`), and a demonstration that does not earn
the full reward is an error.

Example:
    >>> from vime.suites.swe.tasks.oneline import oneline_tasks
    >>> for turn in demonstration(oneline_tasks(1)[0]):
    ...     print(turn.splitlines()[1])
    {"name": "bash", "arguments": {"command": "cat stock.py"}}
    {"name": "str_replace", "arguments": {"path": "stock.py", "old_str": "return a + a", "new_str": "return a * a"}}
    {"name": "bash", "arguments": {"command": "python3 -m unittest -q 2>&1 | tail -1"}}
    {"name": "submit", "arguments": {}}
"""

from __future__ import annotations

from typing import Any

from vime.errors import DataError
from vime.suites.tools.demonstrations import tool_call_text

# The tests' last line only ("OK" or "FAILED (failures=1)"): unittest's full report
# would add about 100 tokens of the tiny tokenizer to every episode.
RUN_TESTS = "python3 -m unittest -q 2>&1 | tail -1"


def demonstration(task: dict[str, Any]) -> list[str]:
    """The assistant's turns for a task whose ``solution`` is one ``[path, old, new]`` edit
    (every task of the one-line family; a task of another kind, e.g. several edits or no
    solution, has no scripted demonstration: a :class:`DataError` says so).
    """
    solution = task.get("solution") or []
    if len(solution) != 1:
        raise DataError(
            f"SWE task {task.get('id')!r} has no one-edit 'solution' to demonstrate; the "
            "one-line family (vime.suites.swe.tasks.oneline:oneline_tasks) has one; set "
            "env.builtin_tasks to it or model.warm_start_steps=0"
        )
    path, old, new = solution[0]
    return [
        tool_call_text("bash", {"command": f"cat {path}"}),
        tool_call_text("str_replace", {"path": path, "old_str": old, "new_str": new}),
        tool_call_text("bash", {"command": RUN_TESTS}),
        tool_call_text("submit", {}),
    ]
