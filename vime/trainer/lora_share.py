"""The trainer's side of an in-memory adapter load (``sync.lora_load=ipc``): the adapters
shared with the engines by CUDA IPC handles, the PEFT file written after, in the
background.

:func:`share_peft` (collective) packs the PEFT-named adapters on every rank's GPU, laid
out as a safetensors file's data (:func:`vime.trainer.lora_export.pack`), keeps that
buffer alive until the next share, and writes into ``folder``:

- ``ipc/adapter_config.json`` and ``ipc/adapter_ipc.json`` (the header and each GPU's
  handle, :mod:`vime.engine.lora_ipc`): what the engines load, once;
- ``adapter_config.json`` at once, and ``adapter_model.safetensors`` from a background
  thread (the same bytes as :func:`~vime.trainer.lora_export.export_peft` writes, renamed
  into place whole): the run's PEFT folder, for checkpoints, ``vime-agent eval adapter=``
  and the file load of an engine that restarts. The next share (and
  :func:`finish_writes`) waits for it and raises what it raised.

Every trainer rank shares its own copy (TP shards are gathered on every rank), so an
engine on any trainer GPU finds its GPU's handle. PP > 1 is not supported (the stages'
adapters live on different GPUs): use the file load.

Usage (no doctest: it needs CUDA): ``share_peft(trainer.module, "run/weights/v000003",
base=hf_folder)``; tests/sync/test_lora_ipc.py runs it against a GPU engine.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vime.engine.lora_ipc import IPC_DIR, IPC_FILE, encode_handle
from vime.errors import ConfigError
from vime.trainer.lora import lora_of
from vime.trainer.lora_export import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    pack,
    peft_config,
    safetensors_header,
    stage_adapter,
    write_packed,
)

_SHARED: list[torch.Tensor] = []  # the buffer the engines' handles point at, until the next
_WRITER: list[threading.Thread] = []  # the PEFT file's writer of the last share
_FAILED: list[BaseException] = []  # what it raised
_PINNED: dict = {}  # the writer's host buffer (the file export's is its own)


def share_peft(model: Any, folder: str | Path, *, base: str | Path) -> Path | None:
    """Share the adapters by CUDA IPC and write ``folder`` as the module docstring says
    (collective; global rank 0 writes and returns ``folder``)."""
    from megatron.core import parallel_state as ps

    if ps.get_pipeline_model_parallel_world_size() > 1:
        raise ConfigError(
            "sync.lora_load=ipc: the adapters of a pipeline-parallel trainer live on several "
            "GPUs; use sync.lora_load=file with placement.pp > 1",
            key="sync.lora_load",
        )
    finish_writes()
    adapters = lora_of(model)
    tensors = stage_adapter(model)
    if tensors is None or adapters is None:
        return None
    header = safetensors_header(tensors)
    _SHARED[:] = [pack(tensors)]
    torch.cuda.ipc_collect()  # free buffers of earlier shares the engines have let go
    flat = _SHARED[0]
    handles = {_gpu_uuid(flat): encode_handle(_reduce(flat))}
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, handles)
        handles = {k: v for part in parts for k, v in part.items()}
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    out = Path(folder)
    (out / IPC_DIR).mkdir(parents=True, exist_ok=True)
    config = json.dumps(peft_config(adapters.config, base), indent=2) + "\n"
    meta = {"header": header, "handles": handles, "bytes": flat.numel() * flat.element_size()}
    for path, text in (
        (out / IPC_DIR / ADAPTER_CONFIG, config),
        (out / IPC_DIR / IPC_FILE, json.dumps(meta)),
        (out / ADAPTER_CONFIG, config),
    ):
        path.write_text(text)
    done = torch.cuda.Event()
    done.record()  # the pack's kernel, on this thread's stream
    writer = threading.Thread(
        target=_write, args=(header, flat, done, out / ADAPTER_WEIGHTS), name="vime-peft-writer"
    )
    writer.start()
    _WRITER[:] = [writer]
    return out


def finish_writes() -> None:
    """Wait for the last share's PEFT file; raise what its writer raised.

    Example (nothing shared yet):
        >>> finish_writes()
    """
    for writer in _WRITER:
        writer.join()
    _WRITER.clear()
    if _FAILED:
        err = _FAILED.pop()
        raise OSError(f"writing the LoRA adapter's PEFT file failed: {err}") from err


def _write(header: dict[str, Any], flat: torch.Tensor, done: Any, path: Path) -> None:
    try:
        done.synchronize()
        partial = path.with_name(path.name + ".partial")
        write_packed(header, flat, partial, _PINNED)
        os.replace(partial, path)  # the folder is a whole PEFT folder from here on
    except BaseException as err:  # handed to the next finish_writes
        _FAILED.append(err)


def _reduce(flat: torch.Tensor) -> tuple[Any, ...]:
    from torch.multiprocessing.reductions import reduce_tensor

    return reduce_tensor(flat.view(torch.uint8))[1]


def _gpu_uuid(t: torch.Tensor) -> str:
    return str(torch.cuda.get_device_properties(t.device).uuid)
