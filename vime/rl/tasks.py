"""Where a run's tasks come from: a task file, or an env's bundled task generator.

Example:
    >>> tasks = builtin_tasks("vime.suites.math.data:arithmetic_suite", {"n": 4, "levels": ["add1"]}, "")
    >>> len(tasks)
    4
    >>> len(eval_tasks(EnvConfig(eval_size=3)))
    3
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from vime.envs.tasks import Task, load_tasks
from vime.errors import ConfigError
from vime.rl.config import EnvConfig

# Bundled generators draw evaluation tasks with this offset on the seed: held-out tasks.
EVAL_SEED_OFFSET = 1_000_003


def builtin_tasks(function: str, args: dict[str, Any], path: str, *, seed: int = 0) -> list[Task]:
    """Tasks from ``path`` (.jsonl/.parquet) if given, else ``function(**args, seed=seed)``.

    ``function`` is ``"module:name"``; ``seed`` is passed only if the function takes one.
    """
    if path:
        return load_tasks(path)
    module_name, _, name = function.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"env.builtin_tasks: cannot load {function!r} ({err}); give 'module:function' "
            "or set env.tasks.path to a .jsonl/.parquet task file",
            key="env.builtin_tasks",
        ) from err
    kwargs = dict(args)
    if "seed" in inspect.signature(fn).parameters:
        kwargs["seed"] = seed
    try:
        tasks = list(fn(**kwargs))
    except TypeError as err:
        raise ConfigError(
            f"env.builtin_args: {function}(**{kwargs}) failed: {err}", key="env.builtin_args"
        ) from err
    return load_tasks(tasks)


def train_tasks(env: EnvConfig) -> list[Task]:
    """The training tasks: ``env.tasks.path`` if set, else the env's bundled generator.

    Example:
        >>> len(train_tasks(EnvConfig(builtin_args={"n": 5, "levels": ["add1"]})))
        5
    """
    return builtin_tasks(env.builtin_tasks, env.builtin_args, env.tasks.path, seed=env.tasks.seed)


def eval_tasks(env: EnvConfig) -> list[Task]:
    """``env.eval_size`` tasks from ``env.eval_tasks``, else from the training source
    (bundled generators are drawn with another seed: held-out tasks).

    Example:
        >>> eval_tasks(EnvConfig(eval_size=0))
        []
    """
    if env.eval_size == 0:
        return []
    path = env.eval_tasks or env.tasks.path
    tasks = builtin_tasks(
        env.builtin_tasks, env.builtin_args, path, seed=env.tasks.seed + EVAL_SEED_OFFSET
    )
    return tasks[: env.eval_size]
