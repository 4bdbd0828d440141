"""Router: which policy server each episode's requests go to, and which servers are down.

This is the routing state of :class:`~vime.agents.policy_client.PolicyClient`, kept apart
from its transports: no I/O here, only counters and decisions on them.

Load: an episode (``session``) sticks to the server it was first given while that
server is healthy (prefix-cache reuse across its turns); a new session goes to the
healthy server with the fewest tokens in flight (prompt + ``max_tokens`` of each request
sent and not yet answered), ties to the one with fewer sessions, then round-robin.
A server that failed all retries is marked down for ``down_s`` seconds, or until its
weight version is recorded again (the loop does that once it has restarted the engine
and reloaded the current weights); a session pinned to a down server moves (fails over)
to the best healthy one. :meth:`Router.stats` reports requests, failovers and tokens in
flight per server.

Example:
    >>> router = Router(["http://a:1", "http://b:1"], down_s=30.0)
    >>> router.server_for("ep1"), router.server_for("ep2")
    ('http://a:1', 'http://b:1')
    >>> router.mark_down("http://a:1")
    True
    >>> router.server_for("ep1")  # its server is down: the session fails over
    'http://b:1'
    >>> router.stats()["http://a:1"]["failovers"]
    1
"""

from __future__ import annotations

import time

from vime.errors import EngineError


class Router:
    """Routing state for a fleet of servers (see the module docstring).

    ``urls`` are the servers (a trailing ``/`` is dropped); ``down_s`` is how long a server
    marked down is avoided.

    Example:
        >>> Router(["http://a:1/"], down_s=30.0).urls
        ['http://a:1']
    """

    def __init__(self, urls: list[str], down_s: float) -> None:
        self.urls = [u.rstrip("/") for u in urls]
        self.down_s = down_s
        self._versions: dict[str, int] = dict.fromkeys(self.urls, 0)
        self._sessions: dict[str, str] = {}  # session -> url
        self._pinned: dict[str, int] = dict.fromkeys(self.urls, 0)  # url -> sessions
        self._inflight: dict[str, int] = dict.fromkeys(self.urls, 0)  # url -> tokens
        self._requests: dict[str, int] = dict.fromkeys(self.urls, 0)  # url -> requests sent
        self._failovers: dict[str, int] = dict.fromkeys(self.urls, 0)  # url -> sessions moved off
        self._down_until: dict[str, float] = dict.fromkeys(self.urls, 0.0)
        self._rr = 0

    def server_for(self, session: str) -> str:
        """The server ``session`` is pinned to (assigned on first use: fewest tokens in flight).

        A session whose server is marked down moves to the best healthy server, if any.

        Example:
            >>> Router(["http://a:1", "http://b:1"], down_s=30.0).server_for("ep1")
            'http://a:1'
        """
        url = self._sessions.get(session)
        if url is not None and self._down_until[url] <= time.monotonic():
            return url  # the common case: pinned and healthy
        others = self.healthy(exclude=url)
        if url is not None:
            # Down, but nowhere better (one server, or all down): stay, as before failover.
            return self.move(session, url, self.best(others)) if others else url
        url = self.best(others or self.urls)
        self._sessions[session] = url
        self._pinned[url] += 1
        return url

    def release(self, session: str) -> None:
        """Forget ``session``'s server (call when its episode ends).

        Example:
            >>> Router(["http://a:1"], down_s=30.0).release("ep1")
        """
        url = self._sessions.pop(session, None)
        if url is not None:
            self._pinned[url] -= 1

    def healthy(self, exclude: str | None = None) -> list[str]:
        """The servers not marked down (but ``exclude``), in ``urls`` order.

        Example:
            >>> Router(["http://a:1", "http://b:1"], down_s=30.0).healthy(exclude="http://a:1")
            ['http://b:1']
        """
        now = time.monotonic()
        return [u for u in self.urls if self._down_until[u] <= now and u != exclude]

    def best(self, urls: list[str]) -> str:
        """The least loaded of ``urls``: fewest tokens in flight, then sessions, then round-robin.

        Example:
            >>> router = Router(["http://a:1", "http://b:1"], down_s=30.0)
            >>> router.add_inflight("http://a:1", 100)
            >>> router.best(router.urls)
            'http://b:1'
        """
        load = {u: (self._inflight[u], self._pinned[u]) for u in urls}
        least = min(load.values())
        ties = [u for u in urls if load[u] == least]
        url = ties[self._rr % len(ties)]
        self._rr += 1
        return url

    def move(self, session: str, old: str, new: str) -> str:
        """Re-pin ``session`` from the unavailable ``old`` to ``new`` (a failover); ``new``."""
        self._sessions[session] = new
        self._pinned[old] -= 1
        self._pinned[new] += 1
        self._failovers[old] += 1
        return new

    def fail_over(self, session: str, failed: str, tried: list[str]) -> str | None:
        """Where ``session``'s request goes after ``failed`` gave up: the best healthy server
        not in ``tried`` (None if there is none). The session is re-pinned there if it was
        still pinned to ``failed``; one released meanwhile (its episode was cancelled) is
        only routed, not pinned again.

        Example:
            >>> router = Router(["http://a:1", "http://b:1"], down_s=30.0)
            >>> router.server_for("ep1")
            'http://a:1'
            >>> router.fail_over("ep1", "http://a:1", ["http://a:1"]), router.server_for("ep1")
            ('http://b:1', 'http://b:1')
        """
        others = [u for u in self.healthy() if u not in tried]
        if not others:
            return None
        if self._sessions.get(session) == failed:
            return self.move(session, failed, self.best(others))
        return self.best(others)

    def mark_down(self, url: str) -> bool:
        """Avoid ``url`` for ``down_s`` seconds; True if it was not already down (so the
        caller warns once per outage, not once per failed request).

        Example:
            >>> router = Router(["http://a:1"], down_s=30.0)
            >>> router.mark_down("http://a:1"), router.mark_down("http://a:1")
            (True, False)
        """
        now = time.monotonic()
        was_up = self._down_until[url] <= now
        self._down_until[url] = now + self.down_s
        return was_up

    def is_down(self, url: str) -> bool:
        """Whether ``url`` is marked down now.

        Example:
            >>> router = Router(["http://a:1"], down_s=30.0)
            >>> router.mark_down("http://a:1") and router.is_down("http://a:1")
            True
        """
        return self._down_until[url] > time.monotonic()

    def add_inflight(self, url: str, tokens: int) -> None:
        """Count a request sent to ``url`` and its ``tokens`` (prompt + ``max_tokens``) in flight.

        No await may come between :meth:`server_for` and this call: the next session routed
        must see this request's load.
        """
        self._inflight[url] += tokens
        self._requests[url] += 1

    def remove_inflight(self, url: str, tokens: int) -> None:
        """The request's ``tokens`` are no longer in flight on ``url`` (answered or failed)."""
        self._inflight[url] -= tokens

    def set_weight_version(self, url: str, version: int) -> None:
        """Record that the engine at ``url`` now serves weights ``version``; a server marked
        down takes work again.

        Example:
            >>> router = Router(["http://a:1"], down_s=30.0)
            >>> router.set_weight_version("http://a:1/", 3); router.weight_version("http://a:1")
            3
        """
        url = url.rstrip("/")
        if url not in self._versions:
            raise EngineError(f"set_weight_version: {url!r} is not one of policy.urls {self.urls}")
        self._versions[url] = int(version)
        # The engine just loaded (or was restarted at) the current weights: it takes work again.
        self._down_until[url] = 0.0

    def weight_version(self, url: str) -> int:
        """The weight version last recorded for ``url``."""
        return self._versions[url.rstrip("/")]

    def stats(self) -> dict[str, dict[str, int | bool]]:
        """Per-server counters: requests sent, sessions failed over away from it, tokens in
        flight, sessions pinned, whether it is marked down, its weight version.

        Example:
            >>> Router(["http://a:1"], down_s=30.0).stats()["http://a:1"]
            {'requests': 0, 'failovers': 0, 'tokens_in_flight': 0, 'sessions': 0, 'down': False, 'weight_version': 0}
        """
        now = time.monotonic()
        return {
            u: {
                "requests": self._requests[u],
                "failovers": self._failovers[u],
                "tokens_in_flight": self._inflight[u],
                "sessions": self._pinned[u],
                "down": self._down_until[u] > now,
                "weight_version": self._versions[u],
            }
            for u in self.urls
        }
