"""The standard wrappers that ``vime.make`` puts around every env.

From the outside in:

- :class:`EpisodeGuard`: order enforcement (``step`` before ``reset`` or after the
  episode ended is an error) and error wrapping (anything raised inside the env becomes
  an :class:`~vime.errors.EnvError` carrying the env id and the task id, so the
  collector records a failed episode instead of crashing).
- :class:`TurnLimit`: after ``max_turns`` steps an unfinished episode is ``truncated``.
- :class:`ContractChecker`: every ``reset``/``step`` result is validated (messages,
  finite float reward, bool flags, dict info); a violation names the fix.

Example:
    >>> from vime.envs.base import Env
    >>> class Hi(Env):
    ...     def reset(self, *, seed=None, options=None):
    ...         super().reset(seed=seed, options=options)
    ...         return [{"role": "user", "content": "hi"}], {}
    ...     def step(self, action):
    ...         return [{"role": "user", "content": "again"}], 0.0, False, False, {}
    >>> env = wrap(Hi(), env_id="demo/Hi-v0", max_turns=2)
    >>> _ = env.reset(seed=0)
    >>> _ = env.step(Action(text="hi"))
    >>> env.step(Action(text="hi"))[3]  # truncated: the turn limit ran out
    True
"""

from __future__ import annotations

from typing import Any

import gymnasium

from vime.envs.contract import (
    validate_metrics,
    validate_reset_result,
    validate_step_result,
    validate_tools,
)
from vime.errors import EnvError
from vime.types import Action, Message

StepResult = tuple[list[Message], float, bool, bool, dict[str, Any]]


class VimeWrapper(gymnasium.Wrapper[list[Message], Action, list[Message], Action]):
    """A Gymnasium wrapper that exposes the vime contract (``env_id``, ``tools``, ``task``,
    ``episode_metrics``) of the env inside it; Gymnasium 1.x wrappers don't forward attributes.

    Example:
        >>> from vime.envs.base import Env
        >>> VimeWrapper(Env()).tools is None
        True
    """

    @property
    def env_id(self) -> str:
        return str(getattr(self.env.unwrapped, "env_id", ""))

    @env_id.setter
    def env_id(self, value: str) -> None:
        self.env.unwrapped.env_id = value  # type: ignore[attr-defined]

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        return getattr(self.env.unwrapped, "tools", None)

    @property
    def task(self) -> dict[str, Any]:
        return getattr(self.env.unwrapped, "task", {})

    def episode_metrics(self) -> dict[str, float]:
        """The wrapped env's per-episode metrics (see :meth:`vime.envs.Env.episode_metrics`)."""
        inner = self.env
        if isinstance(inner, VimeWrapper) or hasattr(inner, "episode_metrics"):
            return inner.episode_metrics()  # type: ignore[attr-defined, no-any-return]
        return {}


class ContractChecker(VimeWrapper):
    """Validate every ``reset``/``step`` result; a violation raises ``EnvCheckError``.

    Example:
        >>> from vime.envs.base import Env
        >>> ContractChecker(Env()).reset()  # Env.reset returns no messages
        Traceback (most recent call last):
        ...
        vime.errors.EnvCheckError: reset() returned no messages; return the opening conversation, e.g. [{'role': 'user', 'content': 'What is 2+2?'}]
    """

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        result = validate_reset_result(self.env.reset(seed=seed, options=options))
        validate_tools(self.tools)  # after reset: an env may choose its tools per task
        return result

    def step(self, action: Action) -> StepResult:
        return validate_step_result(self.env.step(action))

    def episode_metrics(self) -> dict[str, float]:
        return validate_metrics(super().episode_metrics())


class TurnLimit(VimeWrapper):
    """Truncate the episode after ``max_turns`` steps (``info["truncated_by"] = "max_turns"``).

    Example:
        >>> from vime.envs.base import Env
        >>> TurnLimit(Env(), max_turns=4).max_turns
        4
    """

    def __init__(self, env: gymnasium.Env, max_turns: int) -> None:
        if not (isinstance(max_turns, int) and max_turns >= 1):
            raise EnvError(f"max_turns must be an integer >= 1, got {max_turns!r}")
        super().__init__(env)
        self.max_turns = max_turns
        self.turns = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        self.turns = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Action) -> StepResult:
        new_messages, reward, terminated, truncated, info = self.env.step(action)
        self.turns += 1
        if self.turns >= self.max_turns and not (terminated or truncated):
            truncated = True
            info = {**info, "truncated_by": "max_turns"}
        return new_messages, float(reward), terminated, truncated, info


class EpisodeGuard(VimeWrapper):
    """Enforce reset → step … → done → reset, and turn any failure into ``EnvError``.

    ``EnvError.env_id`` and ``EnvError.task_id`` say where it happened; the original
    exception is chained as ``__cause__``. A failed episode is over: call ``reset``.

    Example:
        >>> from vime.envs.base import Env
        >>> EpisodeGuard(Env()).step(Action(text="hi"))
        Traceback (most recent call last):
        ...
        vime.errors.EnvError: Env: step() called before reset(): call env.reset(options={'task': ...}) to start an episode
    """

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        self.state = "needs_reset"  # "running" | "done" | "needs_reset"
        self.task_id: str | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        task = (options or {}).get("task")
        self.task_id = str(task["id"]) if isinstance(task, dict) and "id" in task else None
        self.state = "needs_reset"
        try:
            result = self.env.reset(seed=seed, options=options)
        except Exception as err:
            raise self._wrap(err, "reset") from err
        if self.task_id is None:  # the env drew its own task: report its id if it has one
            tid = self.task.get("id")
            self.task_id = str(tid) if tid is not None else None
        self.state = "running"
        return result

    def step(self, action: Action) -> StepResult:
        if self.state == "needs_reset":
            raise self._error(
                "step() called before reset(): call env.reset(options={'task': ...}) to start "
                "an episode"
            )
        if self.state == "done":
            raise self._error(
                "step() called after the episode ended (terminated or truncated): call "
                "env.reset() to start a new one"
            )
        if not isinstance(action, Action):
            raise self._error(
                f"step() expects a vime.types.Action, got {type(action).__name__}: pass "
                "Action(text=...) (the collector builds it from the model's output)"
            )
        try:
            new_messages, reward, terminated, truncated, info = self.env.step(action)
        except Exception as err:
            self.state = "done"
            raise self._wrap(err, "step") from err
        if terminated or truncated:
            self.state = "done"
        return new_messages, float(reward), terminated, truncated, info

    def episode_metrics(self) -> dict[str, float]:
        """The env's per-episode metrics (validated: finite floats), or ``EnvError``."""
        try:
            return super().episode_metrics()
        except Exception as err:
            raise self._wrap(err, "episode_metrics") from err

    def close(self) -> None:
        try:
            self.env.close()
        except Exception as err:
            raise self._wrap(err, "close") from err

    def _where(self) -> str:
        where = self.env_id or type(self.unwrapped).__name__
        return where + (f" (task {self.task_id})" if self.task_id is not None else "")

    def _error(self, message: str) -> EnvError:
        return EnvError(
            f"{self._where()}: {message}", env_id=self.env_id or None, task_id=self.task_id
        )

    def _wrap(self, err: Exception, method: str) -> EnvError:
        if isinstance(err, EnvError):
            # Keep the subclass (EnvCheckError stays one), add where it happened.
            wrapped = type(err)(f"{self._where()}: {err}")
        else:
            wrapped = EnvError(f"{self._where()}: {method}() raised {type(err).__name__}: {err}")
        wrapped.env_id = self.env_id or None
        wrapped.task_id = self.task_id
        return wrapped


def wrap(env: gymnasium.Env, *, env_id: str = "", max_turns: int | None = None) -> EpisodeGuard:
    """Put the standard wrappers around ``env`` (what ``vime.make`` does).

    Example:
        >>> from vime.envs.base import Env
        >>> type(wrap(Env(), env_id="demo/Hi-v0")).__name__
        'EpisodeGuard'
    """
    if env_id:
        env.unwrapped.env_id = env_id  # type: ignore[attr-defined]
    inner: gymnasium.Env = ContractChecker(env)
    if max_turns is not None:
        inner = TurnLimit(inner, max_turns)
    return EpisodeGuard(inner)
