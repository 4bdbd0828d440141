"""The engine a run uses, for the length of a ``with`` block: attached or launched.

Example (skipped as a doctest: it starts a vLLM server):
    >>> with serve_engine(EngineConfig(), "/tmp/tiny") as server:  # doctest: +SKIP
    ...     print(server.url)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from vime.engine.config import EngineConfig
from vime.engine.server import VLLMServer


@contextlib.contextmanager
def serve_engine(
    config: EngineConfig, model_dir: str | Path, log_dir: str | Path | None = None
) -> Iterator[VLLMServer]:
    """Attach to ``config.url``, or launch a server on ``model_dir`` and stop it on exit.

    ``log_dir`` is where a launched server logs unless ``config.log_dir`` says otherwise.
    An attached server is never stopped: vime did not start it.

    Example (skipped as a doctest: it needs that server):
        >>> with serve_engine(EngineConfig(url="http://10.0.0.5:8000"), "") as s:  # doctest: +SKIP
        ...     s.health()
    """
    if config.url:
        yield VLLMServer.attach(config.url)
        return
    launch = dataclasses.replace(
        config, model=str(model_dir), log_dir=config.log_dir or str(log_dir or "")
    )
    with VLLMServer(launch) as server:
        yield server
