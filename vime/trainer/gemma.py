"""Gemma 1, Gemma 2 and Gemma 3 (text) on megatron-core's GPT model, with modules of vime's own.

What megatron-core's GPT layer lacks, and what this module gives it:

- :class:`GemmaRMSNorm`: RMSNorm as ``x · (1 + w)`` (the stored weight is ``w``, so the
  HF tensors map unchanged and export bit for bit), in float32 as transformers does;
- sandwich norms (Gemma 2/3): :class:`GemmaSelfAttention` and :class:`GemmaMLP` normalise their
  outputs (``post_attention_layernorm``, ``post_feedforward_layernorm``) before the residual
  add; ``pre_feedforward_layernorm`` is Megatron's ``pre_mlp_layernorm``;
- Gemma 3's second rotary base (``rope_parameters.sliding_attention``): the local layers'
  :class:`GemmaSelfAttention` rotates q/k with its own table;
- per-layer sliding windows and attention-logit soft-capping: parameters of vime's SDPA
  core attention (:mod:`vime.trainer.attention`), set layer by layer in
  :func:`gemma_block_spec`;
- embeddings × √hidden (:func:`scale_embeddings`) and the final logit soft-capping
  (:func:`softcap`, applied by :class:`~vime.trainer.model.PolicyGPTModel` and by
  :func:`vime.trainer.logprobs.token_logprobs`).

Example:
    >>> from transformers import Gemma3TextConfig
    >>> g = gemma_spec_from_hf(Gemma3TextConfig(num_hidden_layers=7))
    >>> g.sliding_layers, g.local_rope_theta
    ((True, True, True, True, True, False, True), 10000.0)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from vime.errors import UnsupportedArchitectureError

# The multimodal "gemma3" wrapper is refused.
GEMMA_SUPPORTED = ("gemma", "gemma2", "gemma3_text")
LAYER_TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class GemmaSpec:
    """The Gemma-only facts of a :class:`~vime.trainer.model.ModelSpec`."""

    rope_theta: float  # the global (full-attention) layers' base
    query_pre_attn_scalar: float  # softmax scale = its inverse square root
    sliding_window: int | None
    sliding_layers: tuple[bool, ...]  # layer i attends to the last `sliding_window` tokens
    local_rope_theta: float | None = None  # Gemma 3: the sliding layers' own base
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sandwich_norms: bool = True  # Gemma 2/3; Gemma 1 normalises sublayer inputs only

    @property
    def softmax_scale(self) -> float:
        """``query_pre_attn_scalar ** -0.5``, as transformers and vLLM compute it.

        Example:
            >>> GemmaSpec(1e4, 256, None, ()).softmax_scale
            0.0625
        """
        return self.query_pre_attn_scalar**-0.5


def _refuse(field: str, why: str) -> UnsupportedArchitectureError:
    return UnsupportedArchitectureError(f"{field}: {why} (docs/models.md, Gemma)")


def _default_rope(params: dict[str, Any], field: str) -> float:
    """The base of a plain-RoPE parameter set, or raise naming ``field``."""
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if rope_type != "default":
        raise _refuse(
            f"{field}.rope_type={rope_type!r}",
            "only plain RoPE is mapped for Gemma (Gemma-3-1B and Gemma 2 use it)",
        )
    return float(params["rope_theta"])


def _ropes(cfg: Any) -> tuple[float, float | None]:
    """``(global base, local base or None)`` from Gemma 2's single or Gemma 3's per-layer-type
    ``rope_parameters`` (transformers 5; older configs: ``rope_theta``, ``rope_local_base_freq``)."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    if cfg.model_type in ("gemma", "gemma2"):
        params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        return _default_rope(params, "rope_parameters"), None
    full = dict(params.get("full_attention") or {"rope_theta": getattr(cfg, "rope_theta", 1e6)})
    local = dict(
        params.get("sliding_attention")
        or {"rope_theta": getattr(cfg, "rope_local_base_freq", 10000.0)}
    )
    return (
        _default_rope(full, "rope_parameters.full_attention"),
        _default_rope(local, "rope_parameters.sliding_attention"),
    )


def _sliding_layers(cfg: Any) -> tuple[int | None, tuple[bool, ...]]:
    layers = int(cfg.num_hidden_layers)
    types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * layers)
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown or len(types) != layers:
        raise _refuse(f"layer_types={types}", f"expected {layers} of {LAYER_TYPES}")
    window = getattr(cfg, "sliding_window", None)
    if window is None:  # transformers then masks nothing more than causally
        return None, (False,) * layers
    return int(window), tuple(t == "sliding_attention" for t in types)


def gemma_spec_from_hf(cfg: Any) -> GemmaSpec:
    """The :class:`GemmaSpec` of a ``gemma2`` or ``gemma3_text`` config, or raise
    :class:`UnsupportedArchitectureError` naming the field vime does not map.

    Example:
        >>> from transformers import Gemma2Config
        >>> g = gemma_spec_from_hf(Gemma2Config(num_hidden_layers=4))
        >>> g.sliding_layers, g.attn_softcap, g.final_softcap
        ((True, False, True, False), 50.0, 30.0)
    """
    family = cfg.model_type
    if family == "gemma3":
        raise _refuse(
            "model_type='gemma3' (Gemma3ForConditionalGeneration)",
            "the multimodal wrapper adds a SigLIP vision tower and image tokens, which the "
            "GPT model has no place for; its text model alone (model_type gemma3_text, "
            "Gemma3ForCausalLM, e.g. Gemma-3-1B) is supported",
        )
    if family not in GEMMA_SUPPORTED:
        raise _refuse(f"model_type={family!r}", f"supported Gemma types: {GEMMA_SUPPORTED}")
    # vLLM reads hidden_activation where set, transformers hidden_act (Gemma 1's legacy
    # "gelu" becomes the tanh approximation in both): both must be the tanh GeLU.
    act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
    if act != "gelu_pytorch_tanh":
        field = "hidden_activation" if getattr(cfg, "hidden_activation", None) else "hidden_act"
        raise _refuse(f"{field}={act!r}", "only 'gelu_pytorch_tanh' is mapped")
    if getattr(cfg, "attention_bias", False):
        raise _refuse("attention_bias=True", "Gemma's biases (o_proj included) are not mapped")
    if getattr(cfg, "use_bidirectional_attention", False):
        raise _refuse(
            "use_bidirectional_attention=True", "an encoder (EmbeddingGemma), not a causal LM"
        )
    theta, local_theta = _ropes(cfg)
    window, sliding = _sliding_layers(cfg)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return GemmaSpec(
        rope_theta=theta,
        # Gemma 1 scales by head_dim ** -0.5 (it has no query_pre_attn_scalar).
        query_pre_attn_scalar=float(getattr(cfg, "query_pre_attn_scalar", None) or head_dim),
        sliding_window=window,
        sliding_layers=sliding,
        local_rope_theta=local_theta,
        attn_softcap=_optional_float(getattr(cfg, "attn_logit_softcapping", None)),
        final_softcap=_optional_float(getattr(cfg, "final_logit_softcapping", None)),
        sandwich_norms=family != "gemma",
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """``cap · tanh(logits / cap)`` (Gemma 2's soft-capping, in the logits' dtype), or the
    logits unchanged when ``cap`` is None.

    Example:
        >>> round(softcap(torch.tensor([1e6]), 30.0).item(), 3)
        30.0
    """
    if cap is None:
        return logits
    return torch.tanh(logits / cap) * cap


def scale_embeddings(model: Any, hidden_size: int) -> None:
    """Multiply the output of ``model.embedding`` by √hidden, rounded to the embedding's
    dtype first as transformers does (a forward hook: the parameter names stay Megatron's).

    Example (any module with an ``embedding``; hidden size 4: × 2):
        >>> model = torch.nn.Module()
        >>> model.embedding = torch.nn.Embedding(3, 4)
        >>> scale_embeddings(model, 4)
        >>> model.embedding(torch.tensor([1])).equal(2 * model.embedding.weight[1:2])
        True
    """
    normalizer = torch.tensor(math.sqrt(hidden_size))

    def hook(module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output * normalizer.to(output.dtype)

    model.embedding.register_forward_hook(hook)


class GemmaRMSNorm(torch.nn.Module):
    """RMSNorm computing ``x · (1 + w)`` in float32, built the way megatron-core builds norms.

    Example:
        >>> from types import SimpleNamespace
        >>> cfg = SimpleNamespace(params_dtype=torch.float32, sequence_parallel=False)
        >>> norm = GemmaRMSNorm(cfg, 2, eps=0.0)
        >>> norm(torch.tensor([[3.0, 4.0]])).tolist()  # w = 0: x / rms(x), rms = √12.5
        [[0.8485281467437744, 1.1313709020614624]]
    """

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-6, **_: Any) -> None:
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, dtype=config.params_dtype))
        # Megatron all-reduces the gradients of norms marked so under sequence parallelism.
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """The weight as a checkpoint tensor replicated over TP and DP (megatron-core's MLP
        asks each child for this; its default does the same for torch's own norms)."""
        from megatron.core.transformer.utils import (
            ensure_metadata_has_dp_cp_group,
            make_sharded_tensors_for_checkpoint,
        )

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        state = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(
            state, prefix, {}, sharded_offsets, dp_cp_group=metadata["dp_cp_group"]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x.float()
        out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


def _attention_classes() -> tuple[type, type]:
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.transformer.attention import SelfAttention
    from megatron.core.transformer.mlp import MLP

    class GemmaSelfAttention(SelfAttention):
        """Self-attention whose output is normalised (``post_attention_layernorm``); with
        ``rope_theta`` it rotates q/k with that base instead of the model's."""

        def __init__(self, *args: Any, rope_theta: float | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            cfg = self.config
            self.post_layernorm = GemmaRMSNorm(cfg, cfg.hidden_size, cfg.layernorm_epsilon)
            self.local_rope = None
            if rope_theta is not None:
                self.local_rope = RotaryEmbedding(
                    kv_channels=cfg.kv_channels,
                    rotary_percent=1.0,
                    rotary_base=rope_theta,
                    use_cpu_initialization=cfg.use_cpu_initialization,
                )

        def forward(self, hidden_states, *args, rotary_pos_emb=None, **kwargs):  # type: ignore[override]
            if self.local_rope is not None and rotary_pos_emb is not None:
                # The model's table covers the same positions: only the base differs.
                rotary_pos_emb = self.local_rope(rotary_pos_emb.shape[0])
            out, bias = super().forward(
                hidden_states, *args, rotary_pos_emb=rotary_pos_emb, **kwargs
            )
            assert bias is None  # no linear biases in Gemma: the norm sees the whole output
            return self.post_layernorm(out), bias

    class GemmaMLP(MLP):
        """The gated MLP, its output normalised (``post_feedforward_layernorm``)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            cfg = self.config
            self.post_layernorm = GemmaRMSNorm(cfg, cfg.hidden_size, cfg.layernorm_epsilon)

        def forward(self, hidden_states, *args, **kwargs):  # type: ignore[override]
            out, bias = super().forward(hidden_states, *args, **kwargs)
            assert bias is None
            return self.post_layernorm(out), bias

    return GemmaSelfAttention, GemmaMLP


def _layer_spec(spec: Any, index: int, classes: tuple[type, type]) -> Any:
    """The ModuleSpec of global layer ``index`` (0-based): local or global attention."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer.spec_utils import ModuleSpec

    from vime.trainer.attention import sdpa_core_attention_class

    g: GemmaSpec = spec.gemma
    layer = gpt_layer_specs.get_gpt_layer_local_spec(
        qk_layernorm=spec.qk_norm, normalization="RMSNorm"
    )
    sub = layer.submodules
    attention_class, mlp_class = classes
    sliding = g.sliding_layers[index]
    sub.input_layernorm = sub.pre_mlp_layernorm = GemmaRMSNorm
    attn = sub.self_attention
    if g.sandwich_norms:
        sub.self_attention = ModuleSpec(
            module=attention_class,
            params={**attn.params, "rope_theta": g.local_rope_theta if sliding else None},
            submodules=attn.submodules,
        )
        sub.mlp = ModuleSpec(module=mlp_class, submodules=sub.mlp.submodules)
    # megatron-core calls core_attention itself (no ModuleSpec): a partial carries the params.
    attn.submodules.core_attention = partial(
        sdpa_core_attention_class(),
        window=g.sliding_window if sliding else None,
        softcap=g.attn_softcap,
    )
    if spec.qk_norm:
        attn.submodules.q_layernorm = attn.submodules.k_layernorm = GemmaRMSNorm
    return layer


def _quiet_gemma_mlp_warning() -> None:
    """megatron-core's TransformerLayer passes its TP group only to an MLP whose class is
    exactly ``MLP`` and logs "Unknown MLP type" for each other layer: GemmaMLP then takes the
    default TP group, which is the same group. Drop that one message."""
    log = logging.getLogger("megatron.core.transformer.transformer_layer")
    if not any(isinstance(f, _DropUnknownMLP) for f in log.filters):
        log.addFilter(_DropUnknownMLP())


class _DropUnknownMLP(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Unknown MLP type" not in record.getMessage()


def gemma_block_spec(config: Any, spec: Any) -> Any:
    """megatron-core's block spec for this pipeline stage's Gemma layers (local spec, vime's
    SDPA core attention, Gemma norms, one layer spec per layer: local or global).

    Example (Gemma 2's local and global layers, after
    :func:`~vime.trainer.parallel.init_distributed`):
        >>> from transformers import Gemma2Config
        >>> from vime.trainer.model import megatron_config_from_hf, model_spec_from_hf
        >>> from vime.trainer.parallel import init_distributed
        >>> _ = init_distributed()
        >>> spec = model_spec_from_hf(Gemma2Config(hidden_size=64, intermediate_size=96,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16))
        >>> len(gemma_block_spec(megatron_config_from_hf(spec), spec).layer_specs)
        2
    """
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    _quiet_gemma_mlp_warning()
    classes = _attention_classes()
    offset = get_transformer_layer_offset(config)
    count = get_num_layers_to_build(config)
    layers = [_layer_spec(spec, i, classes) for i in range(offset, offset + count)]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=GemmaRMSNorm)
