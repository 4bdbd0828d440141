"""PolicyClient over a fleet: routing by tokens in flight, failover, down marks.

Every engine here is a real HTTP server on a real socket (a few lines of asyncio that
answer ``/v1/completions`` like vLLM), so that killing one is real: its listening socket
is closed and its open connections are reset, as when a vLLM process dies.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket

import pytest

from tests.agents._raw_http import answer_json
from vime.agents.policy_client import EngineUnavailableError, PolicyClient
from vime.types import SamplingParams

PARAMS = SamplingParams(max_tokens=8)


class FakeEngine:
    """An HTTP/1.1 server answering every completion with ``ids``; ``hold`` delays answers.

    Example:
        >>> engine = FakeEngine([4, 2])  # then: await engine.start(); ...; await engine.kill()
    """

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.requests: list[dict] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeEngine:
        """Listen (on the same port again after a kill: the engine restarted)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def kill(self) -> None:
        """Die: stop listening and reset every open connection, answered or not."""
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def wait_requests(self, n: int) -> None:
        async with asyncio.timeout(5):
            while len(self.requests) < n:
                await asyncio.sleep(0.005)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head, re.I)
                body = await reader.readexactly(int(length.group(1)) if length else 0)
                self.requests.append(json.loads(body))
                await self.hold.wait()
                await answer_json(writer, _completion(self.ids))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _completion(ids: list[int]) -> dict:
    logprobs = {"token_logprobs": [-0.5] * len(ids)}
    return {"choices": [{"token_ids": ids, "logprobs": logprobs, "finish_reason": "stop"}]}


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _client(*urls: str, **config) -> PolicyClient:
    return PolicyClient.from_urls(
        *urls, model="m", max_attempts=2, backoff_initial_s=0.001, backoff_max_s=0.01, **config
    )


def test_new_sessions_go_to_the_server_with_fewest_tokens_in_flight() -> None:
    async def run() -> None:
        a, b = await FakeEngine([1]).start(), await FakeEngine([2]).start()
        a.hold.clear()
        b.hold.clear()
        client = _client(a.url, b.url)
        try:
            long = asyncio.create_task(client.generate([5] * 1000, PARAMS, session="long"))
            await a.wait_requests(1)
            short = asyncio.create_task(client.generate([5] * 10, PARAMS, session="short"))
            await b.wait_requests(1)
            stats = client.stats()
            assert stats[a.url]["tokens_in_flight"] == 1008
            assert stats[b.url]["tokens_in_flight"] == 18
            # One session on each: by sessions, n2 would go to A; by tokens, both go to B.
            assert [client.server_for("n1"), client.server_for("n2")] == [b.url, b.url]
            assert client.server_for("long") == a.url  # pinned (prefix cache)
            a.hold.set()
            b.hold.set()
            outs = await asyncio.gather(long, short)
            assert [o.server for o in outs] == [a.url, b.url]
            stats = client.stats()
            assert [stats[u]["tokens_in_flight"] for u in (a.url, b.url)] == [0, 0]
            assert [stats[u]["requests"] for u in (a.url, b.url)] == [1, 1]
        finally:
            await client.aclose()
            await a.kill()
            await b.kill()

    asyncio.run(run())


@pytest.mark.parametrize("transport", ["direct", "sdk"])
def test_a_killed_server_fails_over_mid_session(transport: str) -> None:
    async def run() -> None:
        a, b = await FakeEngine([1, 1]).start(), await FakeEngine([2, 2]).start()
        client = _client(a.url, b.url, http_transport=transport)
        client.set_weight_version(a.url, 3)
        client.set_weight_version(b.url, 5)
        try:
            first = await client.generate([1, 2], PARAMS, session="ep")
            assert (first.server, first.weight_version, first.token_ids) == (a.url, 3, [1, 1])
            a.hold.clear()
            turn = asyncio.create_task(client.generate([1, 2, 1, 1, 7], PARAMS, session="ep"))
            await a.wait_requests(2)
            await a.kill()  # with the session's second turn in flight on it
            out = await turn
            assert (out.server, out.weight_version, out.token_ids) == (b.url, 5, [2, 2])
            assert b.requests[0]["prompt"] == [1, 2, 1, 1, 7]  # the same request, resent
            assert client.server_for("ep") == b.url
            stats = client.stats()
            assert stats[a.url]["down"] and not stats[b.url]["down"]
            assert (stats[a.url]["failovers"], stats[a.url]["tokens_in_flight"]) == (1, 0)
            assert (stats[a.url]["sessions"], stats[b.url]["sessions"]) == (0, 1)
            assert (stats[a.url]["requests"], stats[b.url]["requests"]) == (2, 1)
        finally:
            await client.aclose()
            await b.kill()

    asyncio.run(run())


def test_all_servers_down_is_engine_unavailable() -> None:
    dead1, dead2 = _dead_url(), _dead_url()
    client = _client(dead1, dead2, down_s=0.3)

    async def run() -> None:
        try:
            pattern = rf"{re.escape(dead2)}: unreachable after 2 attempts .*failing over from {re.escape(dead1)}"
            with pytest.raises(EngineUnavailableError, match=pattern):
                await client.generate([1], PARAMS, session="a")
            # The failover target is not marked down by a request that failed elsewhere first.
            assert [s["down"] for s in client.stats().values()] == [True, False]
            # Its own session marks it down; nowhere left to fail over to: raised as is.
            with pytest.raises(
                EngineUnavailableError, match="unreachable after 2 attempts"
            ) as info:
                await client.generate([1], PARAMS, session="b")
            assert "failing over" not in str(info.value)
            assert [s["down"] for s in client.stats().values()] == [True, True]
            await asyncio.sleep(0.35)  # down_s later both take work again
            assert [s["down"] for s in client.stats().values()] == [False, False]
        finally:
            await client.aclose()

    asyncio.run(run())


def test_set_weight_version_brings_a_down_server_back() -> None:
    async def run() -> None:
        a, b = await FakeEngine([1]).start(), await FakeEngine([2]).start()
        client = _client(a.url, b.url, down_s=600)
        try:
            assert [client.server_for(s) for s in ("x", "y")] == [a.url, b.url]
            assert client.server_for("z") == a.url
            await a.kill()
            out = await client.generate([1], PARAMS, session="x")  # fails over to B
            assert out.server == b.url and client.stats()[a.url]["down"]
            assert client.server_for("z") == b.url  # pinned to a down server: moved at once
            assert client.server_for("new") == b.url  # A is down, though B holds every session
            await a.start()  # the loop restarts the engine and reloads the weights ...
            client.set_weight_version(a.url, 7)  # ... then reports the version
            assert not client.stats()[a.url]["down"]
            assert client.server_for("later") == a.url
            out = await client.generate([1], PARAMS, session="later")
            assert (out.server, out.weight_version) == (a.url, 7)
            assert client.stats()[a.url]["failovers"] == 2  # x, then z
        finally:
            await client.aclose()
            await a.kill()
            await b.kill()

    asyncio.run(run())
