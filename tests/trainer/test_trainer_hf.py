"""HF ⇄ Megatron: logits match transformers, export round-trips exactly, errors name the fix."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from vime.errors import UnsupportedArchitectureError
from vime.trainer.hf import export_hf, load_hf_weights, read_hf_state
from vime.trainer.hf_layout import hf_to_local, local_to_hf
from vime.trainer.model import build_gpt_model, model_spec_from_hf


def megatron_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Full-vocab logits [B, S, V] of a TP=1 Megatron model (padding columns dropped)."""
    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device=ids.device), 1)[None, None]
    pos = torch.arange(s, device=ids.device)[None].expand_as(ids)
    with torch.no_grad():
        return model(ids, pos, mask)[..., : model.hf_spec.vocab_size]


@pytest.mark.parametrize(
    ("family", "attention"),
    [("llama", "sdpa"), ("qwen2", "sdpa"), ("qwen3", "sdpa"), ("qwen3", "megatron")],
)
def test_logits_match_hf_and_export_round_trips(family, attention, hf_checkpoints, dist1, tmp_path):
    folder = hf_checkpoints[family]
    # Megatron puts its rotary tables on the GPU when there is one: everything goes there.
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    model = build_gpt_model(hf.config, attention=attention)
    load_hf_weights(model, folder)
    model.to(device)
    ids = torch.randint(
        0, hf.config.vocab_size, (2, 23), generator=torch.Generator().manual_seed(1)
    ).to(device)
    with torch.no_grad():
        ref = hf(ids).logits
    diff = (megatron_logits(model, ids) - ref).abs().max().item()
    assert diff < 1e-4, f"{family}: max |megatron − hf| = {diff}"

    out = export_hf(model, tmp_path / "export", like=folder)
    a, b = read_hf_state(folder), read_hf_state(out)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    assert (out / "config.json").read_text() == (folder / "config.json").read_text()


@pytest.mark.parametrize("kind", ["column", "row", "vocab", "qkv", "fc1"])
def test_tp_slices_reassemble_exactly(kind):
    spec = model_spec_from_hf(
        tf.Qwen2Config(
            vocab_size=250,
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=1,
        )
    )
    g = torch.Generator().manual_seed(0)
    if kind == "qkv":
        hf = [
            torch.randn(64, 64, generator=g),
            torch.randn(32, 64, generator=g),
            torch.randn(32, 64, generator=g),
        ]
    elif kind == "fc1":
        hf = [torch.randn(96, 64, generator=g), torch.randn(96, 64, generator=g)]
    elif kind == "vocab":
        hf = [torch.randn(250, 64, generator=g)]
    else:
        hf = [torch.randn(96, 64, generator=g)]
    shards = [hf_to_local(kind, hf, spec, 2, r) for r in range(2)]
    back = local_to_hf(kind, shards, spec)
    assert all(torch.equal(x, y) for x, y in zip(hf, back, strict=True))
    if kind == "qkv":  # rank 0 holds query group 0 whole: its 2 q heads, then its k and v head
        assert torch.equal(shards[0][:32], hf[0][:32]) and torch.equal(shards[0][32:48], hf[1][:16])


def test_unsupported_architecture_lists_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="llama, mistral, qwen2, qwen3"):
        model_spec_from_hf(tf.GPT2Config())
    with pytest.raises(UnsupportedArchitectureError, match="rope"):
        model_spec_from_hf(
            tf.LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4})
        )
