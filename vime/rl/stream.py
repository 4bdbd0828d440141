"""Continuous rollouts for ``rollout.mode=async``: groups are played without pause while
the trainer trains, and a step takes its batch as soon as enough groups have finished.

A *group* is one task played ``collector.n_samples`` times (a GRPO group). The stream
keeps groups in flight on the rollout event loop; each finished group waits in
``ready`` until a step takes it, in whatever order the groups finished.

**Staleness bound.** A group is admitted (its task lent from the
:class:`~vime.envs.TaskSource`) only while

    in_flight + ready_with_signal < (v + 1 + max_staleness − steps_taken) · batch_size

where ``v`` is the weight version the engines serve and ``steps_taken`` the steps that
took their batch. With ``max_staleness = 0`` nothing is collected while a step trains
(the sync loop); with 1, the next step's groups are played during training under the
previous weights. Also ``in_flight · n_samples ≤ collector.concurrency`` (at least one
group), and nothing is admitted for steps past ``steps``.

**Taking a batch.** :meth:`RolloutStream.take` waits until ``batch_size`` finished groups
carry signal (not filtered by ``rollout.filter_groups``) or ``batch_size · oversample ·
(1 + refill_retries)`` groups have finished, and until no group admitted at version
``v − max_staleness`` or older is still in flight (any later step would find it stale; the
admission bound leaves at most ``batch_size`` of them). It then takes the oldest groups
with signal (at most ``batch_size``) plus every finished group without it (they are the
step's record of what was drawn: buffered, counted in ``rollout/tasks_drawn``). Filtered
groups do not count against the bound, so the stream refills them by itself (dynamic
sampling).

**Nothing lost.** Tasks stay *lent* until their step is buffered (:meth:`TaskSource.settle`
is called by the runner); a checkpoint saves the lent ones, so groups in flight when a run
is killed are played again after ``resume``.

Example (skipped as a doctest: it needs a collector on a running engine):
    >>> stream = RolloutStream(cfg.rollout, cfg.steps, collector, tasks, factory,  # doctest: +SKIP
    ...                        version=lambda: sync.version, first_step=1, signal=trainable)
    >>> groups = runner.run(stream.take(version=0))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vime.agents.collector import Collector
from vime.agents.episode import EnvFactory, lost_to_engine
from vime.conf.train import RolloutConfig
from vime.envs import TaskSource
from vime.types import Episode

log = logging.getLogger("vime.train")
# Whether a step at a weight version could train on a group's episodes (the loop's
# filter_groups and staleness rules: vime.rl.advantages.select_groups).
Signal = Callable[[list[Episode], int], bool]
POLL_S = 0.05  # how often the producer looks for a new weight version


@dataclass
class Group:
    """One finished group: its task, episodes, admission order and weight version."""

    seq: int  # admission order (the oldest groups are taken first)
    task: dict[str, Any]
    episodes: list[Episode]
    version: int  # the weights the engines served when it was admitted

    def has_signal(self, signal: Signal, version: int) -> bool:
        """True when a step can train on it (or must play its lost episodes again)."""
        if any(lost_to_engine(ep) for ep in self.episodes):
            return True  # the runner re-plays what an engine lost: the group completes
        return signal(self.episodes, version)


class RolloutStream:
    """Plays groups continuously within the staleness bound (see the module docstring).

    All of its state lives on the rollout event loop: :meth:`start`, :meth:`take` and
    :meth:`stop` run there (``Rollouts.run`` or ``call_soon_threadsafe``).
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        steps: int,
        collector: Collector,
        tasks: TaskSource,
        env_factory: EnvFactory,
        version: Callable[[], int],
        first_step: int,
        signal: Signal,
    ) -> None:
        self.rollout = rollout
        self.steps = steps  # the run's last step: nothing is admitted past it
        self.signal = signal
        self.collector = collector
        self.tasks = tasks
        self.env_factory = env_factory
        self.version = version  # the weight version the engines serve now
        self.steps_taken = first_step - 1
        self.ready: list[Group] = []
        self.in_flight: dict[int, asyncio.Task[None]] = {}
        self._versions: dict[int, int] = {}  # in flight: the version each was admitted at
        self.stopping = False
        self.exhausted = False  # the task source has no more tasks
        self._seq = 0
        self._error: BaseException | None = None
        self._finished = asyncio.Event()  # a group finished (take waits on it)
        self._producer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ producer

    def start(self) -> None:
        """Start admitting groups (on the rollout loop)."""
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(self._produce())

    def _room(self) -> int:
        """How many more groups the staleness bound admits now."""
        r = self.rollout
        ahead = min(self.version() + 1 + r.max_staleness, self.steps) - self.steps_taken
        version = self.version()
        outstanding = len(self.in_flight) + sum(
            g.has_signal(self.signal, version) for g in self.ready
        )
        by_staleness = ahead * r.batch_size - outstanding
        per_group = r.collector.n_samples
        by_concurrency = max(1, r.collector.concurrency // per_group) - len(self.in_flight)
        return min(by_staleness, by_concurrency)

    async def _produce(self) -> None:
        while not self.stopping:
            for _ in range(max(0, self._room())):
                if self.stopping or self.exhausted:
                    break
                try:
                    task = self.tasks.lend()
                except StopIteration:
                    self.exhausted = True
                    self._finished.set()  # a waiting take may have to settle for less
                    break
                self._seq += 1
                self._versions[self._seq] = self.version()
                play = self._play(self._seq, task)
                self.in_flight[self._seq] = asyncio.get_running_loop().create_task(play)
            await asyncio.sleep(POLL_S)

    async def _play(self, seq: int, task: dict[str, Any]) -> None:
        try:
            if not self.stopping:  # checked where collect() clears the abort flag
                episodes = await self.collector.collect([task], self.env_factory)
                self.ready.append(Group(seq, task, episodes, self._versions[seq]))
        except BaseException as err:  # a bug in the collector: surface it in take()
            if not isinstance(err, asyncio.CancelledError):
                self._error = err
            raise
        finally:
            self.in_flight.pop(seq, None)
            self._versions.pop(seq, None)
            self._finished.set()

    # ------------------------------------------------------------------ consumer

    async def take(self, version: int) -> list[Group]:
        """The next step's groups, as soon as they are there (see the module docstring).

        Example (skipped as a doctest: it needs a collector on a running engine):
            >>> groups = runner.run(stream.take(version=2))  # doctest: +SKIP
        """
        r = self.rollout
        cap = max(1, round(r.batch_size * r.oversample)) * (1 + r.refill_retries)
        while True:
            if self._error is not None:
                raise self._error
            signal = [g for g in self.ready if g.has_signal(self.signal, version)]
            done = self.stopping or (self.exhausted and not self.in_flight)
            # A group this old is stale for every later step: this one waits for it.
            overdue = any(v <= version - r.max_staleness for v in self._versions.values())
            full = len(signal) >= r.batch_size or len(self.ready) >= cap
            if (full and not overdue) or done:
                break
            self._finished.clear()
            await self._finished.wait()
        chosen = {g.seq for g in sorted(signal, key=lambda g: g.seq)[: r.batch_size]}
        without = {g.seq for g in self.ready} - {g.seq for g in signal}
        taken = [g for g in self.ready if g.seq in chosen | without]
        self.ready = [g for g in self.ready if g.seq not in chosen | without]
        self.steps_taken += 1
        return sorted(taken, key=lambda g: g.seq)

    def wake(self) -> None:
        """Make a waiting :meth:`take` look again (after ``stopping`` was set)."""
        self._finished.set()

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Admit nothing more; the groups in flight end ``aborted`` after their turn."""
        self.stopping = True
        self.collector.abort()
        self._finished.set()
        running = list(self.in_flight.values())
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(running, timeout=timeout_s)
        for task in [*running, *([self._producer] if self._producer else [])]:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self._producer is not None:
            await asyncio.gather(self._producer, return_exceptions=True)
