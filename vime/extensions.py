"""Extension points by import path: a user's function named in the config, loaded and
checked when the run starts.

A spec is ``module:function`` (an importable module) or ``path/to/file.py:function`` (a
file, relative to the working directory). :func:`load_function` imports it and checks
that it can be called the way vime will call it (the parameter names it is passed, and
``async def`` where vime awaits it); anything wrong is a :class:`~vime.errors.ConfigError`
that names the key and the signature vime expects, before any engine starts.

Example:
    >>> fn = load_function("json:dumps", "rollout.reward", signature="dumps(obj)", params=["obj"])
    >>> fn([1])
    '[1]'
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vime.errors import ConfigError


def load_function(
    spec: str,
    key: str,
    *,
    signature: str,
    params: Sequence[str] = (),
    positional: int = 0,
    asynchronous: bool | None = None,
) -> Callable[..., Any]:
    """The function ``spec`` names, checked against how vime calls it.

    ``params``: the keyword arguments vime passes (the function must accept each, by name
    or through ``**kwargs``, and need no other); ``positional``: how many arguments vime
    passes by position before them. ``asynchronous``: ``True`` where vime
    awaits the result (``async def`` required), ``None`` where either kind works (see
    :func:`call`). ``signature`` is shown in every error.

    Example:
        >>> load_function("json:nope", "rollout.reward", signature="reward(task, episode)")
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: rollout.reward: module 'json' has no 'nope'; expected reward(task, episode)
    """
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise ConfigError(
            f"{key}: {spec!r} is not 'module:function' or 'path/to/file.py:function'; "
            f"expected {signature}",
            key=key,
        )
    module = _import(where, key, signature)
    fn = getattr(module, name, None)
    if fn is None:
        raise ConfigError(f"{key}: module {where!r} has no {name!r}; expected {signature}", key=key)
    if not callable(fn):
        raise ConfigError(f"{key}: {spec} is not a function; expected {signature}", key=key)
    if asynchronous and not is_async(fn):
        raise ConfigError(
            f"{key}: {spec} is a plain function, but vime awaits it: define it with "
            f"'async def'; expected {signature}",
            key=key,
        )
    _check_params(fn, spec, key, signature, params, positional)
    return fn


async def call(fn: Callable[..., Any], **kwargs: Any) -> Any:
    """Call a loaded function that may be ``async def`` or plain; a plain one runs in a
    worker thread, so a slow one (an HTTP call to a judge) does not stall other episodes.

    Example:
        >>> asyncio.run(call(lambda x: x + 1, x=1))
        2
    """
    if is_async(fn):
        return await fn(**kwargs)
    result = await asyncio.to_thread(fn, **kwargs)
    if inspect.isawaitable(result):  # a plain function that returns a coroutine
        return await result
    return result


def is_async(fn: Callable[..., Any]) -> bool:
    """True for an ``async def`` function, or an object whose ``__call__`` is one.

    Example:
        >>> is_async(call), is_async(load_function)
        (True, False)
    """
    call_method = getattr(fn, "__call__", None)  # noqa: B004 - an object with async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call_method)


def _import(where: str, key: str, signature: str) -> Any:
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(
                f"{key}: {where} is not a file (paths are relative to {Path.cwd()}); "
                f"expected {signature}",
                key=key,
            )
        # One module per file, under a name no package uses, kept in sys.modules so that
        # pickled objects of its classes load again.
        name = f"vime_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        found = importlib.util.spec_from_file_location(name, path)
        assert found is not None and found.loader is not None
        module = importlib.util.module_from_spec(found)
        sys.modules[name] = module
        try:
            found.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise ConfigError(
                f"{key}: importing {where} failed: {type(err).__name__}: {err}", key=key
            ) from err
        return module
    try:
        return importlib.import_module(where)
    except ImportError as err:
        raise ConfigError(
            f"{key}: cannot import module {where!r} ({err}); give 'module:function' with the "
            f"module on PYTHONPATH, or 'path/to/file.py:function'; expected {signature}",
            key=key,
        ) from err


def _check_params(
    fn: Callable[..., Any],
    spec: str,
    key: str,
    signature: str,
    params: Sequence[str],
    positional: int,
) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin without a signature: it is called and fails at that point
    try:
        sig.bind(*[None] * positional, **dict.fromkeys(params))
    except TypeError as err:
        raise ConfigError(
            f"{key}: {spec}{sig} cannot be called as vime calls it ({err}); expected {signature}",
            key=key,
        ) from err
