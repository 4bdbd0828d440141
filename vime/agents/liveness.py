"""Engine heartbeat: a hung engine is found while requests wait on it, not when they time out.

A hung engine (its process frozen or deadlocked) keeps every request to it waiting until
``request_timeout_s`` (10 minutes by default). While at least one request waits on an
engine, :class:`Heartbeat` asks the engine's ``GET /health`` every ``every_s`` seconds:
one probe at a time per engine, shared by every request waiting on it (and by the
client's other health questions: :class:`~vime.agents.server_probes.ServerProbes`). A
probe is *silent* when no HTTP answer comes within the probes' health timeout. When two
distinct probes in a row are silent, the engine is hung: every request waiting on it is
cancelled and raises :class:`EngineHungError`. One answered probe resets the count (one
silent probe may be a hiccup of a loaded host; a frozen engine stays silent), and the
last waiting request to finish stops the heartbeat. A hang is found within
``every_s + 2 * health_timeout_s``: 25 s at the defaults (5 s, 10 s), whatever
``request_timeout_s`` is.

Example (``engine_url``: a running vLLM server; the doctests give the session's):
    >>> import aiohttp
    >>> from vime.agents.server_probes import ServerProbes
    >>> async def models(url):
    ...     async with aiohttp.ClientSession() as session:
    ...         heartbeat = Heartbeat(ServerProbes(lambda: session, health_timeout_s=10.0),
    ...                               every_s=lambda: 5.0)
    ...         async with session.get(f"{url}/v1/models") as reply:
    ...             return await heartbeat.watched(url, reply.json())
    >>> asyncio.run(models(engine_url))["object"]
    'list'
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from vime.agents.server_probes import ServerProbes
from vime.errors import EngineError

SILENT_PROBES = 2  # distinct probes in a row without an answer: the engine is hung

T = TypeVar("T")

log = logging.getLogger(__name__)


class EngineHungError(EngineError):
    """An engine's heartbeat found it hung while a request waited on it.

    Example:
        >>> str(EngineHungError("its /health was silent"))
        'its /health was silent'
    """


@dataclass(eq=False)
class _Engine:
    """One engine's heartbeat, while requests wait on it."""

    url: str
    cuts: set[asyncio.Timeout] = field(default_factory=set)  # one per waiting request
    beat: asyncio.Task[None] | None = None
    hung: str = ""  # why it counts as hung ("" while it does not)


class Heartbeat:
    """Watches the engines that requests wait on (see the module docstring).

    ``every_s`` is read at each beat, so a config changed after the client was built
    applies.

    Example:
        >>> Heartbeat(ServerProbes(lambda: None, health_timeout_s=10.0), lambda: 5.0).watching()
        []
    """

    def __init__(self, probes: ServerProbes, every_s: Callable[[], float]) -> None:
        self._probes = probes
        self._every_s = every_s
        # (event loop, url) -> the engine's heartbeat, while requests wait on it.
        self._engines: dict[tuple[asyncio.AbstractEventLoop, str], _Engine] = {}

    def watching(self) -> list[str]:
        """The URLs whose heartbeat runs now (requests wait on them)."""
        return [url for _, url in self._engines]

    async def watched(self, url: str, request: Awaitable[T]) -> T:
        """``await request`` (a request to ``url``) under ``url``'s heartbeat: if the engine
        is found hung meanwhile, the request is cancelled and EngineHungError raised."""
        loop = asyncio.get_running_loop()
        engine = self._engines.get((loop, url))
        if engine is None:
            engine = self._engines[(loop, url)] = _Engine(url)
            engine.beat = loop.create_task(self._beat(engine, loop))
        # The cut is a timeout with no deadline until the heartbeat sets one: asyncio's own
        # cancellation, which tells its cancel apart from any other (e.g. Ctrl-C's).
        cut = asyncio.timeout(None)
        try:
            async with cut:
                engine.cuts.add(cut)
                return await request
        except TimeoutError:
            if cut.expired():
                raise EngineHungError(engine.hung) from None
            raise
        finally:
            engine.cuts.discard(cut)
            if not engine.cuts:  # the last request left: nothing waits on the engine
                self._forget(engine, loop)

    async def _beat(self, engine: _Engine, loop: asyncio.AbstractEventLoop) -> None:
        """Probe ``engine`` every ``every_s`` until SILENT_PROBES distinct probes in a row
        are silent; then cut every request waiting on it."""
        last, silent = time.monotonic(), 0  # the first probe goes out every_s from now
        while silent < SILENT_PROBES:
            await asyncio.sleep(max(0.0, last + self._every_s() - time.monotonic()))
            answered, sent = await self._probes.health(engine.url)
            if sent > last:  # a probe not counted yet (a shared one may be older)
                last, silent = sent, (0 if answered else silent + 1)
        engine.hung = (
            f"hung: its /health was silent on {SILENT_PROBES} probes in a row (each given "
            f"{self._probes.health_timeout_s:g} s, one every {self._every_s():g} s)"
        )
        log.warning(
            "engine %s is %s: cutting %d requests", engine.url, engine.hung, len(engine.cuts)
        )
        self._forget(engine, loop)  # a request sent from now on starts a new heartbeat
        for cut in engine.cuts:
            cut.reschedule(loop.time())

    def _forget(self, engine: _Engine, loop: asyncio.AbstractEventLoop) -> None:
        if engine.beat is not None and engine.beat is not asyncio.current_task():
            engine.beat.cancel()
        if self._engines.get((loop, engine.url)) is engine:
            del self._engines[(loop, engine.url)]
