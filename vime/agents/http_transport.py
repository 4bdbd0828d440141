"""An aiohttp-backed transport for the openai SDK's httpx client.

Why: the openai SDK sends through httpx, whose connection pool (httpcore) walks every
pooled connection, with a socket poll for each idle one, on every request. With hundreds
of concurrent episodes that cost ~4 ms of client CPU per request on the reference
machine, against ~0.3 ms for aiohttp's pool; on a small host that CPU is taken from the
engine. The SDK keeps doing everything it does (request building, headers, timeouts,
status-code → exception mapping); only the bytes travel through aiohttp.

Transport errors are mapped to httpx's (``ConnectError``, ``ReadTimeout``, ...), so the SDK
raises its usual ``APIConnectionError`` / ``APITimeoutError`` and the retry policy is
unchanged.

Example:
    >>> import httpx2, openai
    >>> http = httpx2.AsyncClient(transport=AiohttpTransport(limit=256))
    >>> client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="x",
    ...                             http_client=http)
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2

try:  # installed with vLLM; without it the SDK's default httpx transport is used
    import aiohttp
except ImportError:  # pragma: no cover - depends on the environment
    aiohttp = None  # type: ignore[assignment]

# Idle connections are dropped after this long: below the 5 s after which vLLM's server
# (uvicorn) closes them by default, so a request never goes out on a connection the server
# is closing. (aiohttp's own default, 15 s, races with it.)
KEEPALIVE_S = 4.0

# Hop-by-hop and length headers: aiohttp computes its own.
_SKIP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def available() -> bool:
    """Whether aiohttp can be imported here.

    Example:
        >>> isinstance(available(), bool)
        True
    """
    return aiohttp is not None


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """httpx transport that sends requests with one aiohttp session per event loop.

    Args:
        limit: maximum simultaneous connections (aiohttp's ``TCPConnector(limit=...)``).

    Example:
        >>> AiohttpTransport(limit=64).limit
        64
    """

    def __init__(self, limit: int = 1024) -> None:
        if aiohttp is None:
            raise ImportError("AiohttpTransport needs aiohttp (pip install aiohttp)")
        self.limit = limit
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def session(self) -> Any:
        """This event loop's aiohttp session (created on first use)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # A session belongs to one event loop; a new asyncio.run() needs a new one.
            connector = aiohttp.TCPConnector(
                limit=self.limit,
                limit_per_host=self.limit,
                keepalive_timeout=KEEPALIVE_S,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,  # httpx decodes Content-Encoding itself
                timeout=aiohttp.ClientTimeout(total=None),
            )
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        session = self.session()
        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=t.get("connect"), sock_read=t.get("read")
        )
        headers = [(k, v) for k, v in request.headers.multi_items() if k.lower() not in _SKIP]
        body = request.content if request.method not in ("GET", "HEAD") else None
        try:
            async with session.request(
                request.method,
                str(request.url),
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as resp:
                content = await resp.read()
                return httpx2.Response(
                    resp.status,
                    headers=[
                        (k.decode("latin-1"), v.decode("latin-1")) for k, v in resp.raw_headers
                    ],
                    content=content,
                    request=request,
                )
        except aiohttp.ServerTimeoutError as err:
            raise httpx2.ReadTimeout(str(err) or "read timed out", request=request) from err
        except TimeoutError as err:
            raise httpx2.ReadTimeout("request timed out", request=request) from err
        except aiohttp.ClientConnectorError as err:
            raise httpx2.ConnectError(str(err), request=request) from err
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
            raise httpx2.RemoteProtocolError(str(err), request=request) from err
        except aiohttp.ClientError as err:
            raise httpx2.NetworkError(str(err), request=request) from err

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            try:
                await self._session.close()
            except RuntimeError:  # its event loop is already closed
                pass
        self._session = None
