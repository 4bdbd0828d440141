"""vime/SWE-v0: fix a bug in a repository inside a Docker sandbox; hidden tests give the reward.

Each turn the policy calls tools (``bash``, ``str_replace``, ``write_file``) that act on
its own sandbox; ``submit()`` ends the episode. The reward is computed from the agent's
final ``git diff`` alone (see :mod:`vime.suites.swe.grading`): applied to a pristine copy of the
repository in a fresh container, where the hidden tests are added afterwards. A diff that
touches test files is rejected (reward 0). Per-episode limits: the registered
``max_turns``, ``max_episode_seconds`` and ``max_total_output_chars`` (hitting one
truncates the episode; the diff so far is still graded when ``grade_on_truncation``).

The repository sandbox is leased from the process's warm pool of the image
(:mod:`vime.sandbox.leases`) on the first tool call (so ``reset`` is cheap) and given back
when the episode ends, on ``close()`` or on the next ``reset()``.

Example:
    >>> env = SWEEnv()
    >>> msgs, info = env.reset(seed=0, options={"task": load_bundled()[0]})
    >>> info["task_id"]
    'roman-subtractive'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.config import require
from vime.envs.env_config import env_config
from vime.envs.tool_context import ToolContext
from vime.envs.toolkit import ToolEnv, Toolset, tool_message
from vime.errors import EnvError
from vime.sandbox import SandboxConfig
from vime.types import Action, Message

from .grading import STATUSES, GradeResult, agent_diff, grade, setup_repo
from .registry_images import check_image_source
from .tasks import SWETask, load_bundled
from .tools import SWE_TOOLS

SYSTEM_PROMPT = """\
You are a software engineer fixing an issue in the repository at {repo_dir}.
Use the tools: bash to explore and run commands (e.g. `python3 -m unittest -q`),
str_replace or write_file to edit files. Do not edit the tests: hidden tests will check
your fix. When the fix is done, call submit()."""

NO_TOOL_CALL = (
    "No tool call found in your reply. Call bash(command) to run commands, str_replace(path, "
    "old_str, new_str) or write_file(path, content) to edit files, and submit() when done."
)


@dataclass
class SWEConfig:
    """Settings of :class:`SWEEnv`.

    Example:
        >>> SWEConfig(command_timeout=10.0).grade_on_truncation
        True
    """

    # Wall-clock seconds per episode (commands are cut to what is left).
    max_episode_seconds: float = 600.0
    # Seconds one bash command may run.
    command_timeout: float = 30.0
    # Characters of one tool result shown to the policy (head and tail kept).
    max_output_chars: int = 4000
    # Characters of tool output per episode; past it the episode is truncated.
    max_total_output_chars: int = 100_000
    # Largest diff that is graded (bytes); bigger is rejected with reward 0.
    max_diff_bytes: int = 200_000
    # Seconds the hidden tests may run in the grading container.
    grade_timeout: float = 120.0
    # Grade the diff when a limit truncates the episode (else reward 0).
    grade_on_truncation: bool = True
    # A file of task records ("" = the bundled suite); used when reset gets no task.
    # vime SWETask records (.jsonl/.json), or SWE-bench records (.json, .jsonl, .parquet;
    # told apart by their "instance_id"), checked when the env is made.
    tasks_path: str = ""
    # SWE-bench records: a folder of repository snapshots (git repos or plain folders,
    # named owner__name, owner/name, name or the instance id); each instance gets an
    # image built from it at base_commit plus its install commands ("" = the records'
    # own prebuilt images, sweb.eval.x86_64.<instance_id>).
    repos_dir: str = ""
    # SWE-bench records: a .json/.yaml file {"owner/name": {version or "*": {"install":
    # [commands], "test_cmd": "..."}}}; the commands run when the image is built.
    install_specs: str = ""
    # SWE-bench image builds: a folder of wheels pip installs from (no index); a pip
    # wheel there gives the image pip. Needed where containers cannot reach the index.
    wheels_dir: str = ""
    # SWE-bench image builds: let the install commands reach the network.
    build_network: bool = False
    # SWE-bench records: where instance images come from. "build": built from repos_dir
    # (else the records' own images, already on the Docker host); "registry": pulled
    # from swe.registry under the harness's names, copied to every Docker host, never built.
    image_source: str = "build"
    # image_source=registry: HOST[:PORT][/NAMESPACE] (namespace "swebench" if omitted),
    # e.g. the project's own, 127.0.0.1:55050 (bash scripts/registry.sh start).
    registry: str = ""
    # User for tasks that bring their own image (SWE-bench images keep /testbed root-owned).
    image_user: str = "0:0"
    # Tools offered to the policy (of bash, str_replace, write_file, submit); fewer
    # schemas leave more of a small context to the episode (bash alone can edit files).
    tools: list[str] = field(default_factory=lambda: [t.name for t in SWE_TOOLS])
    # Sandbox of the agent and of the grader (HOME is moved out of the repository).
    sandbox: SandboxConfig = field(
        default_factory=lambda: SandboxConfig(
            memory="512m", timeout=60.0, env={"HOME": "/tmp"}, labels={"vime.env": "swe"}
        )
    )

    def __post_init__(self) -> None:
        if isinstance(self.sandbox, dict):
            self.sandbox = SandboxConfig(**self.sandbox)
        require(self.max_episode_seconds > 0, "swe.max_episode_seconds", "must be > 0")
        require(self.command_timeout > 0, "swe.command_timeout", "must be > 0 seconds")
        require(self.max_output_chars >= 200, "swe.max_output_chars", "must be >= 200")
        require(
            self.max_total_output_chars >= self.max_output_chars,
            "swe.max_total_output_chars",
            "must be >= max_output_chars",
        )
        require(self.max_diff_bytes >= 1, "swe.max_diff_bytes", "must be >= 1")
        require(self.grade_timeout > 0, "swe.grade_timeout", "must be > 0 seconds")
        for key in ("repos_dir", "wheels_dir"):
            folder = getattr(self, key)
            require(not folder or Path(folder).is_dir(), f"swe.{key}", f"{folder} is not a folder")
        require(
            not self.install_specs or Path(self.install_specs).is_file(),
            "swe.install_specs",
            f"{self.install_specs} is not a file",
        )
        check_image_source(self.image_source, self.registry)
        require(
            not self.registry or not (self.repos_dir or self.wheels_dir or self.build_network),
            "swe.registry",
            "swe.image_source=registry pulls the images ready; swe.repos_dir/wheels_dir/"
            "build_network build them: drop one or the other",
        )
        uses = self.repos_dir or self.install_specs or self.wheels_dir or self.build_network
        require(
            not (uses or self.registry) or bool(self.tasks_path),
            "swe.tasks_path",
            "repos_dir/install_specs/wheels_dir/build_network/registry apply to SWE-bench "
            "records: give their file as swe.tasks_path",
        )
        known = [t.name for t in SWE_TOOLS]
        unknown = [t for t in self.tools if t not in known]
        require(not unknown, "swe.tools", f"unknown tool(s) {unknown}; the SWE tools are {known}")


# Task files read in this process, by file identity and the keys that shape the result:
# every env (the collector makes one per episode) reads and checks a file only once.
_LOADED: dict[tuple[Any, ...], list[dict[str, Any]]] = {}


def _file_id(path: str) -> tuple[str, int, int]:
    stat = Path(path).stat() if path and Path(path).is_file() else None
    return (
        str(Path(path).resolve()) if path else "",
        *((stat.st_mtime_ns, stat.st_size) if stat else (0, 0)),
    )


def cached_task_file(path: str, config: SWEConfig) -> list[dict[str, Any]]:
    """:func:`load_task_file`, read once per process while the files are unchanged.

    Example (the bundled held-out tasks: the second call reads nothing):
        >>> path = "envs/swe/eval/heldout.jsonl"
        >>> cached_task_file(path, SWEConfig()) is cached_task_file(path, SWEConfig())
        True
    """
    c = config
    key = (
        _file_id(path),
        _file_id(c.install_specs),
        c.repos_dir,
        c.wheels_dir,
        c.build_network,
        c.registry,
        tuple(c.sandbox.hosts()),
    )
    if key not in _LOADED:
        _LOADED[key] = load_task_file(path, config)
    return _LOADED[key]


def load_task_file(path: str | Path, config: SWEConfig | None = None) -> list[dict[str, Any]]:
    """Task records from a file of vime SWE tasks or of SWE-bench records.

    SWE-bench records (a ``.parquet`` file, or records with ``instance_id``) go through
    :func:`vime.suites.swe.swebench.load_swebench` with the ``config``'s ``repos_dir``,
    ``install_specs``, ``wheels_dir``, ``build_network``, ``image_source`` and ``registry``.

    Example (the bundled held-out tasks, vime SWE records):
        >>> load_task_file("envs/swe/eval/heldout.jsonl")[0]["id"]
        'heldout-clamp-upper'
    """
    from vime.errors import DataError

    from .swebench import load_swebench, read_swebench_file

    cfg = config or SWEConfig()
    rows = read_swebench_file(path)
    if rows and all(isinstance(r, dict) and "instance_id" in r for _, r in rows):
        return load_swebench(
            path,
            repos_dir=cfg.repos_dir,
            install_specs=cfg.install_specs or None,
            wheels_dir=cfg.wheels_dir,
            build_network=cfg.build_network,
            hosts=cfg.sandbox.hosts(),
            image_source=cfg.image_source,
            registry=cfg.registry,
        )
    if cfg.repos_dir or cfg.install_specs or cfg.wheels_dir or cfg.registry:
        raise DataError(
            f"{path}: swe.repos_dir/install_specs/wheels_dir/registry apply to SWE-bench "
            "records (with 'instance_id'); these are vime task records"
        )
    records = []
    for line, record in rows:
        try:
            records.append(SWETask.from_record(record).to_record())
        except DataError as err:
            raise DataError(f"{path}: {line}: {err}") from None
    return records


class SWEEnv(ToolEnv):
    """Repository bug fixing graded by hidden tests (registered as ``vime/SWE-v0``).

    Args:
        config: an :class:`SWEConfig` (or a dict of its fields); defaults if omitted.
        **overrides: fields of :class:`SWEConfig` (what ``vime.make(id, **kw)`` passes).

    Example:
        >>> [t["function"]["name"] for t in SWEEnv().tools]
        ['bash', 'str_replace', 'write_file', 'submit']
    """

    def __init__(self, config: SWEConfig | dict[str, Any] | None = None, **overrides: Any) -> None:
        self.config = env_config(SWEConfig, config, overrides)
        super().__init__(Toolset([t for t in SWE_TOOLS if t.name in self.config.tools]))
        self._swe_task: SWETask | None = None
        self._base = ""
        self._output_chars = 0
        if self.config.tasks_path:
            # Read and checked now, so a record that cannot run stops the run before any
            # episode (and SWE-bench instance images are built once, here).
            self._task_pool = cached_task_file(self.config.tasks_path, self.config)

    def preflight(self) -> None:
        """Every SWE episode runs in a sandbox: Docker must answer on every host.

        Example (the doctests' ``DOCKER_HOST`` is the project's dockerd, which answers):
            >>> SWEEnv().preflight()
        """
        from vime.sandbox.client import check_docker

        check_docker(self.config.sandbox.hosts(), needed_by=self.env_id or "vime/SWE-v0")

    # -- sandboxes -------------------------------------------------------------------

    def _sandbox_config(self, task: SWETask) -> SandboxConfig:
        cfg = self.config.sandbox
        if task.image:
            # The repository lives in the image's own filesystem, owned by its user.
            return dataclasses.replace(
                cfg, image=task.image, read_only=False, user=self.config.image_user
            )
        return cfg

    def _new_sandbox(self) -> Any:
        from vime.sandbox.leases import lease

        assert self._swe_task is not None
        # Warm, from the process's pool of the task's image (the grader's too).
        return lease(self._sandbox_config(self._swe_task))

    def _prepare(self, sandbox: Any) -> None:
        assert self._swe_task is not None
        self._base = setup_repo(sandbox, self._swe_task, self.config.command_timeout)

    # -- episode ---------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on ``options["task"]`` (or a task drawn with ``np_random``)."""
        super().reset(seed=seed, options=options)
        self.draw_task(load_bundled)
        try:
            task = SWETask.from_record(self.task)
        except Exception as err:
            raise EnvError(f"bad SWE task record: {err}", task_id=str(self.task.get("id"))) from err
        self._swe_task = task
        ctx = ToolContext(
            sandbox_factory=self._new_sandbox,
            on_acquire=self._prepare,
            task=self.task,
            workdir=task.repo_dir,
            exec_timeout=self.config.command_timeout,
            max_output_chars=self.config.max_output_chars,
        )
        self.start_episode(ctx, resolved=0.0, rejected=0.0, unresolved=0.0, error=0.0, tampered=0.0)
        self._base = ""
        self._output_chars = 0
        user = f"<issue>\n{task.problem_statement.strip()}\n</issue>"
        if task.files:
            listing = "\n".join(sorted(task.files))
            user += f"\n\nRepository files ({task.repo_dir}):\n{listing}"
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT.format(repo_dir=task.repo_dir)},
            {"role": "user", "content": user},
        ]
        return messages, {"task_id": task.id}

    def step(self, action: Action) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the turn's tool calls; grade on ``submit()`` or when a limit truncates the episode."""
        self.begin_turn(action)
        messages: list[Message] = []
        submitted = False
        for i, call in enumerate(action.tool_calls):
            if call.name == "submit":
                self.stats["tool_calls"] += 1
                submitted = True
                messages.append(tool_message(call, i, "submitted; grading your changes"))
                break
            # A command may not outlive the episode's wall-time budget.
            left = self.config.max_episode_seconds - self.elapsed()
            self.ctx.exec_timeout = max(1.0, min(self.config.command_timeout, left))
            messages.append(self.run_tool(call, i))
            self._output_chars += len(messages[-1]["content"])
        messages += self.parse_error_reply(action)
        if not action.tool_calls and not action.parse_errors:
            messages.append({"role": "user", "content": NO_TOOL_CALL})
        if submitted:
            return self._end(messages, truncated_by="")
        limit = self.limit_hit(self.config.max_episode_seconds)
        if not limit and self._output_chars > self.config.max_total_output_chars:
            limit = "output_size"
        if limit:
            return self._end(messages, truncated_by=limit)
        return messages, 0.0, False, False, {"task_id": self._task_id}

    @property
    def _task_id(self) -> str:
        return self._swe_task.id if self._swe_task else ""

    def _end(
        self, messages: list[Message], truncated_by: str
    ) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        assert self._swe_task is not None
        result = GradeResult(False, "not graded: truncated and grade_on_truncation is off")
        if not truncated_by or self.config.grade_on_truncation:
            result = self._grade()
        self.ctx.close()
        # One of resolved/unresolved/error/tampered is 1: the episode's grading status.
        self.stats.update({s: float(s == result.status) for s in STATUSES})
        self.stats.update(
            rejected=float(result.status == "tampered"),
            diff_bytes=float(result.diff_bytes),
            grade_seconds=result.seconds,
        )
        info: dict[str, Any] = {
            "task_id": self._task_id,
            "resolved": result.resolved,
            "status": result.status,
            "reason": result.reason,
            "tests": result.tests,
        }
        if truncated_by:
            info["truncated_by"] = truncated_by
        return messages, result.reward, not truncated_by, bool(truncated_by), info

    def _grade(self) -> GradeResult:
        task = self._swe_task
        assert task is not None
        if not self.ctx.has_sandbox:
            return GradeResult(False, "empty diff: the agent changed nothing")
        try:
            diff = agent_diff(self.ctx.sandbox, task, self._base, self.config.command_timeout)
        except ValueError as err:
            return GradeResult(False, str(err), status="error")
        self.ctx.close()  # free the agent's container before starting the grader's
        return grade(
            task,
            diff,
            self._new_sandbox,
            timeout=self.config.grade_timeout,
            max_diff_bytes=self.config.max_diff_bytes,
        )
