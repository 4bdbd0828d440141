"""LoRA in the trainer (vime.trainer.lora): the base frozen and untouched, step 0 equal to
the base, the merged export equal to the adapted model, the PEFT folder equal to the
adapters, checkpoints of the adapters and their
optimizer state."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from tests.trainer._trainer_samples import random_samples
from vime.trainer.config import TrainerConfig
from vime.trainer.hf import read_hf_state
from vime.trainer.lora import LoraConfig
from vime.trainer.lora_export import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_hf_state, peft_name
from vime.trainer.step import Trainer


@pytest.fixture(scope="module")
def lora_trainer(dist1, hf_checkpoints):
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8))
    return Trainer(hf_checkpoints["llama"], cfg)


def test_lora_trains_only_adapters_and_exports(lora_trainer, hf_checkpoints, tmp_path, f32_tol):
    import transformers as tf

    trainer = lora_trainer
    folder = hf_checkpoints["llama"]
    samples = random_samples(8, 250, seed=3)
    trainable = [n for n, p in trainer.module.named_parameters() if p.requires_grad]
    assert trainable and all(n.startswith("lora.") for n in trainable)
    base = {n: p.detach().clone() for n, p in trainer.module.named_parameters() if "lora" not in n}
    # B starts at zero: the adapted model is the base, bit for bit.
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    before = trainer.compute_logprobs(samples[:2])

    def hf_logprobs(model, sample):
        ids = torch.tensor([sample.tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
        return [0.0, *lp.tolist()]

    for row, s in zip(before, samples[:2], strict=True):
        gap = max(abs(a - b) for a, b in zip(row, hf_logprobs(hf, s), strict=True))
        assert gap < f32_tol.logprobs
    for _ in range(2):
        trainer.train_step(samples)
    after = trainer.compute_logprobs(samples[:2])
    moved = [
        abs(a - b) for r, q in zip(before, after, strict=True) for a, b in zip(r, q, strict=True)
    ]
    assert max(moved) > 1e-4
    for n, p in trainer.module.named_parameters():
        if "lora" not in n:
            assert torch.equal(p, base[n]), f"{n} moved: the base must stay frozen"
    # Merged export == the adapted model; the PEFT folder loaded by PEFT == the same.
    merged = trainer.export_hf(tmp_path / "merged")
    peft_dir = trainer.export_adapter(tmp_path / "adapter")
    config = json.loads((peft_dir / ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and "q_proj" in config["target_modules"]
    assert any(".q_proj.lora_B." in k for k in read_hf_state_file(peft_dir / ADAPTER_WEIGHTS))
    # The file (packed, one host copy, written by write_safetensors) holds the trained
    # adapter bit for bit: what the merge uses, and q/k/v's A is linear_qkv's one A.
    written, state = load_file(peft_dir / ADAPTER_WEIGHTS), adapter_hf_state(trainer.module)
    assert written.keys() == state.keys()
    assert all(torch.equal(written[k], state[k]) for k in state)
    qkv = next(p for i, n, p in trainer.module.lora.pairs() if i == 0 and n == "linear_qkv")
    for module in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(written[peft_name(0, "self_attn", module, "A")], qkv.a.detach().cpu())
    hf_merged = tf.AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)
    for row, s in zip(after, samples[:2], strict=True):
        gap = max(abs(a - b) for a, b in zip(row, hf_logprobs(hf_merged, s), strict=True))
        assert gap < f32_tol.logprobs, gap
    assert read_hf_state(folder).keys() == read_hf_state(merged).keys()


def read_hf_state_file(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return list(f.keys())


def test_lora_checkpoint_holds_adapters_and_optimizer(lora_trainer, tmp_path):
    trainer = lora_trainer
    samples = random_samples(8, 250, seed=5)
    trainer.train_step(samples)
    trainer.save_checkpoint(tmp_path / "ckpt")
    expected = trainer.compute_logprobs(samples[:2])
    adapters = {n: p.detach().clone() for n, p in trainer.module.lora.named_parameters()}
    trainer.train_step(samples)
    stepped = {n: p.detach().clone() for n, p in trainer.module.lora.named_parameters()}
    trainer.load_checkpoint(tmp_path / "ckpt")
    for n, p in trainer.module.lora.named_parameters():
        assert torch.equal(p, adapters[n]), n
    assert trainer.compute_logprobs(samples[:2]) == expected
    # The optimizer's moments came back too: the same next step, to the bit.
    trainer.train_step(samples)
    for n, p in trainer.module.lora.named_parameters():
        assert torch.equal(p, stepped[n]), n


def _tp2_entry(rank, port, folder, out_dir):
    from tests.trainer._lora_tp2_worker import run

    run(rank, port, folder, out_dir)


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2,
    reason="with CUDA each of the 2 ranks needs its own GPU",
)
def test_lora_at_tp2_matches_tp1_and_resumes_at_tp1(dist1, hf_checkpoints, tmp_path, f32_tol):
    """The adapters at TP=2 (A or B split over the ranks) take TP=1's steps: same gradient
    norms, same exported adapter, same log-probs; the TP=2 checkpoint loads at TP=1."""
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    from vime.net import free_port

    folder = str(hf_checkpoints["llama"])
    mp.spawn(_tp2_entry, args=(free_port(), folder, str(tmp_path)), nprocs=2, join=True)
    found = json.loads((tmp_path / "found.json").read_text())
    cfg = TrainerConfig(lr=1e-2, lora=LoraConfig(rank=4, alpha=8))
    tp1 = Trainer(folder, cfg)
    samples = random_samples(8, 250, seed=3)
    norms = [tp1.train_step(samples)["grad_norm"] for _ in range(2)]
    assert norms == pytest.approx(found["grad_norm"], rel=10 * f32_tol.rel)
    tp1.export_adapter(tmp_path / "adapter_tp1")
    a1 = load_file(tmp_path / "adapter_tp1" / ADAPTER_WEIGHTS)
    a2 = load_file(tmp_path / "adapter_tp2" / ADAPTER_WEIGHTS)
    assert a1.keys() == a2.keys()
    gap = max((a1[k] - a2[k]).abs().max().item() for k in a1)
    assert gap < f32_tol.logprobs, gap
    lp = tp1.compute_logprobs(samples[:2])
    diff = max(
        abs(x - y)
        for r, q in zip(lp, found["logprobs"], strict=True)
        for x, y in zip(r, q, strict=True)
    )
    assert diff < f32_tol.logprobs, diff
    resumed = Trainer(folder, cfg)
    resumed.load_checkpoint(tmp_path / "ckpt_tp2")
    again = resumed.compute_logprobs(samples[:2])
    diff = max(
        abs(x - y) for r, q in zip(again, lp, strict=True) for x, y in zip(r, q, strict=True)
    )
    assert diff < f32_tol.logprobs, diff
