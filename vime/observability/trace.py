"""Spans: where a run's time goes, as a Chrome/Perfetto trace (``trace.enabled=true``).

One process-wide :data:`TRACE`. Code marks its work with ``with TRACE.span(kind):``;
each kind is one of :data:`KINDS`. Every span is always counted (count and seconds per
kind, read once per step by :meth:`Tracer.take_totals`: the ``spans/*`` metrics); only an
enabled tracer also keeps the span itself, and :meth:`Tracer.write` saves the kept spans
as Chrome trace JSON (open it in https://ui.perfetto.dev or ``chrome://tracing``).

Lanes (the trace's rows, ``tid``): an ``episode`` span takes a free episode lane and the
spans inside it (turns, engine requests, env steps) are drawn on it, although all
episodes share one asyncio thread; any other span is drawn on its thread's lane.

Example:
    >>> tracer = Tracer()
    >>> tracer.enable(True)
    >>> with tracer.span("episode", "t1"):
    ...     with tracer.span("turn"):
    ...         pass
    >>> [e["cat"] for e in tracer.drain()], tracer.take_totals()["turn"][0]
    (['turn', 'episode'], 1)
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

KINDS = (
    "episode",
    "turn",
    "engine_request",
    "env_step",
    "sandbox_exec",
    "train_micro_batch",
    "weight_sync",
)
"""The span kinds vime records (the ``cat`` of each trace event)."""

EPISODE_LANE_BASE = 1000  # episode lanes are tids 1000, 1001, ...; threads get 1, 2, ...
_LANE: contextvars.ContextVar[int | None] = contextvars.ContextVar("vime_trace_lane", default=None)


class Tracer:
    """Counts every span; keeps them (for :meth:`write`) while enabled. Thread-safe."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._totals: dict[str, list[float]] = {}
        self._threads: dict[str, int] = {}  # thread name -> lane
        self._free_lanes: list[int] = []
        self._lanes_made = 0
        # What a stall report reads (vime.observability.stall): the spans open now, the
        # spans that ended without an error (progress), and the last of each kind to end.
        self.progress = 0
        self._open: dict[int, tuple[str, str, float, str]] = {}
        self._last_ended: dict[str, tuple[str, float]] = {}
        self._next_id = 0
        # Wall-clock microseconds at perf_counter() == 0: traces of processes line up.
        self._origin_us = (time.time() - time.perf_counter()) * 1e6

    def enable(self, on: bool) -> None:
        """Keep spans from now on (``on``), or only count them."""
        self.enabled = on

    @contextlib.contextmanager
    def span(self, kind: str, name: str = "", **args: Any) -> Iterator[None]:
        """Time the body as one span of ``kind`` (one of :data:`KINDS`) named ``name``."""
        lane = token = None
        if self.enabled and kind == "episode":
            lane = self._take_lane()
            token = _LANE.set(lane)
        start = time.perf_counter()
        key = self._opened(kind, name, start)
        failed = True
        try:
            yield
            failed = False
        finally:
            end = time.perf_counter()
            if token is not None:
                _LANE.reset(token)
            self._closed(key, kind, name, end, failed)
            self._record(kind, name, start, end, args, lane)
            if lane is not None:
                with self._lock:
                    self._free_lanes.append(lane)

    def call(self, kind: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` as one span of ``kind``, named after ``fn``.

        Example:
            >>> Tracer().call("weight_sync", max, 2, 3)
            3
        """
        with self.span(kind, getattr(fn, "__qualname__", kind)):
            return fn(*args, **kwargs)

    @contextlib.contextmanager
    def each(self, items: Iterable[T], kind: str, **args: Any) -> Iterator[Iterator[T]]:
        """An iterator over ``items`` that spans each item from when it is taken until the
        next one is (or the block ends): a consumer that works on one item at a time,
        like Megatron's schedule on micro-batches (forward and backward), gets one span
        per item.

        Example:
            >>> tracer = Tracer()
            >>> with tracer.each([1, 2], "train_micro_batch") as it:
            ...     total = sum(it)
            >>> tracer.take_totals()["train_micro_batch"][0]
            2
        """
        open_at: list[float] = []
        lane = self._lane()

        def close() -> None:
            if open_at:
                end = time.perf_counter()
                self._closed(0, kind, kind, end, failed=False)
                self._record(kind, kind, open_at.pop(), end, args, lane)

        def spanned() -> Iterator[T]:
            for item in items:
                close()
                open_at.append(time.perf_counter())
                yield item

        try:
            yield spanned()
        finally:
            close()

    def note_progress(self) -> None:
        """Count progress that is no span of this process (a group another process wrote)."""
        with self._lock:
            self.progress += 1

    def in_flight(self) -> list[tuple[str, str, float, str]]:
        """The spans open now as ``(kind, name, seconds open, thread)``, oldest first.

        Example:
            >>> tracer = Tracer()
            >>> with tracer.span("sandbox_exec", "ls"):
            ...     [(kind, name) for kind, name, _, _ in tracer.in_flight()]
            [('sandbox_exec', 'ls')]
        """
        now = time.perf_counter()
        with self._lock:
            spans = sorted(self._open.values(), key=lambda s: s[2])
        return [(kind, name, now - start, thread) for kind, name, start, thread in spans]

    def last_ended(self) -> dict[str, tuple[str, float]]:
        """Per kind, the last span to end without an error: ``(name, seconds ago)``."""
        now = time.perf_counter()
        with self._lock:
            return {k: (name, now - end) for k, (name, end) in self._last_ended.items()}

    def take_totals(self) -> dict[str, tuple[int, float]]:
        """``{kind: (count, seconds)}`` of the spans since the last call (then reset)."""
        with self._lock:
            totals, self._totals = self._totals, {}
        return {k: (int(v[0]), v[1]) for k, v in totals.items()}

    def drain(self) -> list[dict[str, Any]]:
        """The kept spans since the last drain, as Chrome trace events (then forgotten)."""
        with self._lock:
            events, self._events = self._events, []
        return events

    def absorb(
        self,
        events: list[dict[str, Any]],
        totals: dict[str, tuple[int, float]],
        *,
        lane_name: str,
    ) -> None:
        """Take in another process's spans (its :meth:`drain` and :meth:`take_totals`): they
        are counted here and drawn on one lane named ``lane_name`` (both clocks are wall
        time, so they line up).

        Example:
            >>> tracer = Tracer()
            >>> tracer.absorb([], {"train_micro_batch": (2, 0.5)}, lane_name="trainer")
            >>> tracer.take_totals()["train_micro_batch"]
            (2, 0.5)
        """
        with self._lock:
            for kind, (count, seconds) in totals.items():
                self.progress += count
                total = self._totals.setdefault(kind, [0, 0.0])
                total[0] += count
                total[1] += seconds
            lane = self._threads.setdefault(lane_name, len(self._threads) + 1)
            if self.enabled:
                pid = os.getpid()
                self._events.extend({**e, "pid": pid, "tid": lane} for e in events)

    def write(self, path: str | Path, events: list[dict[str, Any]]) -> Path:
        """Save ``events`` (from :meth:`drain`) as a Chrome trace JSON file, atomically."""
        with self._lock:
            names = {lane: name for name, lane in self._threads.items()}
        pid = os.getpid()
        lanes = sorted({e["tid"] for e in events})
        meta = [
            {
                "name": "thread_name",
                "ph": "M",
                "pid": pid,
                "tid": lane,
                "args": {"name": names.get(lane, f"episode lane {lane - EPISODE_LANE_BASE}")},
            }
            for lane in lanes
        ]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"traceEvents": meta + events, "displayTimeUnit": "ms"}))
        os.replace(tmp, path)
        return path

    # ------------------------------------------------------------------ internals

    def _record(
        self, kind: str, name: str, start: float, end: float, args: dict[str, Any], lane: int | None
    ) -> None:
        with self._lock:
            total = self._totals.setdefault(kind, [0, 0.0])
            total[0] += 1
            total[1] += end - start
        if not self.enabled:
            return
        event = {
            "name": name or kind,
            "cat": kind,
            "ph": "X",
            "ts": self._origin_us + start * 1e6,
            "dur": (end - start) * 1e6,
            "pid": os.getpid(),
            "tid": lane if lane is not None else self._lane(),
            "args": {k: _plain(v) for k, v in args.items()},
        }
        with self._lock:
            self._events.append(event)

    def _opened(self, kind: str, name: str, start: float) -> int:
        with self._lock:
            self._next_id += 1
            self._open[self._next_id] = (kind, name, start, threading.current_thread().name)
            return self._next_id

    def _closed(self, key: int, kind: str, name: str, end: float, failed: bool) -> None:
        with self._lock:
            self._open.pop(key, None)
            if not failed:  # a span that raised (a retried request) is no progress
                self.progress += 1
                self._last_ended[kind] = (name or kind, end)

    def _lane(self) -> int:
        """The lane of the current episode, else of the current thread."""
        lane = _LANE.get()
        if lane is not None:
            return lane
        name = threading.current_thread().name
        with self._lock:
            return self._threads.setdefault(name, len(self._threads) + 1)

    def _take_lane(self) -> int:
        with self._lock:
            if self._free_lanes:
                self._free_lanes.sort()
                return self._free_lanes.pop(0)
            self._lanes_made += 1
            return EPISODE_LANE_BASE + self._lanes_made - 1


def _plain(value: Any) -> Any:
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


TRACE = Tracer()
"""The process's tracer: vime's call sites record into it."""
