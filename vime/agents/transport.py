"""How the policy client's requests travel: the ``openai`` SDK, or aiohttp directly.

Both raise the SDK's exceptions (``openai.APIStatusError``, ``APITimeoutError``,
``APIConnectionError``), so the client's retry policy sees one error vocabulary. ``direct``
(the default) skips the SDK's per-request work; ``sdk`` is the reference path. Each keeps
one connection pool per server (the SDK's) or per event loop (aiohttp's). Each server gets
its own key where this process knows one (:func:`vime.net.engine_headers`: a run's engines), else
``api_key``.

Example:
    >>> import asyncio
    >>> transport = Transport("direct", max_connections=8, timeout_s=lambda: 60.0, api_key="EMPTY")
    >>> transport.headers("http://127.0.0.1:8000")["Authorization"]
    'Bearer EMPTY'
    >>> asyncio.run(transport.aclose())
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import httpx2
import openai

from vime.net import engine_key

# Idle connections are dropped after this long: below the 5 s after which vLLM's server
# (uvicorn) closes them by default, so a request never goes out on a connection the server
# is closing. (aiohttp's own default, 15 s, races with it.)
KEEPALIVE_S = 4.0

TRANSPORTS = ("direct", "sdk")


class Transport:
    """POSTs to ``/v1/completions``, GETs ``/v1/models``, and the aiohttp session the
    client's probes share. ``timeout_s()`` is read at each request (the run sets the
    client's after building it)."""

    def __init__(
        self, kind: str, *, max_connections: int, timeout_s: Callable[[], float], api_key: str
    ):
        self.kind = kind
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self.api_key = api_key
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._session: aiohttp.ClientSession | None = None  # the direct transport's
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop it belongs to
        self._headers: dict[str, dict[str, str]] = {}  # url -> the SDK's request headers

    def client(self, url: str) -> openai.AsyncOpenAI:
        """The SDK client of ``url`` (made once)."""
        client = self._clients.get(url)
        if client is None:
            n = self.max_connections
            # The SDK's aiohttp client: httpx's own pool scans every pooled connection on
            # each request, which costs milliseconds at hundreds of connections.
            http = openai.DefaultAioHttpClient(
                limits=httpx2.Limits(
                    max_connections=n, max_keepalive_connections=n, keepalive_expiry=KEEPALIVE_S
                ),
                timeout=self.timeout_s(),
            )
            # The SDK's own retries are off: the policy client owns the retry policy.
            client = openai.AsyncOpenAI(
                base_url=f"{url}/v1",
                api_key=engine_key(url) or self.api_key,
                max_retries=0,
                timeout=self.timeout_s(),
                http_client=http,
            )
            self._clients[url] = client
        return client

    def headers(self, url: str) -> dict[str, str]:
        """The headers the SDK would send to ``url`` (auth, content type, user agent)."""
        headers = self._headers.get(url)
        if headers is None:
            headers = self._headers[url] = _sdk_headers(self.client(url))
        return headers

    def session(self) -> aiohttp.ClientSession:
        """The direct transport's connection pool for the running event loop."""
        loop = asyncio.get_running_loop()
        session = self._session
        if session is None or session.closed or self._loop is not loop:
            # A session belongs to one event loop; a new asyncio.run() needs a new one.
            n = self.max_connections
            connector = aiohttp.TCPConnector(
                limit=n, limit_per_host=n, keepalive_timeout=KEEPALIVE_S
            )
            session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=None)
            )
            self._session, self._loop = session, loop
        return session

    async def post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``url``'s ``/v1/completions``; the parsed JSON answer."""
        if self.kind == "direct":
            return await self._post_direct(url, body)
        # The SDK's generic post with a raw response: errors still map to the SDK's
        # exceptions, but the SDK neither walks the params (its type-driven transform is
        # slow on a long token-id prompt) nor builds pydantic objects for the response.
        # On a small host that client CPU is taken from the engine.
        raw = await self.client(url).post("/completions", cast_to=httpx2.Response, body=body)
        return json.loads(raw.content)

    async def models(self, url: str) -> dict[str, Any]:
        """GET ``url``'s ``/v1/models``; the parsed JSON answer (failures as :meth:`post`'s)."""
        if self.kind == "direct":
            return await self._direct("GET", url, "/v1/models", None)
        raw = await self.client(url).get("/models", cast_to=httpx2.Response)
        return json.loads(raw.content)

    async def _post_direct(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._direct("POST", url, "/v1/completions", json.dumps(body).encode())

    async def _direct(self, method: str, url: str, path: str, data: bytes | None) -> dict[str, Any]:
        """One request with aiohttp; failures raise the SDK's exceptions, as the SDK path
        does (but a connection the server dropped is a connection error, not the SDK's
        "Request timed out.")."""
        endpoint = f"{url}{path}"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s())
        try:
            async with self.session().request(
                method, endpoint, data=data, headers=self.headers(url), timeout=timeout
            ) as resp:
                status, content = resp.status, await resp.read()
        except TimeoutError as err:
            raise openai.APITimeoutError(request=httpx2.Request(method, endpoint)) from err
        except aiohttp.ClientError as err:
            raise openai.APIConnectionError(
                message=f"{type(err).__name__}: {err}", request=httpx2.Request(method, endpoint)
            ) from err
        if status >= 400:
            try:
                detail: Any = json.loads(content)
            except ValueError:
                detail = content.decode(errors="replace")
            response = httpx2.Response(status, request=httpx2.Request(method, endpoint))
            message = detail_of(detail) or f"HTTP {status}"
            raise openai.APIStatusError(message, response=response, body=detail)
        return json.loads(content)

    async def aclose(self) -> None:
        """Close every connection."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        if self._session is not None and not self._session.closed:
            try:
                await self._session.close()
            except RuntimeError:  # its event loop is already closed
                pass
        self._session = None


def _sdk_headers(client: openai.AsyncOpenAI) -> dict[str, str]:
    """The headers the SDK sends on every request (auth, content type, user agent, ...).

    Example:
        >>> h = _sdk_headers(openai.AsyncOpenAI(base_url="http://h:1/v1", api_key="k"))
        >>> h["Authorization"], h["Content-Type"]
        ('Bearer k', 'application/json')
    """
    merged = {**client.default_headers, **client.auth_headers}
    return {k: v for k, v in merged.items() if isinstance(v, str)}  # drops the SDK's Omit()


def error_detail(err: openai.APIStatusError) -> str:
    """The server's own message in an HTTP error (the SDK's text if it sent none)."""
    return detail_of(err.body) or str(err)


def with_cause(err: BaseException | None) -> str:
    """``err`` and, where another error caused it, the first one: the SDK calls a
    connection the server dropped "Request timed out."; the cause says what happened.

    Example:
        >>> try:
        ...     try:
        ...         raise ConnectionResetError("reset by peer")
        ...     except OSError as cause:
        ...         raise RuntimeError("Request timed out.") from cause
        ... except RuntimeError as err:
        ...     with_cause(err)
        'Request timed out. (ConnectionResetError: reset by peer)'
    """
    root = err
    while root is not None:
        below = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
        if below is None:
            break
        root = below
    if root is None or root is err:
        return str(err)
    return f"{err} ({type(root).__name__}: {root})"


def detail_of(body: Any) -> str:
    """The error message inside an OpenAI-style error body ("" if none).

    Example:
        >>> detail_of({"error": {"message": "too long"}})
        'too long'
    """
    if isinstance(body, dict):
        msg = body.get("message") or body.get("error", {})
        if isinstance(msg, dict):
            msg = msg.get("message")
        if msg:
            return str(msg)
    return body if isinstance(body, str) else ""
