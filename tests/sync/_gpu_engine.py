"""The GPU sync tests' vLLM engine: the tiny model in bf16, 256 tokens, a tenth of the GPU.

Small enough to share one GPU with the trainer and with another engine; eager, so that it
starts in seconds with the same numerics. Used by tests/sync/test_gpu_sync.py (NCCL and
IPC weight transfer) and tests/sync/test_lora_ipc.py (LoRA adapters by CUDA IPC).

Usage (no doctest: tests are not doctested, and building it needs the tiny model):
``VLLMServer(tiny_gpu_engine(tmp, extra_args=args, env=env)).start()``
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from vime.engine.config import EngineConfig


def tiny_gpu_engine(
    log_dir: str | Path, *, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> EngineConfig:
    """The engine config, ``extra_args`` after ``--enforce-eager``, ``env`` for its process."""
    from vime.models.tiny import build_tiny_model

    return EngineConfig(
        model=str(build_tiny_model()),
        device="cuda",
        dtype="bfloat16",
        max_model_len=256,
        gpu_memory_utilization=0.1,
        extra_args=["--enforce-eager", *extra_args],  # eager: starts in seconds, same numerics
        env=dict(env or {}),
        log_dir=str(log_dir),
    )
