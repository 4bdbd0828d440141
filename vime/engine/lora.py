"""Serving LoRA adapters: the flags a vLLM server needs to load them at run time, and the
name each adapter version is served under.

A LoRA run's engines serve the frozen base with LoRA on (``--enable-lora``, a max rank
that fits the trainer's, two adapters at once: the one serving and the one loading) and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which opens ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``. Each weight sync loads version ``v`` as
``adapter_name(base, v)``; requests name the adapter of the version they are for.

Example:
    >>> lora_launch(EngineConfig(), 16).extra_args
    ['--enable-lora', '--max-lora-rank', '16', '--max-loras', '2', '--max-cpu-loras', '3']
    >>> adapter_name("tiny", 3)
    'tiny-lora-v3'
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from vime.engine import lora_ipc
from vime.engine.config import EngineConfig
from vime.errors import ConfigError

# vLLM's accepted --max-lora-rank values (vllm.config.lora.MaxLoRARanks, 0.26 and 0.32).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM accepts as ``--max-lora-rank`` that holds ``rank``.

    Example:
        >>> max_lora_rank(12)
        16
    """
    for allowed in MAX_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(
        f"trainer.lora.rank={rank}: vLLM serves adapters of rank {MAX_LORA_RANKS[-1]} at most",
        key="trainer.lora.rank",
    )


def lora_launch(config: EngineConfig, rank: int) -> EngineConfig:
    """``config`` with the flags and environment that serve adapters of ``rank`` (max
    loras 2: the serving and the loading version; the CPU cache holds one more), and
    vime's patch that loads adapters by CUDA IPC handles (:mod:`vime.engine.lora_ipc`).

    Example:
        >>> lora_launch(EngineConfig(), 16).env
        {'VLLM_ALLOW_RUNTIME_LORA_UPDATING': 'True', 'VIME_VLLM_LORA_IPC': '1'}
    """
    args = ["--enable-lora", "--max-lora-rank", str(max_lora_rank(rank))]
    args += ["--max-loras", "2", "--max-cpu-loras", "3"]
    return dataclasses.replace(
        config,
        extra_args=[*config.extra_args, *args],
        env={**config.env, RUNTIME_ENV: "True", lora_ipc.ENV: "1"},
    )


def adapter_name(base: str, version: int) -> str:
    """The name adapter ``version`` is served under. Version 0 (the adapters at zero: the
    base's outputs) is an adapter too, loaded before the first rollout: an engine that
    cannot load adapters fails the run at its start, and every sample goes through the
    same LoRA kernels.

    Example:
        >>> adapter_name("tiny", 0)
        'tiny-lora-v0'
    """
    return f"{base}-lora-v{version}"


def adapter_rank(folder: str | Path) -> int:
    """The rank of the PEFT adapter in ``folder`` (its ``adapter_config.json``'s ``r``), or
    a ConfigError naming ``adapter``.

    Example:
        >>> adapter_rank("/nonexistent")
        Traceback (most recent call last):
        ...
        vime.errors.ConfigError: adapter: /nonexistent has no adapter_config.json; give a PEFT adapter folder (e.g. a LoRA run's weights/vNNNNNN)
    """
    config = Path(folder) / "adapter_config.json"
    if not config.is_file():
        raise ConfigError(
            f"adapter: {folder} has no adapter_config.json; give a PEFT adapter folder "
            "(e.g. a LoRA run's weights/vNNNNNN)",
            key="adapter",
        )
    return int(json.loads(config.read_text())["r"])


def serve_adapter(url: str, folder: str | Path, name: str = "adapter") -> str:
    """Load the PEFT folder into the engine at ``url`` (started with :func:`lora_launch`)
    as ``name``; returns the name requests give as ``model``.

    Usage (no doctest: it needs an engine started for LoRA, which the tests' shared engine
    is not): ``serve_adapter("http://127.0.0.1:8000", "runs/r/weights/v000040")`` returns
    ``'adapter'``.
    """
    from vime.engine.client import EngineClient

    with EngineClient(url) as engine:
        engine.load_lora_adapter(name, folder)
    return name
