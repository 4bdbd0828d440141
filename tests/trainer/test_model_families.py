"""Llama 3.x (llama3 rope scaling), Qwen2.5 and Mistral: tiny random models shaped after the
real checkpoints' configs give Megatron logits equal to transformers', export round-trips
bit for bit, vLLM's log-probs on Llama 3.x equal the trainer's, and what cannot be matched
is refused naming the config field."""

from __future__ import annotations

import shutil

import openai
import pytest
import torch
import transformers as tf
from _trainer_models import REAL_SHAPED, hf_config, make_hf_checkpoint
from test_trainer_hf import megatron_logits

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
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    model = build_gpt_model(hf.config)
    load_hf_weights(model, folder)
    model.to(device)
    # The rotary frequencies are HF's bit for bit (llama3: scaled by megatron-core's code).
    assert torch.equal(model.rotary_pos_emb.inv_freq.to(device), hf.model.rotary_emb.inv_freq)
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


@pytest.mark.engine
@pytest.mark.slow
def test_llama3_logprobs_match_vllm(tiny_model_dir, dist1, tmp_path):
    """vLLM (its own llama3 rope code) and the trainer agree on a Llama 3.x model's log-probs."""
    from vime.engine import EngineConfig, VLLMServer, is_vllm_cpu
    from vime.trainer.step import Trainer, TrainerConfig
    from vime.types import Sample

    folder = make_hf_checkpoint("llama3", tmp_path / "llama3", vocab=512)  # the tokenizer's
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tiny_model_dir / name, folder / name)
    server = VLLMServer(EngineConfig(model=str(folder), max_model_len=256, log_dir=str(tmp_path)))
    server.start()
    try:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")
        samples = []
        for seed in range(3):
            prompt = list(range(10 + seed, 50 + seed))
            resp = client.completions.create(
                model=server.model_name,
                prompt=prompt,
                max_tokens=150,  # 190 positions: the scaled frequencies matter (see above)
                temperature=1.0,
                logprobs=1,
                seed=seed,
                extra_body={"return_token_ids": True, "ignore_eos": True},
            )
            choice = resp.choices[0]
            completion = list((choice.model_extra or {})["token_ids"])
            lps = list(choice.logprobs.token_logprobs)
            mask = [0] * len(prompt) + [1] * len(completion)
            samples.append(
                Sample(
                    tokens=prompt + completion,
                    loss_mask=mask,
                    rollout_logprobs=[0.0] * len(prompt) + lps,
                )
            )
    finally:
        server.stop()
    ours = Trainer(folder, TrainerConfig(temperature=1.0)).compute_logprobs(samples)
    diffs = [
        abs(a - b)
        for s, lps in zip(samples, ours, strict=True)
        for a, b, m in zip(lps, s.rollout_logprobs, s.loss_mask, strict=True)
        if m
    ]
    mean, worst = sum(diffs) / len(diffs), max(diffs)
    print(f"llama3 trainer vs vLLM over {len(diffs)} tokens: mean {mean:.2e}, max {worst:.2e}")
    if is_vllm_cpu():  # the same float32 math (the tiny qwen2 model: ~1.6e-7 / ~1e-6)
        assert mean < 1e-5 and worst < 1e-4
    else:
        assert mean < 1e-3 and worst < 1e-2
