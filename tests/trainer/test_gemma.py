"""Gemma 1, Gemma 2 and Gemma 3 (text) beyond the logits test of test_model_families.py: every Gemma
piece changes the logits (so matching transformers means each is computed), the padded and
packed (thd) trainer layouts give transformers' log-probs (sliding windows within each
packed sample, the final soft-cap in the chunked log-probs) and train the same step, and
what is not mapped is refused naming the field."""

from __future__ import annotations

import pytest
import torch
import transformers as tf
from test_trainer_hf import megatron_logits

from tests.trainer._trainer_models import hf_config, hf_model, make_hf_checkpoint
from tests.trainer._trainer_samples import random_samples
from vime.errors import UnsupportedArchitectureError
from vime.trainer.hf import load_hf_weights, read_hf_state
from vime.trainer.logprobs import token_logprobs
from vime.trainer.model import build_gpt_model, model_spec_from_hf
from vime.trainer.step import Trainer, TrainerConfig


@pytest.fixture(scope="module")
def gemma_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma")
    return {f: make_hf_checkpoint(f, root / f) for f in ("gemma2", "gemma3")}


# Each piece, switched off in transformers' config (the weights unchanged). Post norms and
# the embedding scale have no switch: without them the logits differ wholesale.
ABLATIONS = {
    "gemma2": {
        "sliding_window": {"sliding_window": 4096},  # longer than the sequence
        "attn_logit_softcapping": {"attn_logit_softcapping": None},
        "final_logit_softcapping": {"final_logit_softcapping": None},
        "query_pre_attn_scalar": {"query_pre_attn_scalar": 32},
    },
    "gemma3": {
        "sliding_window": {"sliding_window": 4096},  # longer than the sequence
        "rope_parameters.sliding_attention": {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e6},
            }
        },
    },
}


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_each_gemma_piece_shows_in_the_logits(family, gemma_checkpoints, dist1):
    """Megatron equals transformers (test_model_families.py), and transformers without any
    one piece differs from Megatron by far more than 1e-5: each piece is really computed."""
    folder = gemma_checkpoints[family]
    model = build_gpt_model(hf_config(family))
    load_hf_weights(model, folder)
    ids = torch.randint(0, 250, (2, 120), generator=torch.Generator().manual_seed(3))
    ours = megatron_logits(model, ids)
    with torch.no_grad():
        assert (ours - hf_model(folder)(ids).logits).abs().max().item() <= 1e-5
        for piece, change in ABLATIONS[family].items():
            eager = {"attn_implementation": "eager"}
            other = tf.AutoModelForCausalLM.from_pretrained(folder, **eager, **change)
            diff = (ours - other(ids).logits).abs().max().item()
            print(f"{family} without {piece}: max |logit diff| {diff:.1e}")
            assert diff > 1e-4, piece  # ≥ 10 × the tolerance of the match above
    if family == "gemma3":  # the local layers' rotary table is transformers' local one
        local = model.decoder.layers[0].self_attention.local_rope.inv_freq
        hf_local = hf_model(folder).model.rotary_emb.sliding_attention_inv_freq
        assert torch.equal(local, hf_local)
        assert model.decoder.layers[5].self_attention.local_rope is None  # a global layer


def hf_logprobs(folder, samples):
    hf = hf_model(folder)
    out = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens])
            logp = torch.log_softmax(hf(ids).logits[0, :-1], -1)
            out.append([0.0, *logp.gather(1, ids[0, 1:, None])[:, 0].tolist()])
    return out


def max_abs_diff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_padded_and_packed_logprobs_and_step_match(family, gemma_checkpoints, dist1):
    """Samples of 30-90 tokens (window 48) in several micro-batches: packed and padded
    log-probs equal transformers'; one train step gives the same loss in both layouts."""
    folder = gemma_checkpoints[family]
    samples = random_samples(5, 250, seed=4, min_len=30, max_len=90)
    ref = hf_logprobs(folder, samples)
    cfg = dict(lr=1e-3, micro_batch_tokens=160, logprob_chunk_tokens=32)
    packed = Trainer(folder, TrainerConfig(pack_sequences=True, **cfg))
    padded = Trainer(folder, TrainerConfig(pack_sequences=False, **cfg))
    for trainer in (packed, padded):
        assert max_abs_diff(trainer.compute_logprobs(samples), ref) <= 1e-5
    m1, m2 = packed.train_step(samples), padded.train_step(samples)
    assert m1["num_micro_batches"] > 1
    for key in ("loss", "grad_norm", "entropy"):
        assert m1[key] == pytest.approx(m2[key], rel=1e-5, abs=1e-7), key
    after = packed.compute_logprobs(samples)
    assert max_abs_diff(after, padded.compute_logprobs(samples)) <= 1e-5
    assert max_abs_diff(after, ref) > 1e-4  # the step moved the weights


def test_checkpoint_resume_and_export_after_a_step(gemma_checkpoints, dist1, tmp_path):
    """A trained Gemma 2 step saved as a Megatron checkpoint (every norm, the sandwich
    ones included) resumes in a fresh trainer, whose export equals the trainer's."""
    folder = gemma_checkpoints["gemma2"]
    samples = random_samples(4, 250, seed=5, min_len=30, max_len=60)
    cfg = TrainerConfig(lr=1e-3)
    trainer = Trainer(folder, cfg)
    trainer.train_step(samples)
    trainer.save_checkpoint(tmp_path / "ckpt")
    resumed = Trainer(folder, cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1
    a = read_hf_state(trainer.export_hf(tmp_path / "a"))
    b = read_hf_state(resumed.export_hf(tmp_path / "b"))
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.norm.weight"], read_hf_state(folder)["model.norm.weight"])


def test_chunked_logprobs_apply_the_final_softcap_forward_and_backward():
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(7, 16, generator=g) * 4).requires_grad_()
    weight = torch.randn(40, 16, generator=g).requires_grad_()
    targets = torch.randint(0, 40, (7,), generator=g)
    lp, ent = token_logprobs(hidden, weight, targets, chunk_size=3, logit_softcap=30.0)
    logits = torch.tanh(hidden @ weight.T / 30.0) * 30.0
    dense = torch.log_softmax(logits, -1)
    assert torch.allclose(lp, dense.gather(1, targets[:, None])[:, 0], atol=1e-5)
    assert torch.allclose(ent, -(dense.exp() * dense).sum(-1), atol=1e-5)
    grads = torch.autograd.grad(lp.sum(), (hidden, weight))
    expected = torch.autograd.grad(dense.gather(1, targets[:, None]).sum(), (hidden, weight))
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-5)
    uncapped, _ = token_logprobs(hidden.detach(), weight.detach(), targets)
    assert (uncapped - lp.detach()).abs().max() > 0.1  # the cap matters at these logits


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (tf.Gemma3Config(), "model_type='gemma3' (Gemma3ForConditionalGeneration)"),
        (tf.Gemma2Config(hidden_activation="gelu"), "hidden_activation='gelu'"),
        (tf.GemmaConfig(hidden_act="silu"), "hidden_act='silu'"),
        (tf.Gemma3TextConfig(use_bidirectional_attention=True), "use_bidirectional_attention"),
        (tf.Gemma2Config(attention_bias=True), "attention_bias=True"),
        (
            tf.Gemma3TextConfig(rope_scaling={"rope_type": "linear", "factor": 8.0}),
            "rope_parameters.full_attention.rope_type='linear'",
        ),
    ],
    ids=["gemma3-multimodal", "exact-gelu", "silu", "bidirectional", "bias", "linear-rope"],
)
def test_unmapped_gemma_configs_are_refused_naming_the_field(config, field):
    with pytest.raises(UnsupportedArchitectureError) as err:
        model_spec_from_hf(config)
    assert field in str(err.value)


def test_gemma_needs_vime_attention(dist1):
    with pytest.raises(UnsupportedArchitectureError, match=r"trainer\.attention=sdpa"):
        build_gpt_model(hf_config("gemma2"), attention="megatron")
