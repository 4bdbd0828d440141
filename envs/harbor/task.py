"""Harbor task folders, read with ``tomllib`` (the ``harbor`` package needs Python >= 3.12).

A task folder (the format of the ``harbor`` package and of Terminal-Bench 2)::

    my-task/
      task.toml            # [agent] / [verifier] timeout_sec, [environment] cpus, memory_mb ...
      instruction.md       # what the agent is asked to do
      environment/Dockerfile   # the task's image (COPY sources are under environment/)
      solution/solve.sh    # optional: a reference solution (the "oracle" agent)
      tests/test.sh        # the verifier: writes /logs/verifier/reward.txt or reward.json

Example:
    >>> task = load_bundled()[0]
    >>> task.name, task.agent_timeout_sec
    ('count-words', 120.0)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import DataError

BUNDLED_DIR = Path(__file__).resolve().parent / "tasks"


@dataclass(frozen=True)
class HarborTask:
    """One Harbor task folder, read and checked.

    Example:
        >>> t = load_task(BUNDLED_DIR / "count-words")
        >>> t.dockerfile.name, t.has_solution
        ('Dockerfile', True)
    """

    path: Path
    instruction: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The folder's name: the task id."""
        return self.path.name

    @property
    def dockerfile(self) -> Path:
        return self.path / "environment" / "Dockerfile"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution(self) -> Path:
        return self.path / "solution" / "solve.sh"

    @property
    def has_solution(self) -> bool:
        return self.solution.is_file()

    def _section(self, name: str) -> dict[str, Any]:
        value = self.config.get(name, {})
        return value if isinstance(value, dict) else {}

    @property
    def agent_timeout_sec(self) -> float:
        """``[agent] timeout_sec``: the episode's wall time (Harbor's default, 600 s, if unset)."""
        return float(self._section("agent").get("timeout_sec", 600.0))

    @property
    def verifier_timeout_sec(self) -> float:
        """``[verifier] timeout_sec``: how long ``tests/test.sh`` may run."""
        return float(self._section("verifier").get("timeout_sec", 600.0))

    @property
    def verifier_env(self) -> dict[str, str]:
        """``[verifier] env``: extra environment of ``tests/test.sh``."""
        return {str(k): str(v) for k, v in self._section("verifier").get("env", {}).items()}

    @property
    def memory_mb(self) -> int | None:
        """``[environment] memory_mb`` (or the older ``memory = "2G"``), None if unset."""
        env = self._section("environment")
        if "memory_mb" in env:
            return int(env["memory_mb"])
        text = str(env.get("memory", "")).strip().upper()
        if not text:
            return None
        units = {"G": 1024, "M": 1}
        return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)

    @property
    def cpus(self) -> float | None:
        """``[environment] cpus``, None if unset."""
        cpus = self._section("environment").get("cpus")
        return float(cpus) if cpus is not None else None


def load_task(folder: str | Path) -> HarborTask:
    """Read one task folder; :class:`DataError` names what is missing or malformed.

    Example:
        >>> load_task(BUNDLED_DIR / "fix-csv-total").verifier_timeout_sec
        60.0
    """
    path = Path(folder).resolve()
    where = f"Harbor task {path}"
    if not (path / "task.toml").is_file():
        raise DataError(f"{where}: no task.toml (is this a Harbor task folder?)")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as err:
        raise DataError(f"{where}: task.toml is not valid TOML: {err}") from err
    for need in ("instruction.md", "environment/Dockerfile", "tests/test.sh"):
        if not (path / need).is_file():
            raise DataError(f"{where}: {need} is missing (every Harbor task needs it)")
    if (path / "environment" / "docker-compose.yaml").is_file():
        raise DataError(
            f"{where}: environment/docker-compose.yaml (several services) is not supported; "
            "vime replays one Dockerfile"
        )
    task = HarborTask(path, (path / "instruction.md").read_text(), config)
    try:
        # Read every field once, so a bad value stops loading rather than an episode.
        _ = (task.agent_timeout_sec, task.verifier_timeout_sec, task.memory_mb, task.cpus)
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        raise DataError(f"{where}: task.toml has a malformed value: {err}") from err
    return task


def load_tasks(folder: str | Path) -> list[HarborTask]:
    """Every task under ``folder`` (the folder itself if it is a task), sorted by name.

    Example:
        >>> [t.name for t in load_tasks(BUNDLED_DIR)]
        ['count-words', 'fix-csv-total', 'greeting-file']
    """
    root = Path(folder)
    if (root / "task.toml").is_file():
        return [load_task(root)]
    if not root.is_dir():
        raise DataError(f"{root}: not a folder of Harbor tasks")
    tasks = [load_task(p.parent) for p in sorted(root.glob("*/task.toml"))]
    if not tasks:
        raise DataError(f"{root}: no Harbor task folder (*/task.toml) in it")
    return tasks


def load_bundled() -> list[HarborTask]:
    """The three small tasks written here in Harbor's format (``envs/harbor/tasks``).

    Example:
        >>> len(load_bundled())
        3
    """
    return load_tasks(BUNDLED_DIR)


def task_records(n: int = 0, *, seed: int = 0, tasks_path: str = "") -> list[dict[str, str]]:
    """Task records ``{"id", "path"}`` of ``tasks_path`` (the bundled tasks for ""), for a
    training run's ``env.builtin_tasks``: ``n`` of them cycling through the tasks (0: each
    once), in an order shuffled by ``seed``.

    Example:
        >>> [r["id"] for r in task_records(4)]
        ['count-words', 'fix-csv-total', 'greeting-file', 'count-words']
    """
    import random

    tasks = load_tasks(tasks_path) if tasks_path else load_bundled()
    order = list(tasks)
    if seed:
        random.Random(seed).shuffle(order)
    count = n or len(order)
    return [
        {"id": order[i % len(order)].name, "path": str(order[i % len(order)].path)}
        for i in range(count)
    ]
