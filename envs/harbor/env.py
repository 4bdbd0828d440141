"""vime/Harbor-v0: Harbor task folders (Terminal-Bench's format) as a vime env.

The agent reads the task's ``instruction.md`` and works in a sandbox of the task's image
(its ``environment/Dockerfile`` replayed offline on vime's base image,
:mod:`vime.suites.harbor.dockerfile`) through the SWE tools: ``bash``, ``str_replace``,
``write_file`` (paths relative to the Dockerfile's ``WORKDIR``) and ``submit()``. The
episode ends on ``submit()`` or a limit (the registered ``max_turns``, or ``[agent]
timeout_sec`` of wall time); then the task's own tests grade the sandbox as Harbor does
(:mod:`vime.suites.harbor.verifier`): reward = what ``tests/test.sh`` wrote.

The sandbox runs as root with a writable image (Harbor's tasks expect both), without
network; it is leased from the process's pool of the image on the first tool call, and
replaced (never reused) after the episode.

Example:
    >>> env = HarborEnv()
    >>> msgs, info = env.reset(seed=0, options={"task": "count-words"})
    >>> info["task_id"], "words.txt" in msgs[-1]["content"]
    ('count-words', True)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.config import require
from vime.envs.env_config import env_config
from vime.envs.toolkit import ToolContext, ToolEnv, Toolset, tool_message
from vime.errors import EnvError
from vime.sandbox import SandboxConfig
from vime.suites.swe.tools import SWE_TOOLS
from vime.types import Action, Message

from .dockerfile import DockerfilePlan, build_task_image
from .task import BUNDLED_DIR, HarborTask, load_task, load_tasks
from .verifier import STATUSES, Verdict, verify

SYSTEM_PROMPT = """\
You are an agent working in a Linux terminal; your working folder is {workdir}.
Use the tools: bash to run shell commands, str_replace or write_file to edit files.
Hidden tests will check the result. When the task is done, call submit()."""

NO_TOOL_CALL = (
    "No tool call found in your reply. Call bash(command) to run commands, str_replace(path, "
    "old_str, new_str) or write_file(path, content) to edit files, and submit() when done."
)


@dataclass
class HarborConfig:
    """Settings of :class:`HarborEnv`.

    Example:
        >>> HarborConfig(tasks_path="").command_timeout
        30.0
    """

    # A Harbor task folder, or a folder of them ("" = the three bundled tasks).
    tasks_path: str = ""
    # Seconds one bash command may run (cut to what is left of the task's agent timeout).
    command_timeout: float = 30.0
    # Characters of one tool result shown to the policy (head and tail kept).
    max_output_chars: int = 4000
    # Grade when a limit truncates the episode (Harbor grades a timed-out agent too).
    grade_on_truncation: bool = True
    # Tools offered to the policy (of bash, str_replace, write_file, submit).
    tools: list[str] = field(default_factory=lambda: [t.name for t in SWE_TOOLS])
    # Sandbox limits; the image, user (root) and writable rootfs come from the task.
    # [environment] memory_mb / cpus of task.toml override memory / cpus when given.
    sandbox: SandboxConfig = field(
        default_factory=lambda: SandboxConfig(
            memory="512m", timeout=60.0, env={"HOME": "/root"}, labels={"vime.env": "harbor"}
        )
    )

    def __post_init__(self) -> None:
        if isinstance(self.sandbox, dict):
            self.sandbox = SandboxConfig(**self.sandbox)
        require(self.command_timeout > 0, "harbor.command_timeout", "must be > 0 seconds")
        require(self.max_output_chars >= 200, "harbor.max_output_chars", "must be >= 200")
        require(
            not self.tasks_path or Path(self.tasks_path).exists(),
            "harbor.tasks_path",
            f"{self.tasks_path} does not exist",
        )
        known = [t.name for t in SWE_TOOLS]
        unknown = [t for t in self.tools if t not in known]
        require(not unknown, "harbor.tools", f"unknown tool(s) {unknown}; the tools are {known}")


_LOADED: dict[str, list[HarborTask]] = {}


def _tasks(path: str) -> list[HarborTask]:
    """The tasks of ``path`` (the bundled ones for ""), read once per process."""
    key = str(Path(path or BUNDLED_DIR).resolve())
    if key not in _LOADED:
        _LOADED[key] = load_tasks(key)
    return _LOADED[key]


class HarborEnv(ToolEnv):
    """Harbor task folders, graded by their own tests (registered as ``vime/Harbor-v0``).

    ``reset(options={"task": ...})`` takes a task name (of ``tasks_path``), a task folder
    path, a :class:`HarborTask`, or a record ``{"id": name}`` (or ``{"id", "path"}``);
    without one a task is drawn.

    Args:
        config: a :class:`HarborConfig` (or a dict of its fields); defaults if omitted.
        **overrides: fields of :class:`HarborConfig` (what ``vime.make(id, **kw)`` passes).

    Example:
        >>> [t["function"]["name"] for t in HarborEnv().tools]
        ['bash', 'str_replace', 'write_file', 'submit']
    """

    def __init__(
        self, config: HarborConfig | dict[str, Any] | None = None, **overrides: Any
    ) -> None:
        self.config = env_config(HarborConfig, config, overrides)
        super().__init__(Toolset([t for t in SWE_TOOLS if t.name in self.config.tools]))
        self._by_name = {t.name: t for t in _tasks(self.config.tasks_path)}
        self._harbor: HarborTask | None = None
        self._plan: DockerfilePlan | None = None

    def preflight(self) -> None:
        """Every Harbor episode runs in a sandbox: Docker must answer on every host.

        Example (the doctests' ``DOCKER_HOST`` is the project's dockerd, which answers):
            >>> HarborEnv().preflight()
        """
        from vime.sandbox.client import check_docker

        check_docker(self.config.sandbox.hosts(), needed_by=self.env_id or "vime/Harbor-v0")

    # -- sandboxes -------------------------------------------------------------------

    def _new_sandbox(self) -> Any:
        from vime.sandbox import distribute_image
        from vime.sandbox.leases import lease

        task = self._harbor
        assert task is not None
        cfg = self.config.sandbox
        hosts = cfg.hosts()
        tag, self._plan = build_task_image(task.dockerfile, host=hosts[0])
        distribute_image(tag, hosts)  # no-op on one host
        changes: dict[str, Any] = {"image": tag, "read_only": False, "user": "0:0"}
        if task.memory_mb:
            changes["memory"] = f"{task.memory_mb}m"
        if task.cpus:
            changes["cpus"] = task.cpus
        env = {**cfg.env, **self._plan.env}
        return lease(dataclasses.replace(cfg, env=env, **changes))

    def _on_acquire(self, sandbox: Any) -> None:
        assert self._plan is not None
        self.ctx.workdir = self._plan.workdir

    # -- episode ---------------------------------------------------------------------

    def _pick(self, chosen: Any) -> HarborTask:
        if isinstance(chosen, HarborTask):
            return chosen
        if isinstance(chosen, dict) and chosen.get("path"):
            return load_task(chosen["path"])
        name = chosen.get("id", "") if isinstance(chosen, dict) else str(chosen)
        if name in self._by_name:
            return self._by_name[name]
        if Path(name).is_dir():
            return load_task(name)
        raise EnvError(f"no Harbor task {name!r} (known: {sorted(self._by_name)})", task_id=name)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]`` (or a task drawn with ``np_random``)."""
        chosen = (options or {}).get("task")
        opts = {k: v for k, v in (options or {}).items() if k != "task"}
        super().reset(seed=seed, options=opts)
        if chosen is None:
            self.draw_task(lambda: [{"id": name} for name in sorted(self._by_name)])
            chosen = self.task
        task = self._pick(chosen)
        self._harbor = task
        self.task = {"id": task.name}
        # The workdir is the Dockerfile's WORKDIR, read without building anything yet.
        from .dockerfile import plan_dockerfile

        workdir = plan_dockerfile(task.dockerfile.read_text(), task.dockerfile.parent).workdir
        ctx = ToolContext(
            sandbox_factory=self._new_sandbox,
            on_acquire=self._on_acquire,
            task=self.task,
            workdir=workdir,
            exec_timeout=self.config.command_timeout,
            max_output_chars=self.config.max_output_chars,
        )
        self.start_episode(ctx, passed=0.0, failed=0.0, error=0.0)
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(workdir=workdir)},
            {"role": "user", "content": task.instruction.strip()},
        ]
        return messages, {"task_id": task.name}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls; grade on ``submit()`` or when a limit truncates the episode."""
        assert self._harbor is not None
        self.begin_turn(action)
        messages: list[Message] = []
        submitted = False
        budget = self._harbor.agent_timeout_sec
        for i, call in enumerate(action.tool_calls):
            if call.name == "submit":
                self.stats["tool_calls"] += 1
                submitted = True
                messages.append(tool_message(call, i, "submitted; the task's tests run now"))
                break
            left = budget - self.elapsed()
            self.ctx.exec_timeout = max(1.0, min(self.config.command_timeout, left))
            messages.append(self.run_tool(call, i))
        messages += self.parse_error_reply(action)
        if not action.tool_calls and not action.parse_errors:
            messages.append({"role": "user", "content": NO_TOOL_CALL})
        limit = "" if submitted else self.limit_hit(budget)
        if not submitted and not limit:
            return messages, 0.0, False, False, {"task_id": self._harbor.name}
        verdict = Verdict(0.0, "failed", "not graded: truncated and grade_on_truncation is off")
        if submitted or self.config.grade_on_truncation:
            verdict = self._grade()
        self.ctx.close()  # a writable sandbox is replaced, never reused
        self.stats.update({s: float(s == verdict.status) for s in STATUSES})
        self.stats["grade_seconds"] = verdict.seconds
        info: dict[str, Any] = {
            "task_id": self._harbor.name,
            "status": verdict.status,
            "reason": verdict.reason,
            "test_output": verdict.output[-2000:],
        }
        if limit:
            info["truncated_by"] = limit
        return messages, verdict.reward, not limit, bool(limit), info

    def _grade(self) -> Verdict:
        assert self._harbor is not None
        if not self.ctx.has_sandbox:
            # Nothing was done (a task's tests fail on its image as built): no container is
            # started for it, so an episode without a tool call costs no sandbox.
            return Verdict(0.0, "failed", "the agent never used its sandbox; nothing to grade")
        return verify(self.ctx.sandbox, self._harbor)
