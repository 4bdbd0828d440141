"""Where a run's tasks come from: a task file, or an env's bundled task generator.

Example:
    >>> tasks = builtin_tasks("envs.math.data:arithmetic_suite", {"n": 4, "levels": ["add1"]}, "")
    >>> len(tasks)
    4
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from vime.envs.tasks import Task, load_tasks
from vime.errors import ConfigError


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
