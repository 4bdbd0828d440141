"""One folder per run: config, metrics, buffer, checkpoints, weight exports, logs.

```
runs/20261130-061500-math/
  config.yaml        the resolved config this run used
  metrics.jsonl      one line per step (MetricsLog)
  reward.png         reward curve, redrawn every step
  buffer/            DataBuffer: every episode, by step
  checkpoints/step_000010/   trainer checkpoint + state.json (step, data position, version)
  weights/           latest HF export that the engines loaded
  logs/              engine logs
```

Example:
    >>> import tempfile
    >>> run = RunDir.create(tempfile.mkdtemp(), name="demo")
    >>> run.latest_checkpoint() is None
    True
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError


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
        root = Path(path)
        if not (root / "config.yaml").exists():
            raise ConfigError(
                f"resume: {root} is not a vime run folder (no config.yaml); pass the folder "
                "printed at the start of the run, e.g. resume=runs/20261130-061500-math",
                key="resume",
            )
        return cls(root)

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
        """The newest checkpoint whose state.json was written (i.e. that completed)."""
        if not self.checkpoints.exists():
            return None
        done = sorted(p for p in self.checkpoints.glob("step_*") if (p / "state.json").exists())
        return done[-1] if done else None


def write_state(checkpoint: Path, state: dict[str, Any]) -> None:
    """Write ``state.json`` atomically: its presence marks the checkpoint as complete."""
    tmp = checkpoint / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    os.replace(tmp, checkpoint / "state.json")


def read_state(checkpoint: Path) -> dict[str, Any]:
    """The state saved with a checkpoint (step, data position, weight version, ...)."""
    return json.loads((checkpoint / "state.json").read_text())
