"""TP=2, DP=2 and PP=2 on CPU (two gloo processes), checked against TP=1 in this process."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp
from _trainer_samples import random_samples

from vime.net import free_port
from vime.trainer.step import Trainer, TrainerConfig


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _entry(rank, port, checkpoints, out_dir):
    # imported in the child (spawn), where tests/trainer is on sys.path
    from _trainer_tp2_worker import run

    run(rank, port, checkpoints, out_dir)


@pytest.mark.slow
def test_tp2_dp2_pp2_match_tp1_and_tp2_checkpoint_resumes_at_tp1(hf_checkpoints, dist1, tmp_path):
    checkpoints = {k: str(v) for k, v in hf_checkpoints.items()}
    mp.spawn(_entry, args=(free_port(), checkpoints, str(tmp_path)), nprocs=2, join=True)
    found = json.loads((tmp_path / "found.json").read_text())
    print("TP=2 max |megatron − hf| logits:", found["logit_diff"])

    for family in ("llama", "qwen2", "qwen3"):
        assert found["logit_diff"][family] < 1e-4, (family, found["logit_diff"][family])
        assert found["export_exact"][family], family
    assert found["export_exact"]["qwen2_pp2"]

    samples = random_samples(6, 250, seed=7)
    cfg = TrainerConfig(lr=1e-3, warmup_steps=1, micro_batch_tokens=64)
    tp1 = Trainer(hf_checkpoints["qwen2"], cfg)
    lp = tp1.compute_logprobs(samples)
    for other in ("tp2_logprobs", "pp2_logprobs"):
        assert max_abs_diff(lp, found[other]) < 1e-5, other
    step1 = tp1.train_step(samples)
    for other in ("tp2_step1", "dp2_step1", "pp2_step1"):  # same loss and gradient everywhere
        assert found[other]["loss"] == pytest.approx(step1["loss"], rel=1e-5), other
        assert found[other]["grad_norm"] == pytest.approx(step1["grad_norm"], rel=1e-4), other
    assert found["dp"] == 2
    assert max_abs_diff(tp1.compute_logprobs(samples), found["dp2_logprobs_after"]) < 1e-5

    # saved at TP=2 after one step, loaded at TP=1: the next step is the one TP=2 took
    resumed = Trainer(hf_checkpoints["qwen2"], cfg)
    assert resumed.load_checkpoint(tmp_path / "ckpt_tp2") == 1
    step2 = resumed.train_step(samples)
    assert step2["loss"] == pytest.approx(found["tp2_step2"]["loss"], rel=1e-5, abs=1e-7)
    assert step2["grad_norm"] == pytest.approx(found["tp2_step2"]["grad_norm"], rel=1e-4)
    assert step2["loss"] != pytest.approx(step1["loss"], rel=1e-3)  # it is a different step
