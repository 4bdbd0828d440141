"""An engine's key: how a launched server gets it (off its command line), what vime's
middleware answers with and without it, and that every client finds it by URL.

The real server behind the key is tested from another network namespace in
tests/placement/test_engine_auth.py; these need no server.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from vime.engine import EngineClient, EngineConfig, VLLMServer
from vime.engine.vllm_auth import KEY_ENV, RequireEngineKey
from vime.net import engine_headers, remember_engine_key


def test_a_launched_server_gets_the_key_in_its_environment_only(tiny_model_dir):
    keyed = VLLMServer(EngineConfig(model=str(tiny_model_dir), api_key="secret-1"))
    command = keyed.command()
    assert "secret-1" not in " ".join(command)  # ps shows a command line to every user
    assert command[command.index("--middleware") + 1] == "vime.engine.vllm_auth.RequireEngineKey"
    assert keyed.environment()[KEY_ENV] == "secret-1"
    # Without a key: no middleware, and no key inherited from this process's environment.
    open_ = VLLMServer(EngineConfig(model=str(tiny_model_dir), env={}))
    assert "--middleware" not in open_.command()
    assert KEY_ENV not in open_.environment()


def test_every_client_of_an_url_sends_its_key():
    remember_engine_key(["http://10.9.9.9:8000/"], "secret-2")
    assert engine_headers("http://10.9.9.9:8000") == {"Authorization": "Bearer secret-2"}
    with EngineClient("http://10.9.9.9:8000") as client:
        assert client._http.headers["Authorization"] == "Bearer secret-2"
    with EngineClient("http://10.9.9.8:8000") as client:  # an engine with no key
        assert "Authorization" not in client._http.headers


def _answer(guard: RequireEngineKey, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(guard(scope, None, send))
    return sent


def test_the_middleware_refuses_every_route_but_health_and_metrics_without_the_key():
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "served", "path": scope.get("path")})

    guard = RequireEngineKey(app, key="secret-3")

    def http(method: str, path: str, key: str | None = None) -> list[dict[str, Any]]:
        headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
        scope = {"type": "http", "method": method, "path": path, "headers": headers}
        return _answer(guard, scope)

    guarded = [("POST", "/collective_rpc"), ("POST", "/v1/completions"), ("POST", "/pause")]
    for method, path in [*guarded, ("POST", "/health"), ("GET", "/tokenize")]:
        for key in (None, "wrong"):
            start, body = http(method, path, key)
            assert start["status"] == 401, (method, path, key)
            assert json.loads(body["body"])["error"]["code"] == "invalid_api_key"
        assert http(method, path, "secret-3") == [{"type": "served", "path": path}]
    for path in ("/health", "/metrics"):
        assert http("GET", path) == [{"type": "served", "path": path}]
    websocket = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    assert _answer(guard, websocket) == [{"type": "websocket.close", "code": 1008}]
    assert _answer(guard, {"type": "lifespan"}) == [{"type": "served", "path": None}]
