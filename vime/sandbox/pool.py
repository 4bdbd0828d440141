"""``SandboxPool``: warm, bounded, thread- and asyncio-safe Docker sandboxes.

The pool keeps ``size`` sandboxes in total (idle + leased + being started or reset).
``acquire`` hands out a warm one (a few µs when one is idle; one that sat idle longer
than :data:`PROBE_AFTER_S` is first checked with docker, a few ms, so a container lost
to a daemon restart is replaced instead of handed out); ``release`` resets it in the
background (:meth:`DockerSandbox.reset`: every process killed, every writable place
emptied) and puts it back, or discards and replaces it when the reset fails, it died, or
its rootfs is writable (a reset cannot undo writes there). New sandboxes are spread over
the configured docker hosts, the one with the most free capacity first (at most
``config.per_host_limit`` on one host); a host where a start fails is taken out of
rotation for :data:`HOST_RETRY_S` seconds (doubling while it keeps failing), then retried.
With ``warm`` below ``size`` the pool starts ``warm`` sandboxes up front and grows ahead
of demand: each acquire starts replacements so that ``warm`` stay idle or starting (up to
``size``), and one that still finds none idle starts one more. Past ``warm`` idle ones,
sandboxes idle for ``idle_s`` are removed, so a pool that grew for a busy step shrinks
back.

From asyncio, use :meth:`SandboxPool.acquire_async` / :meth:`release_async` /
:meth:`session_async` and :meth:`run_async` for blocking sandbox calls: they run on the
pool's own threads, so ``asyncio.to_thread``'s small default executor never caps how many
sandboxes an event loop can drive at once.

Example (the doctests of this module run against the project's dockerd; the methods'
examples use ``pool``, a started ``SandboxPool(SandboxConfig(), size=1)``):
    >>> with SandboxPool(SandboxConfig(), size=1) as pool:
    ...     with pool.session(timeout=30) as sb:
    ...         sb.exec("echo hi", timeout=5).stdout
    'hi\\n'
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vime.config import require
from vime.errors import SandboxError
from vime.sandbox.docker import DockerSandbox, SandboxConfig

T = TypeVar("T")

# Idle seconds after which acquire asks docker whether the container still runs.
PROBE_AFTER_S = 1.0
# Seconds a docker host stays out of rotation after a failed start (doubles, up to 30 s).
HOST_RETRY_S = 2.0
# Most seconds between two looks for idle sandboxes to remove (see ``idle_s``).
SHRINK_EVERY_S = 1.0


class SandboxPool:
    """A bounded pool of pre-started :class:`DockerSandbox` es for one config (one image).

    ``size`` is the most sandboxes alive at once; ``warm`` of them (default: all) are
    started up front and kept idle or starting ahead of acquires; past ``warm`` idle ones,
    one idle for ``idle_s`` seconds is removed (0: never). ``workers`` threads start and reset
    sandboxes in the background.

    Example (``warm=0``: nothing is started until an acquire needs it):
        >>> pool = SandboxPool(SandboxConfig(), size=4, warm=0)
        >>> pool.stats()["idle"], pool.stats()["created"]
        (0, 0)
        >>> pool.close()
    """

    def __init__(
        self,
        config: SandboxConfig | None = None,
        size: int = 4,
        *,
        warm: int | None = None,
        idle_s: float = 0.0,
        workers: int | None = None,
        factory: Callable[[SandboxConfig, str], DockerSandbox] | None = None,
    ) -> None:
        require(size >= 1, "pool.size", f"must be >= 1, got {size}")
        self.config = config or SandboxConfig()
        self.size = size
        self.warm = size if warm is None else warm
        require(0 <= self.warm <= size, "pool.warm", f"must be in [0, size={size}], got {warm}")
        require(idle_s >= 0, "pool.idle_s", f"must be >= 0 (0 = keep), got {idle_s}")
        self.idle_s = idle_s
        self.hosts = self.config.hosts()
        self._host_failures: collections.Counter[str] = collections.Counter()
        self._down_until: dict[str, float] = {}
        self._factory = factory or (lambda cfg, host: DockerSandbox(cfg, host=host))
        self._cond = threading.Condition()
        self._idle: collections.deque[DockerSandbox] = collections.deque()
        self._idle_since: dict[DockerSandbox, float] = {}
        self._leased: set[DockerSandbox] = set()
        self._pending = 0  # sandboxes being started or reset (they count towards size)
        self._waiters = 0  # acquire calls waiting for a sandbox
        self._per_host: collections.Counter[str] = collections.Counter()
        self._rr = itertools.count()
        self._closed = False
        self._stop = threading.Event()
        self._failures = 0
        self._last_error: str | None = None
        self.created = 0
        self.discarded = 0
        self.shrunk = 0  # idle sandboxes above warm removed after idle_s
        self._workers = ThreadPoolExecutor(
            max_workers=workers or min(size, 8), thread_name_prefix="vime-pool"
        )
        # For the async wrappers: one thread per sandbox, plus room for waiters.
        self._async_threads = ThreadPoolExecutor(
            max_workers=size + 4, thread_name_prefix="vime-pool-async"
        )
        if self.config.image and len(set(self.hosts)) > 1:
            # A task image built on one host must exist on all of them (no registry).
            from vime.sandbox.images import distribute_image

            distribute_image(self.config.image, self.hosts)
        with self._cond:
            for _ in range(self.warm):
                self._spawn_locked()
        if self.idle_s > 0 and self.warm < size:
            threading.Thread(target=self._shrink_loop, name="vime-pool-shrink", daemon=True).start()

    # -- background work -------------------------------------------------------------

    def _pick_host_locked(self) -> str | None:
        """The host with the most free capacity, hosts out of rotation last; ties go
        round-robin so equal hosts fill evenly. None when every host is at its limit."""
        limit = self.config.per_host_limit or self.size
        now = time.monotonic()
        free = {h: limit - self._per_host[h] for h in self.hosts if self._per_host[h] < limit}
        if not free:
            return None
        up = [h for h in free if self._down_until.get(h, 0.0) <= now]
        # Every host down: the soonest back gets the start (its backoff paces the tries).
        candidates = up or [min(free, key=lambda h: self._down_until[h])]
        most = max(free[h] for h in candidates)
        tied = [h for h in candidates if free[h] == most]
        return tied[next(self._rr) % len(tied)]

    def _spawn_locked(self) -> bool:
        host = self._pick_host_locked()
        if host is None:
            return False
        self._pending += 1
        self._per_host[host] += 1
        self._workers.submit(self._create, host)
        return True

    def _create(self, host: str) -> None:
        with self._cond:
            if self._closed:  # queued before close(): nothing to start
                self._pending -= 1
                self._per_host[host] -= 1
                return
        try:
            sb = self._factory(self.config, host)
        except Exception as err:  # keep the pool alive: record, back off, try again
            with self._cond:
                self._pending -= 1
                self._per_host[host] -= 1
                self._failures += 1
                self._last_error = f"{type(err).__name__}: {err}"
                self._host_failures[host] += 1  # out of rotation a while (see HOST_RETRY_S)
                backoff = HOST_RETRY_S * 2 ** min(self._host_failures[host] - 1, 5)
                self._down_until[host] = time.monotonic() + min(30.0, backoff)
                delay = min(5.0, 0.25 * 2 ** min(self._failures, 5))
                self._cond.notify_all()
            if not self._stop.wait(delay):
                with self._cond:
                    if not self._closed and self._live_locked() < self.size:
                        self._spawn_locked()
            return
        with self._cond:
            self._pending -= 1
            self._failures = 0
            self._host_failures.pop(host, None)
            self._down_until.pop(host, None)
            self.created += 1
            if self._closed:
                self._per_host[host] -= 1
            else:
                self._put_idle_locked(sb)
                self._cond.notify()
                return
        sb.close()

    def _reset(self, sb: DockerSandbox) -> None:
        try:
            ok = sb.config.read_only  # else a fresh container replaces it
            if ok:
                sb.reset()
                ok = sb.alive
        except Exception as err:
            ok = False
            with self._cond:
                self._last_error = f"reset failed: {err}"
        with self._cond:
            self._pending -= 1
            if ok and not self._closed:
                self._put_idle_locked(sb)
                self._cond.notify()
                return
        self._discard(sb)

    def _discard(self, sb: DockerSandbox) -> None:
        sb.close()
        with self._cond:
            self._per_host[sb.host] -= 1
            self.discarded += 1
            if not self._closed:
                self._spawn_locked()

    def _top_up_locked(self) -> None:
        """Ahead of demand: start sandboxes until ``warm`` are idle or coming (starts and
        resets), while the pool has room."""
        while len(self._idle) + self._pending < self.warm and self._live_locked() < self.size:
            if not self._spawn_locked():
                return

    def _shrink_loop(self) -> None:
        """(Its own thread.) Remove sandboxes idle for ``idle_s`` while more than ``warm``
        are idle (the spares :meth:`_top_up_locked` keeps) and no acquire waits; the
        longest idle go first."""
        while not self._stop.wait(min(SHRINK_EVERY_S, self.idle_s)):
            stale: list[DockerSandbox] = []
            with self._cond:
                now = time.monotonic()
                while len(self._idle) > self.warm and not self._waiters:
                    oldest = self._idle[0]  # released last-in at the right end
                    if now - self._idle_since.get(oldest, now) < self.idle_s:
                        break
                    self._idle.popleft()
                    self._idle_since.pop(oldest, None)
                    self._per_host[oldest.host] -= 1
                    self.shrunk += 1
                    stale.append(oldest)
            for sb in stale:
                sb.close()

    def _put_idle_locked(self, sb: DockerSandbox) -> None:
        self._idle.append(sb)
        self._idle_since[sb] = time.monotonic()

    def _live_locked(self) -> int:
        return len(self._idle) + len(self._leased) + self._pending

    # -- the API ----------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> DockerSandbox:
        """A clean sandbox, waiting at most ``timeout`` s (None = forever).

        Raises :class:`SandboxError` on timeout (with the last start error, if any) or
        when the pool is closed.

        Example:
            >>> sb = pool.acquire(timeout=30)
            >>> sb.exec("echo hi", timeout=5).stdout
            'hi\\n'
            >>> pool.release(sb)
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            sb, idle_s = self._take(timeout, deadline)
            if idle_s < PROBE_AFTER_S or sb.probe():
                return sb
            self.release(sb)  # its container is gone: discarded and replaced

    def _take(self, timeout: float | None, deadline: float | None) -> tuple[DockerSandbox, float]:
        """Lease an idle sandbox that looks alive; return it and its idle seconds."""
        with self._cond:
            self._waiters += 1
            try:
                return self._take_locked(timeout, deadline)
            finally:
                self._waiters -= 1

    def _take_locked(
        self, timeout: float | None, deadline: float | None
    ) -> tuple[DockerSandbox, float]:
        while True:
            if self._closed:
                raise SandboxError("SandboxPool.acquire: the pool is closed")
            while self._idle:
                sb = self._idle.popleft()
                since = self._idle_since.pop(sb, time.monotonic())
                if sb.alive:
                    self._leased.add(sb)
                    self._top_up_locked()
                    return sb, time.monotonic() - since
                self._pending += 1  # discarded below, outside the lock
                self._workers.submit(self._discard_pending, sb)
            # None idle: start more, one per waiter not covered by a start or reset.
            while self._pending < self._waiters and self._live_locked() < self.size:
                if not self._spawn_locked():
                    break
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                why = f"; last error: {self._last_error}" if self._last_error else ""
                raise SandboxError(
                    f"SandboxPool.acquire: no sandbox free within {timeout}s "
                    f"(size={self.size}, leased={len(self._leased)}, starting or "
                    f"resetting={self._pending}){why}; raise pool size or the timeout"
                )
            self._cond.wait(remaining)

    def _discard_pending(self, sb: DockerSandbox) -> None:
        with self._cond:
            self._pending -= 1
        self._discard(sb)

    def release(self, sb: DockerSandbox, reset: bool = True) -> None:
        """Give ``sb`` back. With ``reset`` it is wiped in the background first; a dead
        or unresettable sandbox is removed and replaced. Never raises for a bad sandbox.

        Example (the pool holds one sandbox, so the session gets the same one, wiped):
            >>> sb = pool.acquire(timeout=30)
            >>> sb.write_file("/workspace/mine", "x")
            >>> pool.release(sb)
            >>> with pool.session(timeout=30) as again:
            ...     again is sb, again.exec("ls -A /workspace", timeout=5).stdout
            (True, '')
        """
        with self._cond:
            if self._closed:  # close() already removed it (or is about to)
                closing = True
            elif sb not in self._leased:
                raise SandboxError(f"SandboxPool.release: {sb!r} was not acquired from this pool")
            else:
                closing = False
                self._leased.discard(sb)
                if sb.alive and not reset:
                    self._put_idle_locked(sb)
                    self._cond.notify()
                    return
                self._pending += 1
        if closing:
            sb.close()
        elif sb.alive:
            self._workers.submit(self._reset, sb)
        else:
            self._workers.submit(self._discard_pending, sb)

    @contextlib.contextmanager
    def session(self, timeout: float | None = None, reset: bool = True) -> Iterator[DockerSandbox]:
        """``with pool.session() as sb:`` acquire, then release even on error.

        Example:
            >>> with pool.session(timeout=30) as sb:
            ...     sb.exec("true", timeout=5).exit_code
            0
        """
        sb = self.acquire(timeout)
        try:
            yield sb
        finally:
            self.release(sb, reset=reset)

    async def run_async(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking call (``sb.exec`` ...) on the pool's threads from asyncio.

        Example:
            >>> with pool.session(timeout=30) as sb:
            ...     asyncio.run(pool.run_async(sb.exec, "echo hi", timeout=5)).stdout
            'hi\\n'
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._async_threads, functools.partial(fn, *args, **kwargs)
        )

    async def acquire_async(self, timeout: float | None = None) -> DockerSandbox:
        """:meth:`acquire` for asyncio code.

        Example (with :meth:`release_async`):
            >>> async def lease_one():
            ...     sb = await pool.acquire_async(timeout=30)
            ...     await pool.release_async(sb)
            ...     return sb.alive
            >>> asyncio.run(lease_one())
            True
        """
        return await self.run_async(self.acquire, timeout)

    async def release_async(self, sb: DockerSandbox, reset: bool = True) -> None:
        """:meth:`release` for asyncio code (it never blocks long: the reset is queued);
        :meth:`acquire_async` has an example."""
        self.release(sb, reset=reset)

    @contextlib.asynccontextmanager
    async def session_async(
        self, timeout: float | None = None, reset: bool = True
    ) -> AsyncIterator[DockerSandbox]:
        """``async with pool.session_async() as sb:``.

        Example:
            >>> async def check():
            ...     async with pool.session_async(timeout=30) as sb:
            ...         return (await pool.run_async(sb.exec, "true", timeout=5)).exit_code
            >>> asyncio.run(check())
            0
        """
        sb = await self.acquire_async(timeout)
        try:
            yield sb
        finally:
            self.release(sb, reset=reset)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every sandbox is started and idle (benchmarks, tests).

        Example:
            >>> pool.wait_ready(60)
            >>> pool.stats()["idle"]
            1
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self._idle) < self.warm:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed:
                    why = f"; last error: {self._last_error}" if self._last_error else ""
                    raise SandboxError(
                        f"SandboxPool.wait_ready: {len(self._idle)}/{self.warm} sandboxes ready "
                        f"after {timeout}s{why}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def stats(self) -> dict[str, Any]:
        """Counts for metrics: idle, leased, pending, created, discarded, per host.

        Example (nothing leased; the last release's reset may still be pending):
            >>> stats = pool.stats()
            >>> stats["leased"], stats["created"] >= 1, list(stats["per_host"].values())
            (0, True, [1])
        """
        with self._cond:
            return {
                "idle": len(self._idle),
                "leased": len(self._leased),
                "pending": self._pending,
                "created": self.created,
                "discarded": self.discarded,
                "shrunk": self.shrunk,
                "per_host": dict(self._per_host),
                "hosts_down": sorted(
                    h for h, t in self._down_until.items() if t > time.monotonic()
                ),
                "last_error": self._last_error,
            }

    def close(self) -> None:
        """Stop replenishing and remove every sandbox, idle or leased. Idempotent.

        Example (a pool of its own: the shared ``pool`` stays open for the other examples):
            >>> other = SandboxPool(SandboxConfig(), size=1, warm=0)
            >>> other.close(); other.close(); other.closed
            True
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            victims = list(self._idle) + list(self._leased)
            self._idle.clear()
            self._idle_since.clear()
            self._leased.clear()
            self._cond.notify_all()
        # Sandboxes still starting close themselves when their start returns.
        self._workers.shutdown(wait=True, cancel_futures=False)
        with ThreadPoolExecutor(max_workers=8) as closers:
            try:
                closing = [closers.submit(sb.close) for sb in victims]
            except RuntimeError:  # at interpreter exit (atexit) no new thread may start
                closing = []
                for sb in victims:
                    sb.close()
            for done in closing:
                done.result()
        self._async_threads.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def in_use(self) -> int:
        """How many sandboxes are leased right now."""
        with self._cond:
            return len(self._leased)
