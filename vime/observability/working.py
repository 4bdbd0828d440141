"""Progress for long work that ends no span until it is done: a checkpoint save.

The stall watch (:mod:`vime.observability.stall`) counts ended spans and trainer steps as
progress. A save of a large model ends neither until it is whole, and can take longer than
``watchdog.stall_s``: without this it would be reported as a stall and stop a sound run.
:class:`Working` counts one unit of progress for every second in which the process used
CPU or the folder being written grew. A save blocked on a hung disk does neither, so it is
still a stall.

Example:
    >>> import tempfile
    >>> from vime.observability.trace import Tracer
    >>> tracer = Tracer()
    >>> with Working(tempfile.mkdtemp(), tracer=tracer, every_s=0.05):
    ...     _ = sum(i * i for i in range(3_000_000))  # CPU work: progress
    >>> tracer.progress > 0
    True
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from vime.observability.trace import TRACE, Tracer

MIN_CPU_S = 0.01
"""CPU seconds in one interval that count as work (a process blocked in a write uses none)."""


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under ``folder`` (files that vanish mid-walk are skipped)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


class Working:
    """While open, note progress on ``tracer`` each ``every_s`` in which this process used
    CPU or ``folder`` grew (a context manager)."""

    def __init__(self, folder: str | Path, tracer: Tracer = TRACE, every_s: float = 1.0) -> None:
        self.folder = Path(folder)
        self.tracer = tracer
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="working", daemon=True)

    def __enter__(self) -> Working:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        cpu, size = time.process_time(), folder_bytes(self.folder)
        while not self._stop.wait(self.every_s):
            now_cpu, now_size = time.process_time(), folder_bytes(self.folder)
            if now_cpu - cpu >= MIN_CPU_S or now_size > size:
                self.tracer.note_progress()
            cpu, size = now_cpu, now_size
