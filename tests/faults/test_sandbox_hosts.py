"""Pooled sandboxes over two real docker daemons (the shared one and a second dockerd of
the project's own, ``second_daemon`` in conftest.py): vime/Tools-v0 episodes through the Collector
with a scripted policy spread over both (at most ``per_host_limit`` per host), and a
daemon that dies mid-step: its episodes end ``error`` with the reason, the others
complete, the host is taken out of rotation, and is used again once it is back. No
container is left on either daemon. And docs/sandboxes.md's two-daemon recipe (the block
marked ``hosts 2``), run as one script: its own second daemon, a one-step SWE training run
over both.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import uuid
from typing import Any

import pytest

from tests.docs.blocks import ROOT, all_blocks
from tests.docs.test_code_blocks import shortened
from tests.faults._faults import wait_for
from tests.faults._sandbox_episodes import collect, labelled, running
from vime.sandbox import SandboxConfig, base_image_tag
from vime.sandbox.leases import close_pools, host_label, pool_for, take_figures
from vime.types import EpisodeStatus

pytestmark = pytest.mark.docker

# Sleepers hold their sandbox long enough to be seen on their host; quick ones don't.
SCRIPT: dict[str, str | None] = {
    **{f"sleep{i}": "import subprocess\nsubprocess.run(['sleep', '7'])\n" for i in range(8)},
    **{f"quick{i}": "print(6 * 7)\n" for i in range(8)},
}
SLEEPERS = [f"sleep{i}" for i in range(8)]
QUICK = [f"quick{i}" for i in range(8)]


@pytest.fixture
def two_daemons(docker_host, second_daemon):
    """(the shared host, the second daemon of conftest.py): both hold the base image."""
    return docker_host, second_daemon


def _config(tag: str, hosts: list[str]) -> SandboxConfig:
    return SandboxConfig(
        image=base_image_tag(),
        memory="128m",
        timeout=60.0,
        docker_hosts=hosts,
        pool_warm=2,
        pool_max=8,
        per_host_limit=4,
        labels={"vime.test": tag},
        run_id=f"pytest-hosts-{tag}",
    )


def _leases(figures: dict[str, float], host: str) -> float:
    return figures.get(f"sandbox/leases/{host_label(host)}", 0.0)


def _no_container_left(hosts: list[str], tag: str) -> None:
    for host in hosts:
        wait_for(f"no container on {host}", lambda h=host: labelled(h, tag) == [], 30, 0.5)


def test_episodes_spread_over_two_daemons(two_daemons, tok):
    a, daemon = two_daemons
    tag = uuid.uuid4().hex[:12]
    cfg = _config(tag, [a, daemon.host])
    take_figures()
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(collect(tok, SCRIPT, cfg, SLEEPERS)))
    thread.start()
    # All 8 sleep at once, 4 on each daemon (the per-host limit is 4).
    wait_for(
        "4 sleepers per daemon",
        lambda: [len(running(h, tag, "sleep 7")) for h in (a, daemon.host)] == [4, 4],
        60,
    )
    thread.join(60)
    assert [(ep.status, ep.reward) for ep in out[0]] == [(EpisodeStatus.COMPLETED, 1.0)] * 8
    figures = take_figures()
    assert (_leases(figures, a), _leases(figures, daemon.host)) == (4.0, 4.0)
    # Each episode says which daemon its sandbox ran on: 1.0 for that host, 0.0 for the other.
    keys = [f"sandbox_host/{host_label(h)}" for h in (a, daemon.host)]
    shares = [[ep.metrics[k] for k in keys] for ep in out[0]]
    assert sorted(shares) == [[0.0, 1.0]] * 4 + [[1.0, 0.0]] * 4, shares
    assert figures["sandbox/hosts"] == 2.0 and figures["sandbox/failures"] == 0.0
    _no_container_left([a, daemon.host], tag)


def test_a_daemon_dying_mid_step(two_daemons, tok):
    a, daemon = two_daemons
    b = daemon.host
    tag = uuid.uuid4().hex[:12]
    cfg = _config(tag, [a, b])
    try:
        out: list[Any] = []
        run = lambda keys: collect(tok, SCRIPT, cfg, keys, keep_pools=True)  # noqa: E731
        thread = threading.Thread(target=lambda: out.append(run(SLEEPERS)))
        thread.start()
        wait_for(
            "4 sleepers per daemon",
            lambda: [len(running(h, tag, "sleep 7")) for h in (a, b)] == [4, 4],
            60,
        )
        daemon.stop()  # dockerd goes away mid-step, with 4 episodes' sandboxes on it
        thread.join(60)
        assert not thread.is_alive(), "the collection hung after a daemon died"
        failed = [ep for ep in out[0] if ep.status is EpisodeStatus.ERROR]
        done = [ep for ep in out[0] if ep.status is EpisodeStatus.COMPLETED and ep.reward == 1.0]
        assert (len(failed), len(done)) == (4, 4), [(ep.status, ep.reason) for ep in out[0]]
        for ep in failed:
            assert "SandboxError" in ep.reason and b.removeprefix("unix://") in ep.reason, ep.reason
        # Out of rotation: the next episodes all run on the live daemon.
        pool = pool_for(cfg)
        wait_for("the dead daemon out of rotation", lambda: pool.stats()["hosts_down"] == [b], 30)
        take_figures()
        again = run(QUICK[:4])
        assert [ep.status for ep in again] == [EpisodeStatus.COMPLETED] * 4
        figures = take_figures()
        assert (_leases(figures, a), _leases(figures, b)) == (4.0, 0.0)
        # Back: the pool's retries put sandboxes on it again, and episodes use them.
        assert daemon.start() == b
        wait_for(
            "sandboxes on the revived daemon",
            lambda: (pool.stats()["per_host"].get(b), pool.stats()["idle"]) == (4, 8),
            60,
            0.5,
        )
        assert pool.stats()["hosts_down"] == []
        again = run(QUICK)
        assert [ep.status for ep in again] == [EpisodeStatus.COMPLETED] * 8
        assert _leases(take_figures(), b) == 4.0
    finally:
        close_pools()
        daemon.start()  # running again (a no-op when it is), for the module's other tests
    _no_container_left([a, b], tag)


def test_the_docs_two_daemon_recipe_trains(docker_host, shared_engine, tiny_model_dir, tmp_path):
    """docs/sandboxes.md's recipe, as a user runs it from the project (here a scratch
    folder whose ``scripts`` and ``.venv`` are the repository's): the project's daemon and
    a second one of its own, the base image imported there, ``env=swe`` over both (one
    step on the session's engine), the second daemon stopped. The run's preflight pinged
    both daemons (a host that does not answer stops it before step 1)."""
    (block,) = [b for b in all_blocks() if b.marker == "hosts"]
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / ".venv").symlink_to(ROOT / ".venv")
    runs = tmp_path / "runs"
    # Two turns of 32 tokens an episode: the random policy's 8 long turns only cost time.
    brief = " env.kwargs.max_turns=2 rollout.collector.sampling.max_tokens=32"
    lines = [
        shortened(line, run_root=runs, ckpt=tiny_model_dir, run=None, url=shared_engine.url) + brief
        if "vime-agent train" in line
        else line.replace("bash scripts/", f"bash {ROOT}/scripts/")
        for line in block.code.splitlines()
    ]
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    second_state = folder / ".run" / "host2"
    try:
        out = subprocess.run(
            ["bash", "-c", script],
            cwd=folder,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, f"{script}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    finally:  # stopped even when the block failed before its last line
        env = {**os.environ, "VIME_RUN_DIR": str(second_state)}
        subprocess.run(["bash", str(ROOT / "scripts" / "dockerd.sh"), "stop"], env=env)
        subprocess.Popen(["rm", "-rf", str(second_state)], start_new_session=True)
    (run,) = list(runs.iterdir())
    config = (run / "config.yaml").read_text()
    second = (second_state / "docker" / "host").read_text().strip()
    assert docker_host in config and second in config, config
    rows = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r][-1] == 1
