"""The observability tests share one real training run (``_observed.py`` says which)."""

from __future__ import annotations

import pytest

from tests.observability._observed import ObservedRun, observe_a_run


@pytest.fixture(scope="session")
def observed_run(docker_host, vllm_server, tiny_model_dir, tmp_path_factory) -> ObservedRun:
    """``vime-agent train env=tools`` for 2 steps with every recorder on (once a session);
    the shared server gets the tiny model's weights (version 0) back afterwards."""
    from tests.shared_server import give_back_tiny_weights

    try:
        return observe_a_run(tmp_path_factory.mktemp("observed"), vllm_server.url)
    finally:
        give_back_tiny_weights(vllm_server.url, tiny_model_dir)
