"""One folder per run: config, metrics, buffer, checkpoints, weight exports, logs.

```
runs/20261130-061500-math/
  config.yaml        the resolved config this run used
  metrics.jsonl      one line per step (MetricsLog)
  metrics.superseded.jsonl   rows of steps a resumed run trained again (MetricsLog.supersede)
  reward.png         reward curve, redrawn as the run goes (at evals, every 30 s, at the end)
  buffer/            DataBuffer: every episode, by step
  checkpoints/step_000010/   trainer checkpoint + state.json (step, data position, version)
  weights/           latest HF export that the engines loaded
  logs/              engine logs
```

Every file here is written so that a kill or a full disk never leaves a torn one where a
reader looks: whole files and folders are written under a temporary name, fsync'd, then
renamed (:func:`atomic_write_text`, :func:`publish`); the append-only files (buffer,
metrics) cut an unacknowledged tail.

Example:
    >>> import tempfile
    >>> run = RunDir.create(tempfile.mkdtemp(), name="demo")
    >>> run.latest_checkpoint() is None
    True
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.buffer import fsync_dir
from vime.errors import ConfigError


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is a vime run folder: it holds the run's ``config.yaml``.

    Example:
        >>> is_run_folder("/nonexistent")
        False
    """
    return (Path(path) / "config.yaml").exists()


def run_folder(path: str | Path, key: str = "RUN") -> Path:
    """``path`` as a run folder; a :class:`ConfigError` naming ``key`` otherwise.

    Example:
        >>> run_folder("/nonexistent", key="resume")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: resume: /nonexistent is not a vime run folder (no config.yaml); ...
    """
    if not is_run_folder(path):
        raise ConfigError(
            f"{key}: {path} is not a vime run folder (no config.yaml); pass the folder "
            "`vime-agent train` printed, e.g. runs/20261130-061500-math",
            key=key,
        )
    return Path(path)


@dataclass
class RunDir:
    """Paths inside one run folder."""

    root: Path

    @classmethod
    def create(cls, parent: str | Path, name: str) -> RunDir:
        """A new run folder ``parent/<timestamp>-<name>``."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        root = Path(parent) / f"{stamp}-{name}"
        suffix = 1
        while root.exists():
            suffix += 1
            root = Path(parent) / f"{stamp}-{name}-{suffix}"
        root.mkdir(parents=True)
        return cls(root)

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run folder (for ``resume=``); fails clearly if it is not one."""
        return cls(run_folder(path, key="resume"))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def plot(self) -> Path:
        return self.root / "reward.png"

    @property
    def buffer(self) -> Path:
        return self.root / "buffer"

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    @property
    def logs(self) -> Path:
        path = self.root / "logs"
        path.mkdir(exist_ok=True)
        return path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step_{step:06d}"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint: a ``step_NNNNNN`` folder (a checkpoint is
        written as ``step_NNNNNN.partial`` and renamed once complete) with its state.json."""
        if not self.checkpoints.exists():
            return None
        done = sorted(
            p
            for p in self.checkpoints.iterdir()
            if _CHECKPOINT.match(p.name) and (p / "state.json").exists()
        )
        return done[-1] if done else None

    def drop_partial(self) -> list[Path]:
        """Delete what a killed run left half-written (``*.partial`` checkpoints and weight
        exports); returns what was deleted. Called on resume: it frees their disk space."""
        found = [*self.checkpoints.glob("*.partial"), *self.weights.glob("*.partial")]
        for path in found:
            shutil.rmtree(path, ignore_errors=True)
        return found


_CHECKPOINT = re.compile(r"^step_\d{6}$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: a temporary file, fsync'd, renamed over it.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "config.yaml"
        >>> atomic_write_text(path, "steps: 3\\n")
        >>> path.read_text(), [p.name for p in path.parent.iterdir()]
        ('steps: 3\\n', ['config.yaml'])
    """
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def publish(partial: Path, final: Path) -> Path:
    """Make the folder ``partial`` durable (every file and folder fsync'd), then rename it
    to ``final`` (replacing an older ``final``): a reader sees all of it or none.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "v1.partial").mkdir()
        >>> (root / "v1.partial" / "w.bin").write_bytes(b"x")
        1
        >>> publish(root / "v1.partial", root / "v1").name, sorted(p.name for p in root.iterdir())
        ('v1', ['v1'])
    """
    for folder, _, files in os.walk(partial):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
    if final.exists():  # the same step saved again (e.g. after a resume): the new one wins
        shutil.rmtree(final)
    os.replace(partial, final)
    fsync_dir(final.parent)
    return final


def write_state(checkpoint: Path, state: dict[str, Any]) -> None:
    """Write ``state.json`` atomically: its presence marks the checkpoint as complete."""
    atomic_write_text(checkpoint / "state.json", json.dumps(state, indent=1))


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The state saved with a checkpoint (step, data position, weight version, ...)."""
    return json.loads((checkpoint / "state.json").read_text())


def pause_point(name: str, step: int) -> None:
    """Test hook (fault tests only): sleep at a named point of a run so that a test can
    SIGKILL the process, or its engine, exactly there.

    ``VIME_TEST_PAUSE_AT=NAME[:STEP]`` names the point (``train``: the step is buffered,
    not trained; ``sync``: the new weights are exported, not yet loaded; ``checkpoint``:
    the trainer state is written, the checkpoint not yet complete) and optionally the
    step. There the run prints ``vime-test: paused at NAME step N`` and sleeps
    ``VIME_TEST_PAUSE_S`` seconds (default 3600), then goes on. Without the variable it
    does nothing.

    Example:
        >>> pause_point("sync", 3)  # VIME_TEST_PAUSE_AT unset: returns at once
    """
    wanted = os.environ.get("VIME_TEST_PAUSE_AT", "")
    at, _, at_step = wanted.partition(":")
    if not wanted or at != name or (at_step and int(at_step) != step):
        return
    print(f"vime-test: paused at {name} step {step}", file=sys.stderr, flush=True)
    time.sleep(float(os.environ.get("VIME_TEST_PAUSE_S", "3600")))
