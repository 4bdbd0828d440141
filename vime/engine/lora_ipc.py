"""In-memory LoRA adapter loads (``sync.lora_load=ipc``): the trainer hands vLLM its packed
adapter by CUDA IPC handles instead of a safetensors file to read.

The trainer (:func:`vime.trainer.lora_share.share_peft`) packs the PEFT-named adapter
tensors into one GPU buffer on each of its ranks, laid out as a safetensors file's data
(names sorted, the same offsets), and writes a folder that ``/v1/load_lora_adapter`` is
given: ``adapter_config.json`` (the PEFT config, which vLLM reads as for a file) and
``adapter_ipc.json``: the safetensors header of the buffer and, per GPU (by UUID), the
buffer's CUDA IPC handle. In each vLLM worker, :func:`patch` (applied by vime's vLLM
plugin where :func:`vime.engine.lora.lora_launch` set ``VIME_VLLM_LORA_IPC=1``) makes
``LoRAModel.from_local_checkpoint`` take such a folder: the worker opens its GPU's handle,
clones the buffer (the trainer's changes with its next step) and builds the adapter from
views of the clone with vLLM's own ``from_lora_tensors``, on the GPU, where a file load
reads 74 MB (1.78B, rank 32) into pinned host memory first. The tensors are the file's,
bit for bit: the same bytes, the same dtype, the same vLLM code after them. A folder
without ``adapter_ipc.json`` loads as before.

A GPU that no handle covers (the engine is not on a trainer rank's GPU) is an error
naming the folder; vLLM answers the load with it and the sync stops the run naming the
adapter (:class:`vime.sync.lora.LoraWeightSync`).

Example (a handle's JSON form; what ``reduce_tensor`` gives is bytes and ints):
    >>> args = (None, (2, 3), (3, 1), 0, None, None, 0, b"h", 12, 0, False, b"r", 4, b"e", True)
    >>> record = encode_handle(args)
    >>> record["handle"], decode_handle(record, 5)[6:9]
    ('aA==', (5, b'h', 12))
    >>> views(torch.arange(6, dtype=torch.float32),
    ...       {"b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})["b"].tolist()
    [4.0, 5.0]
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import torch

from vime.engine.vllm_patch import MARK, replace_methods

ENV = "VIME_VLLM_LORA_IPC"
IPC_FILE = "adapter_ipc.json"
IPC_DIR = "ipc"  # the sub-folder of a version's PEFT folder that an IPC load is given
DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
# reduce_tensor's args (torch.multiprocessing.reductions), in order; _BYTES: the bytes ones.
_FIELDS = [
    "cls",
    "size",
    "stride",
    "offset",
    "storage_cls",
    "dtype",
    "device",
    "handle",
    "storage_size",
    "storage_offset",
    "requires_grad",
    "ref_counter_handle",
    "ref_counter_offset",
    "event_handle",
    "event_sync_required",
]
_BYTES = ("handle", "ref_counter_handle", "event_handle")


def encode_handle(args: tuple[Any, ...]) -> dict[str, Any]:
    """``reduce_tensor(t)[1]`` of a plain CUDA tensor as JSON data (no pickle: the engine
    reads it from a file)."""
    record = dict(zip(_FIELDS, args, strict=True))
    out = {k: v for k, v in record.items() if k not in ("cls", "storage_cls", "dtype")}
    out["size"], out["stride"] = list(record["size"]), list(record["stride"])
    for key in _BYTES:
        out[key] = base64.b64encode(record[key]).decode()
    return out


def decode_handle(record: dict[str, Any], device: int) -> tuple[Any, ...]:
    """:func:`encode_handle`'s record as ``rebuild_cuda_tensor``'s args, opened on this
    process's ``device`` (the trainer's index of the same GPU may differ). A uint8 buffer."""
    values = dict(record)
    values.update(cls=torch.Tensor, storage_cls=torch.storage.TypedStorage, dtype=torch.uint8)
    values.update(size=torch.Size(record["size"]), stride=tuple(record["stride"]), device=device)
    for key in _BYTES:
        values[key] = base64.b64decode(record[key])
    return tuple(values[k] for k in _FIELDS)


def views(flat: torch.Tensor, header: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors a safetensors ``header`` lays out in the data bytes ``flat`` (any
    dtype: viewed as bytes), as views of it."""
    data = flat.view(torch.uint8)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        out[name] = data[start:end].view(DTYPES[entry["dtype"]]).view(entry["shape"])
    return out


def read_ipc(folder: str | Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of the IPC folder ``folder``, cloned onto this process's GPU."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    meta = json.loads((Path(folder) / IPC_FILE).read_text())
    index = torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    record = meta["handles"].get(uuid)
    if record is None:
        raise ValueError(
            f"LoRA adapter {folder}: no CUDA IPC handle for this engine's GPU {uuid} (the "
            f"trainer shared it on {sorted(meta['handles'])}): an IPC adapter load needs the "
            "engine on a trainer rank's GPU; set sync.lora_load=file"
        )
    shared = rebuild_cuda_tensor(*decode_handle(record, index))
    flat = shared.clone()  # the trainer's buffer is reused by its next export
    torch.cuda.current_stream().synchronize()  # the copy is done before the unmapping
    del shared  # drop the mapping now: the trainer may free its buffer after this load
    return views(flat, meta["header"])


def patch() -> bool:
    """Let vLLM's LoRA loader read IPC folders (the module docstring); True if patched."""
    return replace_methods(
        ENV,
        _targets,
        _wrap,
        missing="its LoRA model class",
        moved="vLLM's LoRAModel.from_local_checkpoint moved; IPC adapter loads will fail",
        done="LoRA adapter folders with adapter_ipc.json load from CUDA IPC handles",
    )


def _targets() -> list[tuple[Any, str]]:
    from vllm.lora.lora_model import LoRAModel

    return [(LoRAModel, "from_local_checkpoint"), (LoRAModel, "from_lora_tensors")]


def _wrap(original: Any, from_tensors: Any) -> list[Any]:
    from_file = original.__func__  # a bound classmethod: call it for the class asked

    def from_local_checkpoint(
        cls: Any, lora_dir: str, expected_lora_modules: set[str], peft_helper: Any, **kw: Any
    ) -> Any:
        if not os.path.isfile(os.path.join(lora_dir, IPC_FILE)):
            return from_file(cls, lora_dir, expected_lora_modules, peft_helper, **kw)
        return build(cls, lora_dir, read_ipc(lora_dir), expected_lora_modules, peft_helper, **kw)

    setattr(from_local_checkpoint, MARK, ENV)  # seen through the bound method: applied once
    return [classmethod(from_local_checkpoint), from_tensors]


def build(
    cls: Any, folder: str, tensors: dict[str, Any], expected: set[str], peft_helper: Any, **kw: Any
) -> Any:
    """vLLM's ``cls.from_lora_tensors`` of ``tensors`` where they are (no pinned host
    copy), after the module check a file load makes; ``kw``: ``from_local_checkpoint``'s."""
    from vllm.lora.utils import parse_fine_tuned_lora_name

    mapper = kw.get("weights_mapper")
    names = (parse_fine_tuned_lora_name(n, mapper)[0] for n in tensors)
    unexpected = sorted({n for n in names if n.rsplit(".", 1)[-1] not in expected})
    if unexpected:
        raise ValueError(
            f"While loading {folder}, expected target modules in {expected} but received "
            f"{unexpected}"
        )
    return cls.from_lora_tensors(
        lora_model_id=kw["lora_model_id"],
        tensors=tensors,
        peft_helper=peft_helper,
        device=next(iter(tensors.values())).device,
        dtype=kw.get("dtype"),
        model_vocab_size=kw.get("model_vocab_size"),
        weights_mapper=mapper,
        skip_prefixes=kw.get("skip_prefixes"),
    )
