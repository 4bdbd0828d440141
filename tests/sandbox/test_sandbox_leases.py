"""Pooled leases (what the envs use) against the real dockerd: warm reuse, wiped on
return, growth up to pool_max, the per-host limit, the per-step figures, and the cold
path when the pool is off."""

from __future__ import annotations

import threading
import time

import pytest

from vime.observability.step_metrics import step_figures
from vime.sandbox.leases import close_pools, host_label, lease, pool_for, take_figures

pytestmark = pytest.mark.docker


def test_leases_reuse_wiped_sandboxes_grow_to_the_limit_and_report_figures(
    sandbox_config, docker_host
):
    cfg = sandbox_config(pool_warm=1, pool_max=3, per_host_limit=2)
    take_figures()  # start counting here
    try:
        pool_for(cfg).wait_ready(60)
        first = lease(cfg)
        first.exec("echo secret > /workspace/s", timeout=10)
        sid = first.sandbox.id
        first.close()
        first.close()  # twice is harmless
        # Back warm and wiped: first's container is idle again, without the last episode's
        # file, beside the spare the pool started when first was leased. Which of the two
        # was idle first depends on the machine's load (a CI run once leased the spare), so
        # both are leased and the reused one is looked at.
        deadline = time.monotonic() + 30
        while pool_for(cfg).stats()["idle"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        again, second = lease(cfg), lease(cfg)
        reused = again if again.sandbox.id == sid else second
        assert reused.sandbox.id == sid, (sid, again.sandbox.id, second.sandbox.id)
        assert reused.exec("ls -A /workspace", timeout=10).stdout == ""
        # Demand grows the pool, but one host holds at most per_host_limit (2) of it:
        # a third lease waits until one comes back.
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(lease(cfg)))
        waiter.start()
        waiter.join(1.5)
        assert waiter.is_alive() and pool_for(cfg).stats()["per_host"] == {docker_host: 2}
        second.close()
        waiter.join(30)
        assert got and got[0].sandbox.id == second.sandbox.id
        got[0].close()
        again.close()
        figures = step_figures([], 0, {}, [take_figures])  # what the loop's recorder adds
        assert figures["sandbox/acquires"] == 4.0 and figures["sandbox/failures"] == 0.0
        assert figures["sandbox/execs"] == 2.0 and figures["sandbox/exec_s"] > 0
        assert figures[f"sandbox/leases/{host_label(docker_host)}"] == 4.0
        assert figures["sandbox/hosts"] == 1.0 and take_figures() == {}
    finally:
        close_pools()


def test_pool_off_gives_a_cold_container_removed_on_close(sandbox_config, docker_host):
    from vime.sandbox.client import docker_client

    cfg = sandbox_config(pool=False, labels={"vime.test": "cold-lease"})
    sb = lease(cfg)
    assert sb.exec("echo hi", timeout=10).stdout == "hi\n"
    sb.close()
    left = docker_client(docker_host).api.containers(
        all=True, filters={"label": "vime.test=cold-lease"}
    )
    assert left == []


def test_a_process_that_exits_with_pooled_sandboxes_removes_them_quietly(base_image, docker_host):
    """At interpreter exit no new thread may start: the pools' exit hook must still remove
    every sandbox (one leased, one warm), with no traceback on stderr."""
    import subprocess
    import sys

    from vime.sandbox.client import docker_client

    program = (
        "from vime.sandbox import SandboxConfig\n"
        "from vime.sandbox.leases import lease, pool_for\n"
        f"cfg = SandboxConfig(image={base_image!r}, timeout=30.0, pool_warm=2, pool_max=2,"
        " labels={'vime.test': 'exit-hook'})\n"
        "pool_for(cfg).wait_ready(60)\n"
        "held = lease(cfg)\n"
        "assert held.exec('echo hi', timeout=10).stdout == 'hi\\n'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    left = docker_client(docker_host).api.containers(
        all=True, filters={"label": "vime.test=exit-hook"}
    )
    assert left == []
