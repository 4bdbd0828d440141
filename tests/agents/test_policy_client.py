"""PolicyClient error paths and load spreading.

The happy path runs against the real vLLM server in test_collector_engine.py. Status codes
a real server cannot be made to return on demand (503, 500) come from an in-process HTTP
handler (httpx MockTransport) behind the real openai SDK client, so these tests use the
SDK transport (``http_transport="sdk"``); the default ``direct`` transport maps the
same failures alike (test_transports_map_errors_alike, against a real HTTP server).
"""

from __future__ import annotations

import asyncio
import json
import socket

import httpx2
import openai
import pytest

from tests.agents._raw_http import answer_json
from vime.agents.policy_client import (
    ContextLengthError,
    EngineUnavailableError,
    PolicyClient,
    PolicyClientConfig,
)
from vime.errors import ConfigError, EngineError
from vime.types import SamplingParams

URL = "http://policy.test:8000"


def completion(ids: list[int], **extra) -> dict:
    return {
        "choices": [
            {
                "index": 0,
                "text": "",
                "token_ids": ids,
                "logprobs": {"token_logprobs": [-0.5] * len(ids)},
                "finish_reason": "stop",
                "stop_reason": None,
                **extra,
            }
        ]
    }


def client_with(handler, **config) -> tuple[PolicyClient, list[dict]]:
    seen: list[dict] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return handler(len(seen))

    config.setdefault("http_transport", "sdk")  # the SDK path: MockTransport sits under it
    client = PolicyClient(
        PolicyClientConfig(
            urls=[URL],
            model="m",
            backoff_initial_s=0.001,
            backoff_max_s=0.01,
            **config,
        )
    )
    client._transport._clients[URL] = openai.AsyncOpenAI(
        base_url=f"{URL}/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(record)),
    )
    return client, seen


async def _serve(app) -> tuple:
    """Start ``app`` (aiohttp) on a free local port: its runner (cleanup) and its URL."""
    from aiohttp import web

    # Handlers that play a hung server never return: cleanup cancels them after 0.1 s
    # (aiohttp's default waits 60 s for them).
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_request_carries_token_ids_and_vllm_fields() -> None:
    client, seen = client_with(lambda n: httpx2.Response(200, json=completion([7, 8, 2])))
    params = SamplingParams(
        temperature=0.7,
        top_k=5,
        max_tokens=30,
        stop=["</x>"],
        seed=3,
        extra_body={"repetition_penalty": 1.1},
    )
    out = asyncio.run(client.generate([1, 2, 3], params, session="e1", max_tokens=9))
    assert out.token_ids == [7, 8, 2] and out.logprobs == [-0.5] * 3 and out.finish_reason == "stop"
    body = seen[0]
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 9
    assert body["return_token_ids"] is True and body["logprobs"] == 0
    assert (body["temperature"], body["top_k"], body["stop"], body["seed"]) == (0.7, 5, ["</x>"], 3)
    assert body["repetition_penalty"] == 1.1


def test_5xx_is_retried_then_succeeds() -> None:
    client, seen = client_with(
        lambda n: (
            httpx2.Response(503, json={"error": {"message": "busy"}})
            if n < 3
            else httpx2.Response(200, json=completion([5]))
        )
    )
    out = asyncio.run(client.generate([1], SamplingParams(), session="e"))
    assert out.attempts == 3 and len(seen) == 3


def test_5xx_forever_gives_engine_unavailable_and_marks_server_down() -> None:
    client, seen = client_with(
        lambda n: httpx2.Response(500, json={"error": {"message": "boom"}}), max_attempts=3
    )
    with pytest.raises(EngineUnavailableError, match="HTTP 500 after 3 attempts: boom"):
        asyncio.run(client.generate([1], SamplingParams(), session="e"))
    assert len(seen) == 3


def test_4xx_is_not_retried_and_context_length_is_its_own_error() -> None:
    too_long = {
        "error": {
            "message": "This model's maximum context length is 1024 tokens. However, your prompt contains 2000 input tokens"
        }
    }
    client, seen = client_with(lambda n: httpx2.Response(400, json=too_long))
    with pytest.raises(ContextLengthError, match="maximum context length"):
        asyncio.run(client.generate([1] * 2000, SamplingParams(), session="e"))
    assert len(seen) == 1
    client, seen = client_with(
        lambda n: httpx2.Response(404, json={"error": {"message": "no model"}})
    )
    with pytest.raises(EngineError, match="HTTP 404: no model") as info:
        asyncio.run(client.generate([1], SamplingParams(), session="e"))
    assert not isinstance(info.value, EngineUnavailableError) and len(seen) == 1


def test_malformed_response_is_an_engine_error() -> None:
    client, _ = client_with(lambda n: httpx2.Response(200, json={"choices": [{"text": "hi"}]}))
    with pytest.raises(EngineError, match="no token_ids"):
        asyncio.run(client.generate([1], SamplingParams(), session="e"))


def test_weight_version_from_client_or_response() -> None:
    client, _ = client_with(lambda n: httpx2.Response(200, json=completion([5])))
    client.set_weight_version(URL, 6)
    assert asyncio.run(client.generate([1], SamplingParams(), session="e")).weight_version == 6
    client, _ = client_with(
        lambda n: httpx2.Response(200, json=completion([5], weight_version="9"))
    )
    assert asyncio.run(client.generate([1], SamplingParams(), session="e")).weight_version == 9
    with pytest.raises(EngineError, match=r"not one of policy\.urls"):
        client.set_weight_version("http://other:1", 1)


def test_dead_server_is_unavailable_and_avoided() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = PolicyClient.from_urls(dead, URL, model="m", max_attempts=2, backoff_initial_s=0.001)
    assert client.server_for("a") == dead

    async def run() -> None:
        try:
            await client.generate([1], SamplingParams(), session="a")
        finally:
            await client.aclose()

    with pytest.raises(EngineUnavailableError, match="unreachable after 2 attempts"):
        asyncio.run(run())
    client.release("a")
    assert [client.server_for(s) for s in ("b", "c")] == [URL, URL]  # dead one is skipped


def test_sessions_stick_and_spread() -> None:
    client = PolicyClient.from_urls("http://a:1", "http://b:1", "http://c:1")
    first = [client.server_for(f"s{i}") for i in range(6)]
    assert sorted(first) == sorted(["http://a:1", "http://b:1", "http://c:1"] * 2)
    assert client.server_for("s0") == first[0]  # affinity
    client.release("s0")
    client.release("s3")
    assert client.server_for("new") == first[0]  # the least-loaded server


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"policy\.urls"):
        PolicyClientConfig(urls=[])
    with pytest.raises(ConfigError, match="http://"):
        PolicyClientConfig(urls=["localhost:8000"])
    with pytest.raises(ConfigError, match=r"policy\.http_transport"):
        PolicyClientConfig(urls=[URL], http_transport="aiohttp")  # now "sdk"
    with pytest.raises(ConfigError, match=r"policy\.heartbeat_s"):
        PolicyClientConfig(urls=[URL], heartbeat_s=0)


@pytest.mark.parametrize("transport", ["sdk", "direct"])
def test_transports_map_errors_alike(transport: str) -> None:
    """Both transports against a real local HTTP server scripted to fail, then succeed."""
    from aiohttp import web

    script = [
        (503, {"error": {"message": "busy"}}),
        (200, completion([4, 2])),
        (400, {"error": {"message": "This model's maximum context length is 8 tokens"}}),
        (500, {"error": {"message": "boom"}}),
        (500, {"error": {"message": "boom"}}),
    ]
    seen: list[dict] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.json())
        status, body = script[len(seen) - 1]
        return web.json_response(body, status=status)

    async def run() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner, url = await _serve(app)
        client = PolicyClient.from_urls(
            url, model="m", http_transport=transport, max_attempts=2, backoff_initial_s=0.001
        )
        try:
            out = await client.generate([1, 2], SamplingParams(), session="a")
            assert (out.token_ids, out.attempts) == ([4, 2], 2)
            with pytest.raises(ContextLengthError, match="maximum context length"):
                await client.generate([1] * 9, SamplingParams(), session="a")
            with pytest.raises(EngineUnavailableError, match="HTTP 500 after 2 attempts: boom"):
                await client.generate([1], SamplingParams(), session="a")
        finally:
            await client.aclose()
            await runner.cleanup()

    asyncio.run(run())
    assert len(seen) == 5 and seen[0]["prompt"] == [1, 2] and seen[0]["return_token_ids"] is True


@pytest.mark.parametrize("transport", ["sdk", "direct"])
def test_connection_dropped_under_a_request_is_resent_at_once(transport: str) -> None:
    """A server closing the connection under a request (a keep-alive race) costs no backoff."""
    import re
    import time

    requests = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head, re.I)
                await reader.readexactly(int(length.group(1)) if length else 0)
                requests += 1
                if requests == 1:  # read the request, then hang up without answering
                    writer.close()
                    return
                await answer_json(writer, completion([4, 2]))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def run() -> tuple[list[int], int, float]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = PolicyClient.from_urls(
            f"http://127.0.0.1:{port}",
            model="m",
            http_transport=transport,
            max_attempts=3,
            backoff_initial_s=5.0,  # a backoff would show in the elapsed time
        )
        try:
            start = time.monotonic()
            out = await client.generate([1, 2], SamplingParams(), session="a")
            return out.token_ids, out.attempts, time.monotonic() - start
        finally:
            await client.aclose()
            server.close()

    ids, attempts, elapsed = asyncio.run(run())
    assert (ids, attempts, requests) == ([4, 2], 2, 2)
    assert elapsed < 2.0, f"the resend waited {elapsed:.1f} s (the backoff is 5 s)"


def test_requests_aborted_by_a_sync_ask_the_paused_server_once() -> None:
    """A weight sync aborts every request in flight at once; each one asks /is_paused
    before it waits for the new version. They share the question, so the server (busy
    loading weights) answers a handful, not one per request; all continue afterwards."""
    from aiohttp import web

    sessions, asked = 64, [0]
    aborted: set[int] = set()

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        first = body["prompt"][0]
        if first not in aborted:  # each session's first request is cut by the sync
            aborted.add(first)
            return web.json_response(completion([7], finish_reason="abort"))
        return web.json_response(completion([8, 9]))

    async def is_paused(request: web.Request) -> web.Response:
        asked[0] += 1
        await asyncio.sleep(0.02)  # a busy server
        return web.json_response({"is_paused": True})

    async def run() -> list:
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/is_paused", is_paused)
        runner, url = await _serve(app)
        client = PolicyClient.from_urls(url, model="m", http_transport="direct")
        try:
            calls = [
                client.generate([i, 1], SamplingParams(max_tokens=3), session=f"s{i}")
                for i in range(sessions)
            ]
            outs = asyncio.gather(*calls)
            await asyncio.sleep(0.3)
            client.set_weight_version(url, 1)  # the sync lands
            return await outs
        finally:
            await client.aclose()
            await runner.cleanup()

    outs = asyncio.run(run())
    assert all(o.token_ids == [7, 8, 9] for o in outs)  # every turn continued
    assert 1 <= asked[0] <= 4, asked[0]


@pytest.mark.parametrize("health", ["silent", "answers"])
def test_a_timed_out_request_is_retried_only_if_the_server_answers_its_health(health) -> None:
    """A hung engine (a real local server whose handlers never return) costs one request
    timeout and one health probe, not max_attempts timeouts; later requests to it, marked
    down with nowhere to fail over, fail at once. A server that is slow but answers its
    /health gets the retries as before."""
    from aiohttp import web

    posts = [0]

    async def completions(request: web.Request) -> web.Response:
        posts[0] += 1
        if health == "silent" or posts[0] == 1:
            await asyncio.sleep(3600)  # never answers (the test's loop ends first)
        return web.json_response(completion([5]))

    async def health_check(request: web.Request) -> web.Response:
        if health == "silent":
            await asyncio.sleep(3600)
        return web.Response(text="")

    async def run() -> tuple[list, list[float]]:
        import time

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/health", health_check)
        runner, url = await _serve(app)
        client = PolicyClient.from_urls(
            url, model="m", http_transport="direct", request_timeout_s=0.5, max_attempts=4,
            backoff_initial_s=0.001, backoff_max_s=0.01,
        )  # fmt: skip
        results, seconds = [], []
        try:
            for session in ("a", "b"):
                t0 = time.perf_counter()
                try:
                    results.append(await client.generate([1], SamplingParams(), session=session))
                except EngineUnavailableError as err:
                    results.append(err)
                seconds.append(time.perf_counter() - t0)
        finally:
            await client.aclose()
            await runner.cleanup()
        return results, seconds

    results, seconds = asyncio.run(run())
    if health == "answers":
        assert [r.token_ids for r in results] == [[5], [5]]
        assert posts[0] == 3  # the first request's timed-out try was retried
        return
    first, second = map(str, results)
    assert "unreachable after 1 attempts (APITimeoutError" in first, first
    assert posts[0] == 1, posts  # no retry went to the hung server, and no second request
    assert seconds[0] < 1.5, seconds  # 0.5 s timeout + 0.5 s probe; 4 tries: > 2 s
    assert "marked down, and its /health does not answer within 0.5 s" in second, second
    assert seconds[1] < 0.2, seconds  # the probe's silence is shared: no second wait


@pytest.mark.parametrize("server", ["hangs", "slow", "flaky"])
def test_the_heartbeat_finds_a_hung_server_long_before_the_request_timeout(
    server, monkeypatch
) -> None:
    """A real local server that stops answering while a request waits on it (its handlers
    never return) is found by the heartbeat: two distinct /health probes in a row silent
    (0.5 s each, one every 0.3 s) end the request as EngineUnavailableError within about
    a second, not at request_timeout_s (60 s), and without a retry. A server slow to
    complete whose /health answers ("slow"), or answers every other probe ("flaky": one
    silent probe is not a hang), is not cut off: its 3 s request completes."""
    from aiohttp import web

    monkeypatch.setattr("vime.agents.policy_client.HEALTH_PROBE_S", 0.5)
    posts, probes, hung = [0], [0], [False]

    async def completions(request: web.Request) -> web.Response:
        posts[0] += 1
        hung[0] = server == "hangs"  # it stops answering now, /health included
        await asyncio.sleep(3600 if hung[0] else 3.0)
        return web.json_response(completion([5]))

    async def health_check(request: web.Request) -> web.Response:
        probes[0] += 1
        if hung[0] or (server == "flaky" and probes[0] % 2):
            await asyncio.sleep(3600)
        return web.Response(text="")

    async def run() -> tuple[object, float, list[str]]:
        import time

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/health", health_check)
        runner, url = await _serve(app)
        client = PolicyClient.from_urls(
            url, model="m", http_transport="direct", request_timeout_s=60.0, heartbeat_s=0.3,
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            out: object = await client.generate([1], SamplingParams(), session="a")
        except EngineUnavailableError as err:
            out = err
        try:
            return out, time.perf_counter() - t0, client._heartbeat.watching()
        finally:
            await client.aclose()
            await runner.cleanup()

    out, seconds, watching = asyncio.run(run())
    assert watching == []  # the request's end stopped its engine's heartbeat
    if server != "hangs":
        assert getattr(out, "token_ids", out) == [5]
        assert 3.0 <= seconds < 5.0, seconds
        assert probes[0] >= 4, probes  # the heartbeat ran the whole time
        return
    assert isinstance(out, EngineUnavailableError)
    assert "hung: its /health was silent on 2 probes in a row (each given 0.5 s" in str(out)
    assert (posts[0], probes[0]) == (1, 2), (posts, probes)  # no retry, two probes
    # 0.3 s to the first probe, 0.5 s for each silent one; request_timeout_s is 60 s.
    assert 1.2 < seconds < 4.0, seconds


@pytest.mark.parametrize("transport", ["sdk", "direct"])
def test_the_model_card_is_asked_once_for_all_callers_and_a_dropped_connection_resent(
    transport: str,
) -> None:
    """``/v1/models`` follows the completions' rules: the server hanging up on the first
    request (read, then closed unanswered: the SDK calls that "Request timed out.") costs
    one resend, not the episodes waiting for the card. Eight callers at once share one
    fetch: the server sees two requests (the dropped one and its resend)."""
    import re

    requests = 0
    card = {"object": "list", "data": [{"id": "tiny", "object": "model", "max_model_len": 512}]}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                assert re.match(rb"GET /v1/models ", head), head[:40]
                requests += 1
                if requests == 1:
                    writer.close()
                    return
                await answer_json(writer, card)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def run() -> list:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = PolicyClient.from_urls(
            f"http://127.0.0.1:{port}", http_transport=transport, backoff_initial_s=5.0
        )
        try:
            names = [client.model_name() for _ in range(4)]
            lengths = [client.max_model_len() for _ in range(4)]
            return await asyncio.wait_for(asyncio.gather(*names, *lengths), 2.0)  # no backoff
        finally:
            await client.aclose()
            server.close()

    assert asyncio.run(run()) == ["tiny"] * 4 + [512] * 4
    assert requests == 2


def test_a_hung_server_s_model_card_is_given_up_by_the_heartbeat(monkeypatch) -> None:
    """A server whose ``/v1/models`` and ``/health`` stop answering is found hung by the
    heartbeat, as a completion's server is (two silent 0.5 s probes), long before
    request_timeout_s (60 s); the error says so."""
    import time

    from aiohttp import web

    monkeypatch.setattr("vime.agents.policy_client.HEALTH_PROBE_S", 0.5)

    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(text="")

    async def run() -> tuple[str, float]:
        app = web.Application()
        app.router.add_get("/v1/models", never)
        app.router.add_get("/health", never)
        runner, url = await _serve(app)
        client = PolicyClient.from_urls(url, request_timeout_s=60.0, heartbeat_s=0.3)
        t0 = time.perf_counter()
        try:
            await client.model_name()
        except EngineUnavailableError as err:
            return str(err), time.perf_counter() - t0
        finally:
            await client.aclose()
            await runner.cleanup()
        raise AssertionError("the card came from a hung server")

    message, seconds = asyncio.run(run())
    assert message.startswith("no policy server answered /v1/models (http://127.0.0.1:"), message
    assert "hung: its /health was silent on 2 probes in a row" in message, message
    assert seconds < 3.0, seconds
