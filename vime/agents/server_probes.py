"""Questions about a policy server's state (paused? alive?) that many requests share.

A weight sync aborts every request in flight at once, a hung engine times out all of
them at once, and the heartbeat (:mod:`vime.agents.liveness`) asks after an engine while
any of them waits; each then asks the server something. :class:`ServerProbes` sends one
probe per server and question and hands its answer to every caller, so hundreds of
requests cost the server one request.

Example (``engine_url``: a running vLLM server; the doctests give the session's):
    >>> async def ask(url):
    ...     async with aiohttp.ClientSession() as session:
    ...         probes = ServerProbes(lambda: session, health_timeout_s=10.0)
    ...         return await asyncio.gather(probes.answers(url), probes.is_paused(url))
    >>> asyncio.run(ask(engine_url))
    [True, False]
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from vime.net import engine_headers

# Seconds a server gets to answer GET /health (a heartbeat, a request to it timed out, or
# it is marked down); any HTTP answer counts (a server that is not vLLM may have no
# /health). A vLLM server answers in milliseconds, from its API process, even under load.
HEALTH_PROBE_S = 10.0


class ServerProbes:
    """Shared ``/is_paused`` and ``/health`` probes, sent with ``session()``'s pool.

    Example:
        >>> ServerProbes(lambda: None, health_timeout_s=3.0).health_timeout_s
        3.0
    """

    def __init__(
        self, session: Callable[[], aiohttp.ClientSession], *, health_timeout_s: float
    ) -> None:
        self._session = session
        self.health_timeout_s = health_timeout_s
        # (what, url) -> the probe in flight or just answered, and when it was asked.
        self._probes: dict[tuple[str, str], tuple[asyncio.Future[bool], float]] = {}

    async def is_paused(self, url: str) -> bool:
        """Whether ``url`` is paused (a weight sync in progress); False if it cannot say.
        An answer younger than 0.1 s is shared (the server is busy loading weights)."""
        return (await self._shared("is_paused", url, self._ask_paused, 0.1))[0]

    async def answers(self, url: str) -> bool:
        """Whether ``url`` answers ``GET /health`` within ``health_timeout_s`` (any status)."""
        # Fresh for as long as a silent probe takes, and 2 s after.
        return (await self.health(url, fresh_s=self.health_timeout_s + 2.0))[0]

    async def health(self, url: str, *, fresh_s: float = 0.0) -> tuple[bool, float]:
        """Whether ``url`` answers ``GET /health`` within ``health_timeout_s``, and when that
        probe was sent (``time.monotonic()``): callers sharing a probe get the same time,
        so two answers with different times come from two distinct probes. The probe in
        flight is shared, and so is one sent less than ``fresh_s`` seconds ago."""
        return await self._shared("health", url, self._ask_health, fresh_s)

    async def _shared(
        self, what: str, url: str, ask: Callable[[str], Coroutine[Any, Any, bool]], fresh_s: float
    ) -> tuple[bool, float]:
        """``ask(url)`` and when it was asked, shared: callers get the probe in flight, or an
        answer asked less than ``fresh_s`` seconds ago."""
        loop = asyncio.get_running_loop()
        probe, asked = self._probes.get((what, url), (None, 0.0))
        fresh = probe is not None and (not probe.done() or time.monotonic() - asked < fresh_s)
        if probe is None or not fresh or probe.get_loop() is not loop:
            probe, asked = loop.create_task(ask(url)), time.monotonic()
            self._probes[(what, url)] = (probe, asked)
        return await asyncio.shield(probe), asked

    async def _ask_health(self, url: str) -> bool:
        timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
        try:
            get = self._session().get(f"{url}/health", headers=engine_headers(url), timeout=timeout)
            async with get as resp:
                await resp.read()
                return True
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def _ask_paused(self, url: str) -> bool:
        try:
            async with self._session().get(f"{url}/is_paused", headers=engine_headers(url)) as resp:
                return bool((await resp.json()).get("is_paused"))
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
            return False
