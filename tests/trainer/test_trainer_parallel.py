"""TP=2, DP=2 and PP=2 in two processes, checked against TP=1 in this process.

On a CPU the two ranks talk over gloo; with CUDA each rank takes its own GPU and NCCL,
so there the test needs two GPUs.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from tests.trainer._trainer_samples import random_samples
from vime.net import free_port
from vime.trainer.step import Trainer, TrainerConfig


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _entry(rank, port, checkpoints, out_dir):
    # imported in the child (spawn), where tests/trainer is on sys.path
    from tests.trainer._trainer_tp2_worker import run

    run(rank, port, checkpoints, out_dir)


WORLD = 2


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < WORLD,
    reason=f"with CUDA each of the {WORLD} ranks needs its own GPU (NCCL cannot put two ranks "
    f"on one device); {torch.cuda.device_count() if torch.cuda.is_available() else 0} visible",
)
def test_tp2_dp2_pp2_match_tp1_and_tp2_checkpoint_resumes_at_tp1(
    hf_checkpoints, dist1, tmp_path, f32_tol
):
    checkpoints = {k: str(v) for k, v in hf_checkpoints.items()}
    mp.spawn(_entry, args=(free_port(), checkpoints, str(tmp_path)), nprocs=WORLD, join=True)
    found = json.loads((tmp_path / "found.json").read_text())
    print(f"{f32_tol.device}: TP=2 max |megatron − hf| logits:", found["logit_diff"])

    for family in ("llama", "qwen2", "qwen3"):
        assert found["logit_diff"][family] < f32_tol.logits, (family, found["logit_diff"][family])
        assert found["export_exact"][family], family
    assert found["export_exact"]["qwen2_pp2"]

    samples = random_samples(6, 250, seed=7)
    cfg = TrainerConfig(lr=1e-3, warmup_steps=1, micro_batch_tokens=64)
    tp1 = Trainer(hf_checkpoints["qwen2"], cfg)
    lp = tp1.compute_logprobs(samples)
    diffs = {other: max_abs_diff(lp, found[other]) for other in ("tp2_logprobs", "pp2_logprobs")}
    print(f"{f32_tol.device}: max |logprob − TP=1|:", diffs)
    for other, diff in diffs.items():
        assert diff < f32_tol.logprobs, other
    # The argmax over two vocab slices: the HF model's greedy tokens are hits on both ranks.
    assert [row[5:] for row in found["tp2_greedy_hits"]] == [[1.0] * 12] * 2
    step1 = tp1.train_step(samples)
    for other in ("tp2_step1", "dp2_step1", "pp2_step1"):  # same loss and gradient everywhere
        assert found[other]["loss"] == pytest.approx(step1["loss"], rel=f32_tol.rel), other
        assert found[other]["grad_norm"] == pytest.approx(
            step1["grad_norm"], rel=10 * f32_tol.rel
        ), other
    assert found["dp"] == 2
    after = max_abs_diff(tp1.compute_logprobs(samples), found["dp2_logprobs_after"])
    assert after < f32_tol.logprobs

    # saved at TP=2 after one step, loaded at TP=1: the next step is the one TP=2 took
    resumed = Trainer(hf_checkpoints["qwen2"], cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt_tp2") == 1
    step2 = resumed.train_step(samples)
    assert step2["loss"] == pytest.approx(found["tp2_step2"]["loss"], rel=f32_tol.rel, abs=1e-7)
    assert step2["grad_norm"] == pytest.approx(
        found["tp2_step2"]["grad_norm"], rel=10 * f32_tol.rel
    )
    assert step2["loss"] != pytest.approx(step1["loss"], rel=1e-3)  # it is a different step
