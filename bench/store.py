"""Rollouts through the shared rollout store against the trainer's own collector, on one
engine: episodes/s and the latency from a group's last token to the trainer's read.

Two kinds of rep, alternated (local, store, store, local, ...) so that drift in the
machine's load hits both alike, each playing ``--tasks`` math tasks × ``--samples``
(512 concurrent episodes by default), 16 sampled tokens each:

- ``local``: one :class:`vime.agents.Collector` plays every group and appends them to a
  :class:`vime.buffer.DataBuffer` (fsync'd), as the trainer's process does with the run's
  own buffer (the default, no server);
- ``store``: a :class:`vime.rl.rollout_worker.RolloutWorker` (its own collector on the
  same engine) leases the same number of tasks from the store, plays them and writes each
  group; a reader in a process of its own (as the trainer is) polls the store for
  finished groups every 50 ms, as :class:`vime.rl.store_orchestrator.StoreOrchestrator`
  does, and fetches them. The rep ends when the reader holds every group.

Printed: episodes/s of each (median over reps), the ratio store / local (the median of
each pair's own ratio; target ≥ 0.95), and p50/p99 over all groups of the time from the
group's last episode ending (in the worker) to the reader holding it (``time.monotonic``,
one clock for the machine's processes).

Usage::

    bash scripts/postgres.sh start        # prints the store URL
    python bench/store.py --store postgresql://postgres@127.0.0.1:55432/vime
    python bench/store.py --store URL --url http://127.0.0.1:8000 --tasks 32 --reps 2
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import statistics
import tempfile
import time
import uuid
from multiprocessing import Queue
from pathlib import Path
from typing import Any

from vime.agents import Collector, PolicyClient
from vime.buffer import DataBuffer
from vime.conf.compose import load_config
from vime.conf.train import TrainConfig
from vime.envs import EnvMaker, TaskSource
from vime.rl.rollout_worker import RolloutWorker, WorkerConfig
from vime.rl.tasks import train_tasks
from vime.store.postgres import PgStore, RunSpec

POLL_S = 0.05  # as the store's orchestrator polls


async def local_rep(
    url: str, model: str, cfg: TrainConfig, tasks: list[dict[str, Any]], run: Path
) -> float:
    """Episodes/s of one collector playing ``tasks`` and buffering them (fsync'd), as the
    trainer's process does with the run's own buffer."""
    policy = PolicyClient.from_urls(url)
    collector = Collector(policy, model, cfg.rollout.collector)
    try:
        with DataBuffer(run) as buffer:
            t0 = time.perf_counter()
            env_factory = EnvMaker(cfg.env.id, dict(cfg.env.kwargs))
            groups = await collector.collect_groups(tasks, env_factory)
            buffer.append([ep for g in groups for ep in g], step=len(buffer.steps()) + 1)
            return sum(len(g) for g in groups) / (time.perf_counter() - t0)
    finally:
        await policy.aclose()
        collector.close()


def read_groups(store_url: str, run: str, n: int, out: Queue) -> None:
    """(A process of its own, as the trainer is.) Poll the store for finished groups,
    fetching each once, until ``n`` are held; put draw → when it was held on ``out``."""
    store = PgStore(store_url, run)
    read_at: dict[int, float] = {}
    store.ready()
    out.put("polling")  # the rep's clock starts now, not while this process imports
    while len(read_at) < n:
        for g in store.ready(known=list(read_at)):
            read_at.setdefault(g.draw, time.monotonic())  # system-wide: the worker's clock
        time.sleep(POLL_S)
    out.put(read_at)


async def store_rep(
    store_url: str, url: str, model: str, cfg: TrainConfig, tasks: list[dict[str, Any]]
) -> tuple[float, list[float]]:
    """Episodes/s through the store, and each group's last-token-to-read seconds."""
    store = PgStore(store_url, f"bench-{uuid.uuid4().hex[:8]}")
    spec = RunSpec("", model, [url], 0)
    store.register(spec)
    worker = RolloutWorker(store, cfg, spec, WorkerConfig(concurrency=len(tasks), name="bench"))
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    reader = spawn.Process(target=read_groups, args=(store_url, store.run, len(tasks), results))
    reader.start()
    assert await asyncio.to_thread(results.get) == "polling"
    t0 = time.perf_counter()
    store.publish(list(enumerate(tasks, 1)))
    playing = asyncio.create_task(worker.run())
    read_at = await asyncio.to_thread(results.get)
    wall = time.perf_counter() - t0
    reader.join()
    await asyncio.to_thread(store.finish)
    await playing
    worker.collector.close()
    store.close()
    latency = [read_at[d] - worker.played_at[d] for d in read_at]
    return len(tasks) * cfg.rollout.collector.n_samples / wall, latency


async def bench(store_url: str, url: str, model: str, args: argparse.Namespace) -> None:
    cfg = load_config(
        [
            "env=math",
            f"rollout.collector.n_samples={args.samples}",
            f"rollout.collector.concurrency={args.tasks * args.samples}",
            "rollout.collector.sampling.max_tokens=16",
            "rollout.collector.progress=false",
        ]
    )
    source = TaskSource(train_tasks(cfg.env), seed=0)
    run = Path(tempfile.mkdtemp(prefix="vime-bench-store-"))
    local: list[float] = []
    through: list[float] = []
    latency: list[float] = []
    for rep in range(args.reps):
        order = ("local", "store") if rep % 2 == 0 else ("store", "local")
        for kind in order:
            tasks = source.take(args.tasks)
            if kind == "local":
                local.append(await local_rep(url, model, cfg, tasks, run))
            else:
                eps, lat = await store_rep(store_url, url, model, cfg, tasks)
                through.append(eps)
                latency += lat
        print(f"rep {rep}: local {local[-1]:.1f} eps/s, store {through[-1]:.1f} eps/s", flush=True)
    shutil.rmtree(run, ignore_errors=True)
    ratios = [s / loc for s, loc in zip(through, local, strict=True)]
    latency.sort()
    p99 = latency[min(len(latency) - 1, int(0.99 * len(latency)))]
    print(
        f"{args.tasks} tasks × {args.samples} samples ({args.tasks * args.samples} episodes "
        f"at once), {args.reps} reps\n"
        f"local  {statistics.median(local):8.1f} episodes/s\n"
        f"store  {statistics.median(through):8.1f} episodes/s\n"
        f"ratio store/local {statistics.median(ratios):.3f} (target >= 0.95)\n"
        f"last token -> trainer read: p50 {statistics.median(latency) * 1000:.0f} ms, "
        f"p99 {p99 * 1000:.0f} ms ({len(latency)} groups)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="the PostgreSQL URL (scripts/postgres.sh)")
    parser.add_argument("--url", default="", help="attach to this vLLM server")
    parser.add_argument("--model", default="", help="model folder (default: the tiny model)")
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--reps", type=int, default=4)
    args = parser.parse_args()
    model = args.model
    if not model:
        from vime.models.tiny import build_tiny_model

        model = str(build_tiny_model())
    if args.url:
        asyncio.run(bench(args.store, args.url, model, args))
        return
    from vime.engine import EngineConfig, VLLMServer

    with VLLMServer(EngineConfig(model=model)) as server:
        asyncio.run(bench(args.store, server.url, model, args))


if __name__ == "__main__":
    main()
