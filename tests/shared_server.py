"""The session's vLLM server is shared: a test that trains against it gives its weights back.

Example:
    >>> from tests.shared_server import give_back_tiny_weights  # doctest: +SKIP
    >>> give_back_tiny_weights(vllm_server.url, tiny_model_dir)  # doctest: +SKIP
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx


def give_back_tiny_weights(url: str, tiny_model_dir: Path) -> None:
    """Load the tiny model's weights (version 0) into the server at ``url`` again."""
    from vime.engine import EngineClient

    EngineClient(url).update_weights_from_disk(tiny_model_dir, 0)


def generated_tokens(url: str) -> float:
    """vLLM's own count of the tokens it has sampled (Prometheus ``/metrics``)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    )
