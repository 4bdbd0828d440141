"""Qwen3-MoE through megatron-core's MoE layers (Gemma's refusals: test_gemma.py).

The real-shaped Qwen3-MoE (renormalised top-k, a dense layer from ``mlp_only_layers``) is
checked in test_model_families.py (logits, export) and test_model_parity.py (vLLM, RL
steps); here the other router and layer-pattern settings.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from test_trainer_hf import megatron_logits

from vime.errors import UnsupportedArchitectureError
from vime.trainer.hf import export_hf, load_hf_weights, read_hf_state
from vime.trainer.model import build_gpt_model, model_spec_from_hf


def _moe_checkpoint(folder, **fields):
    cfg = tf.Qwen3MoeConfig(
        vocab_size=250,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        num_experts=6,
        num_experts_per_tok=3,
        **fields,
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return folder, model


def test_unnormalised_top_k_and_sparse_step_match_hf(dist1, tmp_path):
    # norm_topk_prob=False (Qwen3-MoE's default): the top-k softmax weights are not
    # renormalised; decoder_sparse_step=2: layers 1 and 3 are sparse, 0 and 2 dense.
    folder, hf = _moe_checkpoint(tmp_path / "moe", norm_topk_prob=False, decoder_sparse_step=2)
    model = build_gpt_model(hf.config)
    assert model.hf_spec.moe_layers == (False, True, False, True)
    assert model.config.moe_router_pre_softmax  # softmax over all experts, then top-k
    load_hf_weights(model, folder)
    ids = torch.randint(0, 250, (2, 64), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
    diff = (megatron_logits(model, ids) - ref).abs().max().item()
    print(f"qwen3-moe (norm_topk_prob=False, sparse step 2): max |megatron - hf| = {diff:.2e}")
    assert diff <= 1e-5
    a, b = read_hf_state(folder), read_hf_state(export_hf(model, tmp_path / "out", like=folder))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_moe_config_errors_name_the_field():
    with pytest.raises(UnsupportedArchitectureError, match="num_experts_per_tok=9"):
        model_spec_from_hf(tf.Qwen3MoeConfig(num_experts=8, num_experts_per_tok=9))
    dense = model_spec_from_hf(tf.Qwen3MoeConfig(num_hidden_layers=2, num_experts=0))
    assert dense.num_experts == 0 and not dense.is_moe_layer(0)  # every layer a dense MLP


def test_moe_checkpoint_resumes_and_exports_the_trained_weights(dist1, tmp_path):
    """A trained MoE step saved as a Megatron checkpoint and loaded by a fresh trainer (what
    ``vime-agent export RUN`` does) exports the same HF tensors as the trainer that trained."""
    from tests.trainer._trainer_models import make_hf_checkpoint
    from tests.trainer._trainer_samples import random_samples
    from vime.trainer.step import Trainer, TrainerConfig

    folder = make_hf_checkpoint("qwen3-moe", tmp_path / "moe")
    cfg = TrainerConfig(lr=1e-3, warmup_steps=1, micro_batch_tokens=64)
    trained = Trainer(folder, cfg)
    trained.train_step(random_samples(6, 250, seed=7))
    trained.save_checkpoint(tmp_path / "ckpt")
    a = read_hf_state(trained.export_hf(tmp_path / "a"))
    assert not torch.equal(
        a["model.layers.0.mlp.gate.weight"], read_hf_state(folder)["model.layers.0.mlp.gate.weight"]
    )  # the router trained
    resumed = Trainer(folder, cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1
    b = read_hf_state(resumed.export_hf(tmp_path / "b"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
