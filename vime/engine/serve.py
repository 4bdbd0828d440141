"""The engine a run uses, for the length of a ``with`` block: attached or launched.

``with serve_engine(EngineConfig(), model_dir) as server:`` launches a server on the
folder and stops it after the block; with ``EngineConfig(url=...)`` it attaches (the
function's example).
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

    Example (attached to the test session's server, see :mod:`vime.engine`):
        >>> with serve_engine(EngineConfig(url=engine_url), "") as s:
        ...     s.health(), s.external
        (True, True)
    """
    if config.url:
        yield VLLMServer.attach(config.url, api_key=config.api_key)
        return
    launch = dataclasses.replace(
        config, model=str(model_dir), log_dir=config.log_dir or str(log_dir or "")
    )
    with VLLMServer(launch) as server:
        yield server
