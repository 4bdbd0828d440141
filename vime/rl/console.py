"""Live console view of a training run: one line per step, with a running summary.

Example (the console writes to stderr, which a doctest does not compare):
    >>> c = StepConsole(total=2, run_dir="runs/x")
    >>> c.step(1, {"reward/mean": 0.5, "rollout/sampled_tokens": 800.0, "time/rollout_s": 2.0})
    >>> c.done()
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from rich.console import Console


class StepConsole:
    """Prints step, reward, eval, tokens/s and the rollout/train/sync time split."""

    def __init__(self, total: int, run_dir: str | Path) -> None:
        self.total = total
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.first_reward: float | None = None
        self.console.print(f"[bold]vime[/] run folder: {run_dir}")
        self.header_shown = False

    def step(self, step: int, row: dict[str, Any]) -> None:
        if not self.header_shown:  # after the warm start and engine start-up logs
            self.console.print(
                "[dim]step       reward  (Δ start)    eval    tok/s   rollout  train   sync  |lp diff|  version[/]"
            )
            self.header_shown = True
        reward = row.get("reward/mean", float("nan"))
        if self.first_reward is None:
            self.first_reward = reward
        delta = reward - self.first_reward
        rollout_s = row.get("time/rollout_s", 0.0)
        tokens = row.get("rollout/sampled_tokens", 0.0)
        # The collection's own wall time: in async mode it overlapped the last train step,
        # and the step's rollout time is only the wait for it.
        collect_s = row.get("rollout/collect_s") or rollout_s
        tps = tokens / collect_s if collect_s > 0 else 0.0
        eval_reward = row.get("eval/reward")
        eval_text = f"{eval_reward:6.3f}" if eval_reward is not None else "     -"
        diff = row.get("train/train_rollout_logprob_abs_diff")
        diff_text = f"{diff:9.2e}" if diff is not None else "        -"
        self.console.print(
            f"{step:>4}/{self.total:<4} {reward:6.3f}  ({delta:+.3f})  {eval_text}  {tps:7.0f}  "
            f"{rollout_s:6.2f}s  {row.get('time/train_s', 0.0):5.2f}s  "
            f"{row.get('time/sync_s', 0.0):5.2f}s  {diff_text}  v{row.get('weight_version', '?')}"
        )

    def baseline(self, row: dict[str, Any]) -> None:
        self.console.print(
            f"step 0: eval reward {row.get('eval/reward', float('nan')):.3f} (before training)"
        )

    def done(self) -> None:
        self.console.print("[bold green]done[/]")


def quiet_library_warnings() -> None:
    """Hide import-time warnings about optional CUDA extensions (Apex, Transformer Engine)
    and deprecations inside Megatron that a user cannot act on; vime's own output stays.

    Example:
        >>> quiet_library_warnings()
    """
    for category in (UserWarning, DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"megatron\.")
        warnings.filterwarnings("ignore", category=category, module=r"torch\.distributed\.")
