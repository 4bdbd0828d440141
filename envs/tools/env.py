"""vime/Tools-v0: answer a question by calling tools over several turns.

The policy sees the question and the tool schemas (``env.tools``). Each turn its tool
calls run and come back as ``{"role": "tool", ...}`` messages; calls that cannot be
parsed, name an unknown tool or carry bad arguments come back as an observation saying
what was wrong. The episode ends when the policy

- calls ``submit(answer)`` (terminated; reward 1 if the answer is right, else 0), or
- answers without any tool call (terminated; the answer is the last ``\\boxed{...}`` in
  the text, none gives reward 0), or
- runs out of turns (the registered ``max_turns``) or wall time (truncated, reward 0).

The sandbox (for ``python``, ``read_file``, ``write_file``) is leased from the process's
warm pool (:mod:`vime.sandbox.leases`) only when such a tool is first called, gets the
task's ``files`` in its workspace, and goes back (wiped) on ``close()`` or the next
``reset()``.

Example:
    >>> env = ToolsEnv(ToolsConfig(tools=["calculator", "submit"]))
    >>> msgs, info = env.reset(options={"task": {"id": "t", "question": "What is 6*7?", "answer": "42"}})
    >>> call = ToolCall(name="submit", arguments={"answer": "42"})
    >>> env.step(Action(text="", tool_calls=[call]))[1:3]
    (1.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vime.config import require
from vime.envs.answers import extract_boxed
from vime.envs.env_config import env_config
from vime.envs.tool_context import ToolContext
from vime.envs.toolkit import Tool, ToolEnv, Toolset, tool_message
from vime.errors import EnvError
from vime.sandbox import SandboxConfig
from vime.types import Action, Message, ToolCall

from .builtin_tools import BUILTINS
from .tasks import answers_match, load_tasks


def system_prompt(tools: list[Tool], workdir: str) -> str:
    """The system message; it names only what the offered tools allow (the tiny model
    attends over every prompt token of every turn: short prompts train faster).

    Example:
        >>> system_prompt([BUILTINS["calculator"]], "/workspace")
        'Solve the task with the tools; do not guess. Reply with the answer in \\\\boxed{} and no tool call.'
    """
    names = {t.name for t in tools}
    text = "Solve the task with the tools; do not guess."
    if any(t.takes_ctx for t in tools):  # a workspace tool: the task's files are there
        text += f" Files are in {workdir}."
    if "submit" in names:
        return (
            text
            + " Finish with submit(answer), or reply with the answer in \\boxed{} and no tool call."
        )
    return text + " Reply with the answer in \\boxed{} and no tool call."


@dataclass
class ToolsConfig:
    """Settings of :class:`ToolsEnv`.

    Example:
        >>> ToolsConfig(exec_timeout=4.0).tools[-1]
        'submit'
    """

    # Built-in tools offered to the policy (names from vime.suites.tools.builtin_tools.BUILTINS).
    tools: list[str] = field(
        default_factory=lambda: ["calculator", "python", "read_file", "write_file", "submit"]
    )
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
    # The sandbox the tools run in (leased from a warm pool on first use, one per episode).
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
        require(self.max_episode_seconds > 0, "tools.max_episode_seconds", "must be > 0")
        require(self.exec_timeout > 0, "tools.exec_timeout", "must be > 0 seconds")
        require(self.max_output_chars >= 100, "tools.max_output_chars", "must be >= 100")
        require(self.answer_rel_tol >= 0, "tools.answer_rel_tol", "must be >= 0")


class ToolsEnv(ToolEnv):
    """Multi-turn tool use with a verifier reward (registered as ``vime/Tools-v0``).

    Args:
        config: a :class:`ToolsConfig` (or a dict of its fields); defaults if omitted.
        extra_tools: more :class:`~vime.envs.toolkit.Tool` s (made with ``@tool``).
        **overrides: fields of :class:`ToolsConfig` (what ``vime.make(id, **kw)`` passes).

    Example:
        >>> ToolsEnv(exec_timeout=3.0).config.exec_timeout
        3.0
    """

    def __init__(
        self,
        config: ToolsConfig | dict[str, Any] | None = None,
        *,
        extra_tools: list[Tool] | tuple[Tool, ...] = (),
        **overrides: Any,
    ) -> None:
        self.config = env_config(ToolsConfig, config, overrides)
        self._offered = [BUILTINS[name] for name in self.config.tools] + list(extra_tools)
        super().__init__(Toolset(self._offered))

    def preflight(self) -> None:
        """A workspace tool (python, read_file, ...) runs in a sandbox: Docker must answer.

        Example (the doctests' ``DOCKER_HOST`` is the project's dockerd, which answers):
            >>> ToolsEnv(tools=["python"]).preflight()
        """
        sandboxed = [t.name for t in self._offered if t.takes_ctx]
        if sandboxed:
            from vime.sandbox.client import check_docker

            who = f"{self.env_id or 'vime/Tools-v0'} (its tools {', '.join(sandboxed)})"
            check_docker(self.config.sandbox.hosts(), needed_by=who)

    # -- episode ---------------------------------------------------------------------

    def _place_files(self, sandbox: Any) -> None:
        for rel, content in self.task.get("files", {}).items():
            sandbox.write_file(f"{self.config.sandbox.workspace}/{rel}", content)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]`` (or a task drawn with ``np_random``)."""
        super().reset(seed=seed, options=options)
        self.draw_task(lambda: load_tasks(self.config.tasks_path or None))
        for key in ("id", "question", "answer"):
            if key not in self.task:
                raise EnvError(
                    f"tools task lacks the field {key!r}; a task is "
                    "{'id': ..., 'question': ..., 'answer': ..., 'files': {path: text}}",
                    task_id=str(self.task.get("id")),
                )
        cfg = self.config
        ctx = ToolContext(
            sandbox_factory=self._new_sandbox,
            on_acquire=self._place_files,
            task=self.task,
            workdir=cfg.sandbox.workspace,
            exec_timeout=cfg.exec_timeout,
            max_output_chars=cfg.max_output_chars,
        )
        self.start_episode(ctx, correct=0.0)
        messages = [
            {"role": "system", "content": system_prompt(self._offered, cfg.sandbox.workspace)},
            {"role": "user", "content": str(self.task["question"])},
        ]
        return messages, {"task_id": str(self.task["id"])}

    def _new_sandbox(self) -> Any:
        from vime.sandbox.leases import lease

        return lease(self.config.sandbox)  # warm, from the process's pool of the image

    def _finish(
        self, answer: Any, messages: list[Message], how: str
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        correct = answers_match(answer, self.task["answer"], self.config.answer_rel_tol)
        self.stats["correct"] = float(correct)
        self.ctx.close()  # nothing runs after the answer: free the sandbox now
        info = {
            "task_id": str(self.task["id"]),
            "answer": answer,
            "correct": correct,
            "ended_by": how,
        }
        return messages, float(correct), True, False, info

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls; end on submit, on a tool-free answer, or at a limit."""
        self.begin_turn(action)
        messages: list[Message] = []
        if not action.tool_calls and not action.parse_errors:
            return self._finish(extract_boxed(action.text or ""), messages, "text")
        for i, call in enumerate(action.tool_calls):
            if call.name == "submit" and "submit" in self.toolset:
                self.stats["tool_calls"] += 1
                answer = self._submitted(call)
                if answer is not None:
                    messages.append(tool_message(call, i, f"submitted {answer!r}"))
                    return self._finish(answer, messages, "submit")
                self.stats["tool_errors"] += 1
                error = 'error: submit needs one argument, answer, e.g. {"answer": "42"}'
                messages.append(tool_message(call, i, error))
                continue
            messages.append(self.run_tool(call, i))
        # After the tool results: those answer the assistant's well-formed calls directly.
        messages += self.parse_error_reply(action)
        info: dict[str, Any] = {"task_id": str(self.task["id"])}
        limit = self.limit_hit(self.config.max_episode_seconds)
        if limit:
            self.ctx.close()
            return messages, 0.0, False, True, {**info, "truncated_by": limit}
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
