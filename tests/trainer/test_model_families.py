"""Llama 3.x (llama3 rope scaling), Qwen2.5, Mistral, Qwen3-MoE, Gemma 2 and Gemma 3: tiny random models
shaped after the real checkpoints' configs give Megatron logits equal to transformers'
(within 1e-5; the dense ones bit for bit), export round-trips bit for bit, and what cannot
be matched is refused naming the config field. vLLM and the RL loop on these families:
test_model_parity.py."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from test_trainer_hf import megatron_logits

from tests.trainer._trainer_models import REAL_SHAPED, hf_config, hf_model, make_hf_checkpoint
from vime.errors import UnsupportedArchitectureError
from vime.trainer.hf import export_hf, load_hf_weights, read_hf_state
from vime.trainer.model import build_gpt_model, model_spec_from_hf


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: make_hf_checkpoint(f, root / f) for f in REAL_SHAPED}


@pytest.mark.parametrize("family", REAL_SHAPED)
def test_family_matches_hf_and_export_round_trips(family, family_checkpoints, dist1, tmp_path):
    folder = family_checkpoints[family]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = hf_model(folder).to(device)
    model = build_gpt_model(hf.config)
    load_hf_weights(model, folder)
    model.to(device)
    # The rotary frequencies are HF's bit for bit (llama3: scaled by megatron-core's code;
    # Gemma 3: the global layers' base here, the local one in test_gemma.py).
    rope = hf.model.rotary_emb
    hf_freq = getattr(rope, "full_attention_inv_freq", None)
    hf_freq = rope.inv_freq if hf_freq is None else hf_freq
    assert torch.equal(model.rotary_pos_emb.inv_freq.to(device), hf_freq)
    if family == "llama3":  # the scaling is really applied: plain RoPE frequencies differ
        plain = 1.0 / (5e5 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
        assert not torch.equal(hf.model.rotary_emb.inv_freq.cpu(), plain)
    # 200 positions: the llama3 low frequencies turn far enough to show in the logits
    # (plain RoPE here gives a 3.7e-2 logit difference).
    ids = torch.randint(0, 250, (2, 200), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        ref = hf(ids).logits
    diff = (megatron_logits(model, ids) - ref).abs().max().item()
    print(f"{family}: max |megatron - hf| logits = {diff:.2e}")
    assert diff <= 1e-5, f"{family}: max |megatron − hf| = {diff}"

    out = export_hf(model, tmp_path / "export", like=folder)
    a, b = read_hf_state(folder), read_hf_state(out)
    assert sorted(a) == sorted(b)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_sliding_window_is_refused_only_where_sequences_can_exceed_it():
    cfg = hf_config("mistral")
    cfg.sliding_window = 4096  # Mistral-7B-v0.1's window, max_position_embeddings 256
    assert model_spec_from_hf(cfg).family == "mistral"  # no sequence reaches the window
    cfg.sliding_window = 128
    with pytest.raises(UnsupportedArchitectureError, match=r"sliding_window=128 <.*null"):
        model_spec_from_hf(cfg)
    with pytest.raises(UnsupportedArchitectureError, match="use_sliding_window"):
        model_spec_from_hf(tf.Qwen2Config(use_sliding_window=True, sliding_window=64))


def test_llama3_rope_parameters_megatron_fixes_are_checked():
    cfg = hf_config("llama3")
    assert model_spec_from_hf(cfg).llama3_rope_factor == 32.0
    cfg.rope_parameters = {**cfg.rope_parameters, "original_max_position_embeddings": 4096}
    with pytest.raises(UnsupportedArchitectureError, match="original_max_position_embeddings"):
        model_spec_from_hf(cfg)
    yarn = {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}
    with pytest.raises(UnsupportedArchitectureError, match=r"'yarn'.*'llama3'"):
        model_spec_from_hf(tf.Qwen2Config(rope_parameters=yarn))
