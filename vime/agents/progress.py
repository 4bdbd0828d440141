"""A live progress line for episode collection: episodes, sampled tokens/s, mean reward.

Built on ``rich``; refreshed twice a second from rich's own thread, so the per-episode
cost on the event loop is a few additions. Disabled, it is a no-op with the same API.

Example:
    >>> with CollectProgress(total=4, enabled=False) as bar:
    ...     bar.update(Episode(task_id="t", env_id="e", tokens=[1, 2], loss_mask=[0, 1],
    ...                        rollout_logprobs=[0.0, -0.1], reward=1.0))
    >>> bar.mean_reward
    1.0
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from vime.types import Episode, EpisodeStatus


class CollectProgress:
    """Counts finished episodes and shows them as a rich progress bar.

    Attributes:
        done, sampled_tokens, failed: running totals.

    Example:
        >>> bar = CollectProgress(total=None, enabled=False)
        >>> bar.tokens_per_s >= 0
        True
    """

    def __init__(self, total: int | None, *, enabled: bool = True, description: str = "rollout"):
        self.total = total
        self.enabled = enabled
        self.description = description
        self.done = 0
        self.failed = 0
        self.sampled_tokens = 0
        self.reward_sum = 0.0
        self.start = time.perf_counter()
        self._progress: Any = None
        self._task: Any = None

    @property
    def mean_reward(self) -> float:
        ok = self.done - self.failed
        return self.reward_sum / ok if ok else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / max(time.perf_counter() - self.start, 1e-9)

    def __enter__(self) -> CollectProgress:
        self.start = time.perf_counter()
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("episodes"),
                TextColumn("{task.fields[tps]:>8.0f} tok/s"),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TextColumn("failed {task.fields[failed]}"),
                TimeElapsedColumn(),
                refresh_per_second=2,
            )
            self._progress.start()
            self._task = self._progress.add_task(
                self.description, total=self.total, tps=0.0, reward=0.0, failed=0
            )
        return self

    def update(self, episode: Episode) -> None:
        """Count one finished episode.

        Example:
            >>> bar = CollectProgress(total=2, enabled=False)
            >>> bar.update(Episode("t", "e", [1, 2], [0, 1], [0.0, -0.1], reward=1.0))
            >>> bar.update(Episode("t", "e", [1], [0], [0.0], status="error"))
            >>> bar.done, bar.failed, bar.sampled_tokens, bar.mean_reward
            (2, 1, 1, 1.0)
        """
        self.done += 1
        self.sampled_tokens += episode.num_sampled_tokens
        if episode.status in (EpisodeStatus.ERROR, EpisodeStatus.ABORTED):
            self.failed += 1
        else:
            self.reward_sum += episode.reward
        if self._progress is not None:
            self._progress.update(
                self._task,
                completed=self.done,
                tps=self.tokens_per_s,
                reward=self.mean_reward,
                failed=self.failed,
            )

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
