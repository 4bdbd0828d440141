"""A run's metrics, written where users look: JSONL always, TensorBoard and W&B on request.

:class:`RunMetrics` is what the RL loop writes each step's row to. ``metrics.jsonl`` stays
the source of truth; TensorBoard (``metrics.tensorboard=true``, event files in
``<run>/tensorboard``) and W&B (``metrics.wandb=offline|online``, its run folder under
``<run>/wandb``) get the same numbers through their own libraries. On close the run page
is rewritten (``metrics.page``).

Example:
    >>> import tempfile
    >>> run = Path(tempfile.mkdtemp())
    >>> metrics = RunMetrics(run, MetricsConfig(page=False))
    >>> metrics.write(1, {"reward/mean": 0.5, "rollout/replayed": None})
    >>> [r["reward/mean"] for r in metrics.read()]
    [0.5]
    >>> metrics.close()
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from vime.observability.config import MetricsConfig
from vime.observability.metrics import MetricsLog

log = logging.getLogger("vime.metrics")


class RunMetrics:
    """JSONL + the configured sinks for one run folder (see the module docstring)."""

    def __init__(self, run_dir: str | Path, config: MetricsConfig, name: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.config = config
        self.jsonl = MetricsLog(self.run_dir / "metrics.jsonl")
        self._tb: Any = None
        self._wandb: Any = None
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
        if config.wandb != "false":
            self._wandb = _wandb_run(self.run_dir, config, name or self.run_dir.name)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Append ``metrics`` as step ``step`` to every sink (numbers only to TB and W&B)."""
        self.jsonl.write(step, metrics)
        numbers = {
            k: float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=step)

    def supersede(self, kept_through: int) -> int:
        """Move the JSONL rows of the steps after ``kept_through`` aside (a resumed run
        replays them): :meth:`vime.observability.metrics.MetricsLog.supersede`. TensorBoard
        and W&B keep what they were sent: they get the replayed steps again."""
        return self.jsonl.supersede(kept_through)

    def read(self) -> list[dict[str, Any]]:
        """Every step written so far (from the JSONL)."""
        return self.jsonl.read()

    def close(self) -> None:
        """Flush and close the sinks."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _wandb_run(run_dir: Path, config: MetricsConfig, name: str) -> Any:
    """A W&B run in ``<run>/wandb`` (``offline``: no network), with the run's config."""
    import os

    import wandb
    import yaml

    config_file = run_dir / "config.yaml"
    run_config = yaml.safe_load(config_file.read_text()) if config_file.exists() else {}
    os.environ.setdefault("WANDB_SILENT", "true")
    return wandb.init(
        project=config.wandb_project,
        name=name,
        dir=str(run_dir),
        mode="online" if config.wandb == "online" else "offline",
        config=run_config,
        # A resumed run (resume=RUN_DIR) logs into the same W&B run.
        id=name.replace("/", "-"),
        resume="allow",
        settings=wandb.Settings(console="off", x_disable_stats=True),
    )
