"""``register`` / ``make`` / ``registry``: environments by id, built with the standard wrappers.

An id looks like Gymnasium's: ``namespace/Name-vN``. Registering an id also registers it
with Gymnasium, so ``gymnasium.make(id)`` works (with Gymnasium's own wrappers);
``vime.make(id)`` adds vime's: turn limit, order enforcement, contract checks and error
wrapping (see :mod:`vime.envs.wrappers`). Entry points are ``"module:Class"`` strings
(imported only when the env is made, so listing never imports env code) or callables.

The bundled suites (:data:`BUNDLED`; their code is ``envs/`` in the repository, installed
as ``vime.suites``) are registered when ``vime`` is imported.

Example:
    >>> import vime
    >>> vime.register("demo/Echo-v0", entry_point="vime.suites.math.env:MathEnv", max_turns=1)
    >>> vime.registry["demo/Echo-v0"].max_turns
    1
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium
from gymnasium.envs.registration import parse_env_id

from vime.envs.base import Env
from vime.envs.wrappers import EpisodeGuard, wrap
from vime.errors import ConfigError, EnvError, VimeError


@dataclass(frozen=True)
class EnvSpec:
    """What ``register`` recorded for one id.

    Example:
        >>> EnvSpec("demo/X-v0", "pkg.mod:X", max_turns=2).entry_point_name
        'pkg.mod:X'
    """

    id: str
    entry_point: str | Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    max_turns: int | None = None
    nondeterministic: bool = False

    @property
    def entry_point_name(self) -> str:
        """The entry point as ``module:name`` text (for listings and error messages)."""
        ep = self.entry_point
        if isinstance(ep, str):
            return ep
        return f"{getattr(ep, '__module__', '?')}:{getattr(ep, '__qualname__', repr(ep))}"

    def load(self) -> Callable[..., Any]:
        """Import and return the entry point, or raise :class:`EnvError` saying why not."""
        if not isinstance(self.entry_point, str):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise EnvError(
                f"{self.id}: cannot import {module_name!r} for entry point "
                f"{self.entry_point!r} ({err}); install the package that provides it or fix "
                "the entry point in register()",
                env_id=self.id,
            ) from err
        except Exception as err:  # the module exists but fails while importing
            raise EnvError(
                f"{self.id}: importing {module_name!r} raised {type(err).__name__}: {err}; "
                f"fix the module (try: python -c 'import {module_name}')",
                env_id=self.id,
            ) from err
        try:
            return getattr(module, attr)  # type: ignore[no-any-return]
        except AttributeError as err:
            raise EnvError(
                f"{self.id}: module {module_name!r} has no {attr!r} (entry point "
                f"{self.entry_point!r}); fix the name after ':' in register()",
                env_id=self.id,
            ) from err


registry: dict[str, EnvSpec] = {}
"""Every registered env: id → :class:`EnvSpec`. Listing it imports no env code."""


def register(
    id: str,
    entry_point: str | Callable[..., Any],
    *,
    max_turns: int | None = None,
    nondeterministic: bool = False,
    override: bool = False,
    **defaults: Any,
) -> None:
    """Register an environment under ``id`` (``namespace/Name-vN``).

    Args:
        id: the env id, e.g. ``"my/Echo-v0"``.
        entry_point: ``"module:Class"`` (imported lazily) or a callable returning an
            :class:`~vime.envs.Env`.
        max_turns: the turn limit ``make`` applies (``None``: no limit); a step that
            reaches it returns ``truncated=True``.
        nondeterministic: the env's outcome differs between runs with the same seed
            (the checker then skips its determinism checks).
        override: replace an existing registration with a different entry point.
        **defaults: keyword arguments passed to the entry point (``make`` can override them).

    Example:
        >>> register("demo/Math-v9", "vime.suites.math.env:MathEnv", max_turns=1, level="add1")
        >>> registry["demo/Math-v9"].defaults
        {'level': 'add1'}
    """
    try:
        parse_env_id(id)
    except gymnasium.error.Error as err:
        raise EnvError(
            f"env id {id!r} is malformed ({err}); use the form 'namespace/Name-v0'", env_id=id
        ) from err
    if max_turns is not None and not (isinstance(max_turns, int) and max_turns >= 1):
        raise EnvError(f"{id}: max_turns must be an integer >= 1 or None, got {max_turns!r}")
    spec = EnvSpec(id, entry_point, dict(defaults), max_turns, nondeterministic)
    old = registry.get(id)
    if old is not None and not override and _key(old) != _key(spec):
        raise EnvError(
            f"{id} is already registered with entry point {old.entry_point_name!r}; pick a new "
            "id (e.g. bump the version to -v1) or pass override=True",
            env_id=id,
        )
    registry[id] = spec
    # Gymnasium keeps its own registry: give it the same entry point and limit. Popping
    # first avoids its "overriding" warning when a module is imported twice.
    gymnasium.registry.pop(id, None)
    gymnasium.register(
        id,
        entry_point=entry_point,
        max_episode_steps=max_turns,
        nondeterministic=nondeterministic,
        kwargs=dict(defaults),
        disable_env_checker=True,  # its passive checker expects numpy observations
    )


def make(id: str, **kwargs: Any) -> EpisodeGuard:
    """Build the env registered as ``id`` with the standard wrappers.

    ``kwargs`` override the registered defaults; ``max_turns=`` overrides the turn limit.
    Like ``gymnasium.make``, ``"module:ns/Name-v0"`` first imports ``module`` (which calls
    ``register``), so a command line can name an env defined in the user's own file.
    Returns an :class:`~vime.envs.wrappers.EpisodeGuard` (the outer wrapper): use it like
    the env itself (``reset``, ``step``, ``tools``, ``env_id``, ``episode_metrics``, ``close``).

    Example:
        >>> env = make("vime/Math-v0")
        >>> env.env_id
        'vime/Math-v0'
    """
    if ":" in id:
        module_name, _, id = id.partition(":")
        _import_user_module(module_name, id)
    spec = registry.get(id)
    if spec is None:
        close = difflib.get_close_matches(id, list(registry), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise EnvError(
            f"no env registered as {id!r}{hint} (run `vime-agent envs` to list them, or "
            "register it with vime.register(id, entry_point))",
            env_id=id,
        )
    max_turns = kwargs.pop("max_turns", spec.max_turns)
    factory = spec.load()
    try:
        env = factory(**{**spec.defaults, **kwargs})
    except Exception as err:
        raise EnvError(
            f"{id}: building the env with {spec.entry_point_name}(**{ {**spec.defaults, **kwargs} }) "
            f"raised {type(err).__name__}: {err}",
            env_id=id,
        ) from err
    if not isinstance(env, Env):
        raise EnvError(
            f"{id}: entry point {spec.entry_point_name} returned {type(env).__name__}, not a "
            "vime.Env; subclass vime.Env (class MyEnv(vime.Env): ...)",
            env_id=id,
        )
    if id in gymnasium.registry:
        # Like gymnasium.make: the spec records how this instance was built.
        env.unwrapped.spec = dataclasses.replace(
            gymnasium.spec(id), kwargs={**spec.defaults, **kwargs}, max_episode_steps=max_turns
        )
    return wrap(env, env_id=id, max_turns=max_turns)


@dataclass(frozen=True, eq=False)
class EnvMaker:
    """A factory of fresh envs of one registered id, ``make(env_id, **kwargs)``, that says
    which env it makes (the collector names a generation function's episodes by it).

    Example:
        >>> EnvMaker("vime/Math-v0")().env_id
        'vime/Math-v0'
    """

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> EpisodeGuard:
        return make(self.env_id, **self.kwargs)


def preflight_env(id: str, kwargs: dict[str, Any] | None = None, *, key: str = "env.id") -> None:
    """Make the env once, run its :meth:`~vime.envs.Env.preflight` check, and close it.

    Called before a run starts, so that a wrong id or kwarg, or a service the env needs
    and cannot reach, stops the command at once. Any failure becomes a
    :class:`~vime.errors.ConfigError` (``key`` names the setting that chose this env); a
    ``ConfigError`` from the check itself keeps its own key.

    Example:
        >>> preflight_env("vime/Math-v0", {"max_turns": 1})
    """
    env = None
    try:
        env = make(id, **(kwargs or {}))
        cast(Env, env.unwrapped).preflight()  # make() checked that it is a vime Env
    except ConfigError:
        raise
    except (VimeError, TypeError, ValueError) as err:
        raise ConfigError(
            f"{key}: env {id!r} with kwargs {dict(kwargs or {})} cannot be made: {err}", key=key
        ) from err
    finally:
        if env is not None:
            env.close()


def _import_user_module(module_name: str, env_id: str) -> None:
    """Import the module that registers ``env_id`` (the ``module:`` part of an id)."""
    import os
    import sys

    # Console scripts don't put the working directory on sys.path (``python -m`` does),
    # and a user's env file usually lives there. Appended, so it never shadows packages.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        importlib.import_module(module_name)
    except Exception as err:
        raise EnvError(
            f"{env_id}: cannot import {module_name!r} ({type(err).__name__}: {err}); run from "
            f"the folder that holds {module_name.replace('.', '/')}.py, or install it",
            env_id=env_id,
        ) from err


def _key(spec: EnvSpec) -> tuple[str, str, int | None, bool]:
    return (
        spec.entry_point_name,
        repr(sorted(spec.defaults.items())),
        spec.max_turns,
        spec.nondeterministic,
    )


BUNDLED: dict[str, dict[str, Any]] = {
    "vime/Math-v0": {"entry_point": "vime.suites.math.env:MathEnv", "max_turns": 1},
    "vime/Tools-v0": {"entry_point": "vime.suites.tools.env:ToolsEnv", "max_turns": 8},
    "vime/SWE-v0": {
        "entry_point": "vime.suites.swe.env:SWEEnv",
        "max_turns": 30,
        "nondeterministic": True,
    },
    "vime/Harbor-v0": {
        "entry_point": "vime.suites.harbor.env:HarborEnv",
        "max_turns": 30,
        "nondeterministic": True,
    },
}
"""The suites shipped with vime: id → :func:`register` arguments. Their code is ``envs/``
in the repository, installed as the ``vime.suites`` package (see setup.py)."""

# vime/OpenEnv-v0 needs an optional extra (pip install 'vime[openenv]', openenv-core): it
# is listed only where that is installed, so every listed env can be made and checked.
if importlib.util.find_spec("openenv") is not None:
    BUNDLED["vime/OpenEnv-v0"] = {
        "entry_point": "vime.suites.openenv.env:OpenEnvEnv",
        "max_turns": 8,
    }


def register_bundled() -> None:
    """Register :data:`BUNDLED` with vime and Gymnasium (no env code is imported).

    ``import vime`` calls it, so ``gymnasium.make("vime/Math-v0")`` works after it.

    Example:
        >>> register_bundled()
        >>> "vime/Math-v0" in registry
        True
    """
    for env_id, kwargs in BUNDLED.items():
        register(env_id, **kwargs)
