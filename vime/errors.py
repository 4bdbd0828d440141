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

import errno
import os
import shutil


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


class StallError(VimeError):
    """The run made no progress for ``watchdog.stall_s``; the message names the stuck part
    and the stall report (:mod:`vime.observability.stall`)."""


class DiskFullError(VimeError, OSError):
    """No space left (or over quota) on the disk where a run writes ``path``.

    What was being written is not kept half-written where a reader looks; the message
    names the path and the fix.

    Example:
        >>> print(DiskFullError("runs/x/buffer/step_00000003.jsonl", "buffer append"))
        ... # doctest: +NORMALIZE_WHITESPACE
        buffer append: no space left on the device writing runs/x/buffer/step_00000003.jsonl;
        nothing half-written was kept. Free space there (df -h runs/x/buffer; old
        checkpoints in the run's checkpoints/ folder can go), then resume with resume=RUN_DIR.
    """

    def __init__(self, path: object, what: str, *, resume: object = "RUN_DIR") -> None:
        folder = os.path.dirname(str(path)) or "."
        super().__init__(
            f"{what}: no space left on the device writing {path}; nothing half-written was "
            f"kept. Free space there (df -h {folder}; old checkpoints in the run's "
            f"checkpoints/ folder can go), then resume with resume={resume}."
        )
        self.path = str(path)


def is_disk_full(err: BaseException, where: object = None) -> bool:
    """True when ``err``, or an error it was raised from, is ENOSPC or EDQUOT, or when
    less than 16 MiB is left on the disk of ``where``: a library may wrap the OSError
    past recognition (Megatron's checkpoint writer reports "unexpected pos 704 vs 598").

    Example:
        >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
        True
        >>> is_disk_full(RuntimeError("file write failed"))
        False
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "Disk quota exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    if where is None:
        return False
    folder = os.path.abspath(str(where))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return shutil.disk_usage(folder).free < 16 * 2**20
