"""The main job under two sets of overrides, A and B, alternated on one machine.

Each side gets its own vLLM server, launched once from its own ``engine.*`` keys on the
warm-started tiny model (so ``engine.omp_threads=2`` can be a side), and its runs attach
to it. Runs alternate A, B, A, B (``--rounds``) so that machine noise hits both; printed:
each run's per-step rollout and step times, then the medians of every step after the
first (the first pays for warm-up) and the ratios B / A.

Usage::

    python bench/main_job_ab.py --a rollout.batch_identical_requests=false --b
    python bench/main_job_ab.py --a --b engine.omp_threads=2 --steps 6 --rounds 2

Example (the sides' overrides):
    >>> split_sides(["--a", "x=1", "--b", "y=2", "z=3"])
    (['x=1'], ['y=2', 'z=3'])
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEYS = ("time/rollout_s", "time/train_s", "time/sync_s", "time/step_s")


def split_sides(argv: list[str]) -> tuple[list[str], list[str]]:
    """The overrides after ``--a`` and after ``--b``."""
    sides: dict[str, list[str]] = {"--a": [], "--b": []}
    current = None
    for arg in argv:
        if arg in sides:
            current = arg
        elif current is None:
            raise SystemExit(f"{arg!r} comes before --a / --b")
        else:
            sides[current].append(arg)
    return sides["--a"], sides["--b"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args, rest = parser.parse_known_args()
    a, b = split_sides(rest)

    from vime.conf.compose import load_config
    from vime.engine import VLLMServer
    from vime.rl.loop import train
    from vime.rl.setup import prepare_model
    from vime.runs.folder import RunDir

    root = tempfile.mkdtemp(prefix="vime-bench-ab-")
    base = [f"run_root={root}", f"steps={args.steps}", "eval_every=0", "save_every=0"]
    base.append("plot=false")
    model_dir = prepare_model(load_config(base), RunDir.create(root, "model"))
    sides = {"A": a, "B": b}
    servers = {}
    try:
        for name, overrides in sides.items():
            engine = load_config([*base, *overrides]).engine
            servers[name] = VLLMServer(dataclasses.replace(engine, model=str(model_dir))).start()
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, overrides in sides.items():
                own = [o for o in overrides if not o.startswith("engine.")]
                url = servers[name].url
                run = train(load_config([*base, f"engine.url={url}", *own])).metrics
                rows[name].extend(run[1:])
                print(
                    f"{name}: rollout {[round(r['time/rollout_s'], 2) for r in run]} "
                    f"step {[round(r['time/step_s'], 2) for r in run]}",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
    print(f"\nmedians of steps 2..{args.steps} over {args.rounds} runs per side")
    medians = {
        name: {k: statistics.median(r[k] for r in rs) for k in KEYS} for name, rs in rows.items()
    }
    for name, overrides in sides.items():
        gap = max(r["train/train_rollout_logprob_abs_diff"] for r in rows[name])
        cells = "  ".join(f"{k.split('/')[1]} {medians[name][k]:.3f}s" for k in KEYS)
        print(f"{name} {' '.join(overrides) or '(defaults)'}: {cells}  max gap {gap:.1e}")
    for k in KEYS:
        print(f"B / A {k.split('/')[1]}: {medians['B'][k] / max(medians['A'][k], 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
