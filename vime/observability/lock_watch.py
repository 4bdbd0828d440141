"""A watch for a frozen process: a call that holds Python's interpreter lock (GIL) too long.

A C call that never releases the GIL (``Fraction(10**66040181676)``, a regex that
backtracks for hours) stops every thread of the process, so no Python watchdog, timeout
or log line can run: the run just goes silent. :class:`LockWatch` arms faulthandler's
C-level timer (``faulthandler.dump_traceback_later``), which fires from a thread of its
own without the GIL, and re-arms it from a Python thread every :data:`PERIOD_S`. While
Python threads get to run the timer never fires; a call that holds the GIL for
``timeout_s`` gets every thread's stack printed to stderr (``Timeout (0:02:00)!``, then
``File ... in <the function>``). Once the GIL comes back, the re-arming thread sees how
long it waited and logs a warning that names the time and says what to do.

faulthandler has one such timer per process, so one watch owns it at a time: a watch
entered while another is active shares that one (and its timeout) and does nothing on
exit. A watch cancels the timer on exit, and for the moment of an ``os.fork()`` (a child
inherits an armed timer without its thread and hangs when it exits). A timer that other
code arms while a watch is active (pytest's ``faulthandler_timeout``) is replaced by it.

Example:
    >>> with LockWatch(LOCK_WATCH_S) as watch:
    ...     watch.watching
    True
    >>> with LockWatch(0) as off:  # 0 (trace.lock_watch_s=0) turns it off
    ...     off.watching
    False
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from types import TracebackType
from typing import IO, Any

log = logging.getLogger(__name__)

LOCK_WATCH_S = 120.0
"""How long one call may hold the GIL before every thread's stack is printed (the default
of ``trace.lock_watch_s``): long enough that no sound call of a run comes near it."""

PERIOD_S = 0.5
"""How often the watch's thread re-arms the timer (and so notices a held GIL)."""

_ARMING = threading.Lock()  # who owns the timer; held across os.fork() (see _before_fork)
_active: LockWatch | None = None


class LockWatch:
    """Print every thread's stack when one call holds the GIL for ``timeout_s`` seconds
    (a context manager; ``timeout_s <= 0``: off). See the module docstring.

    Example:
        >>> with LockWatch(60.0) as outer, LockWatch(5.0) as inner:
        ...     outer.watching, inner.watching  # one timer per process: inner shares it
        (True, False)
    """

    def __init__(self, timeout_s: float, period_s: float = PERIOD_S) -> None:
        self.timeout_s = min(float(timeout_s), threading.TIMEOUT_MAX)  # inf: the C timer's max
        self.period_s = period_s
        self.watching = False  # this watch owns faulthandler's timer
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._file: IO[Any] = sys.stderr
        self._armed_at = 0.0

    def __enter__(self) -> LockWatch:
        global _active
        if self.timeout_s <= 0:
            return self
        with _ARMING:
            if _active is not None:
                return self  # the active watch keeps watching (one timer per process)
            file = _stderr()
            if file is None:
                log.warning("no stderr with a file descriptor: the interpreter lock watch is off")
                return self
            _active, self.watching, self._file = self, True, file
            self._arm()
        self._stop.clear()
        self._thread = threading.Thread(target=self._rearm, name="vime-lock-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _active
        if not self.watching:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # before the cancel: it must not re-arm after it
        with _ARMING:
            faulthandler.cancel_dump_traceback_later()
            _active, self.watching = None, False

    def _arm(self) -> None:
        """(Re)start the timer: ``timeout_s`` from now. Called holding ``_ARMING``."""
        self._armed_at = time.monotonic()
        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self._file)

    def _rearm(self) -> None:
        """Re-arm every ``period_s`` until exit; warn when a wake-up came ``timeout_s`` late."""
        stopped = False
        while not stopped:
            stopped = self._stop.wait(self.period_s)
            with _ARMING:
                held = time.monotonic() - self._armed_at
                if not stopped:
                    self._arm()
            if held >= self.timeout_s:  # (on exit too: the hold may have been the last call)
                log.warning(
                    "no thread of this process ran Python for %.0f s: one call held the "
                    "interpreter lock (GIL) that long (or the process was stopped). "
                    "faulthandler's 'Timeout' dump above shows every thread's stack at %.0f s; "
                    "the call is on top of one of them. Bound that work (in env code: how "
                    "large a number or text it parses) or run it in a subprocess or sandbox. "
                    "trace.lock_watch_s sets this watch in training (0: off)",
                    held,
                    self.timeout_s,
                )


def _stderr() -> IO[Any] | None:
    """``sys.stderr``, or the process's own where that has no file descriptor (pytest's
    ``--capture=sys``, some notebooks): faulthandler writes to a descriptor."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return None


def _before_fork() -> None:
    # A child inherits an armed timer without its watchdog thread: cancelling or re-arming
    # it there (at interpreter exit too) waits for that thread forever. Fork unarmed.
    _ARMING.acquire()
    if _active is not None:
        faulthandler.cancel_dump_traceback_later()


def _after_fork_in_parent() -> None:
    if _active is not None:
        _active._arm()
    _ARMING.release()


def _after_fork_in_child() -> None:
    global _active
    if _active is not None:  # its thread did not come along: the child runs unwatched
        _active.watching, _active = False, None
    _ARMING.release()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
