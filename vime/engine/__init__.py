"""vLLM engines: launch a server for a model folder (or attach to one), and drive its
dev endpoints (weight reload, pause/resume, prefix cache, weight version).

Example (the server part is skipped as a doctest: it starts a vLLM server):
    >>> from vime.engine import EngineClient, EngineConfig, VLLMServer
    >>> with VLLMServer(EngineConfig(model="/tmp/tiny")) as server:    # doctest: +SKIP
    ...     EngineClient(server.url).update_weights_from_disk("/tmp/step1", 1)
"""

from vime.engine.client import EngineClient, WeightUpdate
from vime.engine.config import EngineConfig
from vime.engine.server import (
    VLLMServer,
    check_model_path,
    default_served_model_name,
    free_port,
    is_vllm_cpu,
    port_in_use,
)
from vime.errors import EngineError, EngineStartupError

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
