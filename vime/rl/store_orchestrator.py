"""The trainer's side of the shared rollout store (``rollout.store``): rollout workers play,
each step takes what they wrote.

:class:`StoreOrchestrator` is an :class:`~vime.rl.orchestrator.Orchestrator`; the runner
(:class:`~vime.rl.rollouts.Rollouts`) checks, completes, buffers and settles what it takes,
as for every orchestrator. Per step:

1. **Publish** tasks, lent from the task source with their draw numbers, until
   ``batch_size × oversample × (1 + s)`` of them are out (published, not yet taken);
   ``s`` is ``max_staleness`` in ``rollout.mode=async`` and 0 in ``sync``. That bounds how
   far the workers play ahead of the trainer: with ``s = 0`` they play this step's tasks
   only. Each step also publishes the weight version the engines serve, which the workers
   stamp on what they sample.
2. **Wait** until ``batch_size`` finished groups carry signal (the same rule as the other
   orchestrators: ``filter_groups``, the user's filters, staleness), refilling by one more
   draw when every published task is finished without enough of them (at most
   ``refill_retries`` times).
3. **Claim** the oldest groups with signal (at most ``batch_size``) and every finished
   group before the last of them without it, for this step, in one transaction.

**Exactly once.** A group row is claimed by one step and never again; a resumed trainer
replays its buffered steps from the run's buffer, takes again what a step had claimed
before it was buffered (:meth:`~vime.store.postgres.PgStore.claimed`), and publishes its
lent tasks again under their old draw numbers, which finds their groups instead of
playing them twice. Delivery is at least once (a worker whose lease expired plays a task
again), training exactly once (one group per draw, one step per group).

Usage (no doctest: a run with a rollout server and its workers): the loop's orchestrator
factory ``functools.partial(StoreOrchestrator, store=PgStore(url, "run-a"))``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from pathlib import Path
from typing import Any

from vime.conf.train import TrainConfig
from vime.errors import DataError
from vime.observability.trace import TRACE
from vime.rl.orchestrator import (
    Group,
    Orchestrator,
    OrchestratorContext,
    OrchestratorFactory,
    draw_size,
)
from vime.store.postgres import PgStore, RunSpec, StoredGroup
from vime.sync.base import VersionListener, WeightSync

log = logging.getLogger("vime.train")
POLL_S = 0.05  # how often a waiting step looks for new groups


class StoreOrchestrator(Orchestrator):
    """Takes each step's groups from the shared store (see the module docstring)."""

    def __init__(self, ctx: OrchestratorContext, *, store: PgStore) -> None:
        super().__init__(ctx)
        self.store = store
        self.step = ctx.first_step  # the step the next take serves
        self.published: dict[int, dict[str, Any]] = {}  # draw → task, lent and not taken
        self._cache: dict[int, StoredGroup] = {}  # finished groups fetched, not taken
        self._stats: dict[str, float] = {}
        self.exhausted = False

    def window(self) -> int:
        """How many tasks may be out (published, not taken) at once."""
        r = self.ctx.rollout
        ahead = r.max_staleness if r.mode == "async" else 0
        return draw_size(r) * (1 + ahead)

    async def take(self, version: int) -> list[Group]:
        step, self.step = self.step, self.step + 1
        t0 = time.perf_counter()
        await asyncio.to_thread(self.store.set_version, version)
        again = await self._claimed_before(step)
        if again:
            return again
        await self._publish(self.window() - len(self.published))
        chosen = await self._wait_for_batch(version)
        if self.stopping:  # Ctrl-C: claim nothing; the tasks stay lent and their groups ready
            return []
        await asyncio.to_thread(self.store.claim, [g.draw for g in chosen], step)
        if step == self.ctx.steps:  # the run's last batch: its workers may stop
            await asyncio.to_thread(self.store.finish)
        self._stats = {
            "rollout/store_wait_s": time.perf_counter() - t0,
            "rollout/store_out": float(len(self.published) - len(chosen)),
        }
        return [self._group(g) for g in chosen]

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    async def stop(self) -> None:
        self.stopping = True  # the workers play on: what they write waits in the store

    # ------------------------------------------------------------------ the steps

    async def _claimed_before(self, step: int) -> list[Group]:
        """(Resume.) The groups ``step`` claimed before the trainer died (its buffer write
        never happened); ones whose task this run did not publish go back to the pool."""
        claimed = await asyncio.to_thread(self.store.claimed, step)
        if not claimed:
            return []
        await self._publish(max(self.window() - len(self.published), 0))
        mine = [g for g in claimed if g.draw in self.published]
        others = [g.draw for g in claimed if g.draw not in self.published]
        if others:
            await asyncio.to_thread(self.store.release, others)
        log.info("step %d: %d groups it had claimed before a restart", step, len(mine))
        return [self._group(g) for g in mine]

    async def _publish(self, n: int) -> None:
        """Lend ``n`` more tasks (fewer at the source's end) and offer them to the workers."""
        if n <= 0 or self.exhausted:
            return
        try:
            numbered = self.ctx.lend_numbered(n)
        except DataError:  # the source is exhausted
            if self.published:
                self.exhausted = True
                return
            raise
        self.exhausted = len(numbered) < n
        self.published.update(numbered)
        await asyncio.to_thread(self.store.publish, numbered)

    async def _wait_for_batch(self, version: int) -> list[StoredGroup]:
        """The groups this step takes (step 2 and 3 of the module docstring)."""
        r, refills = self.ctx.rollout, 0
        while True:
            ready = await self._ready()
            chosen, signal = [], 0
            for g in ready:
                if signal >= r.batch_size:
                    break
                chosen.append(g)
                signal += self.ctx.signal(g.episodes, version)
            if signal >= r.batch_size or self.stopping:
                return chosen
            if len(ready) == len(self.published):  # every published task is finished
                if refills == r.refill_retries or self.exhausted:
                    return chosen
                refills += 1
                await self._publish(draw_size(r))
            await asyncio.sleep(POLL_S)

    async def _ready(self) -> list[StoredGroup]:
        """Finished groups of the tasks this run published, oldest draw first."""
        rows = await asyncio.to_thread(self.store.ready, list(self._cache))
        for g in rows:
            if g.draw not in self._cache and g.draw in self.published:
                self._cache[g.draw] = g
                TRACE.note_progress()  # a worker's group: the run is not stalled
        return [self._cache[g.draw] for g in rows if g.draw in self._cache]

    def _group(self, g: StoredGroup) -> Group:
        task = self.published.pop(g.draw)
        self._cache.pop(g.draw, None)
        return Group(g.draw, task, g.episodes, version=g.min_version)


class StoreVersions:
    """A :class:`~vime.sync.base.VersionListener` in front of the policy client's: it also
    publishes a version to the store once every engine serves it, so that workers stamp
    the new version, and continue requests a sync aborted, as soon as the sync ends.

    Example:
        >>> class Seen:
        ...     def set_version(self, v): print("store at", v)
        ...     def set_weight_version(self, url, v): pass
        >>> versions = StoreVersions(Seen(), ["http://a:1", "http://b:1"], None)
        >>> versions.set_weight_version("http://a:1", 1)
        >>> versions.set_weight_version("http://b:1", 1)
        store at 1
    """

    def __init__(self, store: Any, urls: list[str], inner: VersionListener | None) -> None:
        self.store, self.urls, self.inner = store, list(urls), inner
        self.served: dict[str, int] = {}
        self.published = -1

    def set_weight_version(self, url: str, version: int) -> None:
        if self.inner is not None:
            self.inner.set_weight_version(url, version)
        self.served[url] = version
        every = min(self.served.get(u, -1) for u in self.urls)
        if every > self.published:
            self.store.set_version(every)
            self.published = every


def store_factory(
    cfg: TrainConfig, run_root: Path, model_dir: Path, engines: list[str], sync: WeightSync
) -> tuple[OrchestratorFactory, PgStore]:
    """(The loop.) Open this run's namespace in ``rollout.store`` (named after the run
    folder), tell the workers how to play its tasks and, from now on, each weight version
    once the engines serve it; and the factory of its orchestrator.
    """
    store = PgStore(cfg.rollout.store, run_root.name)
    spec = RunSpec((run_root / "config.yaml").read_text(), str(model_dir), engines, sync.version)
    store.register(spec)
    sync.policy = StoreVersions(store, engines, sync.policy)
    log.info(
        "rollout.store: workers play this run's tasks with: vime-agent rollout store=%s run=%s",
        cfg.rollout.store,
        run_root.name,
    )
    return functools.partial(StoreOrchestrator, store=store), store
