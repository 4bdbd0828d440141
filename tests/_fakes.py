"""Small envs for the tests (subclasses of :class:`vime.envs.Env`): one generic
single-turn env and the multi-turn tool envs of the collector tests. An env a test
scripts for one fault (it raises, holds the GIL, ...) stays with its test.

Example:
    >>> env = QuestionEnv()
    >>> env.reset(options={"task": {"id": "q", "question": "Say 3."}})[0]
    [{'role': 'user', 'content': 'Say 3.'}]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from vime.envs import Env
from vime.types import Action

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}

# vLLM structured output that makes the random tiny model emit Hermes tool calls, some of
# them malformed (bad JSON, missing name), or a final answer.
TOOL_CALL_REGEX = (
    r'(<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9], "b": [0-9]\}\}\n</tool_call>'
    r'|<tool_call>\n\{"name": "add", "arguments": \{"a": [0-9]\n</tool_call>'
    r'|<tool_call>\n\{"arguments": \{\}\}\n</tool_call>'
    r"|The answer is [0-9]+\.)"
)


class QuestionEnv(Env):
    """One turn: the task's ``question`` (else ``prompt``) as the user message; the
    episode ends after the policy's answer, with ``reward(text, task)`` (default 1.0)."""

    env_id = "test/Question-v0"

    def __init__(
        self,
        prompt: str = "Answer.",
        reward: Callable[[str, dict[str, Any]], float] | None = None,
    ) -> None:
        super().__init__()
        self.prompt = prompt
        self.reward = reward

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": self.task.get("question", self.prompt)}], {}

    def step(self, action: Action):
        reward = self.reward(action.text, self.task) if self.reward else 1.0
        return [], reward, True, False, {}


class ToolTurnsEnv(Env):
    """Runs ``add`` tool calls until the model answers or ``turns`` steps have passed."""

    tools = [ADD_TOOL]  # noqa: RUF012

    def __init__(self, turns: int = 3, system: bool = True) -> None:
        super().__init__()
        self.turns = turns
        self.system = system
        self.env_id = "test/ToolTurns-v0"
        self.steps = 0
        self.closed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed, options=options)
        self.steps = 0
        msgs = [
            {"role": "user", "content": f"What is {self.task.get('a', 2)}+{self.task.get('b', 3)}?"}
        ]
        if self.system:
            msgs.insert(0, {"role": "system", "content": "Use the add tool."})
        return msgs, {}

    def step(self, action: Action):
        self.steps += 1
        out = []
        for call in action.tool_calls:
            args = call.arguments
            result = int(args.get("a", 0)) + int(args.get("b", 0))
            out.append({"role": "tool", "content": json.dumps({"result": result})})
        for err in action.parse_errors:
            out.append({"role": "tool", "content": f"error: {err}"})
        if not out:
            out.append({"role": "user", "content": "Please use the add tool."})
        done = "answer" in action.text
        return out, float(done), done, False, {}

    def episode_metrics(self) -> dict[str, float]:
        return {"steps": float(self.steps)}

    def close(self) -> None:
        self.closed = True


class CrashEnv(ToolTurnsEnv):
    """Raises inside step."""

    def step(self, action: Action):
        raise RuntimeError("the sandbox died")


class SlowEnv(ToolTurnsEnv):
    """Sleeps inside step longer than the collector's env timeout."""

    def step(self, action: Action):
        time.sleep(2.0)
        return super().step(action)
