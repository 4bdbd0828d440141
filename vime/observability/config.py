"""The ``metrics.*`` and ``trace.*`` keys of ``vime-agent train``.

A key that needs something missing (a package, an API key, a profiling engine) fails
when the config is built, naming the key and what it needs.

Example:
    >>> MetricsConfig(wandb="offline").wandb
    'offline'
    >>> TraceConfig(enabled=True).vllm_profile_step
    0
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from vime.config import require, require_choice
from vime.observability.lock_watch import LOCK_WATCH_S

WANDB_MODES = ("false", "offline", "online")


@dataclass
class MetricsConfig:
    """Where each step's metrics go: ``<run>/metrics.jsonl`` always, and these sinks.

    Fields:
        tensorboard: each step's numeric metrics as TensorBoard scalars in
            ``<run>/tensorboard`` (needs the tensorboard package).
        wandb: ``offline`` (a W&B run folder under ``<run>/wandb``, no network; upload
            later with ``wandb sync``), ``online`` (needs ``WANDB_API_KEY``) or ``false``.
        wandb_project: the W&B project that ``wandb`` logs to; the W&B run is named and
            keyed by the run folder, so a resumed run logs into the same W&B run.
        page: the run page ``<run>/index.html`` (curves, time split, evals, episodes),
            rewritten when the run ends normally (``vime-agent page RUN`` at any time).
    """

    tensorboard: bool = False
    wandb: str = "false"
    wandb_project: str = "vime"
    page: bool = True

    def __post_init__(self) -> None:
        self.wandb = str(self.wandb).lower()  # `metrics.wandb=false` arrives as a bool
        require_choice(self.wandb, "metrics.wandb", WANDB_MODES)
        require(
            not self.tensorboard or _installed("tensorboard"),
            "metrics.tensorboard",
            "=true needs the tensorboard package, which is not installed "
            "(pip install tensorboard), or set metrics.tensorboard=false",
        )
        require(
            self.wandb == "false" or _installed("wandb"),
            "metrics.wandb",
            f"={self.wandb} needs the wandb package, which is not installed (pip install "
            "wandb), or set metrics.wandb=false",
        )
        require(
            self.wandb != "online" or bool(os.environ.get("WANDB_API_KEY")),
            "metrics.wandb",
            "=online needs WANDB_API_KEY in the environment (your W&B API key); "
            "metrics.wandb=offline needs no network and no key (upload with `wandb sync`)",
        )


@dataclass
class TraceConfig:
    """Timelines: ``enabled`` writes ``<run>/traces/step_NNNNNN.json`` (Chrome/Perfetto
    trace: episodes, turns, engine requests, env steps, sandbox execs, train micro-batches,
    weight sync) every step; ``vime-agent trace RUN step=N`` draws one as a PNG.
    ``vllm_profile_step`` N > 0 also records vLLM's own torch profiler trace of step N's
    rollouts into ``engine.profiler_dir`` (the engine must be launched with it).
    ``lock_watch_s`` S > 0 prints every thread's stack to stderr, and then a warning, when
    one call holds Python's interpreter lock for S seconds, which freezes the whole
    process silently (:mod:`vime.observability.lock_watch`); 0 turns the watch off.
    """

    enabled: bool = False
    vllm_profile_step: int = 0
    lock_watch_s: float = LOCK_WATCH_S

    def __post_init__(self) -> None:
        require(self.vllm_profile_step >= 0, "trace.vllm_profile_step", "must be >= 0 (0 = off)")
        require(
            self.lock_watch_s >= 0,
            "trace.lock_watch_s",
            f"={self.lock_watch_s} must be >= 0: the seconds one call may hold Python's "
            "interpreter lock before every thread's stack is printed (default "
            f"{LOCK_WATCH_S:g}; 0 turns the watch off)",
        )

    def check_engine(self, profiler_dir: str, external: bool) -> None:
        """``vllm_profile_step`` needs engines that can profile: vime's own launched with
        ``engine.profiler_dir``, or external ones (asked when the run starts).

        Example:
            >>> TraceConfig(vllm_profile_step=2).check_engine("", external=False)
            Traceback (most recent call last):
            ...
            vime.errors.ConfigError: trace.vllm_profile_step: =2 needs engine.profiler_dir (a folder for vLLM's profiler traces): vLLM serves /start_profile only when launched with one
        """
        require(
            not self.vllm_profile_step or bool(profiler_dir) or external,
            "trace.vllm_profile_step",
            f"={self.vllm_profile_step} needs engine.profiler_dir (a folder for vLLM's "
            "profiler traces): vLLM serves /start_profile only when launched with one",
        )


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # in sys.modules as None: imports of it are blocked
        return False


STALL_S = 600.0
"""The default of ``watchdog.stall_s``: as long as an engine request may take
(``request_timeout_s``), and longer than any sound stretch of a run without a finished
span or trainer step (a checkpoint save counts as progress while it writes or computes:
:mod:`vime.observability.working`)."""


@dataclass
class WatchdogConfig:
    """``stall_s`` S > 0: when nothing in the run progresses for S seconds (no episode,
    turn, request, env step, sandbox exec, sync or trainer micro-batch ends), the run
    writes ``RUN/stall-<time>.txt`` naming the part that does not answer (an engine, a
    docker host, the store, a trainer rank), with every thread's stack, and stops with an
    error (exit status 2); ``resume=RUN`` continues it (:mod:`vime.observability.stall`).
    0 turns the watch off.

    Example:
        >>> WatchdogConfig(stall_s=-1)
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: watchdog.stall_s: =-1 must be >= 0 seconds (0 turns the watch off)
    """

    stall_s: float = STALL_S

    def __post_init__(self) -> None:
        require(
            self.stall_s >= 0,
            "watchdog.stall_s",
            f"={self.stall_s:g} must be >= 0 seconds (0 turns the watch off)",
        )
