"""The shared rollout store on a real PostgreSQL server: leases, guarded writes, claims,
and a server killed with SIGKILL and started again."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.store._server import kill_server
from vime.errors import DataError
from vime.store.postgres import PgStore, RunSpec
from vime.types import Episode

ROOT = Path(__file__).resolve().parents[2]


def _store(url: str) -> PgStore:
    store = PgStore(url, f"test-{uuid.uuid4().hex[:8]}")
    store.register(RunSpec("steps: 2", "/model", ["http://127.0.0.1:1"], 0))
    return store


def _group(task_id: str, n: int = 2) -> list[Episode]:
    return [
        Episode(task_id, "e", [1, 2], [0, 1], [0.0, -0.5], group_id=f"g-{task_id}", sample_index=i)
        for i in range(n)
    ]


def test_a_task_is_leased_to_one_worker_until_its_lease_expires(store_url):
    store = _store(store_url)
    store.publish([(1, {"id": "a"}), (2, {"id": "b"}), (3, {"id": "c"})])
    store.publish([(1, {"id": "a"})])  # published again (a resumed trainer): no new task
    assert store.open_tasks() == 3
    assert store.lease("w1", 2, lease_s=0.5) == [(1, {"id": "a"}), (2, {"id": "b"})]
    assert store.lease("w2", 5, lease_s=30) == [(3, {"id": "c"})]  # the rest only
    assert store.lease("w2", 5, lease_s=30) == []
    time.sleep(0.8)  # w1's leases expire: the next worker that asks gets its tasks
    assert [d for d, _ in store.lease("w2", 5, lease_s=30)] == [1, 2]
    assert store.renew("w1", [1, 2], lease_s=30) == 0  # w1 holds nothing any more
    assert store.renew("w2", [1, 2, 3], lease_s=30) == 3


def test_a_worker_whose_lease_was_taken_over_writes_nothing(store_url):
    store = _store(store_url)
    store.publish([(1, {"id": "a"})])
    store.lease("w1", 1, lease_s=0.2)
    time.sleep(0.4)
    store.lease("w2", 1, lease_s=30)
    assert store.complete("w1", 1, _group("a")) is False  # too late: w2 plays it
    assert store.ready() == []
    assert store.complete("w2", 1, _group("a")) is True
    # The same write again (its commit's answer lost, say): found, not written twice.
    assert store.complete("w2", 1, _group("a")) is True
    (group,) = store.ready()
    assert (group.draw, group.task_id, group.producer, len(group.episodes)) == (1, "a", "w2", 2)
    assert store.open_tasks() == 0


def test_each_group_is_claimed_by_one_step_all_or_nothing(store_url):
    store = _store(store_url)
    store.publish([(d, {"id": f"t{d}"}) for d in (1, 2, 3)])
    store.lease("w", 3, lease_s=30)
    written = {d: _group(f"t{d}") for d in (1, 2, 3)}
    for d, episodes in written.items():
        store.complete("w", d, episodes)
    first = store.ready()
    assert [g.draw for g in store.ready(known=[1, 2])] == [1, 2, 3]
    assert [len(g.episodes) for g in store.ready(known=[1, 2])] == [0, 0, 2]  # not fetched again
    assert first[0].episodes[1].to_dict() == written[1][1].to_dict()  # exact round trip
    store.claim([1, 2], step=1)
    store.claim([1, 2], step=1)  # the same step again (a retry): fine
    with pytest.raises(DataError, match="step 2 could claim 1 of 2 groups"):
        store.claim([2, 3], step=2)
    assert [g.draw for g in store.ready()] == [3]  # the refused claim took nothing
    assert [g.draw for g in store.claimed(1)] == [1, 2]
    store.release([2])
    assert [g.draw for g in store.ready()] == [2, 3]


def test_the_run_spec_version_and_end_reach_the_workers(store_url):
    store = _store(store_url)
    worker_view = PgStore(store_url, store.run)
    assert worker_view.version() == 0
    store.set_version(4)
    assert worker_view.version() == 4
    store.finish()
    spec = worker_view.spec()
    assert spec is not None and spec.finished and spec.engines == ["http://127.0.0.1:1"]
    assert PgStore(store_url, "no-such-run").spec() is None


def test_a_wrong_store_url_names_the_key():
    with pytest.raises(Exception, match=r"rollout.store='redis://x': expected a PostgreSQL URL"):
        PgStore("redis://x", "r")


def test_acknowledged_groups_survive_the_server_killed(tmp_path):
    """Its own server (the shared one serves other tests): SIGKILL the postmaster and its
    backends, start it again; the next call reconnects and finds every acknowledged group."""
    folder = Path(tempfile.mkdtemp(prefix="vime-pg-"))
    folder.chmod(0o755)  # the server runs as the postgres user
    with socket.socket() as probe:  # a free port for its own server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "VIME_RUN_DIR": str(folder), "VIME_PG_PORT": str(port)}
    script = ["bash", str(ROOT / "scripts" / "postgres.sh")]
    url = subprocess.run([*script, "start"], env=env, check=True, capture_output=True, text=True)
    try:
        store = _store(url.stdout.strip().splitlines()[-1])
        store.publish([(d, {"id": f"t{d}"}) for d in range(1, 6)])
        store.lease("w", 5, lease_s=60)
        acked = [d for d in range(1, 6) if store.complete("w", d, _group(f"t{d}"))]
        assert acked == [1, 2, 3, 4, 5]
        kill_server(folder)
        subprocess.run([*script, "start"], env=env, check=True, capture_output=True)
        assert [g.draw for g in store.ready()] == acked  # reconnected; nothing lost
        assert store.open_tasks() == 0
    finally:
        subprocess.run([*script, "stop"], env=env, check=False)
        shutil.rmtree(folder, ignore_errors=True)
