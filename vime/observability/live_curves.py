"""The run's ``reward.png``, redrawn as the run goes, but not after every step.

A draw costs about 0.2 s of CPU (matplotlib, a 40-row curve, measured on the 2-core
development machine), and on a small machine the next step's rollout pays for it: a draw
after each of the main job's 40 steps was about 8 s of CPU. The curve is redrawn after a
step with an eval (the points a reader waits for), after the last step, and otherwise at
most every ``every_s`` seconds.

Example:
    >>> import tempfile
    >>> rows = [{"step": 1, "reward/mean": 0.2}]
    >>> curves = LiveCurves(lambda: rows, Path(tempfile.mkdtemp()) / "reward.png", "vime")
    >>> curves.step({}, last=False)  # the first step draws
    True
    >>> curves.step({}, last=False)  # then not again within every_s
    False
    >>> curves.step({"eval/reward": 0.5}, last=False), curves.step({}, last=True)
    (True, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vime.observability.metrics import plot_curves

EVERY_S = 30.0
"""The longest a live run's curve goes without a redraw (when steps keep ending)."""


class LiveCurves:
    """Redraws ``out`` from ``records()`` when :meth:`step` finds it due."""

    def __init__(
        self,
        records: Callable[[], Sequence[dict[str, Any]]],
        out: Path,
        title: str,
        every_s: float = EVERY_S,
    ) -> None:
        self.records = records
        self.out = out
        self.title = title
        self.every_s = every_s
        self._drawn_at: float | None = None

    def step(self, row: dict[str, Any], *, last: bool) -> bool:
        """After a step (its metrics ``row``): redraw if due; returns whether it drew."""
        now = time.monotonic()
        evaluated = any(k.startswith("eval/") for k in row)
        stale = self._drawn_at is None or now - self._drawn_at >= self.every_s
        if not (last or evaluated or stale):
            return False
        plot_curves(self.records(), self.out, title=self.title)
        self._drawn_at = now
        return True
