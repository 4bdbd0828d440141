"""Where the tiny model's warm start reaches its target, by seed and batch.

The copy that the ``env=tools`` warm start teaches (the tool's result into ``\\boxed{}``)
is learned in a jump, and where the jump comes moves with the seed and the device. This
runs the warm start's own child process (:func:`vime.rl.warm_start.child_command`) for
each seed and batch, with ``model.warm_start_target`` set, and prints the step at which
the held-out chance first reached it. The baseline is the first batch listed: each other
batch's row prints the ratio of its demonstrations used (steps × batch) to the baseline's,
the median and the worst seed.

Runs are independent processes, one at a time (each takes the whole CPU or GPU).

Usage::

    python bench/warm_start_seeds.py                         # batches 16 32, seeds 0-2, CPU
    python bench/warm_start_seeds.py --batches 16 32 64 --seeds 0 1 2 3 4 5 --device cuda
    python bench/warm_start_seeds.py --env math --target 0.5 --cap 600
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from vime.conf.compose import load_config
from vime.models.tiny import build_tiny_model
from vime.rl.warm_start import REPORT, child_command, child_environment


def run_one(env: str, batch: int, seed: int, target: float, cap: int, device: str) -> dict:
    """One warm start in its own process; its report, with the wall time."""
    cfg = load_config([f"env={env}"])
    model = dataclasses.replace(
        cfg.model,
        warm_start_steps=cap,
        warm_start_batch=batch,
        warm_start_seed=seed,
        warm_start_target=target,
    )
    environ = child_environment()
    if device == "cpu":  # the trainer picks CUDA when it sees one
        environ["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model"
        command = child_command(build_tiny_model(), out, model, cfg.env, {})
        start = time.perf_counter()
        subprocess.run(command, env=environ, check=True, stdout=subprocess.DEVNULL)
        report = json.loads((out / REPORT).read_text())
    report["seconds"] = time.perf_counter() - start
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="tools")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=0.2)
    parser.add_argument("--cap", type=int, default=1200)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    steps: dict[int, list[int]] = {}
    for batch in args.batches:
        for seed in args.seeds:
            r = run_one(args.env, batch, seed, args.target, args.cap, args.device)
            reached = r.get("held_out_chance", 0.0) >= args.target
            steps.setdefault(batch, []).append(r["steps"] if reached else args.cap)
            print(
                json.dumps(
                    {
                        "batch": batch,
                        "seed": seed,
                        "steps": r["steps"],
                        "reached": reached,
                        "chance": round(r.get("held_out_chance", 0.0), 4),
                        "greedy": r.get("held_out_greedy"),
                        "s_per_step": round(r["seconds"] / r["steps"], 3),
                        "last_checks": r["checks"][-4:],  # [step, nll, chance]
                    }
                ),
                flush=True,
            )
    base = args.batches[0]
    base_median, base_worst = statistics.median(steps[base]) * base, max(steps[base]) * base
    print(f"\nsteps to a held-out chance of {args.target} (a miss counts as the cap {args.cap})")
    for batch, row in steps.items():
        median, worst = statistics.median(row) * batch, max(row) * batch
        print(
            f"batch {batch:3d}: steps {sorted(row)}; demonstrations vs batch {base}: "
            f"median {median / base_median:.2f}x, worst {worst / base_worst:.2f}x"
        )


if __name__ == "__main__":
    main()
