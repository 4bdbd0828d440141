"""vime/Tools-v0: answer a question by calling tools over several turns.

The policy sees the question and the tool schemas (``env.tools``). Each turn its tool
calls run and come back as ``{"role": "tool", ...}`` messages; calls that cannot be
parsed, name an unknown tool or carry bad arguments come back as an observation saying
what was wrong. The episode ends when the policy

- calls ``submit(answer)`` (terminated; reward 1 if the answer is right, else 0), or
- answers without any tool call (terminated; the answer is the last ``\\boxed{...}`` in
  the text, none gives reward 0), or
- runs out of turns (``max_turns``) or wall time (truncated, reward 0).

The sandbox (for ``python``, ``read_file``, ``write_file``) is created only when such a
tool is first called, gets the task's ``files`` in its workspace, and is removed by
``close()`` or the next ``reset()``.

Example:
    >>> env = ToolsEnv(ToolsConfig(tools=["calculator", "submit"]))
    >>> msgs, info = env.reset(options={"task": {"id": "t", "question": "What is 6*7?", "answer": "42"}})
    >>> call = ToolCall(name="submit", arguments={"answer": "42"})
    >>> env.step(Action(text="", tool_calls=[call]))[1:3]
    (1.0, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from envs.tools.builtin_tools import BUILTINS
from envs.tools.tasks import answers_match, load_tasks
from envs.tools.toolkit import Tool, ToolContext, Toolset, parse_error_message, tool_message
from vime.config import require
from vime.envs import Env
from vime.errors import EnvError
from vime.sandbox import SandboxConfig
from vime.types import Action, Message, ToolCall

SYSTEM_PROMPT = (
    "Solve the task with the tools; do not guess. Files are in {workdir}. "
    "Finish with submit(answer), or reply with the answer in \\boxed{{}} and no tool call."
)


@dataclass
class ToolsConfig:
    """Settings of :class:`ToolsEnv`.

    Example:
        >>> ToolsConfig(max_turns=4).tools[-1]
        'submit'
    """

    # Built-in tools offered to the policy (names from envs.tools.builtin_tools.BUILTINS).
    tools: list[str] = field(
        default_factory=lambda: ["calculator", "python", "read_file", "write_file", "submit"]
    )
    # Turns before the episode is truncated (keep equal to the registered max_turns).
    max_turns: int = 8
    # Wall-clock seconds per episode before it is truncated.
    max_episode_seconds: float = 300.0
    # Seconds one python tool call may run.
    exec_timeout: float = 10.0
    # Characters of one tool result shown to the policy (head and tail are kept).
    max_output_chars: int = 2000
    # Relative tolerance for non-integer numeric answers.
    answer_rel_tol: float = 1e-6
    # A jsonl task file; "" = the bundled tasks (used when reset gets no task).
    tasks_path: str = ""
    # The sandbox the tools run in (created lazily, one per episode).
    sandbox: SandboxConfig = field(
        default_factory=lambda: SandboxConfig(
            memory="256m", timeout=30.0, labels={"vime.env": "tools"}
        )
    )

    def __post_init__(self) -> None:
        if isinstance(self.sandbox, dict):
            self.sandbox = SandboxConfig(**self.sandbox)
        unknown = [t for t in self.tools if t not in BUILTINS]
        require(
            not unknown,
            "tools.tools",
            f"unknown tool(s) {unknown}; built-ins are {sorted(BUILTINS)}",
        )
        require(len(set(self.tools)) == len(self.tools), "tools.tools", "lists a tool twice")
        require(self.max_turns >= 1, "tools.max_turns", f"must be >= 1, got {self.max_turns}")
        require(self.max_episode_seconds > 0, "tools.max_episode_seconds", "must be > 0")
        require(self.exec_timeout > 0, "tools.exec_timeout", "must be > 0 seconds")
        require(self.max_output_chars >= 100, "tools.max_output_chars", "must be >= 100")
        require(self.answer_rel_tol >= 0, "tools.answer_rel_tol", "must be >= 0")


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}`` in ``text`` (nested braces allowed), or None.

    Example:
        >>> last_boxed(r"so \boxed{1} no, \boxed{\frac{1}{2}}")
        '\\frac{1}{2}'
    """
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    begin = i
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i].strip()
        i += 1
    return None


class ToolsEnv(Env):
    """Multi-turn tool use with a verifier reward (registered as ``vime/Tools-v0``).

    Args:
        config: a :class:`ToolsConfig` (or a dict of its fields); defaults if omitted.
        extra_tools: more :class:`~envs.tools.toolkit.Tool` s (made with ``@tool``).
        **overrides: fields of :class:`ToolsConfig` (what ``vime.make(id, **kw)`` passes).

    Example:
        >>> ToolsEnv(max_turns=3).config.max_turns
        3
    """

    def __init__(
        self,
        config: ToolsConfig | dict[str, Any] | None = None,
        *,
        extra_tools: list[Tool] | tuple[Tool, ...] = (),
        **overrides: Any,
    ) -> None:
        super().__init__()
        if isinstance(config, dict):
            config = ToolsConfig(**config)
        base = config or ToolsConfig()
        self.config = ToolsConfig(**{**base.__dict__, **overrides}) if overrides else base
        self.toolset = Toolset([BUILTINS[name] for name in self.config.tools] + list(extra_tools))
        self.tools = self.toolset.schemas
        self._tasks: list[dict[str, Any]] | None = None
        self._ctx = ToolContext()
        self._turn = 0
        self._started = 0.0
        self._stats: dict[str, float] = {}

    # -- episode ---------------------------------------------------------------------

    def _default_tasks(self) -> list[dict[str, Any]]:
        if self._tasks is None:
            self._tasks = load_tasks(self.config.tasks_path or None)
        return self._tasks

    def _place_files(self, sandbox: Any) -> None:
        for rel, content in self.task.get("files", {}).items():
            sandbox.write_file(f"{self.config.sandbox.workspace}/{rel}", content)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]`` (or a task drawn with ``np_random``)."""
        super().reset(seed=seed, options=options)
        self._ctx.close()  # the previous episode's sandbox, if close() was not called
        if not self.task:
            tasks = self._default_tasks()
            self.task = dict(tasks[int(self.np_random.integers(len(tasks)))])
        for key in ("id", "question", "answer"):
            if key not in self.task:
                raise EnvError(
                    f"tools task lacks the field {key!r}; a task is "
                    "{'id': ..., 'question': ..., 'answer': ..., 'files': {path: text}}",
                    task_id=str(self.task.get("id")),
                )
        cfg = self.config
        self._ctx = ToolContext(
            sandbox_factory=self._new_sandbox,
            on_acquire=self._place_files,
            task=self.task,
            workdir=cfg.sandbox.workspace,
            exec_timeout=cfg.exec_timeout,
            max_output_chars=cfg.max_output_chars,
        )
        self._turn = 0
        self._started = time.monotonic()
        self._stats = {"tool_calls": 0.0, "tool_errors": 0.0, "parse_errors": 0.0, "correct": 0.0}
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=cfg.sandbox.workspace)},
            {"role": "user", "content": str(self.task["question"])},
        ]
        return messages, {"task_id": str(self.task["id"])}

    def _new_sandbox(self) -> Any:
        from vime.sandbox import DockerSandbox

        return DockerSandbox(self.config.sandbox)

    def _finish(
        self, answer: Any, messages: list[Message], how: str
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        correct = answers_match(answer, self.task["answer"], self.config.answer_rel_tol)
        self._stats["correct"] = float(correct)
        self._ctx.close()  # nothing runs after the answer: free the sandbox now
        info = {
            "task_id": str(self.task["id"]),
            "answer": answer,
            "correct": correct,
            "ended_by": how,
        }
        return messages, float(correct), True, False, info

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls; end on submit, on a tool-free answer, or at a limit."""
        self._turn += 1
        messages: list[Message] = []
        if action.parse_errors:
            self._stats["parse_errors"] += len(action.parse_errors)
        if not action.tool_calls and not action.parse_errors:
            return self._finish(last_boxed(action.text or ""), messages, "text")
        for i, call in enumerate(action.tool_calls):
            self._stats["tool_calls"] += 1
            if call.name == "submit" and "submit" in self.toolset:
                answer = self._submitted(call)
                if answer is not None:
                    messages.append(tool_message(call, i, f"submitted {answer!r}"))
                    return self._finish(answer, messages, "submit")
                self._stats["tool_errors"] += 1
                messages.append(
                    tool_message(
                        call, i, 'error: submit needs one argument, answer, e.g. {"answer": "42"}'
                    )
                )
                continue
            content = self.toolset.call(call, self._ctx)
            if content.startswith("error:"):
                self._stats["tool_errors"] += 1
            messages.append(tool_message(call, i, content))
        if action.parse_errors:
            # After the tool results: those answer the assistant's well-formed calls directly.
            messages.append(parse_error_message(list(action.parse_errors)))
        info: dict[str, Any] = {"task_id": str(self.task["id"])}
        if self._turn >= self.turn_limit(self.config.max_turns):
            info["truncated_by"] = "max_turns"
        elif time.monotonic() - self._started > self.config.max_episode_seconds:
            info["truncated_by"] = "wall_time"
        if "truncated_by" in info:
            self._ctx.close()
            return messages, 0.0, False, True, info
        return messages, 0.0, False, False, info

    @staticmethod
    def _submitted(call: ToolCall) -> str | None:
        # Accept any JSON scalar: small models often submit 42 rather than "42".
        args = call.arguments if isinstance(call.arguments, dict) else {}
        if (
            set(args) != {"answer"}
            or isinstance(args["answer"], dict | list)
            or args["answer"] is None
        ):
            return None
        return str(args["answer"])

    def episode_metrics(self) -> dict[str, float]:
        """Tool calls, tool errors, parse errors, whether the answer was right, turns used."""
        return {
            **self._stats,
            "turns": float(self._turn),
            "sandbox_used": float(self._ctx.acquired),
        }

    def close(self) -> None:
        """Remove the episode's sandbox, if one was created."""
        self._ctx.close()
