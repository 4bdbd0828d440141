"""What a training run records each step, in one object for the RL loop.

:class:`StepRecorder` puts together the step's extra figures
(:func:`~vime.observability.step_metrics.step_figures`), the metric sinks
(:class:`~vime.observability.sinks.RunMetrics`: JSONL, TensorBoard, W&B, the run page)
and the timelines (:class:`~vime.observability.step_trace.StepTrace`).

Example:
    >>> import tempfile
    >>> from vime.observability.config import MetricsConfig, TraceConfig
    >>> run = Path(tempfile.mkdtemp())
    >>> from types import SimpleNamespace
    >>> cfg = SimpleNamespace(metrics=MetricsConfig(page=False), trace=TraceConfig(enabled=True))
    >>> with StepRecorder(run, cfg) as rec:
    ...     t0 = rec.begin(1)
    ...     rec.write(1, {"reward/mean": 1.0}, episodes=[], version=0)
    >>> sorted(p.name for p in (run / "traces").iterdir())
    ['step_000001.json']
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vime.observability.config import MetricsConfig, TraceConfig
from vime.observability.sinks import RunMetrics
from vime.observability.step_metrics import step_figures
from vime.observability.step_trace import StepTrace
from vime.types import Episode


class StepRecorder:
    """Per-step metrics and traces of one run folder (see the module docstring)."""

    def __init__(
        self,
        run_dir: str | Path,
        config: Any,
        engine_urls: list[str] | None = None,
    ) -> None:
        """``config``: the run's config (its ``metrics`` and ``trace``: a
        :class:`MetricsConfig` and a :class:`TraceConfig`); ``engine_urls``: the engines
        whose profiler ``trace.vllm_profile_step`` runs."""
        metrics: MetricsConfig = config.metrics
        trace: TraceConfig = config.trace
        self.sinks = RunMetrics(run_dir, metrics)
        self.tracing = StepTrace(run_dir, trace, engine_urls or [])

    def begin(self, step: int) -> float:
        """Start of ``step`` (vLLM's profiler starts on ``trace.vllm_profile_step``);
        returns the step's start time (``time.perf_counter()``)."""
        self.tracing.begin(step)
        return time.perf_counter()

    def write(
        self,
        step: int,
        row: dict[str, Any],
        episodes: list[Episode] | None = None,
        version: int = 0,
    ) -> None:
        """Record ``step``'s metrics ``row`` plus the figures of its ``episodes`` (trained
        at weight ``version``) everywhere, then close the step's trace."""
        if episodes is not None:
            row.update(step_figures(episodes, version, row))
        self.sinks.write(step, row)
        if episodes is not None:
            self.tracing.end(step)

    def read(self) -> list[dict[str, Any]]:
        """Every step's metrics so far."""
        return self.sinks.read()

    def close(self, write_page: bool = True) -> None:
        """Stop tracing; close the sinks (which rewrites the run page, if ``write_page``)."""
        self.tracing.close()
        self.sinks.close(write_page)

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(write_page=exc_type is None)  # an error or Ctrl-C: no page, exit at once
