"""How soon ``vime-agent train`` has its engine and its first step: CPU engine preloaded
(:mod:`vime.engine.preload`, the default) or spawned at launch (``VIME_ENGINE_PRELOAD=0``).

Runs the main job (its defaults, ``--steps`` steps) in a child process, the two ways
alternated (preload, spawn, spawn, preload, ...) so that drift in the machine's load hits
both alike, and prints for each run the seconds from the command's start until its
engine is ready, until its first step's row is written, and until it exits; then the
medians and the ratios spawn ÷ preload. The warm start is made once before the first run
(it is cached), so every run starts from the same cached model.

Usage::

    .venv/bin/python bench/train_start.py              # 3 runs each way, 2 steps each
    .venv/bin/python bench/train_start.py --reps 2 --steps 3

Example (the order of the runs: each pair alternates which goes first):
    >>> order(2)
    ['preload', 'spawn', 'spawn', 'preload']
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("preload", "spawn")
READY = re.compile(r"^(\S+ \S+),(\d+) vime\.engine\.server: vLLM ready at ", re.M)


def order(reps: int) -> list[str]:
    """The runs in the order they run: ``reps`` of each way, alternated pair by pair."""
    out: list[str] = []
    for rep in range(reps):
        out += list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))
    return out


def run_once(way: str, root: Path, steps: int) -> dict[str, float]:
    """One main job ``way``: seconds from its start to engine ready, first step, exit."""
    env = {**os.environ, "VIME_ENGINE_PRELOAD": "1" if way == "preload" else "0"}
    cmd = [sys.executable, "-m", "vime.cli", "train", f"run_root={root}", f"steps={steps}"]
    start_wall, start = time.time(), time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    total = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    output = done.stdout + done.stderr
    ready = READY.search(output)
    if ready is None:
        raise SystemExit(f"no 'vLLM ready' line in the run's output:\n{output[-3000:]}")
    stamp = datetime.datetime.strptime(ready.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    ready_at = stamp + int(ready.group(2)) / 1000
    (run,) = [p for p in root.iterdir() if (p / "metrics.jsonl").exists()]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r.get("step") == 1 and "time/step_s" in r)
    preloaded = "(preloaded)" in output
    if preloaded != (way == "preload"):
        raise SystemExit(f"a {way} run's engine was {'' if preloaded else 'not '}preloaded")
    return {
        "ready": ready_at - start_wall,
        "first step": first["time"] - start_wall,
        "exit": total,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="runs of each way")
    parser.add_argument("--steps", type=int, default=2, help="steps per run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vime-train-start-"))
    # Once, untimed: the warm start (cached) and the first imports from disk.
    run_once("spawn", work / "warm-up", 1)
    keys = ("ready", "first step", "exit")
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    for i, way in enumerate(order(args.reps)):
        figures = run_once(way, work / f"{i}-{way}", args.steps)
        runs[way].append(figures)
        print(f"{way:>7}: " + ", ".join(f"{k} {figures[k]:.1f} s" for k in keys), flush=True)
    print("\n| | engine ready | first step | exit |\n|---|---|---|---|")
    medians = {
        way: {k: statistics.median(r[k] for r in rows) for k in keys} for way, rows in runs.items()
    }
    for way, m in medians.items():
        print(f"| {way} | " + " | ".join(f"{m[k]:.1f} s" for k in keys) + " |")
    for k in keys:
        print(f"{k}: spawn ÷ preload = {medians['spawn'][k] / medians['preload'][k]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
