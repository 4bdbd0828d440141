"""The session's vLLM server is shared: a test that trains against it gives its weights back.

Example:
    >>> from tests.shared_server import give_back_tiny_weights  # doctest: +SKIP
    >>> give_back_tiny_weights(vllm_server.url, tiny_model_dir)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path


def give_back_tiny_weights(url: str, tiny_model_dir: Path) -> None:
    """Load the tiny model's weights (version 0) into the server at ``url`` again."""
    from vime.engine import EngineClient

    EngineClient(url).update_weights_from_disk(tiny_model_dir, 0)
