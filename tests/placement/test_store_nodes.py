"""Rollout workers on another "machine": the trainer, its engine and the store's PostgreSQL
server in one network namespace, a ``vime-agent rollout`` worker in another, joined by a
veth pair; ``env=math`` trains 3 steps on what the worker plays through the run's
``rollout.generate`` function (docs/scaling.md, Rollout workers and a shared rollout
store). A ``vime-agent store-watch`` on the worker's node
follows the trained steps as a second consumer. The server is SIGKILLed after step 1 and
started again: every process reconnects and the run completes with every group.

The worker reaches the store and the engine only by node 0's address: the server listens
there (``VIME_PG_LISTEN``), and the engine too (``engine.host``). Needs root and ``ip``
(iproute2); skipped where namespaces cannot be made.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests._train import quick_train
from tests.faults._faults import rows, wait_for
from tests.placement.multinode import ROOT
from tests.store._server import kill_server
from vime.buffer import DataBuffer

pytestmark = [pytest.mark.slow, pytest.mark.engine]

STEPS = 3
MARKED = """
from vime.agents.generate import play_env


async def generate(ctx):
    episode = await play_env(ctx)
    episode.metadata["played_by"] = "marked.py"
    return episode
"""


def _wait_for_run(run_root: Path, proc, timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        runs = [p for p in run_root.glob("*") if (p / "config.yaml").exists()]
        if runs:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError("the trainer made no run folder")


def test_a_worker_on_another_node_plays_every_step(nodes, tiny_model_dir, tmp_path):
    addr = nodes.addrs[0]
    store_dir = Path(tempfile.mkdtemp(prefix="vime-pg-"))
    store_dir.chmod(0o755)  # the server runs as the postgres user
    server_env = {"VIME_RUN_DIR": str(store_dir), "VIME_PG_PORT": "55432", "VIME_PG_LISTEN": addr}
    script = ["bash", str(ROOT / "scripts" / "postgres.sh")]
    started = nodes.run(0, [*script, "start"], env=server_env, timeout=120)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip().splitlines()[-1]
    assert f"@{addr}:" in url  # what the other node is given
    marked = tmp_path / "marked.py"  # the run's generation function: the worker plays it
    marked.write_text(MARKED)
    run_root = tmp_path / "runs"
    args = quick_train(
        None,
        run_root,
        f"steps={STEPS}",
        f"rollout.store={url}",
        f"engine.host={addr}",
        "rollout.store_lease_s=5",  # a lease whose answer the crash lost expires soon
        f"rollout.generate={marked}:generate",
        "rollout.collector.sampling.max_tokens=16",
        batch=4,
        samples=2,
    )
    python = [sys.executable, "-m", "vime.cli"]
    trainer = nodes.spawn(0, [*python, "train", *args], tmp_path / "train.log")
    worker = watcher = None
    try:
        run = _wait_for_run(run_root, trainer, 120)
        worker = nodes.spawn(
            1, [*python, "rollout", f"store={url}", f"run={run.name}"], tmp_path / "worker.log"
        )
        # A second consumer on the worker's node: it follows the trained steps, takes nothing.
        watcher = nodes.spawn(
            1, [*python, "store-watch", f"store={url}", f"run={run.name}"], tmp_path / "watch.log"
        )
        # The store's server crashes once step 1 is trained and comes back: the trainer,
        # the worker and the watcher reconnect; nothing acknowledged is lost.
        wait_for("step 1's metrics", lambda: len(rows(run)) >= 1, 300)
        kill_server(store_dir)
        restarted = nodes.run(0, [*script, "start"], env=server_env, timeout=120)
        assert restarted.returncode == 0, restarted.stderr
        assert trainer.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-4000:]
        assert worker.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-4000:]
        assert watcher.wait(timeout=60) == 0, (tmp_path / "watch.log").read_text()[-4000:]
    finally:
        for proc in (trainer, worker, watcher):
            if proc is not None and proc.poll() is None:
                proc.kill()
        nodes.run(0, [*script, "stop"], env=server_env)
        shutil.rmtree(store_dir, ignore_errors=True)
    buffer = DataBuffer(run, readonly=True)
    assert buffer.steps() == list(range(1, STEPS + 1))
    for step in buffer.steps():
        played = buffer.read_step(step)
        assert len(played) == 4 * 2
        assert {ep.metadata.get("played_by") for ep in played} == {"marked.py"}
    worker_log = (tmp_path / "worker.log").read_text()
    assert f"playing run {run.name}" in worker_log
    # Every group trained came from the worker: the trainer publishes one step's tasks at a
    # time in sync mode, so the worker played exactly those.
    assert f"the run ended; {STEPS * 4} groups written" in worker_log
    watched = [w for w in (tmp_path / "watch.log").read_text().splitlines() if w.startswith("step")]
    assert [w.split(":")[0] for w in watched] == [f"step {s}" for s in range(1, STEPS + 1)]
    assert all(": 4 groups (" in w for w in watched), watched
