"""A training run's timelines, step by step (``trace.*`` keys).

:class:`StepTrace` is what the RL loop calls around each step: ``begin(step)`` and
``end(step)``. With ``trace.enabled`` the spans recorded meanwhile (:data:`TRACE`) are
saved as ``<run>/traces/step_NNNNNN.json`` (Chrome/Perfetto trace JSON); with
``trace.vllm_profile_step=N`` vLLM's own profiler runs on every engine during step N
(``/start_profile`` … ``/stop_profile``; the engines write their torch profiler traces
into the folder they were launched with, ``engine.profiler_dir``).

Example:
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> tracing = StepTrace(run, TraceConfig(enabled=True), engine_urls=[])
    >>> tracing.begin(1)
    >>> with TRACE.span("weight_sync"):
    ...     pass
    >>> tracing.end(1).name
    'step_000001.json'
    >>> tracing.close()
"""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

from vime.errors import ConfigError
from vime.net import engine_headers
from vime.observability.config import TraceConfig
from vime.observability.trace import TRACE

log = logging.getLogger("vime.trace")


def trace_path(run_dir: str | Path, step: int) -> Path:
    """Where step ``step``'s trace of a run lives.

    Example:
        >>> trace_path("runs/x", 3).as_posix()
        'runs/x/traces/step_000003.json'
    """
    return Path(run_dir) / "traces" / f"step_{step:06d}.json"


class StepTrace:
    """Per-step trace files and the vLLM profiler window (see the module docstring)."""

    def __init__(self, run_dir: str | Path, config: TraceConfig, engine_urls: list[str]) -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.engine_urls = list(engine_urls)
        self._profiling = False
        if config.vllm_profile_step:  # at start, not at step N: every engine must profile
            for url in self.engine_urls:
                _check_profiler(url)
        TRACE.enable(config.enabled)

    def begin(self, step: int) -> None:
        """Start of ``step``: start vLLM's profiler if this is ``trace.vllm_profile_step``."""
        if step == self.config.vllm_profile_step and self.engine_urls:
            for url in self.engine_urls:
                _post(url, "/start_profile")
            self._profiling = True

    def end(self, step: int) -> Path | None:
        """End of ``step``: stop the profiler; write the step's trace (``trace.enabled``)."""
        if self._profiling:
            self._profiling = False
            for url in self.engine_urls:
                _post(url, "/stop_profile")
            log.info("vLLM profiler traces of step %d: in each engine's engine.profiler_dir", step)
        if not self.config.enabled:
            return None
        return TRACE.write(trace_path(self.run_dir, step), TRACE.drain())

    def close(self) -> None:
        """Stop keeping spans (a later run in this process starts clean)."""
        TRACE.enable(False)
        TRACE.drain()


def _check_profiler(url: str) -> None:
    """A :class:`ConfigError` unless the engine at ``url`` serves ``/start_profile`` (vLLM
    adds the route only when launched with a profiler; its OpenAPI schema lists it)."""
    request = urllib.request.Request(url.rstrip("/") + "/openapi.json", headers=engine_headers(url))
    with urllib.request.urlopen(request, timeout=30) as answer:
        paths = json.loads(answer.read()).get("paths", {})
    if "/start_profile" not in paths:
        raise ConfigError(
            f"trace.vllm_profile_step: the engine at {url} has no /start_profile (it was not "
            "launched with a profiler); launch it with engine.profiler_dir=DIR, or set "
            "trace.vllm_profile_step=0",
            key="trace.vllm_profile_step",
        )


def _post(url: str, route: str) -> None:
    """POST ``route`` to an engine (stopping writes the profile: seconds on CPU)."""
    request = urllib.request.Request(
        url.rstrip("/") + route, data=b"", method="POST", headers=engine_headers(url)
    )
    with urllib.request.urlopen(request, timeout=600):
        pass
