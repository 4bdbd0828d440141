"""``check_env``: small ``check_*`` functions that each test one part of the env contract.

Every check raises :class:`~vime.errors.EnvCheckError` whose message names the likely
fix. :func:`run_checks` runs them all and reports each result; :func:`check_env` raises
on the first failure (listing all of them). Checks drive the env with one scripted
action (default: ``Action(text="42")``) and, if given, one task.

Example:
    >>> import vime
    >>> results = check_env(vime.make("vime/Math-v0"))
    >>> all(r.ok for r in results)
    True
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable
from contextlib import redirect_stderr
from dataclasses import dataclass
from typing import Any

import gymnasium

from vime.envs.base import Env
from vime.envs.contract import (
    validate_metrics,
    validate_reset_result,
    validate_step_result,
    validate_tools,
)
from vime.envs.spaces import ActionSpace, MessagesSpace
from vime.envs.wrappers import EpisodeGuard, wrap
from vime.errors import EnvCheckError, EnvError
from vime.types import Action

MAX_CHECK_STEPS = 64
"""An episode with a fixed action must end within this many steps (or ``max_turns``)."""


@dataclass
class CheckContext:
    """What every check gets: the env as given, its raw form, a guarded form, and the inputs."""

    env: gymnasium.Env
    raw: Env
    guarded: EpisodeGuard
    action: Action
    options: dict[str, Any] | None
    seed: int


@dataclass
class CheckResult:
    """One check's outcome: ``name``, ``ok`` and the failure ``message`` (``""`` when ok)."""

    name: str
    ok: bool
    message: str = ""


def check_is_vime_env(ctx: CheckContext) -> None:
    """The env subclasses :class:`vime.Env` and has chat spaces."""
    if not isinstance(ctx.raw, Env):
        raise EnvCheckError(
            f"{type(ctx.raw).__name__} is not a vime.Env; subclass it: class MyEnv(vime.Env)"
        )
    if not isinstance(ctx.raw.observation_space, MessagesSpace) or not isinstance(
        ctx.raw.action_space, ActionSpace
    ):
        raise EnvCheckError(
            "observation_space/action_space were replaced; keep vime.Env's MessagesSpace and "
            "ActionSpace (call super().__init__() in __init__)"
        )


def check_tools(ctx: CheckContext) -> None:
    """``env.tools`` is ``None`` or valid OpenAI function schemas."""
    validate_tools(ctx.raw.tools)


def check_reset(ctx: CheckContext) -> None:
    """``reset`` returns ``(messages, info)``, seeds ``np_random`` and stores the task."""
    result = _call(
        lambda: ctx.raw.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset"
    )
    validate_reset_result(result)
    if ctx.raw._np_random is None:
        raise EnvCheckError(
            "reset(seed=...) did not seed self.np_random; call super().reset(seed=seed, "
            "options=options) first in reset"
        )
    task = (ctx.options or {}).get("task")
    if task is not None and ctx.raw.task != task:
        raise EnvCheckError(
            "reset(options={'task': ...}) did not store the task in self.task; call "
            "super().reset(seed=seed, options=options) first in reset"
        )


def check_reset_without_task(ctx: CheckContext) -> None:
    """``reset()`` without a task works (the env draws one from ``self.np_random``)."""
    hint = "; reset must work without options['task']: draw a default task from self.np_random"
    validate_reset_result(_call(lambda: ctx.raw.reset(seed=ctx.seed), "reset", hint))


def check_reset_determinism(ctx: CheckContext) -> None:
    """The same seed (and task) gives the same opening conversation."""
    first = validate_reset_result(
        _call(lambda: ctx.raw.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset")
    )[0]
    first = copy.deepcopy(first)
    second = validate_reset_result(
        _call(lambda: ctx.raw.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset")
    )[0]
    if first != second:
        raise EnvCheckError(
            "reset(seed=s) twice gave different messages; draw randomness only from "
            "self.np_random (seeded by super().reset(seed=seed)), not from random/time"
        )


def check_step(ctx: CheckContext) -> None:
    """``step`` returns ``(new_messages, reward, terminated, truncated, info)`` correctly."""
    opening = validate_reset_result(
        _call(lambda: ctx.raw.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset")
    )[0]
    opening = copy.deepcopy(opening)
    new_messages = validate_step_result(_call(lambda: ctx.raw.step(_copy(ctx.action)), "step"))[0]
    if opening and new_messages[: len(opening)] == opening:
        raise EnvCheckError(
            "step() returned the whole conversation; return only the NEW messages the env adds "
            "(the collector keeps the history)"
        )


def check_step_determinism(ctx: CheckContext) -> None:
    """The same seed, task and action give the same step result."""
    if ctx.raw.spec is not None and ctx.raw.spec.nondeterministic:
        return
    results = []
    for _ in range(2):
        _call(lambda: ctx.raw.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset")
        msgs, reward, term, trunc, _ = validate_step_result(
            _call(lambda: ctx.raw.step(_copy(ctx.action)), "step")
        )
        results.append(copy.deepcopy((msgs, reward, term, trunc)))
    if results[0] != results[1]:
        raise EnvCheckError(
            "the same seed, task and action gave different step results "
            f"({results[0][1:]} vs {results[1][1:]}); draw randomness only from self.np_random, "
            "or register the env with nondeterministic=True"
        )


def check_episode_ends(ctx: CheckContext) -> None:
    """An episode played with the scripted action ends (terminated or truncated)."""
    _run_episode(ctx)


def check_step_after_done(ctx: CheckContext) -> None:
    """After the episode ends, ``step`` is rejected with ``EnvError``."""
    _run_episode(ctx)
    try:
        ctx.guarded.step(_copy(ctx.action))
    except EnvError:
        return
    raise EnvCheckError(
        "step() after the episode ended was accepted; build the env with vime.make(id) (or "
        "vime.envs.wrap(env)), which rejects it, instead of gymnasium.make or a bare class"
    )


def check_episode_metrics(ctx: CheckContext) -> None:
    """``episode_metrics()`` returns a dict of finite floats after an episode."""
    _run_episode(ctx)
    validate_metrics(_call(ctx.raw.episode_metrics, "episode_metrics"))


def check_gymnasium(ctx: CheckContext) -> None:
    """Gymnasium's own ``env_checker.check_env`` passes on the raw env."""
    from gymnasium.utils.env_checker import check_env as gym_check_env

    try:
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            gym_check_env(ctx.raw, skip_render_check=True, skip_close_check=True)
    except EnvCheckError:
        raise
    except Exception as err:
        raise EnvCheckError(
            f"gymnasium's env checker failed: {type(err).__name__}: {err} (it steps with random "
            "text actions from env.action_space.sample(): score them, don't raise)"
        ) from err


CHECKS: list[Callable[[CheckContext], None]] = [
    check_is_vime_env,
    check_tools,
    check_reset,
    check_reset_without_task,
    check_reset_determinism,
    check_step,
    check_step_determinism,
    check_episode_ends,
    check_step_after_done,
    check_episode_metrics,
    check_gymnasium,
]
"""The checks :func:`run_checks` runs, in order."""


def run_checks(
    env: gymnasium.Env,
    *,
    action: Action | str | None = None,
    task: dict[str, Any] | None = None,
    seed: int = 123,
) -> list[CheckResult]:
    """Run every check in :data:`CHECKS` on ``env`` and return one result per check.

    Args:
        env: an env from ``vime.make`` or a bare :class:`vime.Env` instance (then the
            standard wrappers are added for the order checks).
        action: the scripted assistant turn (text or Action); default ``"42"``.
        task: one task record passed as ``options={"task": task}``; default: none.
        seed: the seed used for ``reset``.

    Example:
        >>> import vime
        >>> [r.name for r in run_checks(vime.make("vime/Math-v0"))][:2]
        ['check_is_vime_env', 'check_tools']
    """
    if isinstance(action, str):
        action = Action(text=action)
    raw = env.unwrapped
    if isinstance(env, EpisodeGuard):
        guarded = env
    elif env is raw and isinstance(raw, Env):
        max_turns = raw.spec.max_episode_steps if raw.spec is not None else None
        guarded = wrap(raw, env_id=raw.env_id, max_turns=max_turns)
    else:
        # Some other wrapper stack (e.g. gymnasium.make): check it as it is.
        guarded = env  # type: ignore[assignment]
    ctx = CheckContext(
        env=env,
        raw=raw,  # type: ignore[arg-type]
        guarded=guarded,
        action=action or Action(text="42"),
        options={"task": task} if task is not None else None,
        seed=seed,
    )
    results = []
    for check in CHECKS:
        try:
            check(ctx)
        except EnvCheckError as err:
            results.append(CheckResult(check.__name__, False, str(err)))
            if check is check_is_vime_env:
                break  # nothing else can be checked meaningfully
        except Exception as err:  # the env's values broke the check itself (copy, ==)
            results.append(CheckResult(check.__name__, False, _unusable(err)))
        else:
            results.append(CheckResult(check.__name__, True))
    return results


def check_env(
    env: gymnasium.Env,
    *,
    action: Action | str | None = None,
    task: dict[str, Any] | None = None,
    seed: int = 123,
) -> list[CheckResult]:
    """Check ``env`` against the vime contract; raise :class:`EnvCheckError` if any check fails.

    The message starts with the first failure (its fix) and lists the others. The env is
    reset and stepped several times; reset it before using it afterwards.

    Example:
        >>> import vime
        >>> _ = check_env(vime.make("vime/Math-v0"), action="\\\\boxed{3}")
    """
    results = run_checks(env, action=action, task=task, seed=seed)
    failed = [r for r in results if not r.ok]
    if failed:
        first = failed[0]
        rest = "".join(f"\n  also {r.name}: {r.message}" for r in failed[1:])
        env_id = getattr(env.unwrapped, "env_id", "") or type(env.unwrapped).__name__
        raise EnvCheckError(f"{env_id}: {first.name}: {first.message}{rest}", env_id=env_id or None)
    return results


def _run_episode(ctx: CheckContext) -> None:
    limit = MAX_CHECK_STEPS
    _call(lambda: ctx.guarded.reset(seed=ctx.seed, options=copy.deepcopy(ctx.options)), "reset")
    for _ in range(limit):
        result = _call(lambda: ctx.guarded.step(_copy(ctx.action)), "step")
        if result[2] or result[3]:
            return
    raise EnvCheckError(
        f"the episode did not end after {limit} steps with a fixed action; register the env "
        "with max_turns=N (make() then truncates) or return terminated=True when the task is over"
    )


def _call(fn: Callable[[], Any], method: str, hint: str = "") -> Any:
    """Run one env call; an exception becomes a failed check naming the method."""
    try:
        return fn()
    except EnvCheckError:
        raise
    except Exception as err:
        raise EnvCheckError(f"{method}() raised {type(err).__name__}: {err}{hint}") from err


def _unusable(err: Exception) -> str:
    """The failure message when the env's values could not even be checked."""
    return (
        f"the env returned values the checker cannot copy or compare ({type(err).__name__}: "
        f"{str(err)[:200]}); return plain Python values (str, int, float, bool, None, lists "
        "and dicts of them): no numpy arrays, locks or iterators in messages or info"
    )


def _copy(action: Action) -> Action:
    return copy.deepcopy(action)


__all__ = ["CHECKS", "CheckContext", "CheckResult", "check_env", "run_checks"]
