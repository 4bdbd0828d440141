"""Random tiny HF checkpoints (Llama, Qwen2, Qwen3) built locally for the trainer tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES = ("llama", "qwen2", "qwen3")


def make_hf_checkpoint(
    family: str, folder: Path, *, tied: bool = False, vocab: int = 250, seed: int = 0
) -> Path:
    """Save a random tiny ``family`` model (float32) to ``folder`` and return the folder.

    vocab=250 is deliberately not a multiple of 128, so vocab padding is exercised.
    """
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
    cls: Any
    cfg: Any
    if family == "llama":
        cfg = tf.LlamaConfig(
            **common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
        )
        cls = tf.LlamaForCausalLM
    elif family == "qwen2":
        cfg = tf.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        cls = tf.Qwen2ForCausalLM
    elif family == "qwen3":
        cfg = tf.Qwen3Config(
            **common, head_dim=24, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
        )
        cls = tf.Qwen3ForCausalLM
    else:
        raise ValueError(family)
    torch.manual_seed(seed)
    model = cls(cfg).float()
    # Random init leaves biases and norms at 0/1; perturb every tensor so the mapping of
    # each one (qkv bias, q/k norm, …) is actually tested.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return Path(folder)
