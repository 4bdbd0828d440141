"""Sandboxes for env episodes: leased from a warm pool shared by the whole process, and
the per-step sandbox figures the RL loop records.

:func:`lease` gives an env a :class:`Lease` (a :class:`~vime.sandbox.Sandbox`) from the
process's :class:`~vime.sandbox.SandboxPool` of that config (one pool per image and
limits, made on first use: ``pool_warm`` started up front, growing to ``pool_max``,
spread over ``docker_hosts``); ``Lease.close()`` gives it back, to be wiped and reused.
Per set of limits, at most :data:`MAX_IMAGES` images keep a warm pool
(:class:`~vime.sandbox.ImagePools`: the least recently used idle one is closed), so a
suite of many task images does not keep containers of every image.
With ``SandboxConfig.pool`` off the lease is a cold container, removed on close.

Every lease and exec is counted; :func:`take_figures` returns the counts since its last
call (``sandbox/acquire_s``, ``sandbox/exec_s``, ``sandbox/failures``, ``sandbox/hosts``,
``sandbox/leases/<host>`` ...), and the RL loop's recorder adds them to each step's row.

Example (the second call: nothing leased since the first):
    >>> _ = take_figures()
    >>> take_figures()
    {}
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import re
import threading
import time
from pathlib import Path
from typing import Any

from vime.errors import SandboxError
from vime.sandbox.base import ExecResult
from vime.sandbox.config import SandboxConfig
from vime.sandbox.docker import DockerSandbox
from vime.sandbox.image_pools import ImagePools
from vime.sandbox.pool import SandboxPool

# Seconds an episode waits for a sandbox when its pool is at pool_max (all leased).
ACQUIRE_TIMEOUT_S = 600.0
# Images with a warm pool at once, per set of limits (SWE suites bring one image a task).
MAX_IMAGES = 8

_pools: dict[str, ImagePools] = {}
_pools_lock = threading.Lock()


class _Counts:
    """What leases did since the last :func:`take_figures` (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acquire_s: list[float] = []
        self.exec_s: list[float] = []
        self.failures = 0
        self.per_host: collections.Counter[str] = collections.Counter()

    def take(self) -> dict[str, float]:
        with self.lock:
            acq, execs, fails, hosts = self.acquire_s, self.exec_s, self.failures, self.per_host
            self.acquire_s, self.exec_s, self.failures = [], [], 0
            self.per_host = collections.Counter()
        if not (acq or execs or fails):
            return {}
        out = {
            "sandbox/acquires": float(len(acq)),
            "sandbox/acquire_s": sum(acq) / len(acq) if acq else 0.0,
            "sandbox/acquire_s_max": max(acq, default=0.0),
            "sandbox/execs": float(len(execs)),
            "sandbox/exec_s": sum(execs) / len(execs) if execs else 0.0,
            "sandbox/failures": float(fails),
            "sandbox/hosts": float(len(hosts)),
        }
        for host, n in sorted(hosts.items()):
            out[f"sandbox/leases/{host_label(host)}"] = float(n)
        return out


_COUNTS = _Counts()


def host_label(host: str) -> str:
    """A docker host URL as a metric-key part.

    Example:
        >>> host_label("unix:///work/.run/docker/docker.sock")
        'work_.run_docker_docker.sock'
    """
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", host.split("://", 1)[-1]).strip("_")


def take_figures() -> dict[str, float]:
    """The sandbox figures since the last call (empty when no sandbox was used); see the
    module docstring. Example: ``take_figures().get("sandbox/acquire_s")``."""
    return _COUNTS.take()


class Lease:
    """One episode's sandbox: a pooled (or cold) :class:`DockerSandbox` whose ``close``
    gives it back. Calls are timed and failures counted for :func:`take_figures`; every
    other attribute is the sandbox's own.

    Example (the doctests of this module run against the project's dockerd;
    ``pool_warm=0``: the pool starts a sandbox only when one is leased):
        >>> sb = lease(SandboxConfig(pool_warm=0))
        >>> sb.exec("echo hi", timeout=5).stdout
        'hi\\n'
        >>> sb.close()  # back to the process's pool, wiped for the next lease
        >>> close_pools()
    """

    def __init__(self, sandbox: DockerSandbox, pool: SandboxPool | None) -> None:
        self.sandbox, self.pool = sandbox, pool
        self._lock = threading.Lock()
        self._returned = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)

    def _timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        except SandboxError:
            with _COUNTS.lock:
                _COUNTS.failures += 1
            raise
        finally:
            with _COUNTS.lock:
                _COUNTS.exec_s.append(time.perf_counter() - t0)

    def exec(self, cmd: str | list[str], **kwargs: Any) -> ExecResult:
        """:meth:`DockerSandbox.exec`, timed."""
        return self._timed(self.sandbox.exec, cmd, **kwargs)

    def write_file(self, path: str, data: bytes | str) -> None:
        """:meth:`DockerSandbox.write_file`, timed."""
        self._timed(self.sandbox.write_file, path, data)

    def read_file(self, path: str) -> bytes:
        """:meth:`DockerSandbox.read_file`, timed."""
        return self._timed(self.sandbox.read_file, path)

    def copy_in(self, local_dir: str | Path, remote_dir: str) -> None:
        """:meth:`DockerSandbox.copy_in`, timed."""
        self._timed(self.sandbox.copy_in, local_dir, remote_dir)

    def copy_out(self, remote_dir: str, local_dir: str | Path) -> None:
        """:meth:`DockerSandbox.copy_out`, timed."""
        self._timed(self.sandbox.copy_out, remote_dir, local_dir)

    def close(self) -> None:
        """Give the sandbox back (wiped, then reused) or remove it (no pool). Idempotent."""
        with self._lock:
            if self._returned:
                return
            self._returned = True
        if self.pool is None:
            self.sandbox.close()
        else:
            self.pool.release(self.sandbox)


def pool_for(config: SandboxConfig) -> SandboxPool:
    """The process's pool of ``config`` (made and started on first use).

    Example (one pool per config; ``pool_warm=0`` starts nothing):
        >>> cfg = SandboxConfig(pool_warm=0)
        >>> pool_for(cfg) is pool_for(cfg), pool_for(cfg).size == cfg.pool_max
        (True, True)
        >>> close_pools()
    """
    limits = dataclasses.replace(config, image="")
    with _pools_lock:
        pools = _pools.get(repr(limits))
        if pools is None:
            pools = _pools[repr(limits)] = ImagePools(
                limits,
                size_per_image=config.pool_max,
                max_images=MAX_IMAGES,
                warm=config.pool_warm,
                idle_s=config.pool_idle_s,
            )
    return pools.pool(config.image)


def _acquire(config: SandboxConfig, timeout: float) -> tuple[SandboxPool, DockerSandbox]:
    while True:
        pool = pool_for(config)
        try:
            return pool, pool.acquire(timeout)
        except SandboxError:
            # Closed between pool_for and acquire (an idle pool evicted for another
            # image): take the image's new pool.
            if not pool.closed or not _pools:
                raise


def lease(config: SandboxConfig, timeout: float = ACQUIRE_TIMEOUT_S) -> Lease:
    """A sandbox for one episode (see the module docstring); ``close()`` it when done.

    Example:
        >>> import contextlib
        >>> with contextlib.closing(lease(SandboxConfig(pool_warm=0))) as sb:
        ...     sb.exec("true", timeout=5).exit_code
        0
        >>> take_figures()["sandbox/acquires"] >= 1
        True
        >>> close_pools()
    """
    t0 = time.perf_counter()
    try:
        if config.pool:
            pool, sandbox = _acquire(config, timeout)
        else:
            pool, sandbox = None, DockerSandbox(config)
    except SandboxError:
        with _COUNTS.lock:
            _COUNTS.failures += 1
        raise
    with _COUNTS.lock:
        _COUNTS.acquire_s.append(time.perf_counter() - t0)
        _COUNTS.per_host[sandbox.host] += 1
    return Lease(sandbox, pool)


def close_pools() -> None:
    """Remove every pooled sandbox of this process (at exit, and in tests). Idempotent.

    Example:
        >>> close_pools()
    """
    with _pools_lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()


atexit.register(close_pools)
