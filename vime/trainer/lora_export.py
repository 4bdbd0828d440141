"""The trainer's LoRA adapters (:mod:`vime.trainer.lora`) out: a PEFT folder, or merged.

A PEFT folder is ``adapter_config.json`` + ``adapter_model.safetensors`` with the HF
module names PEFT and vLLM load (``base_model.model.model.layers.{i}.self_attn.q_proj
.lora_A.weight`` …). Megatron's fused linears become HF's separate ones: ``linear_qkv``'s
one ``A`` is each of q/k/v_proj's ``lora_A`` and its ``B`` is split like the fused weight
(its rows are the q, k and v rows); ``linear_fc1`` likewise into gate/up_proj. The merged
export adds ``(alpha / rank) · B @ A`` to each HF weight, in float32.

Example:
    >>> peft_name(3, "self_attn", "q_proj", "A")
    'base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight'
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from vime.trainer.hf_layout import local_to_hf
from vime.trainer.lora import TARGETS, LoraAdapters, LoraConfig, lora_of

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def peft_name(layer: int, block: str, module: str, which: str) -> str:
    """PEFT's tensor name of HF module ``module``'s ``lora_{which}`` in ``layer``."""
    return f"base_model.model.model.layers.{layer}.{block}.{module}.lora_{which}.weight"


def _gather(t: torch.Tensor, dim: int) -> list[torch.Tensor]:
    from megatron.core import parallel_state as ps

    group = ps.get_tensor_model_parallel_group()
    tp = dist.get_world_size(group)
    if tp == 1:
        return [t.detach()]
    shards = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(shards, t.detach().contiguous(), group=group)
    return shards


@torch.no_grad()
def stage_adapter(model: Any) -> dict[str, torch.Tensor] | None:
    """This pipeline stage's adapters, PEFT-named, where they live (the GPU): TP gathered,
    B split like the fused weight, and a fused linear's one ``A`` shared (not copied) by
    its modules. None for a model without adapters. Collective over TP."""
    while hasattr(model, "module"):  # DDP
        model = model.module
    adapters = lora_of(model)
    if adapters is None:
        return None
    spec = model.hf_spec
    stage: dict[str, torch.Tensor] = {}
    for i, name, pair in adapters.pairs():
        block, modules = TARGETS[name]
        if pair.column:  # A whole; B's rows split like the fused weight's
            a_full = [pair.a.detach() for _ in modules]
            kind = {"linear_qkv": "qkv", "linear_fc1": "fc1"}[name]
            b_full = local_to_hf(kind, _gather(pair.b, 0), spec)
        else:  # A's columns split over TP; B whole
            a_full = local_to_hf("row", _gather(pair.a, 1), spec)
            b_full = [pair.b.detach()]
        for module, a, b in zip(modules, a_full, b_full, strict=True):
            stage[peft_name(i, block, module, "A")] = a
            stage[peft_name(i, block, module, "B")] = b
    return stage


@torch.no_grad()
def adapter_hf_state(model: Any) -> dict[str, torch.Tensor] | None:
    """The adapters as PEFT-named float tensors on global rank 0 (None elsewhere, and for a
    model without adapters). Collective: every rank calls it (TP all-gather, PP gather).

    Example (``trainer``: a :class:`~vime.trainer.step.Trainer` with rank-4 adapters):
        >>> state = adapter_hf_state(trainer.module)
        >>> name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
        >>> tuple(state[name].shape)
        (4, 64)
    """
    from megatron.core import parallel_state as ps

    local = stage_adapter(model)
    if local is None:
        return None
    # copy=True: never an alias of the trainer's parameters (q/k/v get three A tensors)
    stage = {k: v.to("cpu", copy=True).contiguous() for k, v in local.items()}
    if ps.get_pipeline_model_parallel_world_size() > 1:
        group = ps.get_pipeline_model_parallel_group()
        parts: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(parts, stage, group=group)
        stage = {k: v for part in parts for k, v in part.items()}
    return stage if dist.get_rank() == 0 else None


def peft_config(config: LoraConfig, base: str | Path) -> dict[str, Any]:
    """``adapter_config.json``'s content for ``config`` on the base model folder ``base``.

    Example:
        >>> peft_config(LoraConfig(rank=8), "/m")["target_modules"][:3]
        ['q_proj', 'k_proj', 'v_proj']
    """
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": config.rank,
        "lora_alpha": config.alpha,
        "lora_dropout": config.dropout,
        "target_modules": [m for t in config.targets for m in TARGETS[t][1]],
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def export_peft(model: Any, folder: str | Path, *, base: str | Path) -> Path | None:
    """Write the adapters as a PEFT folder (collective; global rank 0 writes and returns
    the folder). Tensors are in the model's dtype.

    Example (``trainer``: a :class:`~vime.trainer.step.Trainer` with adapters):
        >>> out = export_peft(trainer.module, tmp / "adapters" / "v000003", base=hf_folder)
        >>> sorted(p.name for p in out.iterdir())
        ['adapter_config.json', 'adapter_model.safetensors']
    """
    from megatron.core import parallel_state as ps

    adapters = lora_of(model)
    tensors: dict[str, torch.Tensor] | None
    if ps.get_pipeline_model_parallel_world_size() > 1:  # stages gathered as objects
        tensors = adapter_hf_state(model)
    else:  # one device-to-host copy of the packed tensors (1.78B, rank 32: 74 MB)
        tensors = stage_adapter(model)
    if tensors is None or adapters is None or dist.get_rank() != 0:
        return None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, out / ADAPTER_WEIGHTS)
    text = json.dumps(peft_config(adapters.config, base), indent=2)
    (out / ADAPTER_CONFIG).write_text(text + "\n")
    return out


def write_safetensors(tensors: dict[str, torch.Tensor], path: str | Path) -> int:
    """Write ``tensors`` (one dtype, on any device) as a safetensors file, the format
    ``safetensors.torch.save_file`` writes, with one device-to-host copy of them all
    packed (into a reused pinned buffer) and one write; returns the bytes written.
    Tensors of mixed dtypes go through ``save_file``.

    Example:
        >>> from safetensors.torch import load_file
        >>> write_safetensors({"a": torch.ones(2, 3), "b": torch.zeros(4)}, tmp / "t.st")
        192
        >>> load_file(tmp / "t.st")["a"].sum().item()
        6.0
    """
    names = sorted(tensors)
    dtype = tensors[names[0]].dtype
    if dtype not in _ST_DTYPES or any(tensors[n].dtype != dtype for n in names):
        save_file({n: t.to("cpu").contiguous() for n, t in tensors.items()}, str(path))
        return Path(path).stat().st_size
    return write_packed(safetensors_header(tensors), pack(tensors), path)


def safetensors_header(tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The safetensors header of ``tensors`` (one dtype), names sorted: the layout that
    :func:`pack` gives their bytes.

    Example:
        >>> safetensors_header({"b": torch.zeros(4), "a": torch.ones(2)})["b"]
        {'dtype': 'F32', 'shape': [4], 'data_offsets': [8, 24]}
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for n in sorted(tensors):
        size = tensors[n].numel() * tensors[n].element_size()
        header[n] = {"dtype": _ST_DTYPES[tensors[n].dtype], "shape": list(tensors[n].shape)}
        header[n]["data_offsets"] = [offset, offset + size]
        offset += size
    return header


def pack(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """``tensors`` (one dtype) flattened into one tensor where they are, names sorted: a
    safetensors file's data section (one kernel on the GPU)."""
    return torch.cat([tensors[n].reshape(-1) for n in sorted(tensors)])


def write_packed(
    header: dict[str, Any], flat: torch.Tensor, path: str | Path, pinned: dict | None = None
) -> int:
    """Write the safetensors file of :func:`pack`'s ``flat`` (on any device) with its
    ``header``; returns the bytes written. ``pinned`` keeps the host buffer between calls
    (a writer thread passes its own)."""
    host = _host_copy(flat, _PINNED if pinned is None else pinned)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # data 8-byte aligned, as safetensors pads
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        f.write(host.view(torch.uint8).numpy().data)
    return 8 + len(text) + host.numel() * host.element_size()


_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_PINNED: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # the last size's host buffer


def _host_copy(flat: torch.Tensor, pinned: dict) -> torch.Tensor:
    """``flat`` on the host: a CPU tensor as is, a GPU one copied into a pinned buffer
    kept in ``pinned`` for the next export (pinning 74 MB anew costs more than the copy)."""
    if flat.device.type == "cpu":
        return flat
    key = (flat.numel(), flat.dtype)
    if key not in pinned:
        pinned.clear()
        pinned[key] = torch.empty(key[0], dtype=key[1], pin_memory=True)
    host = pinned[key]
    host.copy_(flat)  # blocking: the write reads it
    return host


def merge_adapters(
    state: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor], scale: float
) -> dict[str, torch.Tensor]:
    """``state`` (HF names) with ``scale · B @ A`` of each adapted module added, in float32.

    Example:
        >>> w = {"model.layers.0.mlp.down_proj.weight": torch.zeros(2, 2)}
        >>> ab = {peft_name(0, "mlp", "down_proj", "A"): torch.ones(1, 2),
        ...       peft_name(0, "mlp", "down_proj", "B"): torch.ones(2, 1)}
        >>> merge_adapters(w, ab, 0.5)["model.layers.0.mlp.down_proj.weight"]
        tensor([[0.5000, 0.5000],
                [0.5000, 0.5000]])
    """
    out = dict(state)
    prefix = "base_model.model."
    for name, a in adapter.items():
        if ".lora_A." not in name:
            continue
        b = adapter[name.replace(".lora_A.", ".lora_B.")]
        target = name[len(prefix) :].replace(".lora_A.weight", ".weight")
        w = out[target]
        out[target] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
    return out


def merged_state(state: dict[str, torch.Tensor] | None, model: Any) -> dict[str, Any] | None:
    """``state`` (:func:`~vime.trainer.hf.hf_state_dict`'s, rank 0) with the model's
    adapters merged in; unchanged for a model without them. Collective when it has them.

    Example:
        >>> merged_state({"x": 1}, torch.nn.Linear(1, 1))
        {'x': 1}
    """
    adapters: LoraAdapters | None = lora_of(model)
    if adapters is None:
        return state
    adapter = adapter_hf_state(model)
    if state is None or adapter is None:
        return state
    return merge_adapters(state, adapter, adapters.config.scale)
