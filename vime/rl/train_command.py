"""``vime-agent train``: the command line of :func:`vime.rl.loop.train`.

It composes the run's config, starts the preloaded vLLM server of a run that launches a
CPU engine (:mod:`vime.engine.preload`), and only then imports the loop: vLLM's imports
run beside vime's (the trainer's, the collector's) instead of after them.

Example:
    $ vime-agent train                       # tiny model, env=math, 40 steps
    $ vime-agent train --config-dir my_conf +experiment=short
"""

from __future__ import annotations

import logging
import os
import sys

from vime.conf.compose import describe, load_config
from vime.conf.overrides import split_config_dir
from vime.conf.train import TrainConfig
from vime.engine import preload
from vime.rl.console import quiet_library_warnings


def main(argv: list[str]) -> int:
    """``vime-agent train [--config-dir DIR] [group=option ...] [key=value ...]``."""
    config_dir, argv = split_config_dir(argv)  # a folder of the user's presets
    if any(a in ("-h", "--help") for a in argv):
        print("usage: vime-agent train [--config-dir DIR] [group=option ...] [key=value ...]\n")
        print(describe(config_dir))
        return 0
    quiet_library_warnings()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    # Rank 0 speaks for the run; the other ranks only warn.
    rank0 = os.environ.get("RANK", "0") == "0"
    logging.getLogger("vime").setLevel(logging.INFO if rank0 else logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cfg = load_config(argv, config_dir)
    if launches_one_engine_here(cfg):
        preload.begin(cfg.engine)
    from vime.rl.loop import train  # after the preload: its imports are most of a start
    from vime.rl.rollouts import STOP

    with STOP.installed():  # Ctrl-C: checkpoint the last completed step, stop the engines
        try:
            result = train(cfg)
        except KeyboardInterrupt as stop:
            print(
                f"vime-agent train: {stop.args[0] if stop.args else 'interrupted'}", file=sys.stderr
            )
            return 130
    if rank0:
        print(f"run folder: {result.run_dir}", file=sys.stderr)
    return 0


def launches_one_engine_here(cfg: TrainConfig) -> bool:
    """Whether this process, the run's only one, launches the run's engines.

    Example:
        >>> launches_one_engine_here(load_config(["engine.url=http://127.0.0.1:8000"]))
        False
    """
    external = [u for u in [cfg.engine.url, *cfg.placement.engine_urls] if u]
    one_process = os.environ.get("WORLD_SIZE", "1") == "1"
    return one_process and cfg.placement.launched_per_node(external=len(external)) > 0
