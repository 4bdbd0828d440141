"""The shared rollout store under real SIGKILLs: a worker mid-episode, then the trainer
mid-step, while two other workers go on producing.

One async run (4 steps) on the session's engine takes its groups from the project's
PostgreSQL server, played by ``vime-agent rollout`` processes:

1. worker w1, playing alone, is SIGKILLed while it holds leased tasks it has not finished
   (frozen once the store shows such a lease, and killed if it still holds it, so the
   kill always lands mid-episode); w2 and w3 start, and after ``rollout.store_lease_s``
   w1's tasks go to one of them;
2. the trainer is SIGKILLed mid-step 3 (``VIME_TEST_PAUSE_AT=train:3``: step 3 claimed and
   buffered, not trained) while w2 and w3 run;
3. ``resume=`` runs to the end, and w2 and w3 exit when they see the run's end.

Then: steps 1..4 once each; every step trains exactly the groups it claimed in the store
(no group lost, none trained twice, none trained by two steps); every group whole, one per
task draw (no task played beyond its samples); w1's unfinished tasks written by others; no
sample older than ``max_staleness`` versions; the trainer/rollout log-prob gap ≤ 1e-6.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import (
    ROOT,
    kill_group,
    rows,
    run_folder,
    start_train,
    tail,
    wait_for,
    wait_log,
)
from vime.buffer import DataBuffer
from vime.store.postgres import PgStore

pytestmark = [pytest.mark.slow, pytest.mark.engine]

STEPS, BATCH, SAMPLES, STALENESS = 4, 4, 2, 1


def _worker(tmp_path: Path, url: str, run: str, name: str) -> subprocess.Popen:
    log = (tmp_path / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "vime.cli", "rollout", f"store={url}", f"run={run}", f"name={name}"],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _unfinished(url: str, run: str, owner: str) -> list[int]:
    """Draws ``owner`` holds a live lease on without having written their group."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT draw FROM vime_tasks WHERE run = %s AND owner = %s AND NOT done "
            "AND lease_until > now()",
            (run, owner),
        ).fetchall()
    return sorted(int(d) for (d,) in found)


def _kill_mid_episode(proc: subprocess.Popen, url: str, run: str, owner: str) -> list[int]:
    """SIGKILL ``proc`` while it holds unfinished leases: once the store shows some, freeze
    it and look again (it may have just finished them), then kill it, or let it go on."""

    def frozen_holding() -> list[int]:
        if not _unfinished(url, run, owner):
            return []
        os.kill(proc.pid, signal.SIGSTOP)
        held = _unfinished(url, run, owner)
        if not held:
            os.kill(proc.pid, signal.SIGCONT)
        return held

    held = wait_for(f"{owner} holding a lease", frozen_holding, 240, every_s=0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return held


def test_killed_worker_and_trainer_lose_no_group_and_train_none_twice(
    shared_engine, store_url, tmp_path
):
    args = quick_train(
        shared_engine.url,
        tmp_path,
        f"steps={STEPS}",
        "save_every=1",
        "rollout.mode=async",
        f"rollout.max_staleness={STALENESS}",
        f"rollout.store={store_url}",
        "rollout.store_lease_s=3",
        "rollout.collector.sampling.max_tokens=16",
        batch=BATCH,
        samples=SAMPLES,
    )
    trainer = start_train(tmp_path, args, "train.log", VIME_TEST_PAUSE_AT="train:3")
    run = wait_for("the run folder", lambda: run_folder(tmp_path), 120)
    # w1 plays alone first: the only worker, it surely leases step 1's tasks.
    workers = {"w1": _worker(tmp_path, store_url, run.name, "w1")}
    try:
        held = _kill_mid_episode(workers["w1"], store_url, run.name, "w1")
        for name in ("w2", "w3"):  # two play on
            workers[name] = _worker(tmp_path, store_url, run.name, name)
        wait_log(trainer, tmp_path / "train.log", "vime-test: paused at train step 3", 300)
        kill_group(trainer)
        resumed = start_train(tmp_path, [*args, f"resume={run}"], "resume.log")
        assert resumed.wait(timeout=300) == 0, tail(tmp_path / "resume.log")
        for name in ("w2", "w3"):  # each saw the run's end
            assert workers[name].wait(timeout=60) == 0, tail(tmp_path / f"{name}.log")
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.kill()

    assert [r["step"] for r in rows(run)] == list(range(1, STEPS + 1))
    buffer, store = DataBuffer(run, readonly=True), PgStore(store_url, run.name)
    trained: list[str] = []
    written: dict[int, str] = {}  # draw → the worker whose group the store holds
    for step in range(1, STEPS + 1):
        episodes = buffer.read_step(step)
        groups = {ep.group_id for ep in episodes}
        claimed = store.claimed(step)
        assert groups == {ep.group_id for g in claimed for ep in g.episodes}, step
        assert len(episodes) == SAMPLES * len(claimed)  # whole groups, one per draw
        assert min(ep.min_weight_version for ep in episodes) >= step - 1 - STALENESS
        trained += groups
        written.update({g.draw: g.producer for g in claimed})
    written.update({g.draw: g.producer for g in store.ready()})
    assert set(written.values()) <= {"w1", "w2", "w3"}
    assert "w1" not in [written[d] for d in held]  # w1 died holding them: another wrote them
    assert len(trained) == len(set(trained))  # no group trained twice
    assert all(r["train/train_rollout_logprob_abs_diff"] <= 1e-6 for r in rows(run))
