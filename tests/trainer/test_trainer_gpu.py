"""The trainer on a CUDA GPU (NCCL, no CPU shims): HF parity, steps, resume, export, bf16.

Skipped without CUDA (CI has none); the CPU runs of the same paths are in the other
trainer tests. Tolerances come from the ``f32_tol`` fixture (conftest.py says why a GPU's
float32 is looser than a CPU's).
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from tests.trainer._trainer_samples import random_samples
from vime.trainer.step import Trainer, TrainerConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_trainer_on_gpu(hf_checkpoints, tmp_path, f32_tol):
    folder = hf_checkpoints["qwen3"]
    samples = random_samples(8, 250, seed=11)
    hf = tf.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda()
    ref = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.tokens], device="cuda")
            logp = torch.log_softmax(hf(ids).logits[0, :-1].float(), -1)
            ref.append([0.0, *logp.gather(1, ids[0, 1:, None])[:, 0].tolist()])

    cfg = TrainerConfig(lr=1e-3, warmup_steps=2, micro_batch_tokens=64)
    trainer = Trainer(folder, cfg)
    assert next(trainer.module.parameters()).is_cuda
    got = trainer.compute_logprobs(samples)
    diff = max(
        abs(a - b) for ra, rb in zip(got, ref, strict=True) for a, b in zip(ra, rb, strict=True)
    )
    print(f"GPU fp32 trainer vs HF logprobs: max {diff:.2e}")
    assert diff < f32_tol.logprobs

    first = trainer.train_step(samples)
    trainer.save_checkpoint(tmp_path / "ckpt")
    second = trainer.train_step(samples)
    resumed = Trainer(folder, cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == 1
    again = resumed.train_step(samples)
    print("GPU steps:", first["loss"], second["loss"], again["loss"], first["step_time_s"])
    assert again["loss"] == pytest.approx(second["loss"], rel=f32_tol.rel)
    assert second["loss"] != pytest.approx(first["loss"], rel=10 * f32_tol.rel)
    out = resumed.export_hf(tmp_path / "hf")
    assert out is not None and (out / "model.safetensors").exists()

    bf16_cfg = TrainerConfig(dtype="bfloat16", lr=1e-3, warmup_steps=2, micro_batch_tokens=64)
    bf16 = Trainer(folder, bf16_cfg)
    assert next(bf16.module.parameters()).dtype == torch.bfloat16
    lp = bf16.compute_logprobs(samples)
    bdiff = max(
        abs(a - b) for ra, rb in zip(lp, ref, strict=True) for a, b in zip(ra, rb, strict=True)
    )
    m = bf16.train_step(samples)
    print(
        f"GPU bf16: logprobs vs fp32 HF max {bdiff:.2e}; loss {m['loss']:.4f}, grad_norm {m['grad_norm']:.3f}"
    )
    # A max over tokens of bf16 weights against the float32 reference (the rounding of the
    # weights, not the engine gap): measured 1.51e-2 on an H200 and on an H100 (2026-12-06).
    assert bdiff < 0.03
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0

    # bf16 saves and resumes on the GPU too (fp32 master weights and Adam state included):
    # a fresh trainer loaded from the checkpoint takes the same next step.
    bf16.save_checkpoint(tmp_path / "ckpt_bf16")
    expected = [bf16.train_step(samples)["loss"] for _ in range(2)]
    back = Trainer(folder, bf16_cfg)
    assert back.load_checkpoint(tmp_path / "ckpt_bf16") == 1
    got = [back.train_step(samples)["loss"] for _ in range(2)]
    print(f"GPU bf16 resume: losses {expected} then, resumed, {got}")
    # Same kernels on the same shapes in the same order (measured on an H200: identical).
    assert got == pytest.approx(expected, rel=1e-5)
