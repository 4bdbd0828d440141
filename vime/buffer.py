"""DataBuffer: the run's append-only, crash-safe, on-disk episode store, batched by step.

Format: one JSON Lines file per step, ``<run>/buffer/step_00000012.jsonl``. Each
:meth:`DataBuffer.append` writes one line per episode (``{"uid", "episode"}``) followed
by one commit line (``{"commit": n, "uids": [...]}``), then flushes and ``fsync`` s the file
once (group commit: one fsync per batch, not per episode). ``append`` returns only after
that, so an acknowledged batch is on disk.

Why this format:

- JSON round-trips what training needs exactly: token ids, and float log-probs (Python
  writes the shortest repr that reads back to the same float64).
- Appending a few lines is the cheapest durable write there is; Parquet cannot be
  appended to in place (a file is only readable once its footer is written), so a
  crash-safe Parquet store would be many tiny files plus a manifest.
- Recovery is simple and local: lines after the last commit line are a batch that was
  never acknowledged (the process died inside ``append``); opening the buffer cuts the
  file back to its last commit, which also removes a torn (half-written) last line. An
  ``append`` that fails (a full disk: :class:`~vime.errors.DiskFullError`) cuts its own
  partial lines before it raises, so the next one starts on a clean line.
- Readers (``read_step``, ``replay``, a notebook, ``grep``) need nothing but the file;
  per-step files make reading one batch O(batch) and old steps easy to delete or archive.

De-duplication: every episode has a ``uid``; an ``append`` of a uid already committed
(anywhere in the buffer) is skipped, so re-sending a batch after a restart is harmless.
The uid index is built from commit lines only (episode lines are not parsed on open).

One writer at a time: the buffer takes an exclusive ``flock`` on ``<run>/buffer/LOCK``.

Example:
    >>> import tempfile
    >>> run = tempfile.TemporaryDirectory()
    >>> episodes = [Episode(f"t{i}", "vime/Math-v0", [1, 2], [0, 1], [0.0, -0.5]) for i in range(3)]
    >>> with DataBuffer(run.name) as buf:
    ...     buf.append(episodes, step=0)
    ...     buf.append(episodes, step=0)  # re-sent after a restart: nothing new
    3
    0
    >>> [ep.uid for ep in buf.read_step(0)] == [ep.uid for ep in episodes]
    True
    >>> run.cleanup()
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from vime.errors import DataError, DiskFullError, is_disk_full
from vime.types import Episode

_STEP_FILE = re.compile(r"^step_(\d{8})\.jsonl$")


class DataBuffer:
    """Append-only episode store in ``<run_dir>/buffer`` (see the module docstring).

    Args:
        run_dir: the run folder; the buffer lives in its ``buffer/`` subfolder.
        readonly: open for reading only (no lock, no repair of torn files).

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
        ...     for step in range(3):
        ...         _ = buf.append([Episode("t", "e", [1], [0], [0.0])], step=step)
        ...     buf.steps()
        [0, 1, 2]
    """

    def __init__(self, run_dir: str | os.PathLike[str], *, readonly: bool = False) -> None:
        self.dir = Path(run_dir) / "buffer"
        self.readonly = readonly
        self._lock_fd: int | None = None
        self._uids: set[str] = set()
        self._counts: dict[int, int] = {}
        if readonly:
            if not self.dir.is_dir():
                raise DataError(f"DataBuffer: {self.dir} does not exist (wrong run folder?)")
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._lock()
        for step in self._scan_steps():
            self._counts[step] = 0
            for uids in self._commits(step, repair=not readonly):
                self._counts[step] += len(uids)
                self._uids.update(uids)

    # ------------------------------------------------------------------ writing

    def append(self, episodes: Iterable[Episode], step: int) -> int:
        """Durably append ``episodes`` to ``step``'s batch; return how many were new.

        Episodes whose uid is already in the buffer are skipped. When this returns, the
        batch is committed and fsync'd.

        Example:
            >>> import tempfile
            >>> ep1, ep2 = Episode("t1", "e", [1], [0], [0.0]), Episode("t2", "e", [1], [0], [0.0])
            >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
            ...     buf.append([ep1, ep2], step=3)
            ...     buf.append([ep1], step=4)  # already in the buffer (at step 3)
            2
            0
        """
        if self.readonly:
            raise DataError("DataBuffer: opened readonly; open it without readonly=True to append")
        if not isinstance(step, int) or step < 0:
            raise DataError(f"DataBuffer.append: step must be an int >= 0, got {step!r}")
        lines: list[str] = []
        uids: list[str] = []
        for ep in episodes:
            if ep.uid in self._uids or ep.uid in uids:
                continue
            uids.append(ep.uid)
            lines.append(json.dumps({"uid": ep.uid, "episode": ep.to_dict()}))
        if not uids:
            return 0
        lines.append(json.dumps({"commit": len(uids), "uids": uids}))
        data = ("\n".join(lines) + "\n").encode()
        path = self._path(step)
        is_new = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        committed = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
            if is_new:
                fsync_dir(self.dir)  # the new file's name must survive a crash too
        except OSError as err:
            # Not acknowledged: cut the partial lines now (it also gives the space back),
            # or the next append would glue its first line onto a torn one.
            os.ftruncate(fd, committed)
            if is_disk_full(err):
                raise DiskFullError(path, f"buffer append (step {step})") from err
            raise
        finally:
            os.close(fd)
        self._uids.update(uids)
        self._counts[step] = self._counts.get(step, 0) + len(uids)
        return len(uids)

    # ------------------------------------------------------------------ reading

    def steps(self) -> list[int]:
        """The steps that hold at least one committed episode, in order.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
            ...     _ = buf.append([Episode("t", "e", [1], [0], [0.0])], step=1)
            ...     _ = buf.append([], step=2)  # an empty batch: no step
            ...     buf.steps()
            [1]
        """
        return sorted(s for s, n in self._counts.items() if n > 0)

    def count(self, step: int | None = None) -> int:
        """Committed episodes in ``step`` (or in the whole buffer).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
            ...     _ = buf.append([Episode(f"t{i}", "e", [1], [0], [0.0]) for i in range(4)], step=0)
            ...     _ = buf.append([Episode("t", "e", [1], [0], [0.0])], step=1)
            ...     buf.count(0), buf.count()
            (4, 5)
        """
        return sum(self._counts.values()) if step is None else self._counts.get(step, 0)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids

    def __len__(self) -> int:
        return self.count()

    def read_step(self, step: int) -> list[Episode]:
        """Every committed episode of ``step``, in the order they were appended.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
            ...     _ = buf.append([Episode("t1", "e", [1], [0], [0.0], status="truncated")], step=0)
            ...     [(ep.task_id, str(ep.status)) for ep in buf.read_step(0)], buf.read_step(1)
            ([('t1', 'truncated')], [])
        """
        return list(self._iter_step(step))

    def replay(self, step: int) -> list[Episode]:
        """The exact batch of ``step`` as it was collected (same episodes, same order).

        Raises :class:`~vime.errors.DataError` when the step holds no episodes.

        Example:
            >>> import tempfile
            >>> run = tempfile.TemporaryDirectory()
            >>> buf = DataBuffer(run.name)
            >>> _ = buf.append([Episode("t1", "e", [1], [0], [0.0])], step=5)
            >>> [ep.task_id for ep in buf.replay(5)]
            ['t1']
            >>> buf.replay(6)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            vime.errors.DataError: DataBuffer.replay: step 6 has no committed episodes in ... (steps present: [5])
            >>> buf.close()
            >>> run.cleanup()
        """
        batch = self.read_step(step)
        if not batch:
            raise DataError(
                f"DataBuffer.replay: step {step} has no committed episodes in {self.dir} "
                f"(steps present: {self.steps()})"
            )
        return batch

    def iter_episodes(self) -> Iterator[Episode]:
        """All committed episodes, step by step.

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as run, DataBuffer(run) as buf:
            ...     _ = buf.append([Episode("t1", "e", [1], [0], [0.0])], step=0)
            ...     _ = buf.append([Episode("t2", "e", [1], [0], [0.0])], step=2)
            ...     [ep.task_id for ep in buf.iter_episodes()], len(buf)
            (['t1', 't2'], 2)
        """
        for step in self.steps():
            yield from self._iter_step(step)

    def close(self) -> None:
        """Release the writer lock (the buffer can then be opened by another process)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> DataBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}.jsonl"

    def _lock(self) -> None:
        fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataError(
                f"DataBuffer: {self.dir} is open for writing by another process; close it "
                "there first, or open this one with readonly=True"
            ) from None
        self._lock_fd = fd

    def _scan_steps(self) -> list[int]:
        return sorted(
            int(m.group(1)) for p in self.dir.iterdir() if (m := _STEP_FILE.match(p.name))
        )

    def _commits(self, step: int, repair: bool) -> list[list[str]]:
        """The uid lists of ``step``'s commit lines; with ``repair``, cut uncommitted tails."""
        path = self._path(step)
        commits: list[list[str]] = []
        end = 0  # byte offset just after the last commit line
        with open(path, "rb") as f:
            offset = 0
            for line in f:
                offset += len(line)
                if line.startswith(b'{"commit"') and line.endswith(b"\n"):
                    record = json.loads(line)
                    commits.append([str(u) for u in record["uids"]])
                    end = offset
        if repair and end < path.stat().st_size:
            # A batch whose append never returned (killed mid-write): not acknowledged, drop it.
            with open(path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
        return commits

    def _iter_step(self, step: int) -> Iterator[Episode]:
        path = self._path(step)
        if not path.exists():
            return
        pending: list[dict[str, Any]] = []
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.endswith(b"\n"):
                    break  # torn tail (a reader racing a crashed writer): never committed
                if line.startswith(b'{"commit"'):
                    for record in pending:
                        yield Episode.from_dict(record["episode"])
                    pending = []
                    continue
                try:
                    pending.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(
                        f"DataBuffer: {path}:{lineno} is not valid JSON ({err.msg}); the file "
                        "was edited or corrupted outside vime"
                    ) from err


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that the names created or renamed in it survive a crash.

    Example:
        >>> import tempfile
        >>> fsync_dir(Path(tempfile.gettempdir()))
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
