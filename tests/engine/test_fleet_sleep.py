"""Colocated engines sleep while the trainer trains and wake before the weight sync.

vLLM's sleep mode needs CUDA, so the engines here are a local HTTP server that records the
dev-mode routes it is called on (the GPU path runs the real thing).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import pytest

from vime.engine import EngineClient
from vime.engine.fleet import EngineFleet, asleep


class _Recorder(BaseHTTPRequestHandler):
    calls: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        type(self).calls.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def engine_url():
    _Recorder.calls = []
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_engines_sleep_inside_the_block_and_wake_even_on_error(engine_url):
    engines = [EngineClient(engine_url), EngineClient(engine_url)]
    with asleep(engines):
        assert _Recorder.calls == ["/sleep?level=1", "/sleep?level=1"]
    assert _Recorder.calls[2:] == ["/wake_up", "/wake_up"]
    _Recorder.calls.clear()
    with pytest.raises(RuntimeError), asleep(engines):
        raise RuntimeError("the train step failed")
    assert _Recorder.calls == ["/sleep?level=1"] * 2 + ["/wake_up"] * 2


def test_split_engines_never_sleep(engine_url):
    with asleep([EngineClient(engine_url)], enabled=False):
        pass
    assert _Recorder.calls == []


def test_fleet_joins_external_urls_once():
    fleet = EngineFleet([], ["http://a:1"])
    fleet.join(["http://b:2/", "http://a:1"])
    assert fleet.urls == ["http://a:1", "http://b:2"]
    assert fleet.restart_dead() == []  # it launched nothing, so it restarts nothing
