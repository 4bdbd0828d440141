"""Metrics: one JSON line per step in the run folder, plus a reward-curve PNG.

JSONL is the source of truth (append-only, greppable, survives a kill); plots and the
live console view are derived from it.

Example:
    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> log = MetricsLog(d / "metrics.jsonl")
    >>> log.write(step=1, metrics={"reward/mean": 0.5})
    >>> [r["reward/mean"] for r in log.read()]
    [0.5]
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vime.errors import DiskFullError, is_disk_full


class MetricsLog:
    """Append-only JSONL metrics file: ``{"step": n, "time": t, **metrics}`` per line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():  # a run killed mid-line: cut the torn line, or the next
            with self.path.open("rb+") as f:  # record would be glued onto it and lost
                text = f.read()
                f.truncate(text.rfind(b"\n") + 1)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Append one record and flush it to disk (a killed run keeps every written step).
        A write that fails (a full disk) cuts its partial line before raising."""
        line = (
            json.dumps({"step": step, "time": time.time(), **_jsonable(metrics)}) + "\n"
        ).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        end = os.fstat(fd).st_size
        try:
            while line:
                line = line[os.write(fd, line) :]
            os.fsync(fd)
        except OSError as err:
            os.ftruncate(fd, end)
            if is_disk_full(err):
                raise DiskFullError(self.path, f"metrics of step {step}") from err
            raise
        finally:
            os.close(fd)

    def supersede(self, kept_through: int) -> int:
        """Move the rows of steps after ``kept_through`` to ``metrics.superseded.jsonl``
        beside this file; returns how many moved.

        A resumed run trains again the steps after its checkpoint (replayed from the
        buffer), so their first rows would otherwise stand twice: this file keeps one row
        per step, the superseded file keeps the replaced ones, each with
        ``superseded_by_resume_from`` (the checkpoint step). ``-1`` moves every row (a run
        resumed before its first checkpoint also redoes its step-0 eval). The superseded
        rows are appended (and fsync'd) before this file is replaced whole, so a kill in
        between loses nothing; a row moved twice that way is written once.

        Example:
            >>> import tempfile
            >>> log = MetricsLog(Path(tempfile.mkdtemp()) / "metrics.jsonl")
            >>> for step in (1, 2, 3):
            ...     log.write(step, {"reward/mean": step / 10})
            >>> log.supersede(kept_through=1)
            2
            >>> [r["step"] for r in log.read()], [r["step"] for r in log.superseded()]
            ([1], [2, 3])
        """
        rows = self.read()
        kept = [r for r in rows if r.get("step", 0) <= kept_through]
        moved = [r for r in rows if r.get("step", 0) > kept_through]
        if not moved:
            return 0
        seen = {(r.get("step"), r.get("time")) for r in self.superseded()}
        fresh = [
            {**r, "superseded_by_resume_from": max(kept_through, 0)}
            for r in moved
            if (r.get("step"), r.get("time")) not in seen
        ]
        _append_synced(self.superseded_path, "".join(json.dumps(r) + "\n" for r in fresh))
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text("".join(json.dumps(r) + "\n" for r in kept))
        with partial.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, self.path)
        return len(moved)

    @property
    def superseded_path(self) -> Path:
        """Where :meth:`supersede` keeps the rows that resumed runs replaced."""
        return self.path.with_name(self.path.stem + ".superseded.jsonl")

    def superseded(self) -> list[dict[str, Any]]:
        """The rows that resumed runs replaced, oldest first (see :meth:`supersede`)."""
        return MetricsLog._records(self.superseded_path)

    def read(self) -> list[dict[str, Any]]:
        """All complete records; a torn last line (killed mid-write) is ignored."""
        return MetricsLog._records(self.path)

    @staticmethod
    def _records(path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records


def _append_synced(path: Path, text: str) -> None:
    """Append ``text`` to ``path`` and fsync it, after cutting a torn last line (a kill
    mid-append) that the text would otherwise be glued onto."""
    MetricsLog(path)  # (its constructor cuts the torn tail)
    with path.open("a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _jsonable(metrics: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            v = None
        out[k] = v
    return out


def plot_curves(
    records: Sequence[dict[str, Any]],
    out: str | Path,
    keys: Iterable[str] = ("reward/mean", "eval/reward"),
    title: str = "vime training",
    columns: int = 1,
) -> Path | None:
    """Save a PNG with one panel per metric key that appears in ``records``.

    Panels fill ``columns`` columns (the run page draws many small ones). Returns the
    path, or None when none of the keys has data yet.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     plot_curves([{"step": 1, "reward/mean": 0.1}], Path(tmp) / "curve.png").name
        ...     plot_curves([{"step": 1, "loss": 2.0}], Path(tmp) / "none.png")  # no key: None
        'curve.png'
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(r.get(k) is not None for r in records)]
    if not present:
        return None
    cols = max(1, min(columns, len(present)))
    rows = -(-len(present) // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(7 if cols == 1 else 3.6 * cols, 2.6 * rows), squeeze=False
    )
    for ax in axes.flat[len(present) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, present, strict=False):
        pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, marker="o", markersize=3, alpha=0.5 if len(pts) > 10 else 1.0)
        if len(pts) > 10:  # per-step values are noisy: draw the trend over 5 steps on top
            w = 5
            trend = [
                sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1])
                for i in range(len(ys))
            ]
            ax.plot(xs, trend, linewidth=2, label=f"mean of last {w}")
            ax.legend(loc="lower right")
        if cols == 1:
            ax.set_ylabel(key)
        else:
            ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)  # a reader never sees a half-written PNG
    return out
