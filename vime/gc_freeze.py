"""One owner for ``gc.freeze()``: holds are counted, and only the last release thaws.

Freezing moves every object alive now out of the collector's generations, so the full
collections that a collection of thousands of in-flight episodes triggers stop re-scanning
them (torch, transformers and the trainer's model: ~400k objects). Two places want that:
the RL loop, for the whole run once its trainer is built, and each collection. With one
counter, a collection's end no longer thaws what the loop froze for the run.

Example:
    >>> with held():
    ...     with held():
    ...         pass
    ...     holds()
    1
    >>> holds()
    0
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holds = 0


def hold() -> None:
    """Freeze every object alive now (again, if already held: newer ones too)."""
    global _holds
    with _lock:
        gc.freeze()
        _holds += 1


def release() -> None:
    """End one hold; the last one thaws (nothing stays pinned after a run: frozen
    objects would be reported leaked at exit). A release without a hold does nothing."""
    global _holds
    with _lock:
        if _holds == 0:
            return
        _holds -= 1
        if _holds == 0:
            gc.unfreeze()


def holds() -> int:
    """How many holds are open."""
    return _holds


@contextlib.contextmanager
def held() -> Iterator[None]:
    """:func:`hold` for the block."""
    hold()
    try:
        yield
    finally:
        release()
