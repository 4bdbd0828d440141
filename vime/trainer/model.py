"""Megatron-core GPT models built from Hugging Face configs (Llama 2/3.x, Mistral, Qwen2/2.5,
Qwen3, Qwen3-MoE, Gemma 1/2, Gemma 3 text: its pieces in :mod:`vime.trainer.gemma`).

:func:`model_spec_from_hf` reads an HF config into a small :class:`ModelSpec` (and refuses
what cannot be mapped exactly); :func:`megatron_config_from_hf` turns it into a Megatron
``TransformerConfig``; :func:`build_gpt_model` builds this rank's pipeline stage as a
:class:`PolicyGPTModel`, which can return final hidden states instead of logits so that
log-probs are computed in chunks (:mod:`vime.trainer.logprobs`).

Example:
    >>> from transformers import Qwen2Config
    >>> spec = model_spec_from_hf(Qwen2Config(vocab_size=500, num_hidden_layers=2))
    >>> spec.family, spec.qkv_bias, spec.padded_vocab_size
    ('qwen2', True, 512)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from vime.errors import UnsupportedArchitectureError
from vime.trainer.gemma import (
    GemmaSpec,
    gemma_block_spec,
    gemma_spec_from_hf,
    scale_embeddings,
    softcap,
)

SUPPORTED_FAMILIES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
)
# The multimodal Gemma 3 is refused by gemma_spec_from_hf, naming the reason.
GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3_text", "gemma3")
# Llama 3.x rope scaling: megatron-core's RotaryEmbedding takes only the factor and fixes
# the other three parameters to these values (those of every published Llama 3.1/3.2/3.3).
LLAMA3_ROPE_FIXED = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# Vocab rows are padded to a multiple of this, independent of TP, so that checkpoints keep
# one shape across TP sizes (Llama and Qwen vocabularies are already multiples of it).
VOCAB_PAD_MULTIPLE = 128
# Megatron's activation recompute: none, the core attention, or every layer.
RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelSpec:
    """The facts of an HF decoder that the Megatron model and the weight mapping need."""

    family: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    # Llama 3.x rope scaling factor (``rope_type: llama3``); None: plain RoPE.
    llama3_rope_factor: float | None = None
    # Mixture of experts (Qwen3-MoE). ``moe_layers[i]``: layer i's MLP is the sparse block
    # (the others are dense MLPs of ``ffn_hidden_size``); empty: a dense model.
    num_experts: int = 0
    experts_per_token: int = 0
    moe_ffn_hidden_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[bool, ...] = ()
    # Gemma 2/3: sandwich norms, x·(1+w) norms, scaled embeddings, windows, soft-capping.
    gemma: GemmaSpec | None = None

    def is_moe_layer(self, index: int) -> bool:
        """True when layer ``index`` (global, 0-based) has the sparse MoE block as its MLP.

        Example:
            >>> ModelSpec("qwen3_moe", 2, 8, 8, 1, 1, 8, 8, 128, 1e-6, 1e4, 8, False, False,
            ...           True, moe_layers=(False, True)).is_moe_layer(1)
            True
        """
        return bool(self.moe_layers) and self.moe_layers[index]

    @property
    def logit_softcap(self) -> float | None:
        """Gemma 2's ``final_logit_softcapping`` (None: the logits are not capped).

        Example:
            >>> ModelSpec("llama", 1, 8, 8, 1, 1, 8, 8, 128, 1e-6, 1e4, 8, False, False,
            ...           False).logit_softcap is None
            True
        """
        return self.gemma.final_softcap if self.gemma else None


def _rope_params(cfg: Any) -> dict[str, Any]:
    """The config's rope settings, from ``rope_parameters`` (transformers 5) or the older
    ``rope_scaling`` + ``rope_theta``."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    for key, value in (getattr(cfg, "rope_scaling", None) or {}).items():
        params.setdefault(key, value)
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", None))
    return params


def _rope(cfg: Any) -> tuple[float, float | None]:
    """``(rope_theta, llama3 factor or None)``, or raise for a rope Megatron would not match.

    Example:
        >>> from transformers import LlamaConfig
        >>> _rope(LlamaConfig(rope_parameters={"rope_type": "llama3", "factor": 32.0,
        ...     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        ...     "original_max_position_embeddings": 8192, "rope_theta": 500000.0}))
        (500000.0, 32.0)
    """
    params = _rope_params(cfg)
    rope_type = params.get("rope_type", params.get("type")) or "default"
    theta = float(params["rope_theta"] if params["rope_theta"] is not None else 10000.0)
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise UnsupportedArchitectureError(
            f"rope_parameters.rope_type={rope_type!r} is not supported; supported: 'default' "
            "(plain RoPE) and 'llama3' (Llama 3.x scaling)"
        )
    wrong = {k: params.get(k) for k, v in LLAMA3_ROPE_FIXED.items() if params.get(k) != v}
    if wrong:
        raise UnsupportedArchitectureError(
            f"rope_parameters {wrong}: megatron-core's llama3 rope scaling fixes "
            f"{LLAMA3_ROPE_FIXED} (the Llama 3.1/3.2/3.3 values); only 'factor' may differ"
        )
    return theta, float(params["factor"])


def _check_sliding_window(cfg: Any, family: str) -> None:
    """Refuse a sliding window that sequences can exceed (Megatron attends to every earlier
    token). A window at least ``max_position_embeddings`` long never masks anything."""
    if getattr(cfg, "use_sliding_window", False):
        raise UnsupportedArchitectureError(
            "use_sliding_window=True is not supported; set it to false (full attention)"
        )
    window = getattr(cfg, "sliding_window", None) if family == "mistral" else None
    if window is not None and int(window) < int(cfg.max_position_embeddings):
        raise UnsupportedArchitectureError(
            f"sliding_window={window} < max_position_embeddings={cfg.max_position_embeddings}: "
            "sequences could exceed the window, and the trainer attends to every earlier "
            f"token; set sliding_window to null, or max_position_embeddings to {window} or "
            "less, in config.json (the two then agree on every sequence)"
        )


def _moe_fields(cfg: Any, family: str) -> dict[str, Any]:
    """The MoE fields of :class:`ModelSpec` from a Qwen3-MoE config (none for dense ones).

    Layer i is sparse when it is not in ``mlp_only_layers`` and ``(i + 1)`` is a multiple of
    ``decoder_sparse_step`` (transformers' and vLLM's rule).

    Example:
        >>> from transformers import Qwen3MoeConfig
        >>> _moe_fields(Qwen3MoeConfig(num_hidden_layers=3, mlp_only_layers=[1]), "qwen3_moe")[
        ...     "moe_layers"]
        (True, False, True)
    """
    experts = int(getattr(cfg, "num_experts", 0) or 0) if family == "qwen3_moe" else 0
    if experts == 0:
        return {}
    top_k = int(cfg.num_experts_per_tok)
    if not 0 < top_k <= experts:
        raise UnsupportedArchitectureError(
            f"num_experts_per_tok={top_k}: must be between 1 and num_experts={experts}"
        )
    step = int(getattr(cfg, "decoder_sparse_step", 1) or 1)
    dense = {int(i) for i in (getattr(cfg, "mlp_only_layers", None) or [])}
    layers = tuple(
        i not in dense and (i + 1) % step == 0 for i in range(int(cfg.num_hidden_layers))
    )
    return dict(
        num_experts=experts,
        experts_per_token=top_k,
        moe_ffn_hidden_size=int(cfg.moe_intermediate_size),
        norm_topk_prob=bool(cfg.norm_topk_prob),
        moe_layers=layers,
    )


def model_spec_from_hf(cfg: Any) -> ModelSpec:
    """Read an HF ``PretrainedConfig`` into a :class:`ModelSpec`, or raise.

    Raises :class:`UnsupportedArchitectureError` (listing the supported families) for any
    model type or option that the Megatron model would not reproduce exactly.

    Example:
        >>> from transformers import LlamaConfig
        >>> model_spec_from_hf(LlamaConfig(num_hidden_layers=1)).num_layers
        1
    """
    family = getattr(cfg, "model_type", None)
    if family in GEMMA_FAMILIES:
        gemma = gemma_spec_from_hf(cfg)
        return _spec(cfg, rope_theta=gemma.rope_theta, qk_norm=family == "gemma3_text", gemma=gemma)
    if family not in SUPPORTED_FAMILIES:
        raise UnsupportedArchitectureError(
            f"model_type={family!r} (architectures={getattr(cfg, 'architectures', None)}) is not "
            f"supported; supported model types: {', '.join(SUPPORTED_FAMILIES)}"
        )
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise UnsupportedArchitectureError(
            f"hidden_act={cfg.hidden_act!r}: only 'silu' is supported"
        )
    if getattr(cfg, "mlp_bias", False):
        raise UnsupportedArchitectureError(
            "mlp_bias=True is not supported (Llama default is False)"
        )
    _check_sliding_window(cfg, family)
    attention_bias = bool(getattr(cfg, "attention_bias", False))
    if family in ("llama", "mistral") and attention_bias:
        # Llama's attention_bias also puts a bias on o_proj, which Megatron can only express
        # together with biases on every linear layer.
        raise UnsupportedArchitectureError(f"{family} attention_bias=True is not supported")
    rope_theta, llama3_factor = _rope(cfg)
    return _spec(
        cfg,
        rope_theta=rope_theta,
        # Qwen2 always has q/k/v biases; Qwen3 has them only with attention_bias=True.
        qkv_bias=family == "qwen2" or (family in ("qwen3", "qwen3_moe") and attention_bias),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        llama3_rope_factor=llama3_factor,
        **_moe_fields(cfg, family),
    )


def _spec(cfg: Any, *, qkv_bias: bool = False, **fields: Any) -> ModelSpec:
    """The :class:`ModelSpec` fields every family reads the same way, plus ``fields``."""
    heads = int(cfg.num_attention_heads)
    vocab = int(cfg.vocab_size)
    return ModelSpec(
        family=cfg.model_type,
        num_layers=int(cfg.num_hidden_layers),
        hidden_size=int(cfg.hidden_size),
        ffn_hidden_size=int(cfg.intermediate_size),
        num_heads=heads,
        num_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
        vocab_size=vocab,
        padded_vocab_size=math.ceil(vocab / VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE,
        rms_norm_eps=float(cfg.rms_norm_eps),
        max_position_embeddings=int(cfg.max_position_embeddings),
        tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        **fields,
    )


def megatron_config_from_hf(
    cfg: Any,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dtype: torch.dtype = torch.float32,
    recompute: str = "none",
) -> Any:
    """A Megatron ``TransformerConfig`` equivalent to HF config ``cfg`` (``ep``: the expert
    parallel size of an MoE model).

    Dropout is 0 and every fused kernel is off: the model must reproduce HF (and vLLM)
    numerics, and the fused paths need CUDA extensions. ``recompute`` is one of
    :data:`RECOMPUTE_MODES` (``full``: every layer, uniformly, one layer per checkpoint).

    Example:
        >>> from transformers import Qwen3Config
        >>> megatron_config_from_hf(Qwen3Config(num_hidden_layers=2)).qk_layernorm
        True
    """
    from megatron.core.transformer import TransformerConfig

    spec = cfg if isinstance(cfg, ModelSpec) else model_spec_from_hf(cfg)
    if spec.num_kv_heads % tp != 0:
        raise UnsupportedArchitectureError(
            f"num_key_value_heads={spec.num_kv_heads} is not divisible by placement.tp={tp}; "
            "choose a tp that divides it"
        )
    if ep > 1 and (not spec.num_experts or spec.num_experts % ep):
        raise UnsupportedArchitectureError(
            f"placement.ep={ep} must divide the model's num_experts={spec.num_experts} "
            "(a dense model has none: leave placement.ep=1)"
        )
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        gated_linear_unit=True,
        # Gemma: gelu_pytorch_tanh (GeGLU); softmax scale from query_pre_attn_scalar.
        activation_func=partial(F.gelu, approximate="tanh") if spec.gemma else F.silu,
        softmax_scale=spec.gemma.softmax_scale if spec.gemma else None,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        apply_rope_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        expert_model_parallel_size=ep,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        use_cpu_initialization=True,
        # Per-token loss normalisation is done by vime's losses (see vime.trainer.losses).
        calculate_per_token_loss=True,
        # megatron-core's MoE layer trains at TP > 1 only with sequence parallelism (each TP
        # rank holds 1/tp of the tokens between the layers' parallel linears); dense models
        # keep replicated activations.
        sequence_parallel=tp > 1 and bool(spec.num_experts),
        **_recompute_config(recompute),
        **_moe_config(spec),
    )


def _recompute_config(recompute: str) -> dict[str, Any]:
    """Megatron's activation-recompute settings for one of :data:`RECOMPUTE_MODES`.

    Example:
        >>> _recompute_config("full")["recompute_method"]
        'uniform'
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r}: choose one of {RECOMPUTE_MODES}")
    if recompute == "none":
        return {}
    if recompute == "full":  # every layer, uniformly, one layer per checkpoint
        return dict(
            recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
        )
    return {"recompute_granularity": recompute}


def _moe_config(spec: ModelSpec) -> dict[str, Any]:
    """Megatron's MoE settings reproducing Qwen3-MoE's sparse block (none for dense models).

    Qwen3-MoE takes the softmax over all experts, keeps the top k and, with
    ``norm_topk_prob``, renormalises them: Megatron's top-k-then-softmax (no pre-softmax)
    is the same distribution; without it, softmax-then-top-k (pre-softmax). No capacity
    limit (no token is dropped, as in transformers and vLLM) and no load-balancing loss:
    the router learns from the policy loss only (``router_aux_loss_coef`` is not applied).

    Example:
        >>> _moe_config(ModelSpec("llama", 1, 8, 8, 1, 1, 8, 8, 128, 1e-6, 1e4, 8, False,
        ...                       False, False))
        {}
    """
    if not spec.num_experts:
        return {}
    return dict(
        num_moe_experts=spec.num_experts,
        moe_router_topk=spec.experts_per_token,
        moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_layer_freq=[int(sparse) for sparse in spec.moe_layers],
        moe_router_pre_softmax=not spec.norm_topk_prob,
        moe_router_score_function="softmax",
        moe_router_load_balancing_type="none",
        moe_aux_loss_coeff=0.0,
        moe_router_dtype="fp32",  # transformers' softmax over router logits is float32
        moe_token_dispatcher_type="allgather",
        moe_grouped_gemm=False,  # SequentialMLP: one Megatron MLP per expert
    )


def _policy_model_class() -> type:
    from megatron.core.models.gpt import GPTModel

    class PolicyGPTModel(GPTModel):
        """A ``GPTModel`` that can return final (normed) hidden states instead of logits.

        With ``return_hidden=True`` the last pipeline stage returns ``[seq, batch, hidden]``
        after the final RMSNorm (``[seq / tp, …]`` under sequence parallelism, see
        :func:`vime.trainer.logprobs.gather_sequence_parallel`), and :meth:`output_weight`
        gives this TP rank's vocab slice of the output projection, so log-probs can be
        computed chunk by chunk.

        ``rope_positions`` (``[s]``, set per micro-batch) gives each token of the one
        sequence its own rotary position instead of its index: a token tree's nodes sit at
        their depths (:mod:`vime.trainer.prefix_tree`).
        """

        return_hidden: bool = False
        rope_positions: torch.Tensor | None = None

        def _preprocess(self, *args, **kwargs):  # type: ignore[override]
            out = super()._preprocess(*args, **kwargs)
            if self.rope_positions is None or out[1] is None:
                return out
            depth = int(self.rope_positions.max()) + 1
            table = self.rotary_pos_emb(depth)  # [depth, 1, 1, dim]
            if isinstance(table, tuple):  # YaRN's (embedding, mscale)
                table = table[0]
            return (out[0], table[self.rope_positions.to(table.device)], *out[2:])

        def _postprocess(self, hidden_states, **kwargs):  # type: ignore[override]
            if self.post_process and self.return_hidden:
                return hidden_states
            out = super()._postprocess(hidden_states=hidden_states, **kwargs)
            spec = getattr(self, "hf_spec", None)
            if self.post_process and kwargs.get("labels") is None and spec is not None:
                out = softcap(out, spec.logit_softcap)  # Gemma 2's final logit cap
            return out

        def output_weight(self) -> torch.Tensor:
            """This rank's ``[vocab / tp, hidden]`` output projection (shared if tied)."""
            if self.share_embeddings_and_output_weights:
                return self.shared_embedding_or_output_weight()
            return self.output_layer.weight

    return PolicyGPTModel


_POLICY_CLASS: type | None = None


def policy_model_class() -> type:
    """The :class:`PolicyGPTModel` class (created lazily so importing vime stays cheap).

    Example:
        >>> policy_model_class().__name__
        'PolicyGPTModel'
    """
    global _POLICY_CLASS
    if _POLICY_CLASS is None:
        _POLICY_CLASS = _policy_model_class()
    return _POLICY_CLASS


ATTENTION_BACKENDS = ("sdpa", "megatron")


def build_gpt_model(
    cfg: Any,
    *,
    dtype: torch.dtype = torch.float32,
    attention: str = "sdpa",
    recompute: str = "none",
) -> Any:
    """Build this rank's stage of the Megatron GPT model for HF config ``cfg``.

    Needs :func:`vime.trainer.parallel.init_distributed` first (TP/PP sizes come from it).
    Weights are random until :func:`vime.trainer.hf.load_hf_weights`. ``attention`` is
    ``"sdpa"`` (PyTorch's fused causal attention, see :mod:`vime.trainer.attention`) or
    ``"megatron"`` (megatron-core's unfused ``DotProductAttention``). ``recompute`` is
    Megatron's activation recompute (one of :data:`RECOMPUTE_MODES`): ``selective``
    recomputes the core attention, ``full`` every layer from its input, in the backward pass.

    Example (a one-layer llama, after :func:`~vime.trainer.parallel.init_distributed`):
        >>> from transformers import LlamaConfig
        >>> from vime.trainer.parallel import init_distributed
        >>> _ = init_distributed()
        >>> cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=1,
        ...                   num_attention_heads=4, num_key_value_heads=2, vocab_size=250)
        >>> type(build_gpt_model(cfg)).__name__
        'PolicyGPTModel'
    """
    from megatron.core import parallel_state as ps

    spec = model_spec_from_hf(cfg)
    tp = ps.get_tensor_model_parallel_world_size()
    pp = ps.get_pipeline_model_parallel_world_size()
    ep = ps.get_expert_model_parallel_world_size()
    config = megatron_config_from_hf(spec, tp=tp, pp=pp, ep=ep, dtype=dtype, recompute=recompute)
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(f"attention={attention!r}: choose one of {ATTENTION_BACKENDS}")
    if spec.gemma is not None and attention != "sdpa":
        raise UnsupportedArchitectureError(
            f"model_type={spec.family} needs trainer.attention=sdpa (vime's attention has "
            "Gemma's sliding windows and soft-capping; megatron-core's local one has neither)"
        )
    layer_spec = _layer_spec(config, spec, attention)
    from vime.trainer.compat import cpu_device_scope

    # With PP and tied embeddings Megatron moves the last stage's copy to CUDA to sync it.
    with cpu_device_scope():
        model = _construct(config, layer_spec, spec)
    if dtype != torch.float32:
        # The local spec's torch RMSNorm ignores params_dtype and stays float32. Megatron's
        # float16 optimizer keeps those in a separate group, and its sharded (checkpoint)
        # state then maps optimizer states onto the wrong parameters ("Optimizer shape
        # does not match model shape"). One dtype for every parameter, as Megatron's
        # Float16Module does; vLLM holds the norms in the same dtype.
        model.to(dtype)
    model.hf_spec = spec
    if spec.gemma is not None and model.pre_process:
        scale_embeddings(model, spec.hidden_size)
    return model


def _layer_spec(config: Any, spec: ModelSpec, attention: str) -> Any:
    """megatron-core's local (no transformer-engine) layer spec: one spec for a dense model,
    a block spec of dense and MoE layers (``config.moe_layer_freq``) for an MoE one; with
    ``attention="sdpa"`` every layer's core attention is vime's SDPA."""
    from megatron.core.models.gpt import gpt_layer_specs

    if spec.gemma is not None:
        return gemma_block_spec(config, spec)
    if spec.num_experts:
        from vime.trainer.compat import allow_moe_without_transformer_engine

        allow_moe_without_transformer_engine()
        block = gpt_layer_specs.get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization="RMSNorm"
        )
        layers = block.layer_specs
    else:
        block = gpt_layer_specs.get_gpt_layer_local_spec(
            qk_layernorm=spec.qk_norm, normalization="RMSNorm"
        )
        layers = [block]
    if config.sequence_parallel:
        from vime.trainer.compat import allow_sequence_parallel_norms

        allow_sequence_parallel_norms(block)
    if attention == "sdpa":
        from vime.trainer.attention import sdpa_core_attention_class

        for layer in layers:  # the dense and the MoE layer specs (shared between layers)
            layer.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class()
    return block


def _construct(config: Any, layer_spec: Any, spec: ModelSpec) -> Any:
    from megatron.core import parallel_state as ps

    return policy_model_class()(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=spec.padded_vocab_size,
        max_sequence_length=spec.max_position_embeddings,
        pre_process=ps.is_pipeline_first_stage(),
        post_process=ps.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=spec.rope_theta,
        # The same formula as HF's _compute_llama3_parameters (tested bit for bit).
        rope_scaling=spec.llama3_rope_factor is not None,
        rope_scaling_factor=spec.llama3_rope_factor or 8.0,
    )
