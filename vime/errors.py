"""One exception tree for vime.

Every error vime raises on purpose is a :class:`VimeError`. Catch the subclass for the
part that failed; the message always names what failed and, where possible, the fix.

Example:
    >>> try:
    ...     raise ConfigError("trainer.lr must be > 0, got -1", key="trainer.lr")
    ... except VimeError as err:
    ...     print(err.key)
    trainer.lr
"""

from __future__ import annotations


class VimeError(Exception):
    """Base of every error vime raises on purpose."""


class ConfigError(VimeError, ValueError):
    """A configuration value or key is wrong. ``key`` is the dotted name at fault."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class DataError(VimeError, ValueError):
    """A task file or record is malformed. The message names the file, the line and the field."""


class EnvError(VimeError):
    """An environment failed (raised inside reset/step, or broke its contract).

    ``env_id`` and ``task_id`` say which environment and which task.
    """

    def __init__(self, message: str, *, env_id: str | None = None, task_id: str | None = None):
        super().__init__(message)
        self.env_id = env_id
        self.task_id = task_id


class EnvCheckError(EnvError):
    """``check_env`` found a contract violation; the message names the likely fix."""


class SandboxError(VimeError):
    """A sandbox could not run a command, died, or could not be created."""


class EngineError(VimeError):
    """A vLLM engine could not be started, reached, or updated."""


class EngineStartupError(EngineError):
    """The engine did not become ready; the message carries the server's log tail."""


class WeightSyncError(EngineError):
    """Pushing trainer weights into an engine failed after retries."""


class RolloutError(VimeError):
    """A step's rollouts failed beyond the run's budget (``rollout.max_error_frac``).

    ``reasons`` maps each failure reason to its episode count, most frequent first.
    """

    def __init__(self, message: str, *, reasons: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.reasons = dict(reasons or {})


class TemplateError(VimeError):
    """The chat template is not append-only: earlier tokens are not a prefix of the new render."""


class TrainerError(VimeError):
    """The trainer hit an unsupported model, a bad checkpoint, or a numerical problem."""


class UnsupportedArchitectureError(TrainerError):
    """The HF config names an architecture vime cannot map onto Megatron."""
