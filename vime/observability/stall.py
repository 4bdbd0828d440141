"""The stall watch: a run that stops making progress writes a report naming the stuck part,
then stops with an error that points at it.

**Progress** is any span (:mod:`vime.observability.trace`) that ends without an error in
the run's process (an episode, a turn, an engine request, an env step, a sandbox exec, a
weight sync), or a step of a trainer rank's own counter, which every rank process and
trainer process publishes through its :class:`Heartbeat` file (``RUN/heartbeats``). A
retried request that failed is no progress.

When nothing progresses for ``watchdog.stall_s`` seconds, :class:`StallWatch`:

1. asks each part whether it answers (the ``probes`` the loop gives it: the engines'
   ``/health``, the docker hosts' ``/_ping``, the store; and the heartbeat files: a rank
   or trainer process whose file is older than :data:`HEARTBEAT_STALE_S` is frozen or
   gone);
2. writes ``RUN/stall-<time>.txt``: the parts that did not answer, the spans in flight
   (oldest first, with their thread), how many of each kind are open (the queue depths),
   the last span of each kind to end, the heartbeats, the ``details`` the loop adds (the
   engines' requests in flight) and every thread's stack;
3. raises :class:`~vime.errors.StallError` in the main thread (a signal, so a blocking
   call is interrupted), which ends the run with exit status 2; if the process is still
   alive ``exit_grace_s`` later (its cleanup waits on the stuck part), it exits with 2.

Everything a run writes is whole or absent, so ``resume=RUN`` continues it once the part
answers again.

Example:
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> with StallWatch(0, run) as watch:  # stall_s 0 (watchdog.stall_s=0): off
    ...     watch.watching
    False
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from vime.errors import StallError
from vime.observability.trace import TRACE, Tracer

log = logging.getLogger("vime.train")

HEARTBEAT_EVERY_S = 1.0
"""How often a :class:`Heartbeat` rewrites its file."""

HEARTBEAT_STALE_S = 10.0
"""A heartbeat file this old belongs to a process that is frozen (SIGSTOP, a hung host) or
gone: ten missed beats, which no loaded host comes near."""

HEARTBEATS_ENV = "VIME_HEARTBEATS"
"""Where a process started by the run (the trainer process) writes its heartbeat."""

Probe = Callable[[], list[str]]
"""A part's check for the report: what did not answer, one line each (``[]``: all did).
Each probe bounds its own waits (a few seconds)."""


class Heartbeat:
    """A thread that rewrites ``<folder>/<name>.json`` every :data:`HEARTBEAT_EVERY_S`
    with this process's pid, the time and its progress counter (a context manager). A
    frozen process's file stops changing: the stall report names it.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> with Heartbeat(folder, "rank-0"):
        ...     sorted(beats(folder))
        ['rank-0']
    """

    def __init__(self, folder: str | Path, name: str, tracer: Tracer = TRACE) -> None:
        self.path = Path(folder) / f"{name}.json"
        self.name = name
        self.tracer = tracer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {name}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.path.unlink(missing_ok=True)  # a process that ended is not a frozen one

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_EVERY_S):
            try:
                self._write()
            except OSError as err:  # a full disk: the next beat tries again
                log.debug("heartbeat %s not written: %s", self.path, err)

    def _write(self) -> None:
        beat = {
            "name": self.name,
            "pid": os.getpid(),
            "time": time.time(),
            "progress": self.tracer.progress,
        }
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(beat))
        os.replace(partial, self.path)


def beats(folder: str | Path) -> dict[str, dict[str, Any]]:
    """The heartbeats in ``folder`` by name (a torn or vanished file is skipped)."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(Path(folder).glob("*.json")):
        try:
            beat = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found[str(beat.get("name", path.stem))] = beat
    return found


def frozen_heartbeats(folder: str | Path, stale_s: float = HEARTBEAT_STALE_S) -> list[str]:
    """The processes whose heartbeat is older than ``stale_s``, one line each.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "rank-1.json").write_text('{"name": "rank-1", "pid": 7, "time": 0}')
        >>> frozen_heartbeats(folder)[0].startswith("rank-1 (pid 7): no heartbeat for")
        True
    """
    now = time.time()
    return [
        f"{name} (pid {beat.get('pid')}): no heartbeat for {now - beat.get('time', 0):.0f} s "
        "(the process is frozen, stopped or gone)"
        for name, beat in beats(folder).items()
        if now - float(beat.get("time", 0)) > stale_s
    ]


class StallWatch:
    """Report and stop a run that makes no progress for ``stall_s`` seconds (a context
    manager around the run's steps; ``stall_s <= 0``: off). See the module docstring.

    ``probes`` check the parts the loop knows (engines, docker hosts, the store);
    ``details`` add sections to the report (title -> text); ``heartbeats`` is the folder
    of the ranks' and trainer processes' :class:`Heartbeat` files.
    """

    def __init__(
        self,
        stall_s: float,
        run_dir: str | Path,
        *,
        probes: Sequence[Probe] = (),
        details: Callable[[], dict[str, str]] | None = None,
        heartbeats: str | Path | None = None,
        exit_grace_s: float = 60.0,
        every_s: float = 1.0,
        tracer: Tracer = TRACE,
    ) -> None:
        self.stall_s = stall_s
        self.run_dir = Path(run_dir)
        self.probes = list(probes)
        self.details = details
        self.heartbeats = Path(heartbeats) if heartbeats is not None else None
        self.exit_grace_s = exit_grace_s
        self.every_s = every_s
        self.tracer = tracer
        self.report: Path | None = None  # written once a stall is found
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Any = None
        self._main = threading.main_thread().ident
        self._error: StallError | None = None

    @property
    def watching(self) -> bool:
        return self._thread is not None

    def __enter__(self) -> StallWatch:
        if self.stall_s <= 0:
            return self
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGUSR2, self._raise_in_main)
        self._thread = threading.Thread(target=self._watch, name="stall watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._error is not None:
            return  # after a stall the grace timer stays armed: the cleanup may hang
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._previous is not None:
            signal.signal(signal.SIGUSR2, self._previous)
            self._previous = None

    def cancel(self) -> None:
        """Stop watching, and disarm the exit timer of a stall already found."""
        self._stop.set()

    # ------------------------------------------------------------------ the watch

    def _progress(self) -> tuple[int, ...]:
        counters = [self.tracer.progress]
        if self.heartbeats is not None:
            counters += [
                int(b.get("progress", 0)) for _, b in sorted(beats(self.heartbeats).items())
            ]
        return tuple(counters)

    def _watch(self) -> None:
        seen, since = self._progress(), time.monotonic()
        while not self._stop.wait(self.every_s):
            now_seen = self._progress()
            if now_seen != seen:
                seen, since = now_seen, time.monotonic()
            elif time.monotonic() - since > self.stall_s:
                self._stalled(time.monotonic() - since)
                return

    def _stalled(self, quiet_s: float) -> None:
        unanswered = self._ask_parts()
        self.report = self._write_report(quiet_s, unanswered)
        stuck = "; ".join(unanswered) or _oldest_span(self.tracer) or "no part named itself"
        self._error = StallError(
            f"the run made no progress for {quiet_s:.0f} s (watchdog.stall_s={self.stall_s:g}): "
            f"{stuck}. The stall report, with every thread's stack, is {self.report}. "
            "resume=RUN continues the run once that part answers again"
        )
        log.error("%s", self._error)
        if self._previous is not None and self._main is not None:
            signal.pthread_kill(self._main, signal.SIGUSR2)
        if not self._stop.wait(self.exit_grace_s):
            # The run's cleanup waits on the stuck part: leave without it.
            print(
                f"vime: the run did not stop within {self.exit_grace_s:g} s of its stall "
                f"report ({self.report}); exiting with status 2",
                file=sys.stderr,
                flush=True,
            )
            os._exit(2)

    def _raise_in_main(self, signum: int, frame: object) -> None:
        if self._error is not None:
            raise self._error

    def _ask_parts(self) -> list[str]:
        unanswered: list[str] = []
        if self.heartbeats is not None:
            unanswered += frozen_heartbeats(self.heartbeats)
        for probe in self.probes:
            try:
                unanswered += probe()
            except Exception as err:  # a probe must not hide the report
                unanswered.append(f"probe {getattr(probe, '__name__', probe)} failed: {err}")
        return unanswered

    def _write_report(self, quiet_s: float, unanswered: list[str]) -> Path:
        sections = {
            "Parts that did not answer": "\n".join(unanswered) or "(every part answered)",
            "Spans in flight (oldest first)": _in_flight(self.tracer),
            "Open spans by kind (queue depths)": _depths(self.tracer),
            "Last span of each kind to end": _last_ended(self.tracer),
        }
        if self.heartbeats is not None:
            sections["Heartbeats"] = _heartbeat_lines(self.heartbeats)
        if self.details is not None:
            try:
                sections.update(self.details())
            except Exception as err:
                sections["Details"] = f"(not available: {err})"
        sections["Threads"] = _stacks()
        head = (
            f"vime stall report, {time.strftime('%Y-%m-%d %H:%M:%S')}, pid {os.getpid()}: "
            f"no progress for {quiet_s:.0f} s (watchdog.stall_s={self.stall_s:g})\n"
        )
        text = head + "".join(f"\n## {title}\n{body}\n" for title, body in sections.items())
        path = self.run_dir / f"stall-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        path.write_text(text)
        return path


def _oldest_span(tracer: Tracer) -> str:
    spans = tracer.in_flight()
    if not spans:
        return ""
    kind, name, seconds, thread = spans[0]
    return f"the oldest span in flight is {kind} {name!r}, open for {seconds:.0f} s ({thread})"


def _in_flight(tracer: Tracer, limit: int = 40) -> str:
    spans = tracer.in_flight()
    lines = [f"{s:8.1f} s  {kind} {name!r} ({thread})" for kind, name, s, thread in spans[:limit]]
    if len(spans) > limit:
        lines.append(f"... and {len(spans) - limit} more")
    return "\n".join(lines) or "(none)"


def _depths(tracer: Tracer) -> str:
    counts: dict[str, int] = {}
    for kind, *_ in tracer.in_flight():
        counts[kind] = counts.get(kind, 0) + 1
    return "\n".join(f"{kind}: {n}" for kind, n in sorted(counts.items())) or "(none)"


def _last_ended(tracer: Tracer) -> str:
    ended = sorted(tracer.last_ended().items(), key=lambda item: item[1][1])
    return (
        "\n".join(f"{kind}: {name!r}, {ago:.1f} s ago" for kind, (name, ago) in ended) or "(none)"
    )


def _heartbeat_lines(folder: Path) -> str:
    now = time.time()
    return (
        "\n".join(
            f"{name}: pid {b.get('pid')}, {now - float(b.get('time', 0)):.1f} s ago, "
            f"progress {b.get('progress')}"
            for name, b in beats(folder).items()
        )
        or "(none)"
    )


def _stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- thread {names.get(ident, ident)}\n" + "".join(traceback.format_stack(frame))
        for ident, frame in sys._current_frames().items()
    )
