"""Reward functions named in the config: ``rollout.reward`` and ``rollout.group_reward``.

Each is an import path (``module:function`` or ``path/to/file.py:function``, loaded and
checked at start by :func:`vime.extensions.load_function`), plain or ``async def``::

    reward(task, episode) -> float              # each finished episode: replaces its reward
    group_reward(task, episodes) -> list[float] # each finished GRPO group, after reward

The :class:`~vime.agents.collector.Collector` calls them for every episode it plays, in
training (sync and async modes) and in the loop's evaluation alike. "Finished" means
``completed`` or ``truncated``: ``error`` and ``aborted`` episodes are not trained on and
are not scored. ``episode.reward`` is the env's reward when ``reward`` is called (the
per-sample reward when ``group_reward`` is); the env's own stays in
``episode.metrics["reward/env"]``. A plain function runs in a worker thread, so a slow one
(an HTTP call to a judge) does not stall the other episodes.

A function that raises, or returns anything but a finite number (one per episode, for
``group_reward``), makes its episodes ``error`` episodes with the reason, e.g.
``rollout.reward raised ZeroDivisionError: division by zero``: never a crash of the run
(more than ``rollout.max_error_frac`` of a step in error still stops it, with the reasons).

A group that an engine lost episodes of (the RL loop plays them again,
:meth:`Collector.rerun`) is scored with the episodes it has, then again once complete.

Example:
    >>> import asyncio
    >>> from vime.types import Episode
    >>> rewards = Rewards(reward=lambda task, episode: len(task["answer"]))
    >>> asyncio.run(rewards.score({"id": "t", "answer": "42"}, Episode("t", "e", [], [], []))).reward
    2.0
"""

from __future__ import annotations

import logging
import math
import numbers
import time
import traceback
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from vime.agents.episode import lost_to_engine
from vime.extensions import call, load_function
from vime.types import Episode, EpisodeStatus

logger = logging.getLogger(__name__)

REWARD = "reward(task, episode) -> float"
GROUP_REWARD = "group_reward(task, episodes) -> list[float]"
# Groups kept for a re-run of their lost episodes; a bound, for callers that never re-run.
MAX_HELD_GROUPS = 10_000

# The keys whose first raise was logged with its traceback.
_TRACED: set[str] = set()

Job = tuple[int, int, str]  # (task index, sample index, group id), as the collector's jobs


class BadReturn(Exception):
    """A reward function returned something vime cannot use (the message says what)."""


class Rewards:
    """The run's reward functions (either may be None: the env's reward stands).

    Example:
        >>> Rewards.load().reward is None
        True
    """

    def __init__(
        self,
        reward: Callable[..., Any] | None = None,
        group_reward: Callable[..., Any] | None = None,
    ) -> None:
        self.reward = reward
        self.group_reward = group_reward
        # group id → its finished episodes, while an engine-lost episode of it is replayed.
        self._held: dict[str, list[Episode]] = {}

    @classmethod
    def load(cls, reward: str = "", group_reward: str = "") -> Rewards:
        """Load ``rollout.reward`` and ``rollout.group_reward`` ("" = none); a missing
        module or function, or a wrong signature, is a ConfigError naming the key.

        Example:
            >>> Rewards.load(group_reward="json:nope")
            Traceback (most recent call last):
            ...
            vime.errors.ConfigError: rollout.group_reward: module 'json' has no 'nope'; expected group_reward(task, episodes) -> list[float]
        """
        return cls(
            _load(reward, "rollout.reward", REWARD, "episode"),
            _load(group_reward, "rollout.group_reward", GROUP_REWARD, "episodes"),
        )

    async def score(self, task: dict[str, Any], episode: Episode) -> Episode:
        """``episode`` with ``rollout.reward``'s reward (in place; the env's kept in
        ``metrics["reward/env"]``), or in error with the reason; unchanged without one.

        Example:
            >>> import asyncio
            >>> ep = Episode("t", "e", [], [], [], reward=1.0)
            >>> ep = asyncio.run(Rewards(reward=lambda task, episode: 0.5).score({"id": "t"}, ep))
            >>> ep.reward, ep.metrics["reward/env"]
            (0.5, 1.0)
        """
        if self.reward is None or not episode.status.trainable:
            return episode
        episode.metrics["reward/env"] = episode.reward
        t0 = time.perf_counter()
        try:
            episode.reward = _number(await call(self.reward, task=task, episode=episode))
        except Exception as err:
            _fail([episode], "rollout.reward", err)
        episode.timings["reward_s"] = time.perf_counter() - t0
        return episode

    async def score_group(self, task: dict[str, Any], episodes: list[Episode]) -> None:
        """Give one group's finished episodes ``rollout.group_reward``'s rewards (in place);
        each one's reward before it is kept in ``metrics["reward/sample"]``.

        ``episodes`` may be only part of the group (a re-run of what an engine lost):
        the rest is what was held of it.

        Example:
            >>> import asyncio
            >>> eps = [Episode("t", "e", [], [], [], reward=r, group_id="g", sample_index=i)
            ...        for i, r in enumerate([1.0, 3.0])]
            >>> def centred(task, episodes):
            ...     return [e.reward - 2 for e in episodes]
            >>> asyncio.run(Rewards(group_reward=centred).score_group({"id": "t"}, eps))
            >>> [e.reward for e in eps]
            [-1.0, 1.0]
        """
        if self.group_reward is None or not episodes:
            return
        group = episodes[0].group_id
        by_index = {e.sample_index: e for e in self._held.pop(group, []) + episodes}
        members = sorted(by_index.values(), key=lambda e: e.sample_index)
        if any(lost_to_engine(e) for e in members):
            self._hold(group, [e for e in members if not lost_to_engine(e)])
        finished = [e for e in members if e.status.trainable]
        if not finished:
            return
        for e in finished:  # again for a re-scored group: each time from the sample's reward
            e.reward = e.metrics.setdefault("reward/sample", e.reward)
        try:
            values = _numbers(
                await call(self.group_reward, task=task, episodes=finished), len(finished)
            )
        except Exception as err:
            _fail(finished, "rollout.group_reward", err)
            return
        for e, value in zip(finished, values, strict=True):
            e.reward = value

    def groups(self, tasks: list[dict[str, Any]], jobs: list[Job]) -> GroupGate:
        """The gate one collection's episodes pass through (see :class:`GroupGate`).

        Example:
            >>> Rewards().groups([{"id": "t"}], [(0, 0, "g")]).expected
            Counter({'g': 1})
        """
        return GroupGate(self, tasks, jobs)

    def _hold(self, group: str, episodes: list[Episode]) -> None:
        self._held[group] = episodes
        while len(self._held) > MAX_HELD_GROUPS:  # the oldest: its re-run never came
            self._held.pop(next(iter(self._held)))


class GroupGate:
    """One collection's episodes, held until their group is complete and scored by
    ``rollout.group_reward``; passed straight through without one.

    A group is complete when every job of it in this collection has ended (a re-run's
    jobs are the episodes it plays again). :meth:`rest` lets out what an abort left.

    Example:
        >>> import asyncio
        >>> gate = Rewards().groups([{"id": "t"}], [(0, 0, "g")])
        >>> ep = Episode("t", "e", [], [], [], group_id="g")
        >>> asyncio.run(gate.add(0, ep)) == [(0, ep)]
        True
    """

    def __init__(self, rewards: Rewards, tasks: list[dict[str, Any]], jobs: list[Job]) -> None:
        self.rewards = rewards
        self.tasks = tasks
        self.expected = Counter(group for _, _, group in jobs)
        self.pending: dict[str, list[tuple[int, Episode]]] = {}

    async def add(self, k: int, episode: Episode) -> list[tuple[int, Episode]]:
        """The (task index, episode) pairs that may go on now: ``episode``'s whole group
        once it is complete and scored, else none (while a group reward is set)."""
        if self.rewards.group_reward is None:
            return [(k, episode)]
        got = self.pending.setdefault(episode.group_id, [])
        got.append((k, episode))
        if len(got) < self.expected[episode.group_id]:
            return []
        del self.pending[episode.group_id]
        await self.rewards.score_group(self.tasks[k], [e for _, e in got])
        return got

    async def rest(self) -> list[tuple[int, Episode]]:
        """(After an abort.) The groups that will not complete, scored with what they have."""
        out = []
        for got in self.pending.values():
            await self.rewards.score_group(self.tasks[got[0][0]], [e for _, e in got])
            out += got
        self.pending.clear()
        return out


def _load(spec: str, key: str, signature: str, second: str) -> Callable[..., Any] | None:
    if not spec:
        return None
    return load_function(spec, key, signature=signature, params=("task", second))


def _number(value: Any) -> float:
    """``value`` as a float, or :class:`BadReturn` saying what came back."""
    if isinstance(value, numbers.Real) and math.isfinite(value):
        return float(value)
    raise BadReturn(f"returned {value!r:.80} ({type(value).__name__}); return a finite number")


def _numbers(values: Any, n: int) -> list[float]:
    """``values`` as ``n`` floats, or :class:`BadReturn` saying what came back."""
    if isinstance(values, str | bytes | Mapping) or not hasattr(values, "__len__"):
        raise BadReturn(
            f"returned {values!r:.80} ({type(values).__name__}); return a list of {n} "
            "floats, one per episode, in the order given"
        )
    if len(values) != n:
        raise BadReturn(
            f"returned {len(values)} rewards for {n} episodes; return one float per "
            "episode, in the order given"
        )
    return [_number(v) for v in values]


def _fail(episodes: list[Episode], key: str, err: Exception) -> None:
    """``episodes`` end in error: what came back, or the traceback's last line."""
    if isinstance(err, BadReturn):
        why = str(err)
    else:
        why = "raised " + traceback.format_exception_only(err)[-1].strip()
        if key not in _TRACED:  # the whole traceback once: every episode's reason has its end
            _TRACED.add(key)
            logger.warning("%s raised (task %s)", key, episodes[0].task_id, exc_info=err)
    for e in episodes:
        e.status = EpisodeStatus.ERROR
        e.reason = f"{key} {why}"
