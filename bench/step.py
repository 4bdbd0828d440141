"""Time split of an RL step (rollout / train / sync), sync vs async mode, in one run.

Both modes run the same config on the same vLLM server (launched once; each run pushes
its starting weights first), alternating sync → async → sync → async so that machine
noise hits both. Prints the per-step medians and the ratio of async to sync wall time
per step (< 1 means the overlap pays).

    .venv/bin/python bench/step.py                 # defaults: env=math, 6 steps, 2 rounds
    .venv/bin/python bench/step.py --steps 8 --rounds 3 rollout.batch_size=32
    .venv/bin/python bench/step.py --pin              # engine on the last core, the rest here
    .venv/bin/python bench/step.py rollout.partial_rollouts=false  # async runs only

``--pin`` gives the engine its own core(s), as on a machine where rollouts and training
have their own devices: the server (and every process it starts) is launched with this
process's affinity set to the last core, and so are the collector's threads; the trainer
keeps the other cores. Without it, everything shares every core, and async has nothing to
overlap. In async mode the trainer runs in a process of its own
(``placement.trainer_process``, on by default there), so the collector's Python threads do
not take its interpreter lock; ``placement.trainer_process=false`` measures without that.

``--engine-url URL`` uses an engine that already serves the run's starting model (the
tiny model after its warm start, as ``prepare_model`` builds it) instead of launching one:
on a GPU machine, serve it on the GPU and hide the GPU from this process
(``CUDA_VISIBLE_DEVICES=``), and the trainer runs on the CPU cores: split devices.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time

from vime.conf.compose import load_config
from vime.conf.dependencies import RULES
from vime.engine import EngineConfig, VLLMServer
from vime.rl.loop import train
from vime.rl.setup import prepare_model
from vime.runs.folder import RunDir

# Keys that act only in async mode (vime.conf.dependencies): a sync run fails on them.
ASYNC_ONLY = {key for rule in RULES if rule.needs == "rollout.mode" for key in rule.keys}
KEYS = ("time/rollout_s", "time/train_s", "time/sync_s", "time/step_s")
# The sync's own split (disk sync: the export, then the engine's pause, reload and reset).
SYNC_KEYS = ("sync/export_s", "sync/pause_s", "sync/reload_s", "sync/cache_reset_s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="the engine on its own core")
    parser.add_argument(
        "--engine-url",
        default="",
        help="an engine already serving this run's model (e.g. on a GPU while the trainer "
        "runs on CPU cores: split devices); none is launched",
    )
    parser.add_argument("overrides", nargs="*", help="train config overrides (key=value)")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="vime-bench-step-")
    # Given to the async runs alone: in a sync run they would do nothing (and fail it).
    async_only = [o for o in args.overrides if o.partition("=")[0].lstrip("+~") in ASYNC_ONLY]
    base = [
        f"run_root={root}",
        f"steps={args.steps}",
        "eval_every=0",
        "save_every=0",
        "plot=false",
        *(o for o in args.overrides if o not in async_only),
    ]
    cfg = load_config(base)
    model_dir = prepare_model(cfg, RunDir.create(root, "model"))
    if args.engine_url:
        if args.pin:
            parser.error("--pin launches the engine itself: not with --engine-url")
        return _compare(args, base, async_only, VLLMServer.attach(args.engine_url))
    cores = sorted(os.sched_getaffinity(0))
    if args.pin:
        if len(cores) < 2:
            parser.error("--pin needs at least 2 cores")
        os.sched_setaffinity(0, cores[-1:])  # inherited by the server and its children
    server = VLLMServer(
        EngineConfig(
            model=str(model_dir),
            max_model_len=cfg.engine.max_model_len,
            omp_threads=1 if args.pin else 0,  # 0 lets vLLM bind cores itself
        )
    ).start()
    if args.pin:
        os.sched_setaffinity(0, cores[:-1])
        _pin_rollout_threads(cores[-1:])
        print(
            f"engine and the collector's threads pinned to core {cores[-1]}; "
            f"trainer on {cores[:-1]}"
        )
    try:
        return _compare(args, base, async_only, server)
    finally:
        server.stop()


ROLLOUT_THREADS = ("vime-rollouts", "vime-env")  # vime.rl.rollouts, vime.agents.collector


def _pin_rollout_threads(cores: list[int]) -> None:
    """Keep the collector's threads (the rollout event loop and the env calls) on
    ``cores``, beside the engine, as rollout workers on their own devices would be: a
    watcher pins each such thread once it appears (Linux affinity is per thread)."""

    def watch() -> None:
        pinned: set[int] = set()
        while True:
            for t in threading.enumerate():
                tid = t.native_id  # None until the thread runs
                if t.name.startswith(ROLLOUT_THREADS) and tid is not None and tid not in pinned:
                    with contextlib.suppress(OSError):  # the thread ended meanwhile
                        os.sched_setaffinity(tid, cores)
                        pinned.add(tid)
            time.sleep(0.2)

    threading.Thread(target=watch, name="bench-pinner", daemon=True).start()


def _compare(
    args: argparse.Namespace, base: list[str], async_only: list[str], server: VLLMServer
) -> int:
    """Alternate sync and async runs on ``server`` (``async_only``: overrides of the async
    runs alone); print the medians and ratios."""
    results: dict[str, list[dict[str, float]]] = {"sync": [], "async": []}
    totals: dict[str, list[float]] = {"sync": [], "async": []}  # whole runs, step 1 included
    last_rewards: dict[str, list[float]] = {"sync": [], "async": []}
    for _ in range(args.rounds):
        for mode in ("sync", "async"):
            own = async_only if mode == "async" else []
            rows = train(
                load_config([*base, f"engine.url={server.url}", f"rollout.mode={mode}", *own])
            ).metrics
            # The first step of a run has nothing to overlap with: measure the steady state.
            results[mode].extend(rows[1:])
            totals[mode].append(sum(r["time/step_s"] for r in rows))
            last_rewards[mode].append(rows[-1]["reward/mean"])

    print(f"\nsteady-state medians over {args.rounds} runs × {args.steps - 1} steps per mode")
    print(f"{'mode':<6}" + "".join(f"{k.split('/')[1]:>12}" for k in KEYS) + f"{'reward':>10}")
    medians: dict[str, dict[str, float]] = {}
    for mode, rows in results.items():
        medians[mode] = {k: statistics.median(r[k] for r in rows) for k in KEYS}
        reward = statistics.mean(r["reward/mean"] for r in rows)
        print(
            f"{mode:<6}" + "".join(f"{medians[mode][k]:>11.2f}s" for k in KEYS) + f"{reward:>10.3f}"
        )
    print(f"\n{'sync':<6}" + "".join(f"{k.split('/')[1]:>14}" for k in SYNC_KEYS))
    for mode, rows in results.items():
        cells = [statistics.median(r.get(k, float("nan")) for r in rows) for k in SYNC_KEYS]
        print(f"{mode:<6}" + "".join(f"{c:>13.2f}s" for c in cells))
    ratio = medians["async"]["time/step_s"] / medians["sync"]["time/step_s"]
    print(f"\nasync / sync wall time per step: {ratio:.2f}× (speed-up {1 / ratio:.2f}×)")
    whole = statistics.median(totals["async"]) / statistics.median(totals["sync"])
    print(f"async / sync wall time of a whole {args.steps}-step run: {whole:.2f}×")
    for mode in ("sync", "async"):
        print(
            f"{mode} reward at step {args.steps} (mean of runs): {statistics.mean(last_rewards[mode]):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
