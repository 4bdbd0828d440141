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

It is an :class:`~vime.rl.orchestrator.Orchestrator`: the runner
(:class:`~vime.rl.rollouts.Rollouts`) checks, completes and buffers what it takes.

Usage (no doctest: it needs a collector on a running engine): ``stream =
RolloutStream(ctx)`` with an :class:`~vime.rl.orchestrator.OrchestratorContext`, then
``runner.run(stream.take(version=0))`` for each step's groups.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from vime.rl.orchestrator import Group, Orchestrator, OrchestratorContext, draw_size

log = logging.getLogger("vime.train")
POLL_S = 0.05  # how often the producer looks for a new weight version


class RolloutStream(Orchestrator):
    """Plays groups continuously within the staleness bound (see the module docstring).

    All of its state lives on the rollout event loop: :meth:`start`, :meth:`take` and
    :meth:`stop` run there (``Rollouts.run`` or ``call_soon_threadsafe``).
    """

    def __init__(self, ctx: OrchestratorContext) -> None:
        super().__init__(ctx)
        self.steps_taken = ctx.first_step - 1
        self.ready: list[Group] = []
        self.in_flight: dict[int, asyncio.Task[None]] = {}  # by admission number
        self._versions: dict[int, int] = {}  # in flight: the version each was admitted at
        self.exhausted = False  # the task source has no more tasks
        self._admitted = 0
        self._error: BaseException | None = None
        self._finished = asyncio.Event()  # a group finished (take waits on it)
        self._producer: asyncio.Task[None] | None = None
        self._taken_at = 0.0  # when the previous step took its batch (perf_counter)
        self._window_s = 0.0  # the time the stream had for the last batch taken

    # ------------------------------------------------------------------ producer

    def start(self) -> None:
        """Start admitting groups (on the rollout loop)."""
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(self._produce())
            self._taken_at = time.perf_counter()  # the first step's window opens

    def _room(self) -> int:
        """How many more groups the staleness bound admits now."""
        r, ctx = self.ctx.rollout, self.ctx
        version = ctx.version()
        ahead = min(version + 1 + r.max_staleness, ctx.steps) - self.steps_taken
        outstanding = len(self.in_flight) + sum(
            g.has_signal(ctx.signal, version) for g in self.ready
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
                    task = self.ctx.lend()
                except StopIteration:
                    self.exhausted = True
                    self._finished.set()  # a waiting take may have to settle for less
                    break
                self._admitted += 1
                self._versions[self._admitted] = self.ctx.version()
                play = self._play(self._admitted, task)
                self.in_flight[self._admitted] = asyncio.get_running_loop().create_task(play)
            await asyncio.sleep(POLL_S)

    async def _play(self, admitted: int, task: dict[str, Any]) -> None:
        try:
            if not self.stopping:  # checked where collect() clears the abort flag
                groups = await self.ctx.play([task])
                # Not self.ready.extend(...): take() may have replaced the list during the
                # await, and a bound method taken before it would add to the old one.
                self.ready += groups
        except BaseException as err:  # a bug in the collector: surface it in take()
            if not isinstance(err, asyncio.CancelledError):
                self._error = err
            raise
        finally:
            self.in_flight.pop(admitted, None)
            self._versions.pop(admitted, None)
            self._finished.set()

    # ------------------------------------------------------------------ consumer

    async def take(self, version: int) -> list[Group]:
        """The next step's groups, as soon as they are there (see the module docstring):
        ``groups = runner.run(stream.take(version=2))``."""
        r, signal = self.ctx.rollout, self.ctx.signal
        cap = draw_size(r) * (1 + r.refill_retries)
        while True:
            if self._error is not None:
                raise self._error
            with_signal = [g for g in self.ready if g.has_signal(signal, version)]
            done = self.stopping or (self.exhausted and not self.in_flight)
            # A group this old is stale for every later step: this one waits for it.
            overdue = any(v <= version - r.max_staleness for v in self._versions.values())
            full = len(with_signal) >= r.batch_size or len(self.ready) >= cap
            if (full and not overdue) or done:
                break
            self._finished.clear()
            await self._finished.wait()
        chosen = {g.seq for g in sorted(with_signal, key=lambda g: g.seq)[: r.batch_size]}
        without = {g.seq for g in self.ready} - {g.seq for g in with_signal}
        taken = [g for g in self.ready if g.seq in chosen | without]
        self.ready = [g for g in self.ready if g.seq not in chosen | without]
        self.steps_taken += 1
        now = time.perf_counter()
        # The time the stream had for this batch (since the previous step took its own):
        # the step's sampled tokens over it is the rollout throughput (console's tok/s).
        self._window_s, self._taken_at = now - self._taken_at, now
        return sorted(taken, key=lambda g: g.seq)

    def stats(self) -> dict[str, float]:
        return {
            "rollout/collect_s": self._window_s,
            "rollout/groups_in_flight": float(len(self.in_flight)),
            "rollout/groups_ready": float(len(self.ready)),
        }

    async def stop(self, timeout_s: float = 60.0) -> None:
        """Admit nothing more; the groups in flight end ``aborted`` after their turn."""
        await super().stop()
        self._finished.set()  # a waiting take returns what it has
        running = list(self.in_flight.values())
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait(running, timeout=timeout_s)
        for task in [*running, *([self._producer] if self._producer else [])]:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if self._producer is not None:
            await asyncio.gather(self._producer, return_exceptions=True)
