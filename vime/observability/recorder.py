"""What a training run records each step, in one object for the RL loop.

:class:`StepRecorder` puts together the step's extra figures
(:func:`~vime.observability.step_metrics.step_figures`), the metric sinks
(:class:`~vime.observability.sinks.RunMetrics`: JSONL, TensorBoard, W&B)
and the timelines (:class:`~vime.observability.step_trace.StepTrace`).

Example:
    >>> import tempfile
    >>> from vime.observability.config import MetricsConfig, TraceConfig
    >>> run = Path(tempfile.mkdtemp())
    >>> with StepRecorder(run, MetricsConfig(page=False), TraceConfig(enabled=True)) as rec:
    ...     t0 = rec.begin(1)
    ...     rec.write(1, {"reward/mean": 1.0}, episodes=[], version=0)
    >>> sorted(p.name for p in (run / "traces").iterdir())
    ['step_000001.json']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
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
        metrics: MetricsConfig,
        trace: TraceConfig,
        engine_urls: list[str] | None = None,
        sources: Sequence[Callable[[], dict[str, float]]] = (),
    ) -> None:
        """``engine_urls``: the engines whose profiler ``trace.vllm_profile_step`` runs;
        ``sources``: calls returning (and resetting) more figures each step, from rooms
        observability does not import (``vime.sandbox.leases.take_figures``)."""
        self.sinks = RunMetrics(run_dir, metrics)
        self.tracing = StepTrace(run_dir, trace, engine_urls or [])
        self.sources = list(sources)

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
            row.update(step_figures(episodes, version, row, self.sources))
        self.sinks.write(step, row)
        if episodes is not None:
            self.tracing.end(step)

    def supersede(self, kept_through: int) -> int:
        """Move aside the rows of steps after ``kept_through``, which a resumed run trains
        again (:meth:`vime.observability.sinks.RunMetrics.supersede`); how many moved."""
        return self.sinks.supersede(kept_through)

    def read(self) -> list[dict[str, Any]]:
        """Every step's metrics so far."""
        return self.sinks.read()

    def close(self) -> None:
        """Stop tracing; close the sinks."""
        self.tracing.close()
        self.sinks.close()

    def __enter__(self) -> StepRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
