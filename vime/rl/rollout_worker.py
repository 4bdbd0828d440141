"""``vime-agent rollout``: a rollout worker for a run that trains from the shared store.

A worker reads what the run's trainer registered in the store (its config, model folder
and engines: :class:`~vime.store.postgres.RunSpec`), then, until the run ends (or
Ctrl-C), leases the tasks the trainer publishes, plays each on the engines with the
run's players (the env loop, ``rollout.generate`` or ``agent.command``, and its rewards:
:mod:`vime.rl.players`), and writes each finished group with its lease acknowledged
(:meth:`~vime.store.postgres.PgStore.complete`). It renews its leases while it plays; a
worker that dies loses its tasks to the others once its leases expire. It follows the
weight version the trainer publishes, and stamps it on every token it samples.

Workers run anywhere that reaches the store and the engines, and as many as you like; the
trainer's publishing bounds how far ahead of it they play (:mod:`vime.rl.store_orchestrator`).

Example:
    $ vime-agent rollout store=postgresql://postgres@10.0.0.5:55432/vime run=20261206-031500-math
    worker host-a:4242: playing run 20261206-031500-math (vime/Math-v0, 8 tasks at once)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import vime.envs as envs
from vime.agents.collector import Collector
from vime.agents.policy_client import PolicyClient
from vime.conf.train import TrainConfig
from vime.config import apply_overrides, field_names, require
from vime.errors import ConfigError
from vime.rl.orchestrator import draw_size
from vime.rl.players import load_players
from vime.store.postgres import PgStore, RunSpec
from vime.types import Episode

log = logging.getLogger("vime.rollout")
POLL_S = 0.05  # how often the worker looks for tasks, versions and the run's end

USAGE = """usage: vime-agent rollout store=URL run=RUN_NAME [key=value ...]

Play the tasks a training run publishes in its rollout store (rollout.store), until the
run ends. Keys:
"""


@dataclass
class WorkerConfig:
    """What ``vime-agent rollout`` plays.

    Example:
        >>> WorkerConfig(store="postgresql://h/vime", run="r").concurrency
        0
    """

    store: str = ""  # the PostgreSQL URL the trainer's rollout.store names
    run: str = ""  # the run's name: its folder's name (the trainer logs the command)
    model: str = ""  # the tokenizer's folder here; "": the trainer's model folder
    concurrency: int = 0  # tasks played at once; 0: the run's batch_size × oversample
    name: str = ""  # this worker's name in the store; "": host:pid
    wait_s: float = 600.0  # how long to wait for the trainer to register the run

    def __post_init__(self) -> None:
        require(self.concurrency >= 0, "concurrency", "must be >= 0 (0: a step's draw)")
        require(self.wait_s >= 0, "wait_s", "must be >= 0 seconds")


class RolloutWorker:
    """Leases, plays and writes a run's tasks (see the module docstring)."""

    def __init__(self, store: PgStore, cfg: TrainConfig, spec: RunSpec, worker: WorkerConfig):
        self.store, self.cfg = store, cfg
        self.name = worker.name or f"{socket.gethostname()}:{os.getpid()}"
        self.concurrency = worker.concurrency or draw_size(cfg.rollout)
        self.lease_s = cfg.rollout.store_lease_s
        self.policy = PolicyClient.from_urls(*spec.engines)
        self.policy.config.request_timeout_s = cfg.rollout.request_timeout_s
        self.policy.config.heartbeat_s = cfg.rollout.engine_heartbeat_s
        self.policy.config.batch_identical = cfg.rollout.batch_identical_requests
        players = load_players(cfg)
        model_dir = Path(worker.model or spec.model_dir)
        self.collector = Collector(
            self.policy,
            model_dir,
            cfg.rollout.collector,
            generate=players.generate,
            rewards=players.rewards,
        )
        self.env_factory = envs.EnvMaker(cfg.env.id, dict(cfg.env.kwargs))
        self.version = -1
        self.written = self.lost = 0  # groups written; groups whose lease was taken over
        self.played_at: dict[int, float] = {}  # draw → when its last episode ended
        self.in_flight: set[int] = set()  # draws leased here and not written yet
        self.finished: list[tuple[int, list[Episode]]] = []  # played, to be written

    async def run(self) -> int:
        """Play until the run ends; the number of groups written."""
        batches: set[asyncio.Task[None]] = set()  # one per lease: its tasks played together
        renew_at = time.monotonic() + self.lease_s / 3
        try:
            while True:
                spec = await asyncio.to_thread(self.store.spec)
                if spec is None or spec.finished:
                    break
                self._follow(spec.version)
                free = self.concurrency - len(self.in_flight)
                if free > 0:
                    leased = await asyncio.to_thread(
                        self.store.lease, self.name, free, lease_s=self.lease_s
                    )
                    if leased:
                        self.in_flight.update(draw for draw, _ in leased)
                        batches.add(asyncio.create_task(self._play(leased)))
                if self.in_flight and time.monotonic() > renew_at:
                    await asyncio.to_thread(
                        self.store.renew, self.name, list(self.in_flight), lease_s=self.lease_s
                    )
                    renew_at = time.monotonic() + self.lease_s / 3
                await _wait(batches)
                if self.finished:  # all in one transaction: one commit per poll, not per group
                    await self._write()
        finally:
            self.collector.abort()
            for batch in batches:
                batch.cancel()
            await asyncio.gather(*batches, return_exceptions=True)
            await self.policy.aclose()
        return self.written

    def _follow(self, version: int) -> None:
        """The engines serve ``version`` now: what is sampled from here on is stamped so."""
        if version != self.version:
            for url in self.policy.urls:
                self.policy.set_weight_version(url, version)
            if self.version >= 0:
                log.info("worker %s: engines at weights v%d", self.name, version)
            self.version = version

    async def _play(self, leased: list[tuple[int, dict[str, Any]]]) -> None:
        """Play a lease's tasks; each group waits in ``finished`` from its last episode on.
        A group cut short (the worker stopping) is not written: its lease expires."""
        tasks = [task for _, task in leased]
        async for k, episodes in self.collector.iter_groups(tasks, self.env_factory):
            draw = leased[k][0]
            if len(episodes) == self.cfg.rollout.collector.n_samples:
                self.played_at[draw] = time.monotonic()  # system-wide: across processes
                self.finished.append((draw, episodes))
            else:
                self.in_flight.discard(draw)

    async def _write(self) -> None:
        """Write the finished groups where this worker still holds their tasks."""
        finished, self.finished = self.finished, []
        written = await asyncio.to_thread(self.store.complete_many, self.name, finished)
        for (draw, _), ok in zip(finished, written, strict=True):
            self.in_flight.discard(draw)
            if ok:
                self.written += 1
            else:
                self.lost += 1
                log.warning("worker %s: task %s was taken over (lease expired)", self.name, draw)


async def _wait(batches: set[asyncio.Task[None]]) -> None:
    """Wait a poll; drop the batches that ended (raising what one raised)."""
    if not batches:
        await asyncio.sleep(POLL_S)
        return
    done, _ = await asyncio.wait(batches, timeout=POLL_S)
    for batch in done:
        batches.discard(batch)
        batch.result()


def _run_config(spec: RunSpec) -> TrainConfig:
    """The trainer's config, read as ``resume`` reads a run's ``config.yaml``."""
    from vime.rl.replay import saved_config

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.yaml").write_text(spec.config_yaml)
        return saved_config(Path(folder))


def _wait_for_run(store: PgStore, wait_s: float) -> RunSpec:
    deadline = time.monotonic() + wait_s
    while (spec := store.spec()) is None:
        if time.monotonic() > deadline:
            raise ConfigError(
                f"run={store.run}: no trainer registered this run in {store.dsn} within "
                f"{wait_s:.0f} s; start it with rollout.store={store.dsn}, or check the "
                "run's name (its folder's name)",
                key="run",
            )
        time.sleep(0.5)
    return spec


def main(argv: list[str] | None = None) -> int:
    """Run ``vime-agent rollout``; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "".join(f"  {k}\n" for k in field_names(WorkerConfig())), end="")
        return 0
    worker_cfg = apply_overrides(WorkerConfig(), argv)
    require(bool(worker_cfg.store), "store", "give the run's rollout store URL (store=URL)")
    require(bool(worker_cfg.run), "run", "give the run's name (its folder's name: run=NAME)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for chatty in ("httpx", "httpx2"):  # a line per request
        logging.getLogger(chatty).setLevel(logging.WARNING)
    store = PgStore(worker_cfg.store, worker_cfg.run)
    with contextlib.closing(store):
        spec = _wait_for_run(store, worker_cfg.wait_s)
        cfg = _run_config(spec)
        worker = RolloutWorker(store, cfg, spec, worker_cfg)
        print(
            f"worker {worker.name}: playing run {store.run} ({cfg.env.id}, "
            f"{worker.concurrency} tasks at once)",
            flush=True,
        )
        written = asyncio.run(worker.run())
        worker.collector.close()
    print(f"worker {worker.name}: the run ended; {written} groups written", flush=True)
    return 0
