"""Where a run's tasks come from: a task file, a user's function (``env.tasks.source``,
:mod:`vime.envs.function_source`), or an env's bundled task generator.

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

from vime.conf.train import EnvConfig, TrainConfig
from vime.envs.function_source import (
    FunctionTaskSource,
    load_source,
    no_eval_split,
    source_eval_tasks,
)
from vime.envs.task_source import TaskSource
from vime.envs.tasks import Task, load_tasks
from vime.errors import ConfigError
from vime.rl.orchestrator import draw_size

# Bundled generators draw evaluation tasks with this offset on the seed: held-out tasks.
EVAL_SEED_OFFSET = 1_000_003


def _generator(function: str) -> Any:
    module_name, _, name = function.partition(":")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            f"env.builtin_tasks: cannot load {function!r} ({err}); give 'module:function' "
            "or set env.tasks.path to a .jsonl/.parquet task file",
            key="env.builtin_tasks",
        ) from err


def _takes(fn: Any, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def builtin_tasks(
    function: str, args: dict[str, Any], path: str, *, seed: int = 0, split: str = "train"
) -> list[Task]:
    """Tasks from ``path`` (.jsonl/.parquet) if given, else ``function(**args, seed=seed)``.

    ``function`` is ``"module:name"``; ``seed`` and ``split`` (``"train"`` or ``"eval"``)
    are passed only if the function takes them. A generator that takes ``split`` keeps
    a held-back eval split of its own, so vime alone chooses it: ``args`` may not.
    """
    if path:
        return load_tasks(path)
    fn = _generator(function)
    kwargs = dict(args)
    if "seed" in inspect.signature(fn).parameters:
        kwargs["seed"] = seed
    if _takes(fn, "split"):
        if "split" in args:
            raise ConfigError(
                f"env.builtin_args.split: {function} keeps a held-back eval split, so the "
                "split is chosen by vime (training draws 'train', env.eval_size draws "
                "'eval'); remove it",
                key="env.builtin_args.split",
            )
        kwargs["split"] = split
    try:
        tasks = list(fn(**kwargs))
    except TypeError as err:
        raise ConfigError(
            f"env.builtin_args: {function}(**{kwargs}) failed: {err}", key="env.builtin_args"
        ) from err
    return load_tasks(tasks)


def _held_back_ids(env: EnvConfig) -> set[str]:
    """Ids of the generator's held-back eval tasks (none if it keeps no split)."""
    if ":" not in env.builtin_tasks or not _takes(_generator(env.builtin_tasks), "split"):
        return set()
    held = builtin_tasks(env.builtin_tasks, env.builtin_args, "", split="eval")
    return {str(t.get("id")) for t in held if t.get("id")}


def train_tasks(env: EnvConfig) -> list[Task]:
    """The training tasks: ``env.tasks.path`` if set, else the env's bundled generator.

    Example:
        >>> len(train_tasks(EnvConfig(builtin_args={"n": 5, "levels": ["add1"]})))
        5
    """
    tasks = builtin_tasks(env.builtin_tasks, env.builtin_args, env.tasks.path, seed=env.tasks.seed)
    if env.tasks.path:
        leaked = sorted({str(t.get("id")) for t in tasks} & _held_back_ids(env))
        if leaked:
            raise ConfigError(
                f"env.tasks.path: {len(leaked)} task(s) of {env.tasks.path} are held back for "
                f"evaluation by {env.builtin_tasks} (e.g. {leaked[:3]}); training never "
                "draws them: remove them from the file",
                key="env.tasks.path",
            )
    return tasks


def train_source(cfg: TrainConfig) -> TaskSource:
    """The training tasks as the run draws them: ``env.tasks``' order (``seed``,
    ``shuffle``), its first ``limit`` tasks, ``epochs`` passes over them; the tasks that
    evaluation takes from ``env.tasks.path`` (:func:`eval_tasks`) are not among them.
    With ``env.tasks.source``: the function's tasks, in its order, until it ends (or
    ``limit``), as a :class:`~vime.envs.function_source.FunctionTaskSource`.

    The epochs must hold the tasks the run draws at the least, ``steps`` ×
    round(``rollout.batch_size`` × ``rollout.oversample``), or the run fails here. Draws
    beyond that (refills, groups async mode drops) can still reach the end of the last
    epoch: the run then stops with the source's DataError (:meth:`TaskSource.take`).

    Example:
        >>> from vime.conf.compose import load_config
        >>> cfg = load_config(["env.tasks.limit=3", "env.tasks.epochs=2", "steps=1"])
        >>> cfg.rollout.batch_size = 6
        >>> len(train_source(cfg).take(6))
        6
    """
    t, r = cfg.env.tasks, cfg.rollout
    if t.source:  # the function's own order and end (TaskSourceConfig refuses epochs)
        return FunctionTaskSource.from_config(t)
    tasks = train_tasks(cfg.env)
    # Evaluation with no file of its own takes the first env.eval_size tasks of the
    # training file (eval_tasks): the run holds them out.
    held_out = cfg.env.eval_size if t.path and not cfg.env.eval_tasks and cfg.eval_every else 0
    if held_out:
        if len(tasks) <= held_out:
            raise ConfigError(
                f"env.eval_size: the first {held_out} tasks of {t.path} are held out for "
                f"evaluation, which leaves none of its {len(tasks)} to train on: set "
                "env.eval_tasks (a file of held-out tasks), a smaller env.eval_size, or "
                "eval_every=0",
                key="env.eval_size",
            )
        tasks = tasks[held_out:]
    source = TaskSource(tasks, seed=t.seed, shuffle=t.shuffle, epochs=t.epochs, limit=t.limit)
    per_step = draw_size(r)
    if t.epochs is not None and t.epochs * len(source) < cfg.steps * per_step:
        fit = t.epochs * len(source) // per_step
        raise ConfigError(
            f"env.tasks.epochs={t.epochs} passes over {len(source)} tasks hold "
            f"{t.epochs * len(source)} draws, but steps={cfg.steps} draw {per_step} each "
            f"(rollout.batch_size × rollout.oversample): set steps <= {fit}, or "
            f"env.tasks.epochs >= {-(-cfg.steps * per_step // len(source))} (null: no end)",
            key="env.tasks.epochs",
        )
    return source


def eval_tasks(env: EnvConfig) -> list[Task]:
    """``env.eval_size`` tasks from ``env.eval_tasks``, else from the training source
    (the first tasks of ``env.tasks.path``, which training then skips; bundled generators
    are drawn with another seed, or their held-back ``"eval"`` split when they keep one;
    ``env.tasks.source`` is called with ``split="eval"``, and must take ``split``:
    held-out tasks either way).

    Example:
        >>> eval_tasks(EnvConfig(eval_size=0))
        []
    """
    if env.eval_size == 0:
        return []
    if env.tasks.source and not env.eval_tasks:
        return source_eval_tasks(env.tasks.source, seed=env.tasks.seed, size=env.eval_size)
    path = env.eval_tasks or env.tasks.path
    tasks = builtin_tasks(
        env.builtin_tasks,
        env.builtin_args,
        path,
        seed=env.tasks.seed + EVAL_SEED_OFFSET,
        split="eval",
    )
    return tasks[: env.eval_size]


def check_task_source(cfg: TrainConfig) -> None:
    """(At start, before any engine.) ``env.tasks.source`` loads and takes the arguments
    vime passes, and evaluation has tasks: a function without ``split`` needs
    ``env.eval_tasks``, or no evaluation (``env.eval_size=0`` or ``eval_every=0``).

    Raises:
        ConfigError: naming the key and the signature vime expects.

    Example:
        >>> check_task_source(TrainConfig())  # no source: nothing to check
    """
    env = cfg.env
    if not env.tasks.source:
        return
    _, takes_split = load_source(env.tasks.source)
    if cfg.eval_every and env.eval_size and not env.eval_tasks and not takes_split:
        raise ConfigError(no_eval_split(env.tasks.source), key="env.eval_tasks")
