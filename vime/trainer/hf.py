"""HF safetensors ⇄ Megatron weights, at any tensor- and pipeline-parallel size.

Every Megatron parameter is described by a :class:`_Map`: the HF tensor(s) it comes from
and a *kind* saying how it is laid out and split across TP ranks:

- ``replicated``: norms (same on every rank);
- ``column`` / ``row``: split along dim 0 / dim 1 (``o_proj`` and ``down_proj`` are row);
- ``vocab``: embedding / lm_head rows, padded to ``padded_vocab_size`` then split on dim 0;
- ``qkv``: q, k, v interleaved per query group (``[q of group g, k_g, v_g]`` for every g),
  then split on dim 0, so that each rank holds whole query groups;
- ``fc1``: gate and up; each rank holds ``[gate slice; up slice]``.

Loading reads the HF tensors on every rank and keeps this rank's slice. Export gathers the
slices over TP (all-gather) and the stages over PP (to global rank 0), undoes the layout,
and writes tensors with the names and dtypes of the checkpoint it was loaded from.

Example (``trainer.module``: a Megatron model stage, see :class:`~vime.trainer.step.Trainer`;
``hf_folder``: the HF checkpoint it was built from):
    >>> from vime.trainer.hf import load_hf_weights, export_hf
    >>> load_hf_weights(trainer.module, hf_folder)
    >>> export_hf(trainer.module, tmp / "hf", like=hf_folder).name
    'hf'
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from vime.errors import TrainerError
from vime.trainer.hf_layout import hf_to_local, local_to_hf
from vime.trainer.model import ModelSpec

WEIGHTS_NAME = "model.safetensors"
# safetensors' dtype names (as get_slice().get_dtype() reports them) for float weights.
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
}


@dataclass(frozen=True)
class _Map:
    mcore: str
    hf: tuple[str, ...]
    kind: str
    # An MoE expert's weight: split over the expert tensor-parallel group, not the TP group
    # (the same ranks while expert parallelism is 1, as in vime).
    expert: bool = False


def _tp_group(expert: bool) -> Any:
    from megatron.core import parallel_state as ps

    if expert:
        return ps.get_expert_tensor_parallel_group()
    return ps.get_tensor_model_parallel_group()


def _param_maps(model: Any) -> list[_Map]:
    """The mapping of every parameter this rank's model stage holds."""
    spec: ModelSpec = model.hf_spec
    maps: list[_Map] = []
    if model.pre_process:
        maps.append(
            _Map("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), "vocab")
        )
    experts = _local_experts(spec)
    for local, layer in enumerate(model.decoder.layers):
        i = layer.layer_number - 1  # global, 0-based (layer_number is global and 1-based)
        maps += _layer_maps(f"decoder.layers.{local}.", i, spec, experts)
    if model.post_process:
        maps.append(_Map("decoder.final_layernorm.weight", ("model.norm.weight",), "replicated"))
        if not (spec.tied_embeddings and model.pre_process):
            # Untied: lm_head. Tied with PP > 1: the last stage keeps its own copy of the
            # embedding (Megatron keeps the two in sync through the embedding group).
            src = "model.embed_tokens.weight" if spec.tied_embeddings else "lm_head.weight"
            maps.append(_Map("output_layer.weight", (src,), "vocab"))
    return maps


def _local_experts(spec: ModelSpec) -> range:
    """The HF indices of the experts this rank holds (all of them without expert parallelism;
    with EP ranks, ``num_experts / ep`` consecutive ones each, as megatron-core places them)."""
    from megatron.core import parallel_state as ps

    ep = ps.get_expert_model_parallel_world_size()
    per_rank = spec.num_experts // ep
    first = ps.get_expert_model_parallel_rank() * per_rank
    return range(first, first + per_rank)


def _layer_maps(m: str, i: int, spec: ModelSpec, experts: range) -> list[_Map]:
    """The maps of decoder layer ``i`` (global), whose Megatron prefix on this stage is ``m``;
    ``experts``: the HF indices of this rank's local experts."""
    h = f"model.layers.{i}."
    att = h + "self_attn."
    # Gemma 2/3's sandwich norms: HF's post_attention_layernorm normalises the attention
    # output (elsewhere, Gemma 1 too, it is the MLP's input norm) and pre_feedforward_layernorm
    # the MLP input.
    norms = (
        [
            ("self_attention.post_layernorm", "post_attention_layernorm"),
            ("pre_mlp_layernorm", "pre_feedforward_layernorm"),
            ("mlp.post_layernorm", "post_feedforward_layernorm"),
        ]
        if spec.gemma and spec.gemma.sandwich_norms
        else [("pre_mlp_layernorm", "post_attention_layernorm")]
    )
    maps = [
        _Map(m + "input_layernorm.weight", (h + "input_layernorm.weight",), "replicated"),
        _Map(
            m + "self_attention.linear_qkv.weight",
            (att + "q_proj.weight", att + "k_proj.weight", att + "v_proj.weight"),
            "qkv",
        ),
        _Map(m + "self_attention.linear_proj.weight", (att + "o_proj.weight",), "row"),
    ]
    maps += [_Map(m + f"{a}.weight", (h + f"{b}.weight",), "replicated") for a, b in norms]
    if spec.qkv_bias:
        names = (att + "q_proj.bias", att + "k_proj.bias", att + "v_proj.bias")
        maps.append(_Map(m + "self_attention.linear_qkv.bias", names, "qkv"))
    if spec.qk_norm:
        for x in ("q", "k"):
            maps.append(
                _Map(
                    m + f"self_attention.{x}_layernorm.weight",
                    (att + f"{x}_norm.weight",),
                    "replicated",
                )
            )
    if not spec.is_moe_layer(i):
        return maps + _mlp_maps(m + "mlp.", h + "mlp.", expert=False)
    # Qwen3-MoE's sparse block: the router, then one gated MLP per local expert (each split
    # over the expert-TP group like a dense MLP).
    maps.append(_Map(m + "mlp.router.weight", (h + "mlp.gate.weight",), "replicated"))
    for j, e in enumerate(experts):
        maps += _mlp_maps(
            m + f"mlp.experts.local_experts.{j}.", h + f"mlp.experts.{e}.", expert=True
        )
    return maps


def _mlp_maps(m: str, h: str, *, expert: bool) -> list[_Map]:
    return [
        _Map(
            m + "linear_fc1.weight", (h + "gate_proj.weight", h + "up_proj.weight"), "fc1", expert
        ),
        _Map(m + "linear_fc2.weight", (h + "down_proj.weight",), "row", expert),
    ]


def _weight_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise TrainerError(f"no *.safetensors in {folder}: pass an HF checkpoint folder")
    return files


def read_hf_state(folder: str | Path, names: set[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of an HF safetensors checkpoint (only ``names`` if given).

    Example:
        >>> from vime.models.tiny import build_tiny_model
        >>> sd = read_hf_state(build_tiny_model(), {"model.norm.weight"})
        >>> {name: tuple(t.shape) for name, t in sd.items()}
        {'model.norm.weight': (128,)}
    """
    out: dict[str, torch.Tensor] = {}
    for path in _weight_files(Path(folder)):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if names is None or key in names:
                    out[key] = f.get_tensor(key)
    return out


def _unwrap(model: Any) -> Any:
    while hasattr(model, "module"):
        model = model.module
    return model


@torch.no_grad()
def load_hf_weights(model: Any, folder: str | Path) -> None:
    """Copy an HF checkpoint into this rank's Megatron model stage (its TP slice).

    Raises :class:`TrainerError` when a tensor is missing or has the wrong shape.

    Example (``trainer.module``: a Megatron model stage, see
    :func:`~vime.trainer.model.build_gpt_model`):
        >>> load_hf_weights(trainer.module, hf_folder)
    """
    model = _unwrap(model)
    spec: ModelSpec = model.hf_spec
    maps = _param_maps(model)
    wanted = {n for m in maps for n in m.hf}
    state = read_hf_state(folder, wanted)
    missing = sorted(wanted - state.keys())
    if missing:
        raise TrainerError(
            f"HF checkpoint {folder} lacks tensors {missing[:5]} (…{len(missing)} in all)"
        )
    params = dict(model.named_parameters())
    for m in maps:
        group = _tp_group(m.expert)
        tp, rank = dist.get_world_size(group), dist.get_rank(group)
        local = hf_to_local(m.kind, [state[n] for n in m.hf], spec, tp, rank)
        param = params[m.mcore]
        if tuple(local.shape) != tuple(param.shape):
            raise TrainerError(
                f"{m.mcore}: HF {m.hf} gives shape {tuple(local.shape)} on TP rank {rank}, "
                f"model has {tuple(param.shape)}: does the config match the weights?"
            )
        param.copy_(local.to(param.dtype))


def _gather_tp(t: torch.Tensor, *, expert: bool = False) -> list[torch.Tensor]:
    group = _tp_group(expert)
    tp = dist.get_world_size(group)
    if tp == 1:
        return [t]
    shards = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(shards, t.contiguous(), group=group)
    return shards


@torch.no_grad()
def hf_state_dict(model: Any) -> dict[str, torch.Tensor] | None:
    """The full HF state dict of the model, on global rank 0 (``None`` elsewhere).

    Every rank must call it (it gathers over TP, expert parallel and PP).

    Example:
        >>> sd = hf_state_dict(trainer.module)
        >>> tuple(sd["model.embed_tokens.weight"].shape)
        (250, 64)
    """
    from megatron.core import parallel_state as ps

    model = _unwrap(model)
    spec: ModelSpec = model.hf_spec
    params = dict(model.named_parameters())
    stage: dict[str, torch.Tensor] = {}
    for m in _param_maps(model):
        shards = _gather_tp(params[m.mcore].detach(), expert=m.expert)
        if m.mcore == "output_layer.weight" and spec.tied_embeddings:
            continue  # the last stage's copy of the tied embedding is not an HF tensor
        for name, t in zip(m.hf, local_to_hf(m.kind, shards, spec), strict=True):
            stage[name] = t.cpu().contiguous()
    if ps.get_expert_model_parallel_world_size() > 1:
        # Each EP rank holds other experts: every rank of the group gets all of them.
        parts: list[Any] = [None] * ps.get_expert_model_parallel_world_size()
        dist.all_gather_object(parts, stage, group=ps.get_expert_model_parallel_group())
        stage = {name: t for part in parts for name, t in part.items()}
    if ps.get_pipeline_model_parallel_world_size() == 1:
        return stage if dist.get_rank() == 0 else None
    group = ps.get_pipeline_model_parallel_group()
    dst = dist.get_global_rank(group, 0)
    gathered: list[Any] = [None] * dist.get_world_size(group) if dist.get_rank() == dst else []
    dist.gather_object(stage, gathered if dist.get_rank() == dst else None, dst=dst, group=group)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in gathered:
        merged.update(part)
    return merged


def model_is_tied(state: dict[str, torch.Tensor]) -> bool:
    """True when an HF state dict has an embedding but no separate ``lm_head``.

    Example:
        >>> model_is_tied({"model.embed_tokens.weight": None})
        True
    """
    return "model.embed_tokens.weight" in state and "lm_head.weight" not in state


def export_hf(model: Any, out_folder: str | Path, *, like: str | Path) -> Path | None:
    """Write the model as an HF checkpoint shaped like the checkpoint folder ``like``.

    Same tensor names and dtypes as ``like``; its config, tokenizer and other non-weight
    files are copied. Collective: every rank calls it; global rank 0 writes. Returns the
    folder on rank 0, ``None`` elsewhere.

    Example:
        >>> (export_hf(trainer.module, tmp / "hf_step_10", like=hf_folder) / "config.json").exists()
        True
    """
    tensors = hf_export_tensors(model, like=like, out=out_folder)
    return None if tensors is None else write_hf(tensors, out_folder, like=like)


def hf_export_tensors(
    model: Any, *, like: str | Path, out: str | Path = "the export"
) -> dict[str, torch.Tensor] | None:
    """The tensors :func:`export_hf` writes (names and dtypes of ``like``), on global rank
    0 (``None`` elsewhere); collective, as :func:`hf_state_dict`. (The delta weight sync
    keeps them: :mod:`vime.sync.delta_export`.)

    Example:
        >>> sorted(hf_export_tensors(trainer.module, like=hf_folder))[0]
        'lm_head.weight'
    """
    from vime.trainer.lora_export import merged_state

    state = merged_state(hf_state_dict(model), model)  # LoRA: the adapters merged in
    if state is None:
        return None
    dtypes: dict[str, str] = {}
    for path in _weight_files(Path(like)):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118
                dtypes[key] = f.get_slice(key).get_dtype()
    if "lm_head.weight" in dtypes and model_is_tied(state):
        # Some tied checkpoints also store lm_head: write it back as a copy of the embedding.
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    if set(dtypes) != set(state):
        raise TrainerError(
            f"export to {out}: tensors differ from {like}: missing "
            f"{sorted(set(dtypes) - set(state))[:5]}, extra {sorted(set(state) - set(dtypes))[:5]}"
        )
    return {k: v.to(_SAFETENSORS_DTYPES[str(dtypes[k])]) for k, v in state.items()}


def write_hf(tensors: dict[str, torch.Tensor], out_folder: str | Path, *, like: str | Path) -> Path:
    """Write ``tensors`` as the HF folder ``out_folder``, with the config, tokenizer and
    other non-weight files of ``like``; returns the folder.

    Example:
        >>> import tempfile
        >>> like, out = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp()) / "hf"
        >>> _ = (like / "config.json").write_text("{}")
        >>> sorted(p.name for p in write_hf({"w": torch.zeros(2)}, out, like=like).iterdir())
        ['config.json', 'model.safetensors']
    """
    like, out = Path(like), Path(out_folder)
    out.mkdir(parents=True, exist_ok=True)
    for item in like.iterdir():
        if (
            item.is_file()
            and not item.name.endswith(".safetensors")
            and item.name != "model.safetensors.index.json"
        ):
            shutil.copy2(item, out / item.name)
    tmp = out / (WEIGHTS_NAME + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / WEIGHTS_NAME)  # atomic: a reader never sees a half-written file
    return out
