"""LoRA adapters on the trainer's linear layers (``trainer.lora.*``), the base frozen.

vime's own small module, not Megatron-Bridge's PEFT: its released versions (0.3.x) need
transformers < 5 (vime runs 5.x) and transformer-engine (CUDA only), so they install on
neither the CPU machines nor next to the pinned stack. Here each targeted Megatron linear
(``linear_qkv``, ``linear_proj``, ``linear_fc1``, ``linear_fc2`` of every decoder layer)
gets ``y += (alpha / rank) · B(A(dropout(x)))`` through a forward hook, so the Megatron
modules, their parameter names and the HF weight map stay as they are. ``B`` starts at
zero: before the first update the adapted model *is* the base, bit for bit.

Tensor parallelism: on a column-parallel linear ``A`` is whole on every rank and ``B``
holds this rank's output rows; ``A``'s output enters the TP region (its gradient is summed
over the ranks' partial ones). On a row-parallel linear ``A`` holds this rank's input
columns, its output is summed over the ranks, ``B`` is whole. Every parameter's gradient
is then the full one, so Megatron DDP and the optimizer need nothing special.

The adapters live in one child module of the model (``model.lora``), keyed by the global
layer number, with its own sharded state dict: a checkpoint holds them (and their
optimizer state) and loads at another TP size. Export (:mod:`vime.trainer.lora_export`)
writes them as a PEFT folder, or merged into HF weights.

Example:
    >>> LoraConfig(rank=16).scale
    2.0
    >>> LoraConfig(rank=0).enabled
    False
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from vime.config import require
from vime.errors import UnsupportedArchitectureError

# The Megatron linears an adapter can target, and their HF modules (PEFT's names).
TARGETS = {
    "linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")),
    "linear_proj": ("self_attn", ("o_proj",)),
    "linear_fc1": ("mlp", ("gate_proj", "up_proj")),
    "linear_fc2": ("mlp", ("down_proj",)),
}
# Column-parallel (output rows split over TP) vs row-parallel (input columns split).
_COLUMN = {"linear_qkv", "linear_fc1"}


@dataclass
class LoraConfig:
    """``trainer.lora.*``: rank 0 (the default) trains the whole model; rank > 0 trains
    only adapters of that rank on ``targets``, scaled by ``alpha / rank``.

    Example:
        >>> LoraConfig(rank=8, alpha=16, targets=["linear_qkv"]).targets
        ['linear_qkv']
    """

    # Adapter rank: 0 trains the whole model; > 0 only adapters (+experiment=lora: 16).
    rank: int = 0
    alpha: float = 32.0  # the adapters' output is scaled by alpha / rank (PEFT's rule)
    # Megatron module names; linear_qkv is HF's q/k/v_proj, linear_fc1 gate/up_proj.
    targets: list[str] = field(default_factory=lambda: list(TARGETS))
    dropout: float = 0.0  # on the adapter's input only, while training

    def __post_init__(self) -> None:
        require(self.rank >= 0, "trainer.lora.rank", f"must be >= 0 (0: no LoRA), got {self.rank}")
        require(self.alpha > 0, "trainer.lora.alpha", f"must be > 0, got {self.alpha}")
        require(0 <= self.dropout < 1, "trainer.lora.dropout", "must be in [0, 1)")
        unknown = sorted(set(self.targets) - set(TARGETS))
        require(
            not unknown and bool(self.targets),
            "trainer.lora.targets",
            f"{unknown or 'empty'}: choose from {list(TARGETS)}",
        )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scale(self) -> float:
        """PEFT's (and vLLM's) scaling: ``alpha / rank``."""
        return self.alpha / self.rank if self.rank else 0.0


class LoraPair(torch.nn.Module):
    """One linear's adapter: ``a`` ``[rank, in(/tp)]`` and ``b`` ``[out(/tp), rank]``.

    Example:
        >>> pair = LoraPair(torch.zeros(2, 4), torch.zeros(3, 2), column=True)
        >>> tuple(pair.a.shape), tuple(pair.b.shape)
        ((2, 4), (3, 2))
    """

    def __init__(self, a: torch.Tensor, b: torch.Tensor, *, column: bool) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(a)
        self.b = torch.nn.Parameter(b)
        self.column = column


class LoraAdapters(torch.nn.Module):
    """Every adapter of this rank's model stage: ``layers[str(global layer)][target]``."""

    def __init__(self, config: LoraConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleDict()

    def pairs(self) -> list[tuple[int, str, LoraPair]]:
        """``(global layer, target, pair)`` in layer order."""
        return [
            (int(i), name, pair)  # type: ignore[misc]
            for i, targets in self.layers.items()
            for name, pair in targets.items()  # type: ignore[operator]
        ]

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """The adapters as sharded tensors (the TP-split one of each pair on its TP axis),
        keyed by global layer: loadable at another TP or PP size."""
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.utils import (
            make_sharded_tensor_for_checkpoint,
            make_tp_sharded_tensor_for_checkpoint,
        )

        out: dict[str, Any] = {}
        for i, name, pair in self.pairs():
            key = f"{prefix}layers.{i}.{name}."
            split, whole = ("b", "a") if pair.column else ("a", "b")
            sharded = make_tp_sharded_tensor_for_checkpoint(
                getattr(pair, split), key + split, tp_axis=0 if pair.column else 1
            )
            if name == "linear_fc1":  # each rank's rows are [gate slice; up slice]
                sharded = apply_swiglu_sharded_factory(sharded, ())
            out[key + split] = sharded
            out[key + whole] = make_sharded_tensor_for_checkpoint(getattr(pair, whole), key + whole)
        return out


def _lora_hook(pair: LoraPair, config: LoraConfig) -> Any:
    """The forward hook adding ``pair``'s term to its linear's ``(output, bias)``."""
    from megatron.core.tensor_parallel import (
        copy_to_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
    )

    scale = config.scale

    def hook(module: Any, args: tuple[Any, ...], output: Any) -> Any:
        x = args[0]
        if config.dropout and module.training:
            x = torch.nn.functional.dropout(x, config.dropout)
        h = torch.matmul(x, pair.a.t())
        if pair.column:
            # A's output feeds every rank's slice of B: its gradient is the sum of theirs.
            h = copy_to_tensor_model_parallel_region(h)
        else:
            h = reduce_from_tensor_model_parallel_region(h)  # x·A summed over input slices
        delta = torch.matmul(h, pair.b.t()) * scale
        out, bias = output
        return out + delta.to(out.dtype), bias

    return hook


def add_lora(model: Any, config: LoraConfig, *, seed: int = 1234) -> LoraAdapters:
    """Freeze ``model`` (a :class:`~vime.trainer.model.PolicyGPTModel` stage) and attach
    adapters on ``config.targets``; returns them (also ``model.lora``).

    ``A`` is initialised as PEFT does (Kaiming-uniform with ``a=√5``), from ``seed`` and
    the global layer, so every TP rank draws the same whole ``A`` and keeps its slice;
    ``B`` is zero.

    Example (``trainer.module``: a :class:`~vime.trainer.model.PolicyGPTModel`, 2 layers):
        >>> adapters = add_lora(trainer.module, LoraConfig(rank=16))
        >>> len(adapters.pairs()), adapters is trainer.module.lora
        (8, True)
    """
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import set_tensor_model_parallel_attributes

    spec = model.hf_spec
    if spec.num_experts:
        raise UnsupportedArchitectureError(
            f"trainer.lora.rank={config.rank}: LoRA on a mixture-of-experts model "
            f"({spec.family}) is not supported; set trainer.lora.rank=0"
        )
    tp, tp_rank = ps.get_tensor_model_parallel_world_size(), ps.get_tensor_model_parallel_rank()
    for p in model.parameters():
        p.requires_grad_(False)
    adapters = LoraAdapters(config)
    dtype = next(model.parameters()).dtype
    for layer in model.decoder.layers:
        i = layer.layer_number - 1
        targets = torch.nn.ModuleDict()
        for name in config.targets:
            linear = _find_linear(layer, name)
            column = name in _COLUMN
            out_local, in_local = linear.weight.shape
            out_full, in_full = (out_local * tp, in_local) if column else (out_local, in_local * tp)
            gen = torch.Generator().manual_seed(seed * 1000 + i * 10 + list(TARGETS).index(name))
            a = torch.empty(config.rank, in_full)
            bound = 1 / math.sqrt(in_full)  # kaiming_uniform_(a=sqrt(5)) on [rank, in]
            a.uniform_(-bound, bound, generator=gen)
            if not column:
                a = a.chunk(tp, dim=1)[tp_rank]
            b = torch.zeros(out_local if column else out_full, config.rank)
            pair = LoraPair(a.to(dtype).contiguous(), b.to(dtype), column=column)
            # The TP-split one counts on every rank in the gradient norm (the whole one, on
            # TP rank 0 only), as Megatron's own split weights do.
            split = pair.b if column else pair.a
            set_tensor_model_parallel_attributes(split, True, 0 if column else 1, 1)
            pair.to(linear.weight.device)
            linear.register_forward_hook(_lora_hook(pair, config))
            targets[name] = pair
        adapters.layers[str(i)] = targets
    model.lora = adapters
    return adapters


def _find_linear(layer: Any, name: str) -> Any:
    owner = layer.self_attention if name in ("linear_qkv", "linear_proj") else layer.mlp
    linear = getattr(owner, name, None)
    if linear is None or not hasattr(linear, "weight"):
        raise UnsupportedArchitectureError(
            f"trainer.lora.targets: layer {layer.layer_number} has no {name} weight to adapt"
        )
    return linear


def lora_of(model: Any) -> LoraAdapters | None:
    """The adapters attached to ``model`` (unwrapped from DDP), or None.

    Example:
        >>> lora_of(torch.nn.Linear(2, 2)) is None
        True
    """
    while hasattr(model, "module"):
        model = model.module
    found = getattr(model, "lora", None)
    return found if isinstance(found, LoraAdapters) else None
