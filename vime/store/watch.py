"""``vime-agent store-watch store=URL run=NAME``: follow a run's trained groups in its
rollout store, live, without taking anything from the trainer.

A second consumer of the store: it reads what each step claimed (``PgStore.claimed``) and
prints one line per step as the trainer takes it, until the run ends: the groups, which
worker played them, the weight versions they were sampled at, and the mean reward.

Example:
    >>> line(3, [StoredGroup(7, "t7", "w1", 1, 2, [])])
    'step 3: 1 groups (w1: 1), versions v1-v2, reward -'
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass

from vime.config import apply_overrides, field_names, require
from vime.store.postgres import PgStore, StoredGroup

USAGE = """usage: vime-agent store-watch store=URL run=RUN_NAME [follow=false]

Print each trained step of a run from its rollout store (rollout.store). Keys:
"""


@dataclass
class WatchConfig:
    """What ``vime-agent store-watch`` follows.

    Example:
        >>> WatchConfig(store="postgresql://h/vime", run="r").follow
        True
    """

    store: str = ""  # the PostgreSQL URL the trainer's rollout.store names
    run: str = ""  # the run's name: its folder's name
    # wait for the run and its new steps until it ends (Ctrl-C stops); false: print what is there
    follow: bool = True
    poll_s: float = 1.0  # how often a follower looks for new steps


def line(step: int, groups: list[StoredGroup]) -> str:
    """One step's summary (see the module docstring)."""
    producers = ", ".join(
        f"{p}: {n}" for p, n in sorted(Counter(g.producer for g in groups).items())
    )
    rewards = [ep.reward for g in groups for ep in g.episodes]
    reward = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
    low = min((g.min_version for g in groups), default=0)
    high = max((g.max_version for g in groups), default=0)
    return (
        f"step {step}: {len(groups)} groups ({producers}), versions v{low}-v{high}, reward {reward}"
    )


def watch(store: PgStore, *, follow: bool, poll_s: float) -> int:
    """Print every step not printed yet; with ``follow``, until the run ends. Returns the
    number of steps printed."""
    shown: set[int] = set()
    while True:
        spec = store.spec()
        for step in store.steps():
            if step not in shown:
                print(line(step, store.claimed(step)), flush=True)
                shown.add(step)
        if not follow or (spec is not None and spec.finished):
            return len(shown)
        time.sleep(poll_s)  # (a run not registered yet: its trainer is still starting)


def main(argv: list[str] | None = None) -> int:
    """Run ``vime-agent store-watch``; the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE + "".join(f"  {k}\n" for k in field_names(WatchConfig())), end="")
        return 0
    cfg = apply_overrides(WatchConfig(), argv)
    require(bool(cfg.store), "store", "give the run's rollout store URL (store=URL)")
    require(bool(cfg.run), "run", "give the run's name (its folder's name: run=NAME)")
    store = PgStore(cfg.store, cfg.run)
    try:
        if store.spec() is None:
            waiting = "; waiting for its trainer" if cfg.follow else ""
            print(f"store-watch: no run {cfg.run!r} in {cfg.store} yet{waiting}", file=sys.stderr)
        watch(store, follow=cfg.follow, poll_s=cfg.poll_s)
    finally:
        store.close()
    return 0
