"""SandboxPool against the real dockerd: warm acquire, reset, replacement, bounds, hosts, asyncio."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import pytest

from vime.errors import SandboxError
from vime.sandbox import ImagePools, SandboxPool, build_layered_image
from vime.sandbox.pool import PROBE_AFTER_S

pytestmark = pytest.mark.docker


def test_pool_acquire_release_reset_and_bounds(sandbox_config):
    with SandboxPool(sandbox_config(), size=2) as pool:
        pool.wait_ready(60)
        t0 = time.monotonic()
        a = pool.acquire(timeout=5)
        assert time.monotonic() - t0 < 0.25  # warm: no container start (that takes 0.3-1 s)
        b = pool.acquire(timeout=5)
        assert a is not b and a.alive and b.alive
        with pytest.raises(SandboxError, match=r"no sandbox free within 0\.2s"):
            pool.acquire(timeout=0.2)  # bounded: both are leased
        a.exec("echo secret > /workspace/s; (sleep 300 > /dev/null 2>&1 &)", timeout=10)
        pool.release(a)  # reset in the background
        again = pool.acquire(timeout=10)
        assert again is a  # the same container, reused ...
        # ... and clean: no files, and no process but PID 1 (python init) and the lister.
        lister = "import os; print(sorted(open(f'/proc/{p}/cmdline').read()[:7] for p in os.listdir('/proc') if p.isdigit()))"
        assert again.exec("ls -A /workspace", timeout=10).stdout == ""
        assert (
            again.exec(["python3", "-c", lister], timeout=10).stdout == "['python3', 'python3']\n"
        )
        pool.release(again)
        pool.release(b, reset=False)
        with pytest.raises(SandboxError, match="not acquired from this pool"):
            pool.release(b)
        assert pool.stats()["created"] == 2


def test_pool_replaces_dead_sandbox(sandbox_config):
    with SandboxPool(sandbox_config(), size=1) as pool:
        sb = pool.acquire(timeout=60)
        sb._api.kill(sb.id)  # killed from outside
        with pytest.raises(SandboxError):
            sb.exec("sleep 1", timeout=10)
        pool.release(sb)
        fresh = pool.acquire(timeout=60)
        assert fresh is not sb and fresh.exec("echo ok", timeout=10).stdout == "ok\n"
        pool.release(fresh)
        stats = pool.stats()
        assert stats["discarded"] == 1 and stats["created"] == 2


def _containers_of_run(pool: SandboxPool) -> int:
    """The containers labelled with the pool's run id that docker still has."""
    from vime.sandbox.client import docker_client

    labels = [f"vime.run={pool.config.run_id}"]
    return len(docker_client(pool.hosts[0]).api.containers(all=True, filters={"label": labels}))


def test_pool_refills_ahead_and_shrinks_back_to_warm(sandbox_config):
    """warm=2 of size 6: each acquire starts a replacement, so the next one finds a warm
    sandbox (no container start on its clock); once all are back and idle for idle_s,
    the pool removes those above warm, and their containers are gone."""
    config = sandbox_config(run_id=f"pytest-shrink-{uuid.uuid4().hex[:8]}")  # its own count
    with SandboxPool(config, size=6, warm=2, idle_s=1.5) as pool:
        pool.wait_ready(60)
        leased = []
        for _ in range(4):
            pool.wait_ready(60)  # the replacements the last acquire started
            t0 = time.monotonic()
            leased.append(pool.acquire(timeout=30))
            assert time.monotonic() - t0 < 0.25  # warm each time: started ahead
        pool.wait_ready(60)
        assert pool.stats()["idle"] == 2 and pool.stats()["leased"] == 4  # 6 alive
        for sb in leased:
            pool.release(sb)
        deadline = time.monotonic() + 30
        while pool.stats()["shrunk"] < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        stats = pool.stats()
        assert (stats["shrunk"], stats["idle"], stats["leased"]) == (4, 2, 0), stats
        assert sum(stats["per_host"].values()) == 2
        # Removal is a kill; docker then removes the auto-remove container (under load, a
        # while later).
        deadline = time.monotonic() + 30
        while _containers_of_run(pool) > 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _containers_of_run(pool) == 2


def test_pool_replaces_an_idle_sandbox_whose_container_died(sandbox_config):
    # Killed while idle (as a daemon restart does to every idle container): the next
    # acquire probes it, finds it gone and hands out a fresh one instead of failing.
    with SandboxPool(sandbox_config(), size=1) as pool:
        sb = pool.acquire(timeout=60)
        pool.release(sb)
        pool.wait_ready(60)
        sb._api.kill(sb.id)
        time.sleep(PROBE_AFTER_S)
        fresh = pool.acquire(timeout=60)
        assert fresh is not sb and not sb.alive
        assert fresh.exec("echo ok", timeout=10).stdout == "ok\n"
        pool.release(fresh)
        assert pool.stats()["discarded"] == 1


def test_pool_threads_and_two_hosts(sandbox_config, docker_host, tmp_path):
    # Two URLs of one daemon (a symlink to its socket): the pool's bookkeeping per host
    # URL and its threads. Two real daemons, one dying: tests/faults/test_sandbox_hosts.py.
    link = tmp_path / "second.sock"
    os.symlink(docker_host.removeprefix("unix://"), link)
    hosts = [docker_host, f"unix://{link}"]
    with SandboxPool(sandbox_config(docker_hosts=hosts), size=4) as pool:
        pool.wait_ready(60)
        assert pool.stats()["per_host"] == {hosts[0]: 2, hosts[1]: 2}
        results: list[str] = []
        errors: list[BaseException] = []

        def episode(i: int) -> None:
            try:
                with pool.session(timeout=60) as sb:
                    sb.write_file("/workspace/i", str(i))
                    results.append(sb.exec("cat /workspace/i", timeout=10).stdout)
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=episode, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and sorted(results, key=int) == [str(i) for i in range(12)]
        assert {sb.host for sb in list(pool._idle)} <= set(hosts)


def test_pool_from_asyncio(sandbox_config):
    async def main(pool: SandboxPool) -> list[str]:
        async def one(i: int) -> str:
            async with pool.session_async(timeout=60) as sb:
                res = await pool.run_async(sb.exec, f"echo {i}", timeout=10)
                return res.stdout.strip()

        return await asyncio.gather(*(one(i) for i in range(6)))

    with SandboxPool(sandbox_config(), size=3) as pool:
        assert asyncio.run(main(pool)) == [str(i) for i in range(6)]


def test_pool_reports_start_failures(sandbox_config):
    with (
        SandboxPool(sandbox_config(image="vime/does-not-exist:1"), size=1) as pool,
        pytest.raises(SandboxError, match=r"image not found|No such image"),
    ):
        pool.acquire(timeout=1.5)


def test_image_pools_keep_one_warm_pool_per_image(base_image, sandbox_config):
    task_image = build_layered_image(base_image, {"/task/id": "task-1"})
    with ImagePools(sandbox_config(), size_per_image=1, max_images=1) as pools:
        a = pools.acquire(base_image, timeout=60)
        b = pools.acquire(task_image, timeout=60)  # a second image: its own pool
        assert b.read_file("/task/id") == b"task-1" and a.image == base_image
        pools.release(a)
        pools.release(b)
        c = pools.acquire(task_image, timeout=60)  # over max_images: the idle base pool went
        assert c is b and list(pools._pools) == [task_image]
        pools.release(c)
        pools.release(a)  # its pool is gone: closed, not an error
        assert not a.alive
